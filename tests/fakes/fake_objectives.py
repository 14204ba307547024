"""The fake worker's `objectives` scenario: a DPO, KTO or GRPO run as TRL would report it, no model.

The objective comes from the StartJob's config (technique.objective). Each step logs a loss and the
objective's own metrics in MetricsLogged.extra, named as TRL names them (DPO/KTO: rewards/chosen,
rewards/rejected, rewards/margins, rewards/accuracies, KTO also kl; GRPO: reward, reward_std,
rewards/<label>/mean and /std for each configured reward, kl, completions/mean_length,
clip_ratio/region_mean, low_mean, high_mean, low_min, high_max, entropy). GRPO steps first send CompletionScored for every sampled completion
(two prompts x grpo.num_generations), so a ten-step run sends more than the window keeps. Every
EVAL_EVERY steps an evaluation and a sample answer per prompt, as the real worker sends for every
objective. SFT runs log no extra metrics. A StopJob ends the run at the next step with a checkpoint, like the real one.
"""

from __future__ import annotations

import math
import time
from typing import Any

from backend.core.protocol import (
    CompletionScored,
    EvalFinished,
    JobFinished,
    JobStarted,
    MetricsLogged,
    PhaseChanged,
    TokensGenerated,
)

PROMPTS = ("Is this a question? Answer yes or no.\n\nDoes the model learn?",
           "Is this a question? Answer yes or no.\n\nThe loss goes down.")
STEPS = 10
EVAL_EVERY = 5


def reward_labels(config: dict[str, Any]) -> list[str]:
    """The labels RewardSpec.label() gives the configured rewards (the function of a python one)."""
    rewards = config.get("grpo", {}).get("rewards") or [{"kind": "exact_match"}]
    return [r.get("function") if r.get("kind") == "python" else r.get("kind", "exact_match") for r in rewards]


def extra_metrics(objective: str, step: int, labels: list[str]) -> dict[str, float]:
    """One step's objective metrics, moving the way a learning run's do."""
    progress = step / STEPS
    if objective in ("dpo", "kto"):
        chosen, rejected = 0.4 * progress, -0.5 * progress
        extra = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
                 "rewards/accuracies": min(1.0, 0.5 + 0.5 * progress)}
        if objective == "kto":
            extra["kl"] = 0.02 * step
        return extra
    if objective == "grpo":
        extra = {"reward": 0.2 + 0.6 * progress, "reward_std": 0.45 - 0.2 * progress, "kl": 0.001 * step,
                 "completions/mean_length": 6.0 - 2.0 * progress, "clip_ratio/region_mean": 0.05 * abs(math.sin(step)),
                 "clip_ratio/low_mean": 0.02 * abs(math.sin(step)), "clip_ratio/high_mean": 0.03 * abs(math.sin(step)),
                 "clip_ratio/low_min": 0.02 * abs(math.sin(step)), "clip_ratio/high_max": 0.03 * abs(math.sin(step)),
                 "entropy": 1.2 - 0.5 * progress}
        for index, label in enumerate(labels):
            extra[f"rewards/{label}/mean"] = min(1.0, 0.1 * (index + 1) + 0.6 * progress)
            extra[f"rewards/{label}/std"] = 0.4 - 0.02 * step
        return extra
    return {}


def completions(worker: Any, step: int, generations: int, labels: list[str]) -> None:
    """Every completion of the step: two prompts, `generations` answers each, scored by each reward."""
    for prompt in PROMPTS:
        for index in range(generations):
            right = (index + step) % 2 == 0
            scores = {label: (1.0 if right else 0.0) for label in labels}
            worker.emit(CompletionScored(step=step, prompt=prompt, completion="yes" if right else "maybe so",
                                         rewards=scores, reward=sum(scores.values())))


def run_objective(worker: Any, start: Any) -> int:
    config = start.config
    objective = config.get("technique", {}).get("objective", "sft")
    labels = reward_labels(config)
    generations = int(config.get("grpo", {}).get("num_generations", 4))
    first, resumed = worker.resume_point() if start.resume else (0, None)
    run_dir = str(worker.run_dir)
    worker.emit(JobStarted(run_dir=run_dir, max_steps=STEPS, resumed_from=resumed))
    worker.emit(PhaseChanged(phase="plan", detail=f"fake: {objective} on lora r=8, fp32"))
    worker.emit(PhaseChanged(phase="train", detail=f"fake {objective}"))
    loss = 0.69
    for step in range(first + 1, STEPS + 1):
        if objective == "grpo":
            completions(worker, step, generations, labels)
        loss *= 0.9
        worker.emit(MetricsLogged(step=step, max_steps=STEPS, loss=loss, learning_rate=1e-3, grad_norm=0.5,
                                  tokens_per_s=900.0, extra=extra_metrics(objective, step, labels)))
        if step % EVAL_EVERY == 0:
            worker.emit(EvalFinished(step=step, eval_loss=loss * 1.1))
            for prompt in PROMPTS:
                worker.emit(PhaseChanged(phase="sample", detail=" ".join(prompt.split())))
                worker.emit(TokensGenerated(text="yes" if step == STEPS else "maybe so", done=True))
        if worker.stop.is_set():
            return worker.finish_stopped(step, loss)
        time.sleep(worker.delay)
    worker.save_checkpoint(STEPS)
    adapter = worker.run_dir / "adapter"
    adapter.mkdir(exist_ok=True)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "lora_alpha": 16}', encoding="utf-8")
    worker.emit(JobFinished(run_dir=run_dir, steps=STEPS, final_loss=loss, first_loss=0.69, tokens_per_s=900.0,
                            adapter_path=str(adapter)))
    return 0
