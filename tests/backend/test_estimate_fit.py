"""Make it fit (issue 33 item 3): the greedy plan over the estimate, and `finetune-studio estimate --fit`."""

from __future__ import annotations

import json
import shlex

import yaml

from backend.core.config.run_config import RunConfig
from backend.core.device_caps import device_caps
from backend.estimate import load_model_config
from backend.estimate.calibration import Calibration
from backend.estimate.cards import usable_bytes
from backend.estimate.fit import SPEED_COSTS, fit_estimator, make_fit, with_changes
from tests.backend.test_cli_estimate import run
from tests.conftest import ROOT

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
PRESET_8B = ROOT / "resources" / "presets" / "llama-3.1-8b_qlora_16gb.yaml"
LORA_NO_CHECKPOINTING = {"technique.method": "lora", "technique.gradient_checkpointing": False,
                         "train.micro_batch_size": 4, "train.gradient_accumulation_steps": 4}


def _config(preset: str, changes: dict) -> RunConfig:
    config = RunConfig.from_dict(yaml.safe_load((ROOT / "resources" / "presets" / f"{preset}.yaml").read_text()))
    return with_changes(config, tuple(changes.items()))


def _cuda(folder: str):
    return fit_estimator("cuda", caps=device_caps("cuda"), model_config=load_model_config(CONFIGS / folder))


def _plan(changes: dict, card: int, preset: str = "llama-3.1-8b_qlora_16gb",
          folder: str = "meta-llama--Llama-3.1-8B-Instruct"):
    return make_fit(_config(preset, changes), usable_bytes(card), _cuda(folder), where=f"a {card} GB card")


def test_changes_come_in_speed_cost_order_and_each_is_the_same_estimate():
    plan = _plan(LORA_NO_CHECKPOINTING, 12)
    names = [step.name for step in plan.steps]
    assert plan.fits and names == sorted(names, key=list(SPEED_COSTS).index)
    assert names[:2] == ["accumulation", "gradient_checkpointing"] and "qlora" in names
    config = _config("llama-3.1-8b_qlora_16gb", LORA_NO_CHECKPOINTING)
    estimate = _cuda("meta-llama--Llama-3.1-8B-Instruct")
    for step in plan.steps:  # each step's figures are estimate_run's for the config so far
        assert estimate(config).total_bytes == step.total_before
        config = with_changes(config, step.changes)
        assert estimate(config).total_bytes == step.total_after < step.total_before
        assert step.after == estimate(config).breakdown.breakdown()
    assert plan.total_after == plan.steps[-1].total_after <= usable_bytes(12) < plan.total_before


