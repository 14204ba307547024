"""estimate_run(): the one estimate of a run, shared by the Techniques page, the Train page, the CLI and the worker.

The figure a person sees must not depend on where they look. Every caller goes through here, so
the same config on the same machine gives the same total with the same parts: the feasibility
verdicts first (backend.estimate.feasibility: a choice that cannot run here is estimated as what will run
instead), then backend.estimate.estimate with the machine's CPU calibration, the data's longest
answer (for DPO, KTO and GRPO also their longest row, read here: backend.estimate.objective_rows),
and the GPU count and ZeRO stage the config's hardware section gives. The total is the
Breakdown's `total_bytes`: the step's peak phase plus the fixed runtime (on the CPU, the process
baseline). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.estimate.calibration import Calibration
from backend.core.config.run_config import RunConfig
import backend.core.cpu_features as cpu_features  # looked up at call time, as the worker's plan does
from backend.core.device_caps import device_caps
import backend.estimate as estimator  # looked up at call time: tests spy on backend.estimate.estimate
from backend.estimate import Breakdown, load_model_config
from backend.estimate.objective_rows import longest_row
from backend.estimate.feasibility import AttentionFacts, Probe, Verdict, blocker, runnable, verdicts
from backend.core.protocol import Capabilities

ZERO_STAGES = {"deepspeed_zero2": 2, "deepspeed_zero3": 3}


@dataclass(frozen=True)
class RunEstimate:
    """The estimate of what will run, the verdicts that shaped it, and why there is none (problem)."""

    device: str
    breakdown: Breakdown | None
    verdicts: tuple[Verdict, ...] = ()
    calibration: Calibration = field(default_factory=Calibration)
    problem: str = ""

    @property
    def total_bytes(self) -> int | None:
        """The one predicted total: the step's peak plus the fixed runtime."""
        return None if self.breakdown is None else int(self.breakdown.total_bytes)

    def start_blocker(self) -> str:
        """Why the worker would refuse this run here ("" when it would start)."""
        first = blocker(list(self.verdicts))
        return first.message() if first is not None else ""


def longest_answer(config: RunConfig) -> int | None:
    """The data's longest answer in tokens, read as the studio's Data page reads it (None: not known)."""
    return data_facts(config)[0]


def data_facts(config: RunConfig) -> tuple[int | None, int | None]:
    """(the longest answer in tokens, the most images in one row) of the data, read as the Data page reads
    it; None where not known (images: unless every row was read; 0 for text-only data)."""
    from backend.core.data.dataset_profile import DatasetProfile  # torch-free (tokenizers only)

    profile = DatasetProfile.read(config.data.path, config.model.path, config.data.format,
                                  skip_invalid=config.data.skip_invalid, seq_len=config.train.seq_len)
    return profile.longest_answer(), profile.most_images()


def estimate_run(config: RunConfig, device: str, *, caps: Capabilities | None = None,
                 target_tokens: int | None = None, calibration: Calibration | None = None,
                 num_gpus: int | None = None, zero_stage: int | None = None, data_problem: str = "",
                 probe: Probe | None = None, facts: AttentionFacts | None = None,
                 model_config: dict[str, Any] | None = None, data_rows: bool = True,
                 images_per_row: int | None = None) -> RunEstimate:
    """The estimate of `config` on `device` as it will run; never raises for an unreadable model
    or an estimator gap (the sentence lands in `problem`). calibration None reads this machine's.
    data_rows: DPO, KTO and GRPO rows as long as the data's longest (False: train.seq_len, the worst case).
    images_per_row: a vision-language model's data's most images a row (None: not known, one assumed)."""
    caps = caps if caps is not None else device_caps(device)
    if caps.cuda != (device == "cuda"):
        caps = caps.model_copy(update={"cuda": device == "cuda"})
    calibration = calibration if calibration is not None else Calibration.read()
    problem = ""
    if model_config is None:
        try:
            model_config = load_model_config(config.model.path)
        except ValueError as exc:
            problem = str(exc).splitlines()[0]
    found = verdicts(config, model_config, caps, probe=probe, facts=facts, data_problem=data_problem)
    breakdown = None
    if model_config is not None:
        gpus = num_gpus if num_gpus is not None else config.hardware.num_processes
        stage = zero_stage if zero_stage is not None else ZERO_STAGES.get(config.hardware.strategy, 0)
        bf16 = caps.bf16 or device != "cuda"
        rows = longest_row(config) if data_rows else None
        try:
            breakdown = estimator.estimate(model_config, runnable(config, found), device=device,  # type: ignore
                                           num_gpus=gpus, zero_stage=stage, bf16_supported=bf16,
                                           target_tokens=target_tokens, cpu_bf16=cpu_features.native_bf16(),
                                           calibration=calibration, row_tokens=rows,
                                           images_per_row=images_per_row)
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RunEstimate(device, breakdown, tuple(found), calibration, problem)


def estimate_here(config: RunConfig, device: str, caps: Capabilities | None = None,
                  runs_root: Path | None = None) -> RunEstimate:
    """estimate_run with what a headless caller has: the data read now and this machine's runs."""
    try:
        answer, images = data_facts(config)
    except Exception:  # the data is the worker's to refuse; the estimate then counts every position
        answer, images = None, None
    return estimate_run(config, device, caps=caps, target_tokens=answer, calibration=Calibration.read(runs_root),
                        images_per_row=images)
