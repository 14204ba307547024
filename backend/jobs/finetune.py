"""run_finetune: one LoRA fine-tune, from a RunConfig to an adapter folder, reporting as it goes.

Reads top to bottom as the job runs: check inputs, load, tokenize, train with the transformers
Trainer (no hand-written loop), save the adapter atomically, report. Everything the person sees
arrives through the Reporter; everything else goes to worker.log.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import PrinterCallback, TrainerState, TrainingArguments

from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.config.schedule import Schedule
from backend.core.errors import JobError, bad_input
from backend.evaluation.samples import SampleGenerator
from backend.core.protocol import Capabilities, JobFailed, JobFinished, JobStarted, PhaseChanged
from backend.core.runs.run_continuation import resume_mismatch
from backend.core.runs.run_folder import RunFolder
from backend.training.callbacks import ReportingCallback
from backend.training.vision.door import VisionRun, add_vision_adapters, load_vision_model, make_trainer, takes_door
from backend.training.model.capabilities import probe_capabilities
from backend.training.counting_trainer import PhaseCallback
from backend.training.tokenized import PackingCollator, PadCollator
from backend.training.model.loading import add_adapters, adapter_config, check_model_folder, load_model, load_tokenizer
from backend.training.memory_ledger import MemoryLedger
from backend.training.mfu import forget_peak, peak_flops, token_flops
from backend.training.model.model_facts import ModelFacts
from backend.training.phase import is_out_of_memory, set_phase
from backend.core.registries.shortcuts import SHORTCUTS
from backend.training.shortcuts.installer import choose_thread_count, install_for_job
from backend.training.model.techniques import TechniquePlan, plan_techniques
from backend.core.runs.start_adapter import start_adapter_folder
from backend.training.objectives.registry import objective_method
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)


def _training_arguments(config: RunConfig, output_dir: Path, plan: TechniquePlan, has_eval: bool,
                        schedule: Schedule) -> TrainingArguments:
    return TrainingArguments(**training_kwargs(config, output_dir, plan, has_eval, schedule))


def training_kwargs(config: RunConfig, output_dir: Path, plan: TechniquePlan, has_eval: bool,
                    schedule: Schedule) -> dict:
    """The Trainer's arguments, as keywords: the DPO, KTO and GRPO configs take the same ones (their doors).
    The length is always the schedule's steps, so num_epochs ends on the step its schedule line named."""
    train, technique = config.train, config.technique
    eval_strategy = "steps" if has_eval and train.eval_steps else "no"
    return dict(
        output_dir=str(output_dir),
        max_steps=schedule.steps,
        per_device_train_batch_size=train.micro_batch_size,
        per_device_eval_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=schedule.warmup,
        max_grad_norm=train.max_grad_norm,
        weight_decay=train.weight_decay,
        logging_strategy="steps",
        logging_steps=train.logging_steps,
        save_strategy="steps",
        save_steps=train.save_steps,
        save_total_limit=train.save_total_limit,
        eval_strategy=eval_strategy,
        eval_steps=train.eval_steps or None,
        seed=train.seed,
        data_seed=train.seed,
        use_cpu=plan.device == "cpu",
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        optim=plan.optimizer,
        activation_checkpointing=technique.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if technique.gradient_checkpointing else None,
        neftune_noise_alpha=technique.neftune_alpha,
        use_liger_kernel=technique.liger_kernel,
        torch_compile=technique.torch_compile,
        # Without packing, batches of similar length waste less on padding.
        train_sampling_strategy="random" if technique.packing else "group_by_length",
        ddp_backend="gloo" if plan.device == "cpu" and world_size() > 1 else None,
        ddp_find_unused_parameters=False,
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_level="warning",
    )


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_schedule(config: RunConfig, examples: int, reporter: Reporter) -> Schedule:
    """The steps and learning rate over the training examples the door built, said in one `schedule` line
    (which of max_steps and num_epochs rules, the steps it comes to); a warmup they cannot hold is bad input."""
    try:
        schedule = config.schedule(examples, world_size())
    except ConfigError as exc:
        raise bad_input(str(exc)) from None
    reporter.emit(PhaseChanged(phase="schedule", detail=schedule.describe()))
    return schedule


def run_finetune(
    config: RunConfig,
    run_dir: Path,
    reporter: Reporter,
    stop: StopListener,
    *,
    resume: bool = False,
    capabilities: Capabilities | None = None,
    params: dict | None = None,
) -> None:
    ledger = MemoryLedger(config, Path(run_dir))
    try:
        _finetune(config, run_dir, reporter, stop, ledger, resume=resume, capabilities=capabilities)
    except BaseException as exc:
        if is_out_of_memory(exc):  # the peak that did not fit, beside what was predicted
            ledger.write("out_of_memory")
        raise


