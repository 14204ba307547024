"""WorkerProcess: the CLI's way to run one job in a worker subprocess and follow its events.

The worker gets its own session so that Ctrl-C in the terminal reaches only the CLI, which turns it
into a StopJob(save=True) (first press), a cancel (second) and a kill (third; the second for a job
with nothing to save, whose stop already cancels): the levels a person expects, and a checkpoint is
never cut in half by a stray signal. SIGTERM and SIGHUP (a closed terminal) stop too, and what a stop
does depends on the job (STOPS, said when it happens); if the CLI is killed outright, the worker
notices and does the same itself (backend/worker/parent_watch.py). The session and the kills are
backend/runtime/child_process.py's.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.api.launch import job_argv, start_line
from backend.runtime.child_process import ChildProcess
from backend.runtime.processes import worker_env
from backend.core.protocol import StopJob, encode
from backend.api.protocol_session import ProtocolSession
from backend.core.runs.run_folder import RunFolder


STOPS = {
    "finetune": "stopping at the next step and saving a checkpoint",
    "export": "stopping the export; its partial folder is removed and no export is written",
    "prune": "stopping the prune; its partial folder is removed and no pruned model is written",
    "evaluate": "stopping the evaluation; no report is written",
    "chat": "stopping the chat at the next token",
}
"""What the first Ctrl-C or SIGTERM does, per job: only a fine-tune has a checkpoint to save; the others
end and remove what they had half written (each job's stop handling: backend/jobs/)."""


def stop_notice(job: str) -> str:
    """The line printed on the first Ctrl-C or SIGTERM, true to what `job` does when stopped."""
    return STOPS.get(job, f"stopping the {job}; its partial output is removed")


class WorkerProcess:
    def __init__(self, command: list[str] | None = None, job: str = "finetune", params: dict | None = None,
                 machine_rank: int = 0):
        self.command = command
        self.machine_rank = machine_rank
        self.job = job
        self.params = params or {}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=30)
        self._proc: ChildProcess | None = None
        self._drain: threading.Thread | None = None
        self._interrupts = 0
        self._gave_up = ""

    def _drain_stderr(self) -> None:
        assert self._proc and self._proc.process.stderr
        for line in self._proc.process.stderr:
            self.stderr_tail.append(line.rstrip())

    def stop(self, save: bool = True) -> None:
        if self._proc and self._proc.running() and self._proc.process.stdin:
            try:
                self._proc.process.stdin.write(encode(StopJob(save=save)))
                self._proc.process.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def kill(self) -> None:
        """SIGKILL the worker (no checkpoint, no last word): what a crash looks like from outside."""
        if self._proc and self._proc.running():
            self._proc.kill()

    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        """A closed terminal (SIGHUP) or `kill` (SIGTERM): stop and save, wait for the checkpoint, then exit."""
        if self._interrupts == 0:
            self._interrupts = 1
            print(f"\nterminated: {stop_notice(self.job)}", flush=True)
            self.stop(save=True)
        else:
            self._on_sigint(_signum, _frame)

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        """Ctrl-C: stop (a fine-tune saves), then cancel, then kill. A job other than a fine-tune already
        cancels on the first stop, so its second Ctrl-C kills."""
        self._interrupts += 1
        if self._interrupts == 1:
            again = "cancel" if self.job == "finetune" else "kill"
            print(f"\n{stop_notice(self.job)} (Ctrl-C again to {again})", flush=True)
            self.stop(save=True)
        elif self._interrupts == 2 and self.job == "finetune":
            print("\ncancelling without saving (Ctrl-C again to kill)", flush=True)
            self.stop(save=False)
        elif self._proc:
            self._interrupts = 3  # a kill the person asked for: the run ends as cancelled (_crashed)
            self._proc.kill()

    def run(
        self,
        folder: RunFolder,
        config: RunConfig,
        resume: bool = False,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Run to the end; returns the terminal event as a dict (synthesised if the worker died)."""
        argv = self.command or job_argv(folder, config, resume, self.job, self.params, self.machine_rank)
        session = ProtocolSession(folder, start_line(folder, config, resume, self.job, self.params),
                                  client="this finetune-studio")
        self._proc = ChildProcess(argv, env=worker_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, encoding="utf-8")
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()
        watchdog = self._rendezvous_watchdog(config)
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
            for signum in (signal.SIGTERM, signal.SIGHUP):
                previous[signum] = signal.signal(signum, self._on_sigterm)
        terminal: dict[str, Any] | None = None
        try:
            stdin, stdout = self._proc.process.stdin, self._proc.process.stdout
            assert stdout and stdin
            for line in stdout:
                reply = session.handle(line)
                if reply.problem:
                    self.stderr_tail.append(f"protocol error: {reply.problem}")
                if reply.failure is not None:  # a worker of another release: said now, not after a timeout
                    terminal = json.loads(reply.failure.model_dump_json())
                    self._proc.kill_group()  # the worker and anything it started
                    self._proc.wait()
                    break
                if reply.write:
                    stdin.write(reply.write)
                    stdin.flush()
                event = reply.event
                if event is None or event.type == "WorkerReady":
                    continue
                if event.type == "JobStarted" and watchdog is not None:
                    watchdog.cancel()  # every machine joined: the job runs
                data = json.loads(event.model_dump_json())
                if on_event:
                    on_event(data)
                if reply.terminal:
                    terminal = data
            code = self._proc.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if terminal is None and self._gave_up:
            from backend.api.distributed import RENDEZVOUS_HINT

            failure = session.fail("bad_input", self._gave_up, RENDEZVOUS_HINT)
            terminal = json.loads(failure.model_dump_json())
        if terminal is None:
            terminal = self._crashed(session, code)
        return terminal

    def _rendezvous_watchdog(self, config: RunConfig) -> threading.Timer | None:
        """Multi-node: say whom machine 0 waits for, and give up after hardware.rendezvous_timeout_s."""
        hw = config.hardware
        if hw.num_machines <= 1 or self.machine_rank != 0:
            return None
        from backend.api.distributed import rendezvous_wait

        notice, failure = rendezvous_wait(config)
        print(notice, file=sys.stderr, flush=True)

        def give_up() -> None:
            self._gave_up = failure
            if self._proc is not None and self._proc.running():
                self._proc.kill_group()  # the launcher and anything it started

        timer = threading.Timer(hw.rendezvous_timeout_s, give_up)
        timer.daemon = True
        timer.start()
        return timer

    def _crashed(self, session: ProtocolSession, code: int) -> dict[str, Any]:
        """An exit without a last word: the shared session says how, and leaves the reason in worker.log."""
        if self._drain is not None:
            self._drain.join(timeout=5)  # the pipe closes with the process: its last lines are in the tail
        failure = session.exited(code if code >= 0 else 0, -code if code < 0 else None, list(self.stderr_tail),
                                 cancelled=self._interrupts >= 3)
        assert failure is not None
        data = json.loads(failure.model_dump_json())
        folder = session.folder
        if failure.kind == "crashed" and self.job == "finetune" and folder is not None and folder.latest_checkpoint():
            data["hint"] += f"; resume with --resume {folder.path}"
        return data
