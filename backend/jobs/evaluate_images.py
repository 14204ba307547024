"""A vision-language run's evaluation: base beside tuned on the held-out image rows.

Called by run_evaluate when the run's model is a proven VLM. The rows are the run's validation split, built
exactly as training built it (training/vision/rows.py: the processor's tokens, labels on the assistant's text
only), so perplexity counts the answers' tokens through the same collator; exact match asks each row's
conversation with its images and compares the greedy answer with the row's (evaluation/image_exact_match.py).
The report has the text path's shape (eval_report.json), with the image rows and images counted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.protocol import JobFinished, PhaseChanged
from backend.evaluation.exact_match import ExactMatchResult, is_match
from backend.evaluation.image_exact_match import held_out_image_rows, image_exact_match
from backend.evaluation.image_prompts import ImagePrompter
from backend.evaluation.perplexity import PerplexityResult, perplexity
from backend.training.phase import set_phase

EXAMPLES = 5


def run_image_evaluation(config: RunConfig, run_dir: Path, reporter: Any, models: Any, limit: int | None,
                         max_new_tokens: int, batch: int, progress: Callable[[str, str], Callable[[int, int], None]],
                         began: float, write_report: Callable[[Path, dict], Path],
                         summary: Callable[[dict], str], notes: list[str]) -> None:
    """notes: what the request asked that this evaluation does not do (a prompts file), said in the report."""
    set_phase("load")
    reporter.emit(PhaseChanged(phase="load_data", detail=config.data.path))
    prompter = ImagePrompter(models.base_path, config)
    _, eval_set, stats, side = prompter.run.build_datasets(config)
    for note in stats.notes:
        reporter.emit(PhaseChanged(phase="data_warning", detail=note))
    if eval_set is None:
        raise bad_input("the run has no validation split (data.validation_split is 0), and a vision-language run "
                        "is scored on its held-out image rows", "train with data.validation_split above 0")
    if limit:
        eval_set = eval_set.select(range(min(limit, len(eval_set))))
    held = held_out_image_rows(eval_set, side.messages, side.images)
    with_images = sum(1 for i in range(len(eval_set)) if side.images[eval_set[i]["row"]])
    reporter.emit(PhaseChanged(phase="tokenize", detail=(
        f"{len(eval_set)} validation rows ({with_images} with images, {prompter.family.label}); "
        f"{len(held)} end with an answer to match")))
    collator = prompter.run.collator(side)
    ppl: dict[str, PerplexityResult] = {}
    em: dict[str, ExactMatchResult] = {}
    for which, model in models.each(reporter):
        ppl[which] = perplexity(model, eval_set, collator.pad_id, batch, progress("perplexity", which), collate=collator)
        if held:
            em[which] = image_exact_match(model, prompter, held, max_new_tokens, progress("exact_match", which))

    report: dict[str, Any] = {
        **models.report_head(run_dir),
        "perplexity": {"split": "validation", "examples": len(eval_set), "image_rows": with_images,
                       "tokens": ppl["base"].tokens, "base": ppl["base"].to_json(), "tuned": ppl["tuned"].to_json()},
        "exact_match": None,
        "skipped": notes + ([] if held else ["exact match skipped: no validation row ends with an assistant answer"]),
        "data_notes": list(stats.notes),
        "examples": [],
    }
    if em:
        report["exact_match"] = {
            "prompts_file": f"{config.data.path} (validation image rows)", "n": len(held),
            "images": sum(len(r.images) for r in held), "max_new_tokens": max_new_tokens,
            "base": em["base"].to_json(), "tuned": em["tuned"].to_json(),
            "in_training": 0, "same_file": False, "held_out": True, "overlap": "",
        }
        report["examples"] = [
            {"prompt": r.shown, "expected": r.expected, "images": [ref.label for ref in r.images],
             "base": em["base"].answers[i], "base_match": is_match(em["base"].answers[i], r.expected),
             "tuned": em["tuned"].answers[i], "tuned_match": is_match(em["tuned"].answers[i], r.expected),
             "in_training": False}
            for i, r in enumerate(held[:EXAMPLES])
        ]
    report["seconds"] = round(time.monotonic() - began, 2)
    write_report(run_dir, report)
    reporter.emit(PhaseChanged(phase="report", detail=summary(report)))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))
