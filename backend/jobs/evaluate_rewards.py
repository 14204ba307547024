"""A GRPO run's evaluation: the mean reward of its reward functions on held-out prompts, base vs tuned.

Called by run_evaluate for `technique.objective: grpo`, whose data are prompts, not answers to
measure perplexity or exact match on. The prompts are the run's validation split, or --prompts FILE
(GRPO prompt records). The "base" is what training started from: model.path, with model.adapter
when the run continued an adapter. The report goes to eval_report.json as for SFT.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.evaluation.mean_reward import RewardResult, mean_reward
from backend.core.protocol import JobFinished, PhaseChanged
from backend.training.objectives.rewards import reward_functions

EXAMPLES = 5


def held_out_prompts(config: RunConfig, tokenizer: Any, prompts_file: Path | None, limit: int | None) -> tuple[list, str]:
    """-> (rows, where they come from): --prompts FILE, else the run's validation split."""
    from backend.training.objectives.grpo import build_datasets, read_prompts

    if prompts_file is not None:
        columns = tuple(r.column for r in config.grpo.rewards if r.kind == "exact_match")
        rows, source = read_prompts(prompts_file, columns, limit), f"prompts from {prompts_file.name}"
    else:
        _, eval_set, _ = build_datasets(config, tokenizer)
        if eval_set is None:
            raise bad_input("the run has no validation split (data.validation_split is 0), and the mean reward is "
                            "measured on held-out prompts", "pass --prompts FILE with prompt records")
        rows, source = eval_set.to_list(), "validation prompts"
    return (rows[:limit] if limit else rows), source


def summary(report: dict[str, Any]) -> str:
    reward = report["mean_reward"]
    return (f"mean reward base {reward['base']['mean']:.3f} -> tuned {reward['tuned']['mean']:.3f} "
            f"({reward['prompts']} prompts x {reward['samples']} samples)")


def run_reward_evaluation(config: RunConfig, run_dir: Path, reporter: Any, models: Any, prompts_file: Path | None,
                          limit: int | None, max_new_tokens: int | None, batch: int,
                          progress: Callable[[str, str], Callable[[int, int], None]], began: float,
                          write_report: Callable[[Path, dict], Path]) -> None:
    grpo = config.grpo
    tokenizer = models.tokenizer()
    rows, source = held_out_prompts(config, tokenizer, prompts_file, limit)
    length = max_new_tokens or grpo.max_completion_length
    reporter.emit(PhaseChanged(phase="tokenize", detail=f"{len(rows)} {source}, {grpo.num_generations} samples each"))
    functions = reward_functions(grpo.rewards, Path.cwd())
    weights = [r.weight for r in grpo.rewards]
    results: dict[str, RewardResult] = {}
    for which, model in models.each(reporter):
        results[which] = mean_reward(model, tokenizer, rows, functions, weights, grpo.num_generations, length,
                                     grpo.temperature, config.train.seed, max(batch, 16), progress("mean_reward", which))
    report: dict[str, Any] = {
        **models.report_head(run_dir),
        "perplexity": None,
        "exact_match": None,
        "mean_reward": {
            "source": source, "prompts": len(rows), "samples": grpo.num_generations, "max_new_tokens": length,
            "temperature": grpo.temperature, "weights": {fn.__name__: w for fn, w in zip(functions, weights)},
            "base": results["base"].to_json(), "tuned": results["tuned"].to_json(),
        },
        "skipped": [], "data_notes": [],
        "examples": [{"prompt": str(row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]),
                      "base": results["base"].answers[i], "tuned": results["tuned"].answers[i]}
                     for i, row in enumerate(rows[:EXAMPLES])],
    }
    report["seconds"] = round(time.monotonic() - began, 2)
    write_report(run_dir, report)
    reporter.emit(PhaseChanged(phase="report", detail=summary(report)))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began))
