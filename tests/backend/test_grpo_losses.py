"""Every GRPO loss the config offers builds TRL's trainer and takes a step with scored generations."""

from __future__ import annotations

import math
import typing

import pytest
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.core.config.run_config import RunConfig
from backend.core.config.objectives import GrpoSection
from backend.training.objectives import grpo
from tests.conftest import ROOT

GRPO_PRESET = ROOT / "resources" / "presets" / "tiny_grpo.yaml"
LOSSES = typing.get_args(GrpoSection.model_fields["loss"].annotation)


@pytest.fixture(scope="module")
def prompts():
    config = RunConfig.load(GRPO_PRESET)
    tokenizer = AutoTokenizer.from_pretrained(config.resolved_model_path())
    train, _, _ = grpo.build_datasets(config, tokenizer)
    return tokenizer, train.select(range(8))


@pytest.mark.parametrize("loss", LOSSES)
def test_each_grpo_loss_takes_a_step(prompts, tmp_path, loss):
    tokenizer, train = prompts
    config = RunConfig.load(GRPO_PRESET, [f"grpo.loss={loss}", 'model.adapter=""', "train.micro_batch_size=4",
                                          "grpo.num_generations=2", "grpo.max_completion_length=4"])
    base = AutoModelForCausalLM.from_pretrained(config.resolved_model_path())
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    arguments = {"output_dir": str(tmp_path), "max_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 0.01,
                 "report_to": [], "use_cpu": True, "logging_steps": 1, "save_strategy": "no"}
    trainer = grpo.make_trainer(config, base, lora, tokenizer, train, None, arguments, [])
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 1 and math.isfinite(logged[0]["loss"]), logged
    assert 0.0 <= logged[0]["reward"] <= 1.0, logged
