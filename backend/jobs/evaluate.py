"""run_evaluate: the base model and the tuned one, side by side, on held-out data.

Reads top to bottom as the job runs: check the request and the run folder (refusals before anything
loads), load the tokenizer and rebuild the validation split exactly as training built it, then for
the base and for the tuned model: perplexity on that split (trained tokens only) and exact match of
greedy answers to the held-out prompts (a vision-language run: its held-out image rows, evaluate_images.py). The figures go to eval_report.json in the run folder and a
one-line summary to the last PhaseChanged; progress is PhaseChanged with a "which k/N unit" detail
(UNITS), once before each measure starts and after each batch. A StopJob ends the job between
batches with JobFailed(cancelled) and no report.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any


from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError, bad_input
from backend.evaluation.exact_match import ExactMatchResult, exact_match, is_match
from backend.evaluation.perplexity import PerplexityResult, perplexity
from backend.evaluation.prompts import HeldOutPrompt, default_prompts_file, read_prompts, training_overlap
from backend.evaluation.run_models import RunModels
from backend.core.protocol import Capabilities, JobFinished, JobStarted, PhaseChanged
from backend.training.model.capabilities import probe_capabilities
from backend.training.tokenized import build_datasets
from backend.training.phase import set_phase
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)
REPORT = "eval_report.json"
KNOWN = {"prompts", "max_new_tokens", "limit", "batch_size"}
EXAMPLES = 5


class EvalRequest:
    """The options of one evaluation, parsed from StartJob.params."""

    def __init__(self, config: RunConfig, params: dict[str, Any]):
        unknown = set(params) - KNOWN
        if unknown:
            raise bad_input(f"unknown evaluate option(s) {sorted(unknown)}; known: {', '.join(sorted(KNOWN))}")
        self.max_new_tokens = _positive(params, "max_new_tokens", 32)
        self.limit = _positive(params, "limit", None)
        self.batch_size = _positive(params, "batch_size", None)
        self.prompts_file: Path | None = None
        self.skipped: str | None = None
        if params.get("prompts"):
            self.prompts_file = Path(str(params["prompts"])).expanduser().absolute()
            if not self.prompts_file.is_file():
                raise bad_input(f"prompts file {self.prompts_file} does not exist",
                                'give a JSONL of {"prompt", "expected"} or alpaca records')
        else:
            self.prompts_file = default_prompts_file(config)
            if self.prompts_file is None:
                self.skipped = ("exact match skipped: no held-out prompts file was given and none lies beside "
                                "the training data (pass --prompts FILE)")


def _positive(params: dict[str, Any], name: str, default: int | None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_input(f"evaluate option {name} must be a whole number of at least 1, got {value!r}")
    return value


UNITS = {"perplexity": "examples", "exact_match": "prompts", "mean_reward": "prompts", "preference": "answers"}
"""What each measure's progress counts: "perplexity base 3/20 examples"."""


def _progress(reporter: Reporter, stop: StopListener, phase: str, which: str) -> Any:
    def on_batch(done: int, total: int) -> None:
        reporter.emit(PhaseChanged(phase=phase, detail=f"{which} {done}/{total} {UNITS.get(phase, 'items')}"))
        if stop.requested:
            raise JobError("cancelled", f"evaluation stopped during {phase} of the {which} model; no report written")
    return on_batch


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "n/a"


def summary_line(report: dict[str, Any]) -> str:
    parts = []
    ppl = report.get("perplexity")
    if ppl:
        parts.append(f"perplexity base {_fmt(ppl['base']['perplexity'], '.2f')} -> tuned "
                     f"{_fmt(ppl['tuned']['perplexity'], '.2f')}")
    em = report.get("exact_match")
    if em:
        parts.append(f"exact match base {em['base']['accuracy']:.1%} -> tuned {em['tuned']['accuracy']:.1%} "
                     f"(N={em['n']})")
    return "; ".join(parts) or "nothing to measure"


