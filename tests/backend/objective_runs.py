"""Run a preset's fine-tune job in-process on the CPU and read back its events (the objective tests' runner)."""

from __future__ import annotations

import io
from pathlib import Path

from backend.core.config.run_config import RunConfig
from backend.core.protocol import Capabilities, decode_event
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

CPU = Capabilities(cuda=False)


def run_preset(tmp_path: Path, preset: Path, overrides: list[str], name: str = "run", resume: bool = False) -> list:
    """The events of `preset` with `overrides`, run in tmp_path/name (its config.yaml saved, as the CLI does)."""
    from backend.jobs.finetune import run_finetune

    config = RunConfig.load(preset, overrides)
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.yaml")
    reporter = Reporter(io.StringIO())
    reporter.attach_run(run_dir)
    run_finetune(config, run_dir, reporter, StopListener(io.StringIO()), resume=resume, capabilities=CPU)
    reporter.close()
    return [decode_event(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def evaluate_run(run_dir: Path, params: dict | None = None) -> dict:
    """Run the evaluate job in-process on a finished run; its eval_report.json."""
    import json

    from backend.jobs.evaluate import run_evaluate

    config = RunConfig.load(run_dir / "config.yaml")
    run_evaluate(config, run_dir, Reporter(io.StringIO()), StopListener(io.StringIO()), capabilities=CPU,
                 params=params or {})
    return json.loads((run_dir / "eval_report.json").read_text())
