"""DPO, KTO and GRPO runs sample a few answers at each evaluation, as SFT runs do (issue 33): the
Train page's "Sample answers" stayed empty for them because only the SFT trainer had a sampler."""

from __future__ import annotations

import pytest

from tests.backend.objective_runs import run_preset
from tests.conftest import ROOT


EVALUATED = ["train.eval_steps=2", "data.max_examples=40", "data.validation_split=0.2"]


def assert_samples_at_each_evaluation(events: list) -> None:
    """The same few prompts sampled at every evaluation, each with its finished answer."""
    assert events[-1].type == "JobFinished", events[-1]
    prompts = [e.detail for e in events if e.type == "PhaseChanged" and e.phase == "sample"]
    answers = [e for e in events if e.type == "TokensGenerated" and e.done]
    evaluations = [e.step for e in events if e.type == "EvalFinished"]
    assert evaluations and len(prompts) == len(answers) > 0
    assert len(prompts) % len(set(prompts)) == 0 and len(prompts) // len(set(prompts)) == len(set(evaluations))
    assert all(p.strip() for p in prompts)


# DPO's and GRPO's cases run in test_preference.py / test_grpo.py's resume tests (one run for both)
@pytest.mark.parametrize("preset, data", [("tiny_kto.yaml", [])])
def test_objective_runs_sample_answers_at_each_evaluation(bundled_model, tmp_path, preset, data):
    events = run_preset(tmp_path, ROOT / "resources" / "presets" / preset,
                        ["train.max_steps=4", "train.save_steps=4", *EVALUATED, *data])
    assert_samples_at_each_evaluation(events)
