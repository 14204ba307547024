"""technique.objective grpo: the GRPO job on the bundled model (from the bundled SFT adapter) raises the
mean reward of its exact-match reward on held-out prompts, reports completions with their scores, and
refuses bad prompts, reward files and start adapters in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.errors import JobError
from backend.core.protocol import Capabilities
from tests.backend.objective_runs import evaluate_run, run_preset
from tests.conftest import ROOT

GRPO_PRESET = ROOT / "resources" / "presets" / "tiny_grpo.yaml"
CPU = Capabilities(cuda=False)
METRICS = {"reward", "reward_std", "rewards/exact_match/mean", "completions/mean_length"}


def run_grpo(tmp_path: Path, overrides: list[str], name: str = "run", resume: bool = False) -> list:
    return run_preset(tmp_path, GRPO_PRESET, overrides, name, resume)


def evaluate(run_dir: Path) -> dict:
    return evaluate_run(run_dir, {"limit": 24})


def test_grpo_raises_the_mean_reward_from_where_it_started(bundled_model, tmp_path):
    from backend.cli.eval import format_report

    events = run_grpo(tmp_path, ["train.save_steps=100"])
    finished = events[-1]
    assert finished.type == "JobFinished" and finished.steps == 30 and not finished.stopped, finished
    metrics = [e for e in events if e.type == "MetricsLogged"]
    assert len(metrics) == 30 and all(METRICS <= set(m.extra) for m in metrics)
    mean = lambda ms: sum(m.extra["reward"] for m in ms) / len(ms)  # noqa: E731
    first, last = mean(metrics[:10]), mean(metrics[-10:])
    print(f"training reward: first 10 steps {first:.3f}, last 10 {last:.3f}")
    assert last > first
    scored = [e for e in events if e.type == "CompletionScored"]
    assert len(scored) == 3 * 30 and set(scored[0].rewards) == {"exact_match"}
    assert {s.reward for s in scored} <= {0.0, 1.0} and scored[0].prompt.startswith("Is this a question?")
    saved = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 8  # one adapter, continued from the start adapter

    report = evaluate(tmp_path / "run")
    reward = report["mean_reward"]
    base, tuned = reward["base"]["mean"], reward["tuned"]["mean"]
    print(f"held-out mean reward: base (the start adapter) {base:.3f}, tuned {tuned:.3f}")
    assert reward["prompts"] == 24 and reward["samples"] == 4 and reward["max_new_tokens"] == 8
    assert tuned > base + 0.15, (base, tuned)
    assert "adapter bundled:adapters/tiny-yes-no" in report["base_model"]
    table = format_report(report)
    assert "mean reward" in table and "exact_match" in table and f"{tuned:.3f}" in table


def test_a_grpo_run_resumes_from_its_checkpoint(bundled_model, tmp_path):
    """Also GRPO's case of test_objective_samples (one run for both): answers sampled at each evaluation."""
    from tests.backend.test_objective_samples import EVALUATED, assert_samples_at_each_evaluation

    short = ["train.save_steps=2", "grpo.num_generations=2", *EVALUATED]
    run_grpo(tmp_path, ["train.max_steps=2", *short])
    events = run_grpo(tmp_path, ["train.max_steps=4", *short], resume=True)
    started = [e for e in events if e.type == "JobStarted"]
    assert started[-1].resumed_from.endswith("checkpoint-2")
    assert [e.step for e in events if e.type == "MetricsLogged"] == [1, 2, 3, 4] and events[-1].steps == 4
    assert_samples_at_each_evaluation(events)  # an evaluation before the stop and one after the resume


@pytest.mark.parametrize("records, expected", [
    ([{"question": "Is it?", "answer": "yes"}], "line 1: GRPO needs a 'prompt' field in every record (its fields: answer, question)"),
    ([{"prompt": "Is it?", "answer": "yes"}, {"prompt": "Is it?"}], "line 2: the reward reads the column 'answer'"),
    ([{"prompt": " ", "answer": "yes"}], "line 1: the field 'prompt' is empty"),
    ([{"prompt": 7, "answer": "yes"}], "line 1: the field 'prompt' is int, not text or a list of {role, content} messages"),
])
def test_bad_prompts_are_refused_with_their_line(tmp_path, records, expected):
    from backend.training.objectives.grpo import read_prompts

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(JobError) as caught:
        read_prompts(data, ("answer",))
    assert expected in caught.value.message and "\n" not in caught.value.message


def test_message_prompts_and_extra_columns_pass_through(tmp_path):
    from backend.training.objectives.grpo import read_prompts

    data = tmp_path / "prompts.jsonl"
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Is it?"}]
    data.write_text(json.dumps({"prompt": messages, "answer": "yes", "source": "demo"}) + "\n")
    (row,) = read_prompts(data, ("answer",))
    assert row == {"prompt": messages, "answer": "yes", "source": "demo"}


def test_a_reward_file_that_breaks_in_training_stops_the_run_in_one_line(bundled_model, tmp_path):
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def picky(prompts, completions, **kwargs):\n    return [0.5]\n")
    overrides = ["train.max_steps=2", "data.max_examples=32", "data.validation_split=0",
                 f'grpo.rewards=[{{kind: python, file: "{rewards}", function: picky}}]']
    with pytest.raises(JobError) as caught:
        run_grpo(tmp_path, overrides)
    assert caught.value.message == f"{rewards}:1: picky returned 1 scores for 16 completions"


@pytest.mark.parametrize("override, expected", [
    ("technique.lora_rank=16", "technique.lora_rank is 16 but the start adapter"),
    ("technique.method=dora", "technique.method is dora but the start adapter"),
    ("model.adapter=/nonexistent/run", "model.adapter: /nonexistent/run does not exist"),
    ("model.adapter=bundled:datasets", "holds no adapter (no adapter_config.json"),
])
def test_a_start_adapter_that_does_not_fit_is_refused_before_loading(bundled_model, tmp_path, override, expected):
    with pytest.raises(JobError) as caught:
        run_grpo(tmp_path, [override, "train.max_steps=1"])
    assert expected in caught.value.message and "\n" not in caught.value.message
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
