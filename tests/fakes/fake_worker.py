"""A scripted stand-in for `python -m backend.worker`, speaking the real protocol.

GUI tests need a worker that starts in a blink, behaves the same every time and can misbehave on
purpose (garbage on stdout, a crash mid-run, a run that only ends when told to stop). Run as
`python tests/fakes/fake_worker.py --scenario normal|malformed|crash|sigkill|slow|stream|oom|disk_full|export_fail|objectives`.

The job in the StartJob picks the behaviour: finetune (the scenarios above; `oom` ends at step 3 with
an out_of_memory JobFailed carrying a fix, `disk_full` ends at step 6, after a checkpoint), or an
export, evaluate or chat job acting like backend/jobs (see fake_jobs.py; `export_fail` fails a check).
`objectives` is a DPO, KTO or GRPO run after the config's technique.objective (fake_objectives.py).

Like the real worker it writes events.jsonl itself, writes checkpoint folders with their completion
marker, honours StopJob(save=...) (a cancel ends in JobFailed "cancelled") and a resume (continuing
from the newest complete checkpoint), and, once the run folder is known, redirects its stderr into
`<run_dir>/worker.log`. Every MetricsLogged carries a memory sample (allocated / reserved / peak on a
pretend GPU, plus the process RSS) and evaluations come as EvalFinished.

`stream` is the benchmark's load: `--rate` metric events a second for `--steps` steps (`--logging-steps`
steps per event), TelemetrySampled at `--telemetry-hz`, an evaluation every `--eval-every` steps and
a checkpoint every `--save-every` steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backend.core.protocol import (  # noqa: E402 (after the sys.path line, so the script runs anywhere)
    Capabilities,
    ChatMessage,
    CheckpointSaved,
    DeviceInfo,
    EvalFinished,
    JobFailed,
    JobFinished,
    JobStarted,
    MemorySample,
    MetricsLogged,
    PhaseChanged,
    StartJob,
    StopAnswer,
    StopJob,
    TelemetrySampled,
    TokensGenerated,
    WorkerReady,
    decode_command,
    encode,
)

SCENARIOS = ("normal", "malformed", "crash", "sigkill", "slow", "stream", "oom", "disk_full", "export_fail",
             "objectives")
MIB = 1 << 20
MARKER = "checkpoint_complete.json"  # backend.core.runs.run_folder.CHECKPOINT_MARKER, without importing the runs module


def memory(step: int) -> MemorySample:
    """A pretend GPU: allocations breathe with the step, the peak creeps up, RSS is real."""
    allocated = int((620 + 40 * math.sin(step / 15)) * MIB)
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        rss = 80 * MIB
    return MemorySample(allocated_bytes=allocated, reserved_bytes=760 * MIB,
                        peak_bytes=700 * MIB + min(step, 50) * MIB, rss_bytes=rss)


class FakeWorker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scenario = args.scenario
        self.delay = args.delay
        self.run_dir = Path(".")
        self.stop = threading.Event()
        self.save_on_stop = True
        self.cut = threading.Event()
        """A StopAnswer arrived: a chat session cuts its answer and goes on."""
        self.inbox: queue.Queue[ChatMessage | None] = queue.Queue()
        """A chat session's next messages; None once StopJob came or stdin closed."""
        self._events = None
        self.pace = 1.0

    def emit(self, event: object) -> None:
        line = encode(event)  # type: ignore[arg-type]
        sys.stdout.write(line)
        sys.stdout.flush()
        if self._events is not None:
            self._events.write(line)
            self._events.flush()

    def raw(self, data: str) -> None:
        sys.stdout.write(data)
        sys.stdout.flush()

    def listen(self) -> None:
        """Commands after the StartJob: StopJob, and a chat session's StopAnswer and ChatMessage."""
        for line in sys.stdin:
            command = decode_command(line) if line.strip() else None
            if isinstance(command, StopJob):
                self.save_on_stop = command.save
                self.stop.set()
                self.inbox.put(None)
            elif isinstance(command, StopAnswer):
                self.cut.set()
            elif isinstance(command, ChatMessage):
                self.inbox.put(command)
        self.inbox.put(None)

    def save_checkpoint(self, step: int) -> str:
        path = self.run_dir / "checkpoints" / f"checkpoint-{step}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_model.safetensors").write_bytes(b"fake")
        (path / MARKER).write_text(json.dumps({"step": step, "time": time.time()}), encoding="utf-8")
        self.emit(CheckpointSaved(step=step, path=str(path)))
        return str(path)

    def resume_point(self) -> tuple[int, str | None]:
        folder = self.run_dir / "checkpoints"
        steps = sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*") if (p / MARKER).is_file()) \
            if folder.is_dir() else []
        return (steps[-1], str(folder / f"checkpoint-{steps[-1]}")) if steps else (0, None)

    def run(self) -> int:
        print("fake worker: starting (stderr before the run folder is known)", file=sys.stderr, flush=True)
        caps = Capabilities(torch_version="0.0-fake", cuda=True, bf16=True,
                            devices=[DeviceInfo(index=0, name="Simulated GPU 24 GB", total_bytes=24 << 30)]) \
            if self.args.cuda else Capabilities()
        sys.stdout.write(encode(WorkerReady(pid=os.getpid(), capabilities=caps)))
        sys.stdout.flush()
        start = decode_command(sys.stdin.readline())
        self.run_dir = Path(start.run_dir)
        self._events = open(self.run_dir / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (lives to exit)
        log = open(self.run_dir / "worker.log", "a", encoding="utf-8")  # noqa: SIM115 (lives to exit)
        os.dup2(log.fileno(), 2)
        threading.Thread(target=self.listen, daemon=True).start()
        if start.job != "finetune":
            from tests.fakes.fake_jobs import run_job

            return run_job(self, start)
        if self.scenario == "objectives":
            from tests.fakes.fake_objectives import run_objective

            return run_objective(self, start)
        first, resumed = self.resume_point() if start.resume else (0, None)
        code = self.finetune(start, first, resumed)
        time.sleep(self.args.linger)  # a real worker takes a while to exit after its last event
        return code

    def finetune(self, start: StartJob, first: int, resumed: str | None) -> int:
        if self.scenario == "stream":
            train = start.config.get("train", {})
            rank = start.config.get("technique", {}).get("lora_rank", 8)
            self.pace = float(train.get("learning_rate", 2e-3)) / 2e-3 * (rank / 8) ** 0.5
            return self.stream(first, resumed)
        max_steps = 1000 if self.scenario == "slow" else 10
        if (self.run_dir / "origin.json").is_file():  # a finished run trained for more steps: its own length
            max_steps = int(start.config["train"]["max_steps"])
        self.emit(JobStarted(run_dir=str(self.run_dir), max_steps=max_steps, resumed_from=resumed))
        self.emit(PhaseChanged(phase="plan", detail="fake: lora r=8 on all-linear, fp32, sdpa"))
        self.emit(PhaseChanged(phase="train", detail="fake"))
        step, loss = first, 3.0 * 0.85 ** first
        while True:
            step += 1
            loss *= 0.85
            self.emit(MetricsLogged(step=step, max_steps=max_steps, loss=loss, learning_rate=1e-3 * (1 - step / max_steps),
                                    grad_norm=1.0 + 0.1 * (step % 3), tokens_per_s=1234.5 + step, mfu=0.4,
                                    memory=memory(step)))
            print(f"fake worker: step {step}", file=sys.stderr, flush=True)
            if self.scenario == "malformed" and step == 4:
                self.raw("this is not json\n")
                half = encode(MetricsLogged(step=step, max_steps=max_steps, loss=loss, tokens_per_s=1000.0))
                self.raw(half[:17])
                time.sleep(0.05)
                self.raw(half[17:])
                self.raw('{"type": "NoSuchEvent", "v": 2}\n')
            if self.scenario in ("crash", "sigkill") and step == 3:
                try:
                    raise RuntimeError("simulated CUDA error")
                except RuntimeError:
                    traceback.print_exc()
                print("fake worker: crashing on purpose", file=sys.stderr, flush=True)
                if self.scenario == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(9)
            if self.scenario == "oom" and step == 3:
                self.emit(JobFailed(kind="out_of_memory", message="CUDA out of memory in the backward pass at step 3",
                                    hint="halve the micro batch, double gradient accumulation", phase="backward",
                                    peak_bytes=23 << 30, predicted_bytes=20 << 30,
                                    fix={"train.micro_batch_size": 1, "train.gradient_accumulation_steps": 8}))
                return 0
            if step % 5 == 0 and self.scenario != "slow":
                self.emit(EvalFinished(step=step, eval_loss=loss * 1.1))
                self.save_checkpoint(step)
                self.emit(PhaseChanged(phase="sample", detail=f"What is {step} + {step}?"))
                self.emit(TokensGenerated(text=f"{2 * step}", done=True))
            if self.scenario == "disk_full" and step == 6:
                self.emit(JobFailed(kind="disk_full", message="the disk holding the run folder is full",
                                    hint="free some space, then resume", phase="save"))
                return 0
            if self.stop.is_set():
                return self.finish_stopped(step, loss)
            if self.scenario != "slow" and step >= max_steps:
                self.emit(JobFinished(run_dir=str(self.run_dir), steps=step, final_loss=loss, first_loss=3.0,
                                      tokens_per_s=1234.5, mfu=0.412, adapter_path=str(self.run_dir / "adapter")))
                return 0
            time.sleep(self.delay)

    def finish_stopped(self, step: int, loss: float) -> int:
        print(f"fake worker: stopping at step {step} (save={self.save_on_stop})", file=sys.stderr, flush=True)
        if not self.save_on_stop:
            kept = self.resume_point()[1]
            saved = f"nothing saved since {Path(kept).name}, which is kept" if kept else "nothing saved"
            self.emit(JobFailed(kind="cancelled", message=f"cancelled at step {step}; {saved}"))
            return 0
        path = self.save_checkpoint(step)
        self.emit(JobFinished(run_dir=str(self.run_dir), stopped=True, steps=step, final_loss=loss,
                              tokens_per_s=1234.5, checkpoint_path=path))
        return 0

    def stream(self, first: int, resumed: str | None) -> int:
        """The benchmark's load: a long run compressed in time, at a steady event rate."""
        a = self.args
        self.emit(JobStarted(run_dir=str(self.run_dir), max_steps=a.steps, resumed_from=resumed))
        self.emit(PhaseChanged(phase="train", detail="fake stream"))
        period, t_period = 1.0 / a.rate, 1.0 / a.telemetry_hz
        began = time.monotonic()
        next_event, next_telemetry = began, began + t_period
        step, loss = first, 3.0
        while step < a.steps:
            now = time.monotonic()
            wake = min(next_event, next_telemetry)
            if now < wake:
                time.sleep(wake - now)
                continue
            if now >= next_telemetry:
                self.emit(TelemetrySampled(time=time.time(), memory=memory(step), cpu_percent=95.0))
                next_telemetry += t_period
            if now < next_event:
                continue
            next_event += period
            step = min(step + a.logging_steps, a.steps)
            loss = 0.5 + 2.5 / (1 + self.pace * step / 400) + 0.03 * math.sin(step / 7)
            self.emit(MetricsLogged(step=step, max_steps=a.steps, loss=loss, learning_rate=2e-4 * (1 - step / a.steps),
                                    grad_norm=0.6 + 0.6 * math.exp(-step / 300) + 0.05 * math.sin(step / 5),
                                    tokens_per_s=5000.0 + 150 * math.sin(step / 60) + 40 * math.sin(step / 3),
                                    mfu=0.38, tokens_seen=step * 4096, elapsed_s=now - began, memory=memory(step)))
            if a.eval_every and step % a.eval_every < a.logging_steps:
                self.emit(EvalFinished(step=step, eval_loss=loss * 1.05))
            if a.save_every and step % a.save_every < a.logging_steps:
                self.emit(CheckpointSaved(step=step, path=str(self.run_dir / "checkpoints" / f"checkpoint-{step}")))
            if self.stop.is_set():
                return self.finish_stopped(step, loss)
        self.emit(JobFinished(run_dir=str(self.run_dir), steps=step, final_loss=loss, first_loss=3.0,
                              tokens_per_s=5000.0, mfu=0.38, seconds=time.monotonic() - began))
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=SCENARIOS, default="normal")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between steps")
    parser.add_argument("--rate", type=float, default=100.0, help="stream: metric events per second")
    parser.add_argument("--steps", type=int, default=36_000, help="stream: steps of the run")
    parser.add_argument("--logging-steps", type=int, default=2, help="stream: steps per metric event")
    parser.add_argument("--telemetry-hz", type=float, default=2.0, help="stream: TelemetrySampled per second")
    parser.add_argument("--eval-every", type=int, default=500, help="stream: steps between evaluations")
    parser.add_argument("--save-every", type=int, default=1000, help="stream: steps between checkpoints")
    parser.add_argument("--cuda", action="store_true", help="report a simulated CUDA device in WorkerReady")
    parser.add_argument("--linger", type=float, default=0.0, help="finetune: seconds alive after the last event")
    return FakeWorker(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
