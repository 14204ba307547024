"""The model a prune job cuts: a run's trained model merged first (the merged export's own code), or a
model folder given as it is.

A run's adapter is merged into a scratch folder through backend/export/merge.py and hf_writer.write_merged
(a QLoRA run dequantized exactly as it trained), in the 16-bit dtype the pruned model is written in, so
the before and after figures differ by the pruning alone. That folder is loaded in fp32 for measuring.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.export.checkpoint_files import CheckpointFiles
from backend.pruning.request import PruneRequest, Shape

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class PruneSource:
    """Where the model to prune is read from, what it is called, and its shapes."""

    folder: Path  # the folder holding its config.json (the trained run's base or model/, or the model folder)
    described: str
    shape: Shape
    dtype: str
    run: Any = None  # the TrainedRun when a run's trained model is pruned

    @classmethod
    def check(cls, run_dir: Path, config: RunConfig, request: PruneRequest) -> "PruneSource":
        """Refusals before anything loads: the run (or folder) and the picks against its config.json."""
        objective = config.technique.objective
        if objective != "sft":  # calibration and perplexity read prompt/answer rows
            raise bad_input(f"{Path(run_dir) / 'config.yaml'}: a {objective} run's data are not prompt/answer rows, "
                            "which pruning calibrates and measures on",
                            "export it merged (finetune-studio export RUN_DIR --format merged) and prune that folder "
                            "with --data pointing at prompt/answer data")
        if request.model:
            folder = Path(request.model).expanduser().absolute()
            if not (folder / "config.json").is_file():
                raise bad_input(f"{folder}: no config.json; give a Hugging Face model folder or a run folder")
            shape = Shape.read(folder)
            request.check(shape)
            dtype = request.dtype or _own_dtype(folder, config)
            return cls(folder, f"model folder {folder}", shape, dtype)
        from backend.export.merge import TrainedRun, default_dtype

        run = TrainedRun.check(Path(run_dir), config, "merged", then="prune")
        folder = run.weights_dir if run.full else run.base_path
        shape = Shape.read(folder)
        request.check(shape)
        what = "fully tuned model" if run.full else f"base {run.base_path.name} + {run.method} adapter, merged"
        return cls(folder, f"run {Path(run_dir).name}: {what}", shape, request.dtype or default_dtype(run), run)

    def tokenizer(self) -> Any:
        """The tokenizer the run trained with (saved beside the pruned model)."""
        if self.run is not None:
            from backend.export.merge import load_tokenizer

            return load_tokenizer(self.run)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def materialize(self, scratch: Path, tokenizer: Any) -> Path:
        """A folder transformers loads: the merged export written into `scratch` for a run, else the folder."""
        if self.run is None:
            return self.folder
        from backend.export.hf_writer import write_merged
        from backend.export.merge import merged_source

        scratch.mkdir(parents=True, exist_ok=True)
        write_merged(merged_source(self.run, DTYPES[self.dtype]), self.run, tokenizer, scratch, self.dtype)
        return scratch

    def load(self, folder: Path) -> Any:
        """The model in fp32 on the CPU, or on the GPU when there is one (values as stored, upcast exactly)."""
        from transformers import AutoModelForCausalLM

        trust = self.run.config.model.trust_remote_code if self.run is not None else False
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=trust,
                                                     **({} if device == "cpu" else {"device_map": {"": device}}))
        model.eval()
        return model

    @staticmethod
    def discard(scratch: Path) -> None:
        shutil.rmtree(scratch, ignore_errors=True)


def _own_dtype(folder: Path, config: RunConfig) -> str:
    """The folder's own 16-bit dtype (bf16 for fp32 weights), as the merged export chooses."""
    try:
        stored = CheckpointFiles(folder, config.model.allow_pickle).floating_dtype()
    except Exception:  # noqa: BLE001 - an unreadable index is said when the model loads
        stored = None
    return "fp16" if stored == torch.float16 else "bf16"
