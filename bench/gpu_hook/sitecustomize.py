"""Hooks for the worker processes of bench/gpu_check.sh, put on PYTHONPATH only for the runs that need them.

The worker is a subprocess the CLI starts, so the check cannot call into it; Python imports
sitecustomize at start-up in every process, and this one acts only when its variables are set:

- GPU_CHECK_MEMORY_CAP_BYTES=N: once torch is imported, torch.cuda.set_per_process_memory_fraction
  caps this process's allocator at N bytes minus what the CUDA context already holds (a card of N
  bytes holds both; GPU_CHECK_CONTEXT_BYTES gives that context when other processes share the
  card), so that a run "fits a 24 GB card" is tried on a larger one.
- GPU_CHECK_PROFILE=START:COUNT:FILE: every transformers Trainer profiles the optimizer steps after
  START for COUNT steps with torch.profiler and writes the top kernels by device time to FILE.
- GPU_CHECK_HOOK_LOG=FILE: one JSON line per thing done (or not done, and why), for the check's report.

The next sitecustomize on sys.path (a distribution's own) still runs.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def log(**fields) -> None:
    path = os.environ.get("GPU_CHECK_HOOK_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"pid": os.getpid(), **fields}) + "\n")


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` once the named module has been executed (a post-import hook)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                run, then = spec.loader.exec_module, self.then

                def exec_module(module, run=run, then=then):
                    run(module)
                    then(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def cap_memory(torch) -> None:
    cap = int(os.environ["GPU_CHECK_MEMORY_CAP_BYTES"])
    if not torch.cuda.is_available():
        log(hook="memory_cap", applied=False, cap_bytes=cap, why="no CUDA device")
        return
    free, total = torch.cuda.mem_get_info()  # initialises CUDA: the context is counted in `total - free`
    # Measured here when this process is alone on the card; the check measures it once up front
    # (GPU_CHECK_CONTEXT_BYTES) because its capped runs share the card with other work.
    context = int(os.environ.get("GPU_CHECK_CONTEXT_BYTES") or (total - free - torch.cuda.memory_reserved()))
    fraction = max(0.0, min(1.0, (cap - context) / total))
    torch.cuda.set_per_process_memory_fraction(fraction)
    log(hook="memory_cap", applied=True, cap_bytes=cap, context_bytes=context, total_bytes=total, fraction=fraction)


def profile_trainers(trainer_module) -> None:
    start, count, path = os.environ["GPU_CHECK_PROFILE"].split(":", 2)
    from transformers import TrainerCallback

    class Profile(TrainerCallback):
        """Profiles optimizer steps START+1..START+COUNT; the table goes to FILE."""

        def __init__(self) -> None:
            self.profiler = None

        def on_step_begin(self, args, state, control, **kwargs):
            import torch

            if state.global_step == int(start) and self.profiler is None:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            import torch

            if self.profiler is not None and state.global_step == int(start) + int(count):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.profiler.__exit__(None, None, None)
                key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
                table = self.profiler.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=70)
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(f"steps {int(start) + 1}-{int(start) + int(count)}, sorted by {key}\n{table}\n")
                log(hook="profile", written=path, steps=[int(start) + 1, int(start) + int(count)])
                self.profiler = None

    original = trainer_module.Trainer.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(Profile())

    trainer_module.Trainer.__init__ = __init__
    log(hook="profile", installed=True)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != _HERE and os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as handle:
                exec(compile(handle.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
            return


if os.environ.get("GPU_CHECK_MEMORY_CAP_BYTES"):
    sys.meta_path.insert(0, AfterImport("torch", cap_memory))
if os.environ.get("GPU_CHECK_PROFILE"):
    sys.meta_path.insert(0, AfterImport("transformers.trainer", profile_trainers))
log(hook="imported", argv=sys.argv[:3])
_chain()