def _finetune(config: RunConfig, run_dir: Path, reporter: Reporter, stop: StopListener, ledger: MemoryLedger, *,
              resume: bool, capabilities: Capabilities | None) -> None:
    began = time.monotonic()
    folder = RunFolder(run_dir)
    capabilities = capabilities or probe_capabilities()
    if world_size() > 1:
        log.info("rank %s of %d (%s)", os.environ.get("RANK"), world_size(), config.hardware.strategy)

    resume_from = None
    for partial in folder.remove_incomplete_checkpoints():
        log.warning("removed incomplete checkpoint %s (its save never finished)", partial.name)
    if resume:
        latest = folder.latest_checkpoint()
        if latest is None:
            raise JobError("bad_input", f"{run_dir}: no complete checkpoint to resume from",
                           "start a new run instead")
        mismatch = resume_mismatch(latest, config)
        if mismatch:
            raise JobError("bad_input", mismatch)
        resume_from = str(latest)
    # max_steps 0 with num_epochs: the steps are known once the data is read (the `schedule` line)
    reporter.emit(JobStarted(run_dir=str(run_dir), max_steps=config.train.max_steps or 0,
                             resumed_from=resume_from))
    if resume_from:
        reporter.emit(PhaseChanged(phase="resume", detail=f"from {Path(resume_from).name}, the newest complete checkpoint"))

    model_path = check_model_folder(config)
    start_adapter_folder(config)  # a start adapter that cannot fit is refused before anything loads
    facts = ModelFacts.read(model_path, config.model.trust_remote_code)  # config.json only, no weights
    image_door = takes_door(model_path, config)  # a proven VLM: image rows, its processor, its parts (training/vision)
    # refuses what cannot run here, before any loading
    plan = plan_techniques(config, capabilities, facts, world_size(), image_rows=image_door)
    reporter.emit(PhaseChanged(phase="plan", detail=plan.summary()))
    # The peak of the precision the products run in (the frozen base's, where they are bf16 on the CPU).
    peak_dtype = plan.load_dtype if plan.precision != "fp32" else (torch.bfloat16 if plan.bf16_base else torch.float32)
    peak = peak_flops(plan.device, peak_dtype)  # measured (once per machine) while the device is still empty
    set_phase("load")
    reporter.emit(PhaseChanged(phase="load_model", detail=config.model.path))
    tokenizer = load_tokenizer(model_path, config)

    if image_door:
        if config.technique.objective != "sft":
            raise bad_input(f"technique.objective {config.technique.objective}: a vision-language model trains "
                            "with sft only for now", "set technique.objective: sft")
        model, trainer, callback, eval_examples = _vision_trainer(config, folder, plan, model_path, reporter, stop,
                                                                 ledger, peak, capabilities)
        tokenizer = trainer.vision_run  # its save_pretrained writes the processor's files
    elif objective_method(config.technique.objective).through_trl:  # DPO, KTO, GRPO (backend.training.objectives)
        model, trainer, callback, eval_examples = _objective_trainer(config, folder, plan, model_path, tokenizer,
                                                               reporter, stop, ledger, peak, capabilities)
    else:
        model, trainer, callback, eval_examples = _sft_trainer(config, folder, plan, model_path, tokenizer,
                                                               reporter, stop, ledger, peak, peak_dtype, capabilities)
    done = int(Path(resume_from).name.rsplit("-", 1)[1]) if resume_from else 0
    if done >= trainer.args.max_steps:
        # Resuming at the last step would run one step too many: the checkpoint is the result.
        trainer._load_from_checkpoint(resume_from)
        trainer.state = TrainerState.load_from_json(str(Path(resume_from) / "trainer_state.json"))
        callback.losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    else:
        trainer.train(resume_from_checkpoint=resume_from)

    if callback.stopped and not stop.save:
        kept = folder.latest_checkpoint()
        saved = (f"nothing saved since {kept.name}, which is kept and can be resumed" if kept is not None
                 else "nothing saved")
        reporter.emit(JobFailed(kind="cancelled", message=f"cancelled at step {trainer.state.global_step}; {saved}"))
        return

    if eval_examples and not callback.stopped:
        reporter.emit(PhaseChanged(phase="evaluate", detail=f"{eval_examples} examples"))
        trainer.evaluate()

    if (callback.mfu() or 0) > 1.0:
        log.warning("MFU above 100%%: the cached peak was measured on a busy machine; re-measuring next run")
        forget_peak(plan.device, peak_dtype)
    full = config.technique.method == "full"
    reporter.emit(PhaseChanged(phase="save", detail="model" if full else "adapter"))
    target = folder.path / "model" if full else folder.adapter_dir
    if trainer.is_world_process_zero():  # one writer of the final folder
        save_atomically(model, tokenizer, target)
        ledger.write("stopped" if callback.stopped else "finished")
    reporter.emit(
        JobFinished(
            run_dir=str(run_dir),
            stopped=callback.stopped,
            steps=trainer.state.global_step,
            first_loss=callback.losses[0] if callback.losses else None,
            final_loss=callback.losses[-1] if callback.losses else None,
            tokens_per_s=callback.tokens_per_s(),
            mfu=callback.mfu(),
            compile_seconds=callback.compile_seconds,
            seconds=time.monotonic() - began,
            adapter_path=str(target),
            checkpoint_path=callback.last_checkpoint,
        )
    )


