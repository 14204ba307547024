"""A scripted stand-in for `python -m backend.worker`, speaking the real protocol.

GUI tests need a worker that starts in a blink, behaves the same every time and can misbehave on
purpose (garbage on stdout, a crash mid-run, a run that only ends when told to stop). Run as
`python tests/fakes/fake_worker.py --scenario normal|malformed|crash|sigkill|slow`.

Like the real worker it writes events.jsonl itself and, once the run folder is known, redirects
its stderr into `<run_dir>/worker.log`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backend.protocol import (  # noqa: E402 (after the sys.path line, so the script runs anywhere)
    CheckpointSaved,
    JobFinished,
    JobStarted,
    MetricsLogged,
    PhaseChanged,
    StopJob,
    WorkerReady,
    decode_command,
    encode,
)

SCENARIOS = ("normal", "malformed", "crash", "sigkill", "slow")


class FakeWorker:
    def __init__(self, scenario: str, delay: float) -> None:
        self.scenario = scenario
        self.delay = delay
        self.run_dir = Path(".")
        self.stop = threading.Event()
        self.save_on_stop = True

    def emit(self, event: object) -> None:
        line = encode(event)  # type: ignore[arg-type]
        sys.stdout.write(line)
        sys.stdout.flush()
        with (self.run_dir / "events.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(line)

    def raw(self, data: str) -> None:
        sys.stdout.write(data)
        sys.stdout.flush()

    def listen_for_stop(self) -> None:
        for line in sys.stdin:
            if line.strip() and isinstance(decode_command(line), StopJob):
                self.save_on_stop = decode_command(line).save
                self.stop.set()
                return

    def run(self) -> int:
        print("fake worker: starting (stderr before the run folder is known)", file=sys.stderr, flush=True)
        sys.stdout.write(encode(WorkerReady(pid=os.getpid())))
        sys.stdout.flush()
        start = decode_command(sys.stdin.readline())
        self.run_dir = Path(start.run_dir)
        log = open(self.run_dir / "worker.log", "a", encoding="utf-8")  # noqa: SIM115 (lives to exit)
        os.dup2(log.fileno(), 2)
        threading.Thread(target=self.listen_for_stop, daemon=True).start()
        max_steps = 1000 if self.scenario == "slow" else 10
        self.emit(JobStarted(run_dir=str(self.run_dir), max_steps=max_steps))
        self.emit(PhaseChanged(phase="train", detail="fake"))
        step, loss = 0, 3.0
        while True:
            step += 1
            loss *= 0.85
            self.emit(MetricsLogged(step=step, max_steps=max_steps, loss=loss, learning_rate=1e-3,
                                    grad_norm=1.0, tokens_per_s=1234.5 + step))
            print(f"fake worker: step {step}", file=sys.stderr, flush=True)
            if self.scenario == "malformed" and step == 4:
                self.raw("this is not json\n")
                half = encode(MetricsLogged(step=step, max_steps=max_steps, loss=loss, tokens_per_s=1000.0))
                self.raw(half[:17])
                time.sleep(0.05)
                self.raw(half[17:])
                self.raw('{"type": "NoSuchEvent", "v": 1}\n')
            if self.scenario in ("crash", "sigkill") and step == 3:
                try:
                    raise RuntimeError("simulated CUDA error")
                except RuntimeError:
                    traceback.print_exc()
                print("fake worker: crashing on purpose", file=sys.stderr, flush=True)
                if self.scenario == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(9)
            if step == 5 and self.scenario != "slow":
                self.emit(CheckpointSaved(step=step, path=str(self.run_dir / "checkpoints" / "checkpoint-5")))
            if self.stop.is_set():
                self.emit(JobFinished(run_dir=str(self.run_dir), stopped=True, steps=step, final_loss=loss,
                                      tokens_per_s=1234.5))
                return 0
            if self.scenario != "slow" and step >= max_steps:
                self.emit(JobFinished(run_dir=str(self.run_dir), steps=step, final_loss=loss, first_loss=3.0,
                                      tokens_per_s=1234.5, adapter_path=str(self.run_dir / "adapter")))
                return 0
            time.sleep(self.delay)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=SCENARIOS, default="normal")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between steps")
    args = parser.parse_args()
    return FakeWorker(args.scenario, args.delay).run()


if __name__ == "__main__":
    sys.exit(main())
