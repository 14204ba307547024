"""Checks of CLI arguments made before anything starts: numbers in range, run folders, files that exist.

A bad argument must be refused in the terminal in one line, not after a worker has started and a
model has loaded, and never taken as something else (`--limit 0` as "no limit"). Torch-free.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable

from backend.cli.errors import Refusals
from backend.core.config.run_config import ConfigError, RunConfig, apply_overrides
from backend.core.errors import JobError
from backend.core.paths import runs_dir
from backend.core.runs.run_folder import RunFolder


def _number(kind: type, low: float, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite `kind` within [low, high] (or (low, high] when low_open), said in one line."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
            if not math.isfinite(value):
                raise ValueError(text)
        except ValueError:
            noun = "a whole number" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        too_low = value <= low if low_open else value < low
        if too_low or (high is not None and value > high):
            if high is None:
                raise argparse.ArgumentTypeError(f"must be at least {low} (got {text})")
            bounds = f"above {low} and at most {high}" if low_open else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds} (got {text})")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


positive_int = _number(int, 1)
"""At least 1: a count (prompts, GPUs, steps, tokens)."""
non_negative_int = _number(int, 0)
"""At least 0: an index or a rank."""
non_negative_float = _number(float, 0.0)
"""At least 0.0: a temperature."""
probability = _number(float, 0.0, 1.0, low_open=True)
"""Above 0 and at most 1: top-p's probability mass."""


def open_run_folder(text: str) -> RunFolder:
    """The run folder a command was given (a path, or a run id from `runs list`), or one line saying
    why it is not one."""
    path = Path(text).expanduser()
    if not path.exists():
        by_id = runs_dir() / text
        if "/" not in text and text not in ("", ".", "..") and (by_id / "config.yaml").is_file():
            return RunFolder(by_id.absolute())
        raise ConfigError(f"{path}: no such run folder; `finetune-studio runs list` shows the runs and their folders")
    if not path.is_dir():
        raise ConfigError(f"{path}: is a file, not a run folder; give the folder that holds config.yaml")
    folder = RunFolder(path.absolute())
    if not folder.config_path.is_file():
        raise ConfigError(f"{folder.path}: not a run folder (no config.yaml); give a folder that `train` made")
    return folder


def existing_file(text: str, option: str) -> Path:
    """A file the user named that a worker will read: refused now if it is missing or a folder."""
    path = Path(text).expanduser().absolute()
    if not path.exists():
        raise ConfigError(f"{option} {path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file")
    return path


def output_folder(text: str, option: str) -> Path:
    """A folder a job will write into: refused now if a file is in its place."""
    path = Path(text).expanduser().absolute()
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside a file ({blocker})"
        raise ConfigError(f"{option} {path}: {where}, not a folder; give a folder (it is created if missing)")
    return path


def refuse_unfinished(folder: RunFolder, config: RunConfig, merged: bool, then: str) -> None:
    """A run without a whole trained model (still training, failed, cancelled, a save cut short) refused in
    one line before a worker starts, so nothing is appended to its events.jsonl or worker.log; the job
    refuses the same way when the window starts it (core/runs/trained_weights.py)."""
    from backend.core.runs.trained_weights import weights_problem

    problem = weights_problem(folder, config, merged, then)
    if problem:
        raise ConfigError(f"{problem[0]}; {problem[1]}")


def refuse_vision_format(config: RunConfig, fmt: str) -> None:
    """A format a vision-language run cannot be exported as yet, in one line before a worker starts (the export
    job refuses the same way: export/merge.TrainedRun.check)."""
    from backend.core.registries.export_formats import vision_refusal
    from backend.core.vision_folder import VisionFolder

    family = VisionFolder.read(config.resolved_model_path()).family
    problem = vision_refusal(fmt, family.label) if family is not None else None
    if problem:
        raise ConfigError(f"{problem[0]}; {problem[1]}")


def refuse_what_cannot_run(config: RunConfig, problem: str = "", start_anyway: bool = False) -> list[str]:
    """Every reason `config` cannot run on this machine, at once (Refusals: exit 2), before a run folder
    is made or a worker starts: the torch-free verdicts the window's Start and the estimate use
    (start_verdicts), the estimate against this machine's memory included. Only when they all pass
    are the model folder's files checked in depth (that check reads transformers' model-type table,
    which imports torch: seconds a refusal should not wait for). `problem` is a config error already
    found, said first when there are more. With `start_anyway` the estimate over memory does not
    block; the lines it overrode are returned, for the run folder's record."""
    from backend.core.device_caps import detected_device, device_caps
    from backend.estimate.feasibility import blocking_lines
    from backend.estimate.run_estimate import estimate_here
    from backend.estimate.start_verdicts import machine_limit, start_verdicts

    machine = detected_device()  # torch-free: NVML, as the studio and `estimate` see the machine
    caps = device_caps(machine.kind, machine.bf16, machine.devices)
    estimate = None if problem else estimate_here(config, machine.kind, caps)
    found = start_verdicts(config, caps, estimate, machine_limit(machine), override="add --start-anyway")
    overridden = blocking_lines([v for v in found if v.overridable]) if start_anyway else []
    lines = [line for line in blocking_lines(found) if line not in overridden]
    if not lines and not problem:
        from backend.training.model.model_check import check_model_folder

        try:
            check_model_folder(config)
        except JobError as exc:
            lines = [exc.message + (f"; {exc.hint}" if exc.hint else "")]
    if not lines:
        return overridden  # (a config problem alone is raised by the caller as it was)
    lines = ([problem] if problem else []) + lines
    what = "this problem" if len(lines) == 1 else f"these {len(lines)} problems"
    raise Refusals(lines, f"nothing was started; fix {what} and run again (this machine: {machine.kind}, "
                          f"{machine.why})")


def load_for_train(path: str, overrides: list[str]) -> RunConfig:
    """RunConfig.load, except that a file which breaks a combination rule (KTO with micro-batch 1) is
    still judged on this machine, so its other problems (Liger on the CPU) are said in the same breath."""
    try:
        return RunConfig.load(path, overrides)
    except ConfigError as exc:
        config = _sections_only(path, overrides)
        if config is None:
            raise
        refuse_what_cannot_run(config, str(exc))
        raise


def _sections_only(path: str, overrides: list[str]) -> RunConfig | None:
    """The file's sections each valid on their own (feasibility.lenient_config), or None."""
    from backend.core.config.file import parse_config_yaml, read_config_text
    from backend.estimate.feasibility import lenient_config

    try:
        raw = parse_config_yaml(read_config_text(Path(path)), str(path))
        apply_overrides(raw, overrides)
    except (ConfigError, OSError, ValueError):
        return None
    return lenient_config(raw)