def write_report(run_dir: Path, report: dict[str, Any]) -> Path:
    """Write eval_report.json whole or not at all."""
    target = run_dir / REPORT
    tmp = target.with_name(f".{REPORT}.partial-{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def run_evaluate(
    config: RunConfig,
    run_dir: Path,
    reporter: Reporter,
    stop: StopListener,
    *,
    resume: bool = False,
    capabilities: Capabilities | None = None,
    params: dict | None = None,
) -> None:
    began = time.monotonic()
    request = EvalRequest(config, params or {})
    reporter.emit(JobStarted(job="evaluate", run_dir=str(run_dir)))
    models = RunModels(run_dir, config, capabilities or probe_capabilities())
    models.require_tuned()
    data = config.resolved_data_path()
    if not data.exists():  # the validation split is cut from it, exactly as the run cut it
        raise bad_input(f"the run's data {data} no longer exists, and perplexity is measured on the validation "
                        "split the run cut from it",
                        f"put the file back, or point data.path in {Path(run_dir) / 'config.yaml'} at a copy")
    reporter.emit(PhaseChanged(phase="plan", detail=models.plan.summary()))
    batch = request.batch_size or config.train.micro_batch_size
    if config.technique.objective == "grpo":  # prompts, scored by the run's rewards (evaluate_rewards.py)
        from backend.jobs.evaluate_rewards import run_reward_evaluation

        explicit = Path(str(params["prompts"])).expanduser().absolute() if (params or {}).get("prompts") else None
        run_reward_evaluation(config, run_dir, reporter, models, explicit, request.limit,
                              (params or {}).get("max_new_tokens"), batch,
                              lambda phase, which: _progress(reporter, stop, phase, which), began, write_report)
        return
    if config.technique.objective in ("dpo", "kto"):  # judged answers, ranked by log-probability
        from backend.jobs.evaluate_preference import run_preference_evaluation

        run_preference_evaluation(config, run_dir, reporter, models, request.limit,
                                  lambda phase, which: _progress(reporter, stop, phase, which), began, write_report)
        return
    if models.family is not None:  # a vision-language run: its held-out image rows (evaluate_images.py)
        from backend.jobs.evaluate_images import run_image_evaluation

        given = (params or {}).get("prompts")
        unread = [f"prompts file {given} not read: a vision-language run is scored on its held-out image rows"] \
            if given else []
        run_image_evaluation(config, run_dir, reporter, models, request.limit, request.max_new_tokens, batch,
                             lambda phase, which: _progress(reporter, stop, phase, which), began, write_report,
                             summary_line, unread)
        return

    set_phase("load")
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    tokenizer = models.tokenizer()
    _, eval_set, stats = build_datasets(config, tokenizer)
    for note in stats.notes:  # skipped examples (data.skip_invalid), as the fine-tune says them
        reporter.emit(PhaseChanged(phase="data_warning", detail=note))
    prompts: list[HeldOutPrompt] = read_prompts(request.prompts_file, request.limit) if request.prompts_file else []
    overlap = training_overlap(prompts, config, request.prompts_file) if prompts else None
    ppl_skipped = None if eval_set is not None else (
        "perplexity skipped: the run has no validation split (data.validation_split is 0)")
    held = f"prompts from {request.prompts_file.name}: {overlap.sentence()}" if overlap and overlap.count else (
        f"held-out prompts from {request.prompts_file.name}" if prompts else "")
    detail = (f"{stats.eval_examples} validation examples" if eval_set is not None else ppl_skipped) + "; " + (
        f"{len(prompts)} {held}" if prompts else str(request.skipped))
    reporter.emit(PhaseChanged(phase="tokenize", detail=detail))

    ppl: dict[str, PerplexityResult] = {}
    em: dict[str, ExactMatchResult] = {}
    for which, model in models.each(reporter):
        if eval_set is not None:
            ppl[which] = perplexity(model, eval_set, tokenizer.pad_token_id, batch,
                                    _progress(reporter, stop, "perplexity", which))
        if prompts:
            em[which] = exact_match(model, tokenizer, prompts, request.max_new_tokens, max(batch, 16),
                                    _progress(reporter, stop, "exact_match", which))

    report: dict[str, Any] = {
        **models.report_head(run_dir),
        "perplexity": None,
        "exact_match": None,
        "skipped": [s for s in (ppl_skipped, request.skipped) if s],
        "data_notes": list(stats.notes),
        "examples": [],
    }
    if ppl:
        report["perplexity"] = {
            "split": "validation", "examples": stats.eval_examples, "tokens": ppl["base"].tokens,
            "base": ppl["base"].to_json(), "tuned": ppl["tuned"].to_json(),
        }
    if em:
        report["exact_match"] = {
            "prompts_file": str(request.prompts_file), "n": len(prompts), "max_new_tokens": request.max_new_tokens,
            "base": em["base"].to_json(), "tuned": em["tuned"].to_json(),
            # Prompts the training data holds too: their scores are not held out, and the report says so.
            "in_training": overlap.count if overlap else 0, "same_file": bool(overlap and overlap.same_file),
            "held_out": not (overlap and overlap.count), "overlap": overlap.sentence() if overlap else "",
        }
        report["examples"] = [
            {"prompt": p.shown, "expected": p.expected,
             "base": em["base"].answers[i], "base_match": is_match(em["base"].answers[i], p.expected),
             "tuned": em["tuned"].answers[i], "tuned_match": is_match(em["tuned"].answers[i], p.expected),
             "in_training": bool(overlap and overlap.flags[i])}
            for i, p in enumerate(prompts[:EXAMPLES])
        ]
    report["seconds"] = round(time.monotonic() - began, 2)
    path = write_report(run_dir, report)
    line = summary_line(report)
    log.info("evaluation: %s (report %s)", line, path)
    reporter.emit(PhaseChanged(phase="report", detail=line))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))
