"""RunMetrics: every metric a past run logged, read from its events.jsonl, for comparing runs.

The loss, the learning rate, gradient norm, throughput and evaluation loss every run logs, and the
objective metrics TRL logged (MetricsLogged.extra: rewards/margins, reward, kl,
...), each as (steps, values). A file is read once per version (modification time and size), so
selecting runs again costs nothing; reading is plain JSON, no torch.
"""

from __future__ import annotations

from pathlib import Path

from backend.core.runs.run_folder import RunFolder

LOSS = "loss"
STANDARD = ("eval_loss", "learning_rate", "grad_norm", "tokens_per_s")
"""What every fine-tune logs besides the loss (eval_loss from its EvalFinished events)."""
Series = tuple[list[float], list[float]]


def read_metrics(path: str | Path) -> dict[str, Series]:
    """{metric name: (steps, values)} of a run folder's fine-tune (not its exports' progress): the loss
    first, then the STANDARD ones it logged, then extra metrics as they came."""
    found: dict[str, Series] = {LOSS: ([], [])}
    for name in STANDARD:
        found[name] = ([], [])
    job = "finetune"
    for event in RunFolder(path).iter_events():
        kind = event.get("type")
        if kind == "JobStarted":
            job = event.get("job", "finetune")
        if job != "finetune" or kind not in ("MetricsLogged", "EvalFinished"):
            continue
        step = float(event.get("step", 0) or 0)
        if kind == "EvalFinished":
            values = {"eval_loss": event.get("eval_loss")}
        else:
            values = {LOSS: event.get(LOSS), **{name: event.get(name) for name in STANDARD[1:]},
                      **(event.get("extra") or {})}
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                steps, ys = found.setdefault(name, ([], []))
                steps.append(step)
                ys.append(float(value))
    return found


class RunMetrics:
    """A cache of read_metrics per run folder, refreshed when its events.jsonl changes."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int], dict[str, Series]]] = {}

    def of(self, path: str) -> dict[str, Series]:
        events = RunFolder(path).events_path
        try:
            stat = events.stat()
            version = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            return {LOSS: ([], [])}
        cached = self._cache.get(path)
        if cached is None or cached[0] != version:
            cached = (version, read_metrics(path))
            self._cache[path] = cached
        return cached[1]

    def series(self, path: str, name: str) -> Series:
        return self.of(path).get(name, ([], []))

    def names(self, paths: list[str]) -> list[str]:
        """The metrics any of these runs logged: the loss first, then the others in first-seen order."""
        names: dict[str, None] = {LOSS: None}
        for path in paths:
            names.update(dict.fromkeys(name for name, (steps, _) in self.of(path).items() if steps))
        return list(names)
