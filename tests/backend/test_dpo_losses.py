"""Every DPO loss the config offers builds TRL's trainer and takes a step with a finite, moving loss."""

from __future__ import annotations

import math
import typing

import pytest
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.core.config.run_config import RunConfig, TechniqueSection
from backend.training.objectives import dpo as preference
from tests.conftest import ROOT

DPO_PRESET = ROOT / "resources" / "presets" / "tiny_dpo.yaml"
LOSSES = typing.get_args(TechniqueSection.model_fields["dpo_loss"].annotation)


@pytest.fixture(scope="module")
def pairs():
    config = RunConfig.load(DPO_PRESET)
    tokenizer = AutoTokenizer.from_pretrained(config.resolved_model_path())
    train, _, _ = preference.build_datasets(config, tokenizer)
    return tokenizer, train.select(range(8))


@pytest.mark.parametrize("loss", LOSSES)
def test_each_dpo_loss_takes_a_step(pairs, tmp_path, loss):
    tokenizer, train = pairs
    config = RunConfig.load(DPO_PRESET, [f"technique.dpo_loss={loss}"])
    base = AutoModelForCausalLM.from_pretrained(config.resolved_model_path())
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    arguments = {"output_dir": str(tmp_path), "max_steps": 2, "per_device_train_batch_size": 4, "learning_rate": 0.01,
                 "report_to": [], "use_cpu": True, "logging_steps": 1, "save_strategy": "no"}
    trainer = preference.make_trainer(config, base, lora, tokenizer, train, None, arguments, [])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(value) for value in losses), losses
    assert losses[0] != losses[1], f"{loss}: the adapter did not move the loss"