def _sft_trainer(config: RunConfig, folder: RunFolder, plan: TechniquePlan, model_path: Path, tokenizer,
                 reporter: Reporter, stop: StopListener, ledger: MemoryLedger, peak: float, peak_dtype,
                 capabilities: Capabilities):
    """Supervised fine-tuning: tokenized examples, the SupervisedCountingTrainer and the speed shortcuts.
    -> (model, trainer, callback, validation examples)."""
    sft = objective_method("sft").door()
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    train_set, eval_set, stats = sft.build_datasets(config, tokenizer)
    for note in stats.notes:  # skipped examples (data.skip_invalid): said where the person looks
        reporter.emit(PhaseChanged(phase="data_warning", detail=note))
    detail = (f"{stats.train_examples} train / {stats.eval_examples} validation examples ({stats.format}), "
              f"{stats.truncated} truncated to {config.train.seq_len} tokens"
              + (", tokenized earlier (cache reused)" if stats.from_cache else ""))
    reporter.emit(PhaseChanged(phase="tokenize", detail=detail))
    schedule = run_schedule(config, stats.train_examples, reporter)

    torch.manual_seed(config.train.seed)
    ledger.start(plan.device, capabilities)  # the process baseline: everything but the model
    model = add_adapters(load_model(model_path, config, plan), config, plan)

    collator = PackingCollator() if config.technique.packing else PadCollator(tokenizer.pad_token_id)
    callback = ReportingCallback(reporter, stop, plan.device)
    context = sum(len(r) for r in train_set["input_ids"]) / max(len(train_set), 1)  # mean example length
    callback.compiling = config.technique.torch_compile
    callback.peak_flops = peak
    if eval_set is not None and world_size() == 1:  # sharded ranks cannot generate on one process alone
        callback.sampler = SampleGenerator.for_run(config, tokenizer, eval_set, reporter)
    args = _training_arguments(config, folder.checkpoints_dir, plan, has_eval=eval_set is not None, schedule=schedule)
    trainer = sft.make_trainer(model, args, train_set, eval_set, collator, [callback, PhaseCallback()])
    callback.trainer = trainer
    installed = install_for_job(plan.shortcuts, model, trainer)
    rows_only = trainer.rows.patched if trainer.rows is not None else []
    callback.token_flops = token_flops(model, context, rows_only)
    if plan.shortcuts.has("thread_choice"):
        sample = collator([train_set[i] for i in range(min(len(train_set), config.train.micro_batch_size))])
        measured = choose_thread_count(plan.shortcuts, trainer, sample, callback.token_flops.per_token, peak,
                                       reporter.emit, lambda: peak_flops(plan.device, peak_dtype))
        if measured is not None:
            callback.peak_flops = measured
            installed.append("thread_choice")
    missing = [n for n in plan.shortcuts.applied if n not in installed and n != "thread_choice"]
    if missing:  # the registry's families say they fit; a model that does not is a registry bug
        log.warning("planned shortcuts not installed: %s", ", ".join(missing))
    log.info("shortcuts in place: %s", ", ".join(s.name for s in SHORTCUTS if s.name in installed) or "none")
    trainer.remove_callback(PrinterCallback)  # its log dicts would only repeat our events in worker.log
    return model, trainer, callback, stats.eval_examples


