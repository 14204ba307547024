"""A DPO or KTO run's evaluation: how base and tuned rank the held-out answers (evaluation/preference_accuracy.py).

Called by run_evaluate for `technique.objective: dpo | kto`, whose data are judged answers, not
answers to measure perplexity on. The rows are the run's validation split, cut exactly as training
cut it; the "base" is what training started from (model.path, with model.adapter when the run
continued an adapter). The report goes to eval_report.json as for SFT and GRPO.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.evaluation.preference_accuracy import answer_logps, label_accuracy, pair_accuracy
from backend.core.protocol import JobFinished, PhaseChanged
from backend.training.objectives.registry import door


def summary(report: dict[str, Any]) -> str:
    p = report["preference"]
    what = "pairs ranked right" if p["kind"] == "pairs" else "answers moved as labelled"
    if p["kind"] == "pairs":
        return f"{what}: base {p['base']['accuracy']:.1%} -> tuned {p['tuned']['accuracy']:.1%} ({p['n']} pairs)"
    return f"{what}: {p['tuned']['accuracy']:.1%} of {p['n']} validation answers"


def run_preference_evaluation(config: RunConfig, run_dir: Path, reporter: Any, models: Any, limit: int | None,
                              progress: Callable[[str, str], Callable[[int, int], None]], began: float,
                              write_report: Callable[[Path, dict], Path]) -> None:
    objective = config.technique.objective
    tokenizer = models.tokenizer()
    _, eval_set, _ = door(objective).build_datasets(config, tokenizer)
    if eval_set is None:
        raise bad_input("the run has no validation split (data.validation_split is 0), and the preference accuracy is "
                        "measured on held-out rows", "train with data.validation_split above 0")
    rows = eval_set.to_list()[:limit] if limit else eval_set.to_list()
    pairs = objective == "dpo"
    items = ([(r["prompt"], r["chosen"]) for r in rows] + [(r["prompt"], r["rejected"]) for r in rows] if pairs
             else [(r["prompt"], r["completion"]) for r in rows])
    reporter.emit(PhaseChanged(phase="tokenize", detail=f"{len(rows)} validation {'pairs' if pairs else 'answers'}"))
    logps: dict[str, list[float]] = {}
    for which, model in models.each(reporter):
        logps[which] = answer_logps(model, tokenizer, items, config.train.seq_len, progress("preference", which))
    n = len(rows)
    if pairs:
        section = {"kind": "pairs", "n": n, **{w: pair_accuracy(logps[w][:n], logps[w][n:]) for w in logps}}
    else:
        moved = label_accuracy(logps["base"], logps["tuned"], [bool(r["label"]) for r in rows])
        section = {"kind": "labelled", "n": n, "base": {"accuracy": None}, "tuned": moved}
    report: dict[str, Any] = {
        **models.report_head(run_dir),
        "perplexity": None,
        "exact_match": None,
        "preference": section,
        "skipped": [], "data_notes": [], "examples": [],
    }
    report["seconds"] = round(time.monotonic() - began, 2)
    write_report(run_dir, report)
    reporter.emit(PhaseChanged(phase="report", detail=summary(report)))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))
