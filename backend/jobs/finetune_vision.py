"""vision_trainer: the SFT trainer of a proven vision-language folder, beside finetune.py's text one.

The same steps as the text SFT path (rows, schedule, model, collator, callback, trainer), through the
vision door (backend/training/vision/door.py). The speed shortcuts stay off (the plan skips them for
families their exactness tests do not cover) and so do the validation samples, which would generate
from token rows without their images.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PrinterCallback

from backend.core.protocol import Capabilities, PhaseChanged
from backend.core.runs.run_folder import RunFolder
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from backend.training.callbacks import ReportingCallback
from backend.training.counting_trainer import PhaseCallback
from backend.training.memory_ledger import MemoryLedger
from backend.training.mfu import token_flops
from backend.training.model.techniques import TechniquePlan
from backend.training.vision.door import VisionRun, add_vision_adapters, load_vision_model, make_trainer


def vision_trainer(config, folder: RunFolder, plan: TechniquePlan, model_path: Path, reporter: Reporter,
                   stop: StopListener, ledger: MemoryLedger, peak: float, capabilities: Capabilities):
    """-> (model, trainer, callback, validation examples), as finetune._sft_trainer."""
    from backend.jobs.finetune import run_schedule, training_kwargs

    run = VisionRun.open(model_path, config)
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    train_set, eval_set, stats, rows = run.build_datasets(config)
    for note in stats.notes:
        reporter.emit(PhaseChanged(phase="data_warning", detail=note))
    images = sum(len(i) for i in rows.images)
    reporter.emit(PhaseChanged(phase="tokenize", detail=(
        f"{stats.train_examples} train / {stats.eval_examples} validation examples ({stats.format}), "
        f"{rows.image_rows} with images ({images} images, {run.family.label}), "
        f"{stats.truncated} truncated to {config.train.seq_len} tokens")))
    schedule = run_schedule(config, stats.train_examples, reporter)

    torch.manual_seed(config.train.seed)
    ledger.start(plan.device, capabilities)
    model = add_vision_adapters(load_vision_model(model_path, config, plan, run.family), config, plan, run.family)
    collator = run.collator(rows)
    callback = ReportingCallback(reporter, stop, plan.device)
    callback.peak_flops = peak
    kwargs = training_kwargs(config, folder.checkpoints_dir, plan, has_eval=eval_set is not None, schedule=schedule)
    kwargs["train_sampling_strategy"] = "group_by_length"  # padded batches: packing is off for image rows
    from transformers import TrainingArguments

    trainer = make_trainer(model, TrainingArguments(**kwargs), train_set, eval_set, collator,
                           [callback, PhaseCallback()], run.image_token_id)
    callback.trainer = trainer
    context = sum(len(r) for r in train_set["input_ids"]) / max(len(train_set), 1)
    callback.token_flops = token_flops(model, context, [])
    trainer.remove_callback(PrinterCallback)
    trainer.vision_run = run  # saved beside the adapter in place of a bare tokenizer
    return model, trainer, callback, stats.eval_examples
