"""RunModels: a run's base model and its tuned version, loaded the way the run trained them.

Adapter methods load the base once (quantized as the run quantized it) with the adapter on top;
"base" is the same model with the adapter switched off, so comparing the two costs one model's
memory; for a run that continued an earlier adapter (model.adapter) "base" is that start adapter,
loaded beside the tuned one: what the run started from. Method full keeps one model at a time: switching drops the other before loading.
A vision-language run's models load with their image side (AutoModelForImageTextToText, as training
loaded them), so a chat or an evaluation can show them images; `family` says which family, else None (a text
model, or a Gemma 3 run that trained text rows on the text path).
Refusals come before anything loads, one sentence each.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
from pathlib import Path
from typing import Any, Iterator, Literal

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError, bad_input
from backend.core.runs.run_continuation import how_to_finish
from backend.core.protocol import Capabilities, PhaseChanged
from backend.core.runs.run_folder import RunFolder
from backend.training.model.loading import check_model_folder, load_model, load_tokenizer
from backend.training.phase import set_phase
from backend.core.runs.start_adapter import start_adapter_folder
from backend.core.registries.vision_families import VisionFamily
from backend.core.vision_folder import VisionFolder
from backend.training.model.techniques import TechniquePlan, plan_techniques
from backend.training.vision.door import load_vision_model, takes_door

log = logging.getLogger(__name__)
Which = Literal["base", "tuned"]


def inference_plan(config: RunConfig, capabilities: Capabilities) -> TechniquePlan:
    """The run's plan on this machine, minus what only training needs (optimizer, offload)."""
    technique = config.technique.model_copy(update={"optimizer": "adamw", "offload": "none"})
    return plan_techniques(config.model_copy(update={"technique": technique}), capabilities)


class RunModels:
    def __init__(self, run_dir: Path, config: RunConfig, capabilities: Capabilities):
        self.folder = RunFolder(run_dir)
        self.config = config
        self.full = config.technique.method == "full"
        self.weights_dir = self.folder.path / "model" if self.full else self.folder.adapter_dir
        self.base_path = check_model_folder(config)
        self.plan = inference_plan(config, capabilities)
        self.start = start_adapter_folder(config) if not self.full else None
        self.family: VisionFamily | None = self._image_family()
        self._model: Any = None
        self._loaded: str | None = None  # "base", "tuned" (full) or "adapter" (base + adapter)

    def _image_family(self) -> VisionFamily | None:
        """The run's family when it trained through the image door (training/vision/door.takes_door: Gemma 3's
        text-only runs took the text path); its data gone, a VLM counts as one (the image door is the rule)."""
        family = VisionFolder.read(self.base_path).family
        if family is None or not family.text_door:
            return family
        try:
            return family if takes_door(self.base_path, self.config) else None
        except (JobError, OSError):
            return family

    @property
    def has_tuned(self) -> bool:
        if self.full:
            return (self.weights_dir / "config.json").is_file() and any(self.weights_dir.glob("*.safetensors"))
        return (self.weights_dir / "adapter_config.json").is_file() and \
            (self.weights_dir / "adapter_model.safetensors").is_file()

    def require_tuned(self) -> None:
        if not self.has_tuned:
            what = "model/ (the fully tuned weights)" if self.full else "adapter/"
            raise bad_input(
                f"{self.folder.path} has no complete {what}: the run never finished, so there is no tuned model",
                how_to_finish(self.folder, "try again") + ", or use the base model",
            )

    def tokenizer(self) -> Any:
        """The tokenizer the run trained with (the base's, loaded as training loaded it)."""
        return load_tokenizer(self.base_path, self.config)

    def _drop(self) -> None:
        self._model, self._loaded = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _wanted(self, which: Which) -> str:
        return which if self.full or not self.has_tuned else "adapter"

    def will_load(self, which: Which) -> bool:
        """Whether `use(which)` has to load weights (a chat session says so before it waits on them)."""
        return self._loaded != self._wanted(which)

    def _load(self, which: Which) -> None:
        want = self._wanted(which)
        if self._loaded == want:
            return
        self._drop()
        if want == "tuned":
            model = self._load_weights(self.weights_dir)
        else:
            model = self._load_weights(self.base_path)
            if want == "adapter":
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(self.weights_dir), is_trainable=False)
                if self.start is not None:
                    model.load_adapter(str(self.start), adapter_name="start", is_trainable=False)
        model.eval()
        self._model, self._loaded = model, want
        log.info("loaded %s for %s", want, which)

    def _load_weights(self, path: Path) -> Any:
        if self.family is not None:
            return load_vision_model(path, self.config, self.plan, self.family)
        return load_model(path, self.config, self.plan)

    @contextlib.contextmanager
    def use(self, which: Which) -> Iterator[Any]:
        """The model to run for `which`, in eval mode (for base over an adapter: adapter switched off)."""
        if which == "tuned":
            self.require_tuned()
        self._load(which)
        if which == "base" and self._loaded == "adapter" and self.start is not None:
            self._model.set_adapter("start")
            try:
                yield self._model
            finally:
                self._model.set_adapter("default")
        elif which == "base" and self._loaded == "adapter":
            with self._model.disable_adapter():
                yield self._model
        else:
            yield self._model

    def close(self) -> None:
        self._drop()

    def each(self, reporter: Any) -> Iterator[tuple[Which, Any]]:
        """(which, model) for base then tuned, each loaded in turn with its load_model phase reported; the
        models are dropped after the last (the evaluation's loop)."""
        for which in ("base", "tuned"):
            reporter.emit(PhaseChanged(phase="load_model", detail=which))
            set_phase("load")
            with self.use(which) as model:
                set_phase("evaluate")
                yield which, model
        self.close()

    def report_head(self, run_dir: Path) -> dict[str, Any]:
        """The fields every eval_report.json starts with: when, which run, which two models."""
        return {
            "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "run_dir": str(run_dir),
            "base_model": str(self.base_path) + (f" + adapter {self.config.model.adapter}" if self.start else ""),
            "tuned_model": str(self.weights_dir),
            "method": self.config.technique.method,
            "objective": self.config.technique.objective,
        }
