"""ReportingCallback: the Trainer's events turned into protocol events, and the stop request obeyed.

The Trainer owns the loop; this callback only watches it. Stops land on a step boundary (on_step_end),
so a stop-and-save checkpoint is the same as any scheduled one. A checkpoint counts only once its
marker is written after an fsync of the rest (on_save runs after the Trainer has written it all).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import TrainerCallback

from backend.core.protocol import CheckpointSaved, EvalFinished, MemorySample, MetricsLogged, PhaseChanged
from backend.core.runs.run_folder import mark_checkpoint_complete
from backend.training.mfu import TokenFlops
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)


def memory_sample(device: str) -> MemorySample:
    rss = psutil.Process().memory_info().rss
    if device.startswith("cuda"):
        return MemorySample(
            allocated_bytes=torch.cuda.memory_allocated(),
            reserved_bytes=torch.cuda.memory_reserved(),
            peak_bytes=torch.cuda.max_memory_allocated(),
            rss_bytes=rss,
        )
    return MemorySample(rss_bytes=rss)


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


EXTRA_PREFIXES = ("reward", "kl", "completions/", "clip_ratio", "entropy", "frac_reward", "logps/")
"""Logged metrics passed on in MetricsLogged.extra: DPO's implicit rewards (rewards/chosen, rejected,
margins, accuracies); KTO's rewards/chosen, rejected, margins, logps/chosen, rejected, kl (its estimate
from mismatched answers) and entropy; GRPO's reward and reward_std, rewards/<function>/mean and /std,
kl, completions/mean_length, clip_ratio/*, entropy. The SFT Trainer logs none of them."""


def objective_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """The finite objective-specific metrics of one log dict (training ones: eval_ keys are left out)."""
    found = {key: _finite(value) for key, value in logs.items() if key.startswith(EXTRA_PREFIXES)}
    return {key: value for key, value in found.items() if value is not None}


def collective_device(backend: str) -> torch.device:
    """Where a collective's tensors must live: NCCL reduces CUDA tensors only (each rank's own GPU),
    gloo reduces CPU tensors."""
    if str(backend).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ReportingCallback(TrainerCallback):
    """Reports each logged step; throughput is wall time between step ends, saves and evals excluded."""

    def __init__(self, reporter: Reporter, stop: StopListener, device: str):
        self.reporter = reporter
        self.stop = stop
        self.device = device
        self.trainer: Any = None  # set after the Trainer exists: its token counter is read here
        self.stopped = False
        self.losses: list[float] = []
        self.last_checkpoint: str | None = None
        self._started = 0.0
        self._last_end = 0.0
        self._train_seconds = 0.0
        self._tokens_at_start = 0
        self._window: list[tuple[float, int]] = []
        self._all_tokens = 0
        self._counts = (0, 0, 0)  # computed tokens, logit positions, last-layer rows: of the whole job
        self._counts_at_start = (0, 0, 0)
        self.token_flops: TokenFlops | None = None  # set by the job (mfu.token_flops)
        self.peak_flops = 0.0
        self.compile_seconds: float | None = None
        self.compiling = False  # set when torch.compile is on: the first step is compilation
        self.sampler: Any = None  # called with the model after each evaluation: sample answers

    def mfu(self) -> float | None:
        """FLOPs that ran (every token computed on, prompts too, padding not; the output projection
        and the last layer's rows-only modules only where they ran) over the measured peak."""
        if not self._train_seconds or self.token_flops is None or not self.peak_flops:
            return None
        tokens, heads, rows = (now - then for now, then in zip(self._counts, self._counts_at_start))
        return self.token_flops.of(tokens, heads, rows) / self._train_seconds / self.peak_flops

    def _tokens(self) -> int:
        return self._all_tokens

    def _sync(self) -> None:
        """Across ranks: any rank's stop request stops all (stdin lines reach one rank), and tokens
        are summed so that rank 0 reports the throughput of the whole job."""
        trainer = self.trainer
        counts = [getattr(trainer, name, 0) for name in ("trained_tokens", "input_tokens", "head_tokens", "row_tokens")]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # 0: go on, 1: stop and save, 2: cancel. MAX makes a cancel win over a save everywhere.
            wish = 0 if not self.stop.requested else (1 if self.stop.save else 2)
            device = collective_device(torch.distributed.get_backend())
            stop = torch.tensor([wish], dtype=torch.int64, device=device)
            total = torch.tensor(counts, dtype=torch.int64, device=device)
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
            if int(stop.item()) != wish:
                self.stop.request(save=int(stop.item()) == 1)
            counts = [int(n) for n in total.tolist()]
        self._all_tokens = counts[0]
        self._counts = (counts[1], counts[2], counts[3])

    def _images_seen(self) -> dict[str, int]:
        """Image rows and tokens trained on, where the trainer counts them (the vision door sets it up)."""
        trainer = self.trainer
        if getattr(trainer, "image_token_id", None) is None:
            return {}
        return {"image_rows_seen": trainer.image_rows, "image_tokens_seen": trainer.image_tokens}

    # --- throughput -------------------------------------------------------------------------
    def tokens_per_s(self) -> float | None:
        """Average useful tokens/s over the run (time saving checkpoints or evaluating excluded)."""
        tokens = self._tokens() - self._tokens_at_start
        return tokens / self._train_seconds if self._train_seconds > 0 else None

    def _recent_tokens_per_s(self) -> float | None:
        if len(self._window) < 2:
            return self.tokens_per_s()
        (t0, n0), (t1, n1) = self._window[0], self._window[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    # --- Trainer hooks ----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.reporter.emit(PhaseChanged(phase="train", detail=f"{state.max_steps} steps"))
        self._started = self._last_end = time.monotonic()
        self._tokens_at_start = self._tokens()
        self._window = [(0.0, self._tokens_at_start)]

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        now = time.monotonic()
        if self.compiling and self.compile_seconds is None:
            # The first compiled step is mostly compilation: report it apart, keep it out of tokens/s.
            self.compile_seconds = now - self._last_end
            self._tokens_at_start = self._tokens()
            self._counts_at_start = self._counts
            self._window = [(0.0, self._tokens_at_start)]
            self.reporter.emit(PhaseChanged(phase="compile", detail=f"first step with torch.compile took "
                                                                    f"{self.compile_seconds:.1f} s"))
        else:
            self._train_seconds += now - self._last_end
        self._last_end = now
        self._window.append((self._train_seconds, self._tokens()))
        self._window = self._window[-20:]
        if self.stop.requested and not self.stopped:
            self.stopped = True
            control.should_training_stop = True
            control.should_save = self.stop.save
            log.info("stopping at step %d (save=%s)", state.global_step, self.stop.save)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            loss = _finite(logs.get("loss"))
            if loss is not None:
                self.losses.append(loss)
            self.reporter.emit(
                MetricsLogged(
                    step=state.global_step,
                    max_steps=state.max_steps,
                    epoch=_finite(state.epoch),
                    loss=loss,
                    learning_rate=_finite(logs.get("learning_rate")),
                    grad_norm=_finite(logs.get("grad_norm")),
                    tokens_per_s=self._recent_tokens_per_s(),
                    mfu=self.mfu(),
                    tokens_seen=self._tokens(),
                    **self._images_seen(),
                    elapsed_s=time.monotonic() - self._started,
                    memory=memory_sample(self.device),
                    extra=objective_metrics(logs),
                )
            )
        self._last_end = time.monotonic()  # reporting is not training either

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics = metrics or {}
        self.reporter.emit(EvalFinished(step=state.global_step, eval_loss=_finite(metrics.get("eval_loss"))))
        if self.sampler is not None:
            self.sampler(kwargs.get("model"), state.global_step)
        self._last_end = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and path.is_dir():
            mark_checkpoint_complete(path, state.global_step)
            self.last_checkpoint = str(path)
            self.reporter.emit(CheckpointSaved(step=state.global_step, path=str(path)))
        self._last_end = time.monotonic()