def _objective_trainer(config: RunConfig, folder: RunFolder, plan: TechniquePlan, model_path: Path, tokenizer,
                       reporter: Reporter, stop: StopListener, ledger: MemoryLedger, peak: float,
                       capabilities: Capabilities):
    """DPO, KTO or GRPO through its door (backend.training.objectives). -> (model, trainer, callback, validation rows)."""
    from backend.training.model.start_adapter import load_start_adapter

    objective = objective_method(config.technique.objective).door()
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    train_set, eval_set, stats = objective.build_datasets(config, tokenizer)
    for note in stats.notes:
        reporter.emit(PhaseChanged(phase="data_warning", detail=note))
    reporter.emit(PhaseChanged(phase="tokenize", detail=f"{stats.train_examples} train / {stats.eval_examples} "
                                                        f"validation {stats.format}"))
    schedule = run_schedule(config, stats.train_examples, reporter)
    torch.manual_seed(config.train.seed)
    ledger.start(plan.device, capabilities)  # the estimate counts the objective's passes (backend/estimate/objectives.py)
    base, lora = adapter_config(load_model(model_path, config, plan), config, plan)
    start = start_adapter_folder(config)
    if start is not None:  # model.adapter: the earlier run's adapter trains on; TRL wraps nothing more
        base, lora = load_start_adapter(base, start), None
    callback = ReportingCallback(reporter, stop, plan.device)
    callback.peak_flops = peak
    if eval_set is not None and world_size() == 1:  # as for SFT: a few answers at each evaluation
        callback.sampler = SampleGenerator.for_prompt_rows(tokenizer, eval_set, reporter)
    arguments = training_kwargs(config, folder.checkpoints_dir, plan, has_eval=eval_set is not None, schedule=schedule)
    trainer = objective.make_trainer(config, base, lora, tokenizer, train_set, eval_set, arguments,
                                     [callback, PhaseCallback()], reporter)
    callback.trainer = trainer
    trainer.remove_callback(PrinterCallback)
    return trainer.model, trainer, callback, stats.eval_examples


def _vision_trainer(config: RunConfig, folder: RunFolder, plan: TechniquePlan, model_path: Path, reporter: Reporter,
                   stop: StopListener, ledger: MemoryLedger, peak: float, capabilities: Capabilities):
    """A proven VLM's SFT through the vision door (backend/training/vision/door.py), step for step as
    _sft_trainer; of the speed shortcuts only the image rows' own (packed_image_rows) run, and the validation
    samples (they would generate without the rows' images) stay off. -> (model, trainer, callback, validation rows)."""
    run = VisionRun.open(model_path, config)
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    train_set, eval_set, stats, rows = run.build_datasets(config)
    for note in stats.notes + padded_note(config, plan):
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
    packed = plan.shortcuts.has("packed_image_rows")  # the registry's word: this family's image rows pack exactly
    collator = run.collator(rows, model if packed else None)
    log.info("image rows %s; attention %s", "packed (packed_image_rows)" if packed else "in padded batches",
             getattr(model.config, "_attn_implementation", None))
    callback = ReportingCallback(reporter, stop, plan.device)
    callback.peak_flops = peak
    kwargs = training_kwargs(config, folder.checkpoints_dir, plan, has_eval=eval_set is not None, schedule=schedule)
    if not packed:  # padded batches waste less on padding when their rows are of similar length
        kwargs["train_sampling_strategy"] = "group_by_length"
    trainer = make_trainer(model, TrainingArguments(**kwargs), train_set, eval_set, collator,
                           [callback, PhaseCallback()], run.image_token_id)
    callback.trainer = trainer
    context = sum(len(r) for r in train_set["input_ids"]) / max(len(train_set), 1)
    callback.token_flops = token_flops(model, context, [])
    trainer.remove_callback(PrinterCallback)
    trainer.vision_run = run  # saved beside the adapter in place of a bare tokenizer
    return model, trainer, callback, stats.eval_examples


def padded_note(config: RunConfig, plan: TechniquePlan) -> tuple[str, ...]:
    """The one line that says why image rows train padded although technique.packing is on."""
    if not config.technique.packing or plan.shortcuts.has("packed_image_rows"):
        return ()
    why = dict(plan.shortcuts.skipped).get("packed_image_rows") or "technique.shortcuts off"
    return (f"packing is off for image rows ({why}): they train in padded batches",)


def save_atomically(model, tokenizer, target: Path) -> Path:
    """Write into a temporary folder and rename: an adapter (or model) folder is whole or absent."""
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        old = target.with_name(target.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
    return target
