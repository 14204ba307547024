"""Train a finished run for more steps without touching it: a new run folder that starts from its checkpoint.

A finished run's record (events, summary, adapter, exports) is the result a person may already have
exported or compared; resuming it in place would rewrite that. So "train N more steps" makes a new
run whose config is the old one with max_steps raised (and num_epochs off: a continued run is counted in
steps, whichever field ruled the first), whose newest checkpoint is the old run's
(hard links: no copy of the weights, and the new run deleting its own checkpoints never touches the
old one's files), and whose events start with the old run's metrics, so its charts continue. Torch-free.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder

ORIGIN = "origin.json"
"""In the new run folder: which run and checkpoint it continues."""
HISTORY_TYPES = ("MetricsLogged", "EvalFinished", "CheckpointSaved")


def checkpoint_step(checkpoint: Path) -> int:
    """The step in a `checkpoint-N` folder name."""
    tail = checkpoint.name.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise ValueError(f"{checkpoint}: not a checkpoint-N folder")
    return int(tail)


def how_to_finish(folder: RunFolder, then: str = "") -> str:
    """The hint for a run without a tuned model: resume when it left a checkpoint, else train it again
    (never send a person to --resume for a run that has nothing to resume from)."""
    after = f", then {then}" if then else ""
    checkpoint = folder.latest_checkpoint()
    if checkpoint is not None:
        return (f"resume it with `finetune-studio train --resume {folder.path}` (it continues from "
                f"{checkpoint.name}){after}")
    return (f"it left no checkpoint to resume from: train it again with "
            f"`finetune-studio train {folder.config_path}`{after}")


def resume_mismatch(checkpoint: Path, config: RunConfig) -> str:
    """Why `config` cannot resume `checkpoint` ("" when it can): an adapter resumes only at the rank and
    method it was trained with, and a full fine-tune's checkpoint holds no adapter at all."""
    adapter = checkpoint / "adapter_config.json"
    method = config.technique.method
    if method == "full":
        return (f"{checkpoint.name} holds a LoRA adapter but technique.method is full; resume with the method it "
                "was trained with, or start a new run") if adapter.is_file() else ""
    if not adapter.is_file():
        if (checkpoint / "config.json").is_file():  # a whole model's weights: a full fine-tune's checkpoint
            return (f"{checkpoint.name} holds no adapter (it was a full fine-tune) but technique.method is "
                    f"{method}; resume with technique.method: full, or start a new run")
        return ""  # nothing to compare with: the worker's own load says what is wrong
    try:
        saved = json.loads(adapter.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""  # unreadable: the worker's own load reports it
    rank, dora = saved.get("r"), bool(saved.get("use_dora"))
    if isinstance(rank, int) and rank != config.technique.lora_rank:
        return (f"technique.lora_rank is {config.technique.lora_rank} but {checkpoint.name} was trained at rank "
                f"{rank}: a checkpoint resumes only at its own rank; set technique.lora_rank: {rank}, or start a "
                "new run for the new rank")
    if dora != (method == "dora"):
        was = "dora" if dora else "lora (or qlora, lora8)"
        return (f"technique.method is {method} but {checkpoint.name} was trained with {was}: resume with that "
                "method, or start a new run")
    return ""


def continue_run(source: RunFolder, more_steps: int, root: Path | None = None) -> RunFolder:
    """A new run that trains `more_steps` past `source`'s newest complete checkpoint; `source` is unchanged."""
    if more_steps < 1:
        raise ValueError("more steps must be at least 1")
    checkpoint = source.latest_checkpoint()
    if checkpoint is None:
        raise ValueError(f"{source.run_id} has no complete checkpoint to continue from")
    step = checkpoint_step(checkpoint)
    config = source.load_config()
    train = config.train.model_copy(update={"max_steps": step + more_steps, "num_epochs": None})
    config = config.model_copy(update={"train": train, "name": f"{config.name}-more"})
    config = RunConfig.model_validate(config.model_dump(mode="json"))
    folder = RunFolder.create(config, root=root or source.path.parent)
    try:
        _link_tree(checkpoint, folder.checkpoints_dir / checkpoint.name)
        with folder.events_path.open("w", encoding="utf-8") as handle:
            for event in source.iter_events():
                if event.get("type") == "JobStarted" and event.get("job", "finetune") != "finetune":
                    break  # exports and evaluations after training are not this run's history
                if event.get("type") in HISTORY_TYPES and int(event.get("step", 0)) <= step:
                    handle.write(json.dumps(event) + "\n")
        (folder.path / ORIGIN).write_text(json.dumps({"continues": source.run_id, "path": str(source.path),
                                                      "checkpoint": checkpoint.name, "step": step}),
                                          encoding="utf-8")
    except OSError:
        shutil.rmtree(folder.path, ignore_errors=True)
        raise
    return folder


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link every file of `source` under `target` (a copy where the file system has no links)."""
    for directory, _dirs, files in os.walk(source):
        rel = Path(directory).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            src, dst = Path(directory) / name, target / rel / name
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