def test_accumulation_keeps_the_effective_batch_and_takes_the_smallest_split_that_fits():
    plan = _plan({"technique.method": "lora", "train.micro_batch_size": 16, "train.gradient_accumulation_steps": 1}, 24)
    assert [step.name for step in plan.steps] == ["accumulation"] and plan.fits
    changes = dict(plan.steps[0].changes)
    assert changes["train.micro_batch_size"] * changes["train.gradient_accumulation_steps"] == 16
    assert changes["train.micro_batch_size"] > 1  # a smaller split already fit: not down to 1
    larger = _plan({"technique.method": "lora", "train.micro_batch_size": changes["train.micro_batch_size"] * 2,
                    "train.gradient_accumulation_steps": 16 // (changes["train.micro_batch_size"] * 2)}, 24)
    assert not larger.already_fits


def test_stops_once_it_fits():
    plan = _plan(LORA_NO_CHECKPOINTING, 24)
    assert plan.fits and all(step.total_before > usable_bytes(24) for step in plan.steps)
    assert len(plan.steps) < len(SPEED_COSTS) and "seq_len" not in [s.name for s in plan.steps]


def test_nothing_to_change_when_it_already_fits():
    plan = _plan({}, 80)
    assert plan.already_fits and plan.fits and plan.steps == () and plan.set_args() == []
    assert plan.sentence().startswith("already fits a 80 GB card")


def test_nothing_fits_says_what_is_left():
    plan = make_fit(_config("llama-3.1-8b_qlora_16gb", {}), usable_bytes(8),
                    _cuda("meta-llama--Llama-3.3-70B-Instruct"), where="an 8 GB card")
    assert not plan.fits and plan.total_after > usable_bytes(8)
    assert plan.sentence().startswith("does not fit an 8 GB card even with every change") and "weights" in plan.sentence()
    assert ("seq_len", "not even 8-token rows fit") in plan.skipped


def test_a_shorter_seq_len_comes_last_and_is_the_longest_that_fits():
    plan = _plan({"train.seq_len": 32768}, 8, "llama-3.2-1b_lora_12gb", "meta-llama--Llama-3.2-1B-Instruct")
    assert plan.fits and plan.steps[-1].name == "seq_len" and "activation_offload" in [s.name for s in plan.steps]
    assert "does not lower the estimate" in dict(plan.skipped)["qlora"]  # the estimate's own say, not a guess
    seq = dict(plan.steps[-1].changes)["train.seq_len"]
    config = with_changes(_config("llama-3.2-1b_lora_12gb", {"train.seq_len": 32768}), tuple(plan.changes().items()))
    longer = with_changes(config, (("train.seq_len", seq + 1),))
    assert seq < 32768 and _cuda("meta-llama--Llama-3.2-1B-Instruct")(longer).total_bytes > usable_bytes(8)


def test_cuda_only_shortcuts_are_skipped_on_a_cpu_run():
    config = _config("llama-3.2-1b_lora_12gb", {"technique.shortcuts": "off"})
    estimate = fit_estimator("cpu", caps=device_caps("cpu"), calibration=Calibration(),
                             model_config=load_model_config(CONFIGS / "meta-llama--Llama-3.2-1B-Instruct"))
    plan = make_fit(config, 1 << 20, estimate, where="1 MiB of RAM")  # fits nothing: every candidate is tried
    skipped = dict(plan.skipped)
    assert "chunked_loss" in skipped and "does not lower the estimate" in skipped["chunked_loss"]
    assert "chunked_loss" not in [step.name for step in plan.steps]


def test_a_change_the_verdicts_refuse_is_skipped_with_their_reason():
    estimate = fit_estimator("cuda", caps=device_caps("cuda"), probe=lambda feature, device: "bitsandbytes is not installed",
                             model_config=load_model_config(CONFIGS / "meta-llama--Llama-3.1-8B-Instruct"))
    plan = make_fit(_config("llama-3.1-8b_qlora_16gb", LORA_NO_CHECKPOINTING), usable_bytes(12), estimate)
    skipped = dict(plan.skipped)
    assert skipped["qlora"].startswith("technique.method: qlora needs bitsandbytes")
    assert skipped["optimizer"].startswith("technique.optimizer: adamw_8bit needs bitsandbytes")
    assert not plan.fits and {"qlora", "optimizer"}.isdisjoint(step.name for step in plan.steps)


def test_every_speed_cost_is_measured_or_says_it_is_not():
    for cost in SPEED_COSTS.values():
        assert (cost.measured and "docs/benchmarks.md" in cost.measured) or not cost.in_speed \
            or cost.sentence().endswith("not measured on a GPU yet")
    assert "CPU" in SPEED_COSTS["chunked_loss"].measured and "AMD EPYC" in SPEED_COSTS["chunked_loss"].measured


# --- the CLI ------------------------------------------------------------------------------------

def _config_only(tmp_path) -> list[str]:
    (tmp_path / "config.json").write_text((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct" / "config.json").read_text())
    return ["--set", f"model.path={tmp_path}"]


def _sets(changes: dict) -> list[str]:
    return [arg for key, value in changes.items() for arg in ("--set", f"{key}={str(value).lower()}")]


def test_cli_prints_set_lines_that_make_it_fit(tmp_path):
    base = ["estimate", str(PRESET_8B), "--worst-case", *_config_only(tmp_path), *_sets(LORA_NO_CHECKPOINTING)]
    before = run(*base, "--card-gb", "12")
    assert before.returncode == 0 and "does not fit a 12 GB card" in before.stdout
    done = run(*base, "--fit", "--card-gb", "12")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("# fits a 12 GB card") and all(line.startswith("--set ") for line in lines[1:])
    assert lines[1].startswith("--set train.micro_batch_size=1 --set train.gradient_accumulation_steps=16")
    assert all("not measured on a GPU yet" in line for line in lines[1:])
    sets = [arg for line in lines[1:] for arg in shlex.split(line, comments=True)]
    after = run(*base, *sets, "--card-gb", "12")
    assert after.returncode == 0 and "fits a 12 GB card" in after.stdout and "does not fit" not in after.stdout
    data = json.loads(run(*base, *sets, "--card-gb", "12", "--json").stdout)
    assert data["card_fits"] is True and data["device"] == "cuda"
    plan = json.loads(run(*base, "--fit", "--card-gb", "12", "--json").stdout)["fit"]
    assert plan["fits"] and plan["set"] == sets and plan["total_after"] == data["total_bytes"]
    assert [step["name"] for step in plan["steps"]][:2] == ["accumulation", "gradient_checkpointing"]


def test_cli_says_in_one_line_what_does_not_fit(tmp_path):
    done = run("estimate", str(PRESET_8B), "--worst-case", *_config_only(tmp_path), "--fit", "--card-gb", "8")
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "does not fit a 8 GB card" in done.stderr
    assert "exit 1" in run("estimate", "--help").stdout.replace("\n", " ")
    refused = run("estimate", str(PRESET_8B), "--worst-case", *_config_only(tmp_path), "--card-gb", "24", "--device", "cpu")
    assert refused.returncode == 2 and "--card-gb is a CUDA card's size" in refused.stderr
