"""DPO and GRPO on every method: quantized bases (QLoRA, LLM.int8) and full tuning with a frozen reference.

DPO's first loss is exactly ln 2 only when the reference equals the policy at the start: the base with
a fresh adapter off (LoRA's B is zero) or, for full tuning, a frozen copy of the same weights. A wrong
reference (none, or another model) shows there before any step is taken.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.config.errors import ConfigError
from backend.core.protocol import Capabilities
from tests.backend.objective_runs import run_preset
from tests.conftest import ROOT

PRESETS = ROOT / "resources" / "presets"
CPU = Capabilities(cuda=False)


def run(tmp_path: Path, preset: str, overrides: list[str]) -> list:
    return run_preset(tmp_path, PRESETS / preset, overrides)


def plan_line(events: list) -> str:
    return next(e.detail for e in events if e.type == "PhaseChanged" and "objective" in (e.detail or ""))


@pytest.mark.parametrize("method, learning_rate, reference", [
    ("qlora", 0.002, "the base with the adapter off"),
    ("lora8", 0.002, "the base with the adapter off"),
    ("full", 0.0005, "a frozen copy of the base"),
])
def test_dpo_starts_at_ln2_and_learns_on_every_method(tmp_path, method, learning_rate, reference):
    events = run(tmp_path, "tiny_dpo.yaml", [f"technique.method={method}", "train.max_steps=4",
                                             f"train.learning_rate={learning_rate}", "train.save_steps=100",
                                             "data.max_examples=64", "data.validation_split=0"])
    assert events[-1].type == "JobFinished", events[-1]
    losses = [e.loss for e in events if e.type == "MetricsLogged"]
    assert abs(losses[0] - math.log(2)) < 2e-3, losses
    assert losses[-1] < losses[0] - 1e-3, losses
    assert reference in plan_line(events)
    saved = "model" if method == "full" else "adapter"
    assert (tmp_path / "run" / saved).is_dir()
    if method == "full":  # every weight trained: a whole model is saved, not an adapter
        assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
        assert not (tmp_path / "run" / "model" / "adapter_config.json").exists()
    if method == "qlora":
        assert "base weights nf4" in plan_line(events)


def test_grpo_full_tuning_with_a_kl_penalty_loads_its_reference(tmp_path):
    events = run(tmp_path, "tiny_grpo.yaml", ['model.adapter=""', "technique.method=full", "train.max_steps=2",
                                              "grpo.beta=0.04", "train.learning_rate=0.0001", "train.save_steps=100",
                                              "data.max_examples=64", "data.validation_split=0"])
    assert events[-1].type == "JobFinished", events[-1]
    assert "a frozen copy of the base" in plan_line(events)
    kls = [e.extra.get("kl") for e in events if e.type == "MetricsLogged"]
    assert kls and all(kl is not None and kl == kl for kl in kls), kls


def test_grpo_continues_a_lora_start_adapter_on_a_quantized_base(tmp_path):
    events = run(tmp_path, "tiny_grpo.yaml", ["technique.method=qlora", "train.max_steps=1", "train.save_steps=100",
                                              "data.max_examples=64", "data.validation_split=0"])
    assert events[-1].type == "JobFinished", events[-1]
    assert "no reference pass (grpo.beta 0)" in plan_line(events)


def test_a_start_adapter_with_full_tuning_is_refused_in_one_line():
    with pytest.raises(ConfigError) as caught:
        RunConfig.load(PRESETS / "tiny_grpo.yaml", ["technique.method=full"])
    text = str(caught.value)
    assert "model.adapter continues an adapter" in text and "\n" not in text


def test_a_dpo_run_from_a_start_adapter_exports_its_one_tuned_adapter(tmp_path):
    from backend.core.runs.run_folder import RunFolder
    from tests.backend.test_export import export

    events = run(tmp_path, "tiny_dpo.yaml", ["model.adapter=bundled:adapters/tiny-yes-no", "train.max_steps=2",
                                             "train.save_steps=100", "data.max_examples=64", "data.validation_split=0"])
    assert events[-1].type == "JobFinished", events[-1]
    folder = RunFolder(tmp_path / "run")
    assert (folder.adapter_dir / "ref").is_dir()  # TRL's reference copy of the start adapter, saved beside it
    events, report = export(folder, "merged")
    assert events[-1]["type"] == "JobFinished" and report["passed"] is True, report
    assert not any("ref" in f["name"] for f in report["files"])
