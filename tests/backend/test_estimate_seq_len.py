"""The longest train.seq_len a run fits: bisection over the estimate's total (issue 24 item 5)."""

from __future__ import annotations

import pytest
import yaml

from backend.core.config.run_config import RunConfig
from backend.estimate import GIB, estimate, load_model_config
from backend.estimate.cards import usable_bytes
from backend.estimate.seq_len import longest_seq_len, run_total, with_seq_len
from tests.conftest import ROOT

CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"


def _preset(name: str) -> RunConfig:
    return RunConfig.from_dict(yaml.safe_load((ROOT / "resources" / "presets" / f"{name}.yaml").read_text()))


@pytest.mark.parametrize("preset, folder, card", [
    ("llama-3.1-8b_qlora_16gb", "meta-llama--Llama-3.1-8B-Instruct", 24),
    ("llama-3.2-1b_lora_12gb", "meta-llama--Llama-3.2-1B-Instruct", 12),
])
def test_the_answer_fits_and_one_more_token_does_not(preset, folder, card):
    config, raw = _preset(preset), load_model_config(CONFIGS / folder)
    total = run_total("cuda", model_config=raw)
    answer = longest_seq_len(config, usable_bytes(card), total, raw)
    assert answer.seq_len is not None and answer.capped_at is None and 1 < answer.seq_len < 131072
    assert total(with_seq_len(config, answer.seq_len)) <= usable_bytes(card)
    assert total(with_seq_len(config, answer.seq_len + 1)) > usable_bytes(card)
    assert f"{answer.seq_len:,} tokens" in answer.sentence(f"a {card} GB card")


def test_capped_at_the_models_positions_and_said():
    raw = load_model_config(CONFIGS / "openai-community--gpt2")
    config = RunConfig.from_dict({"technique": {"method": "lora"}})
    answer = longest_seq_len(config, usable_bytes(80), run_total("cuda", model_config=raw), raw)
    assert answer.seq_len == answer.capped_at == 1024 and "max_position_embeddings" in answer.sentence("x")


def test_nothing_fits_is_said_with_the_floor():
    raw = load_model_config(CONFIGS / "meta-llama--Llama-3.3-70B-Instruct")
    config = RunConfig.from_dict({"technique": {"method": "lora"}})
    answer = longest_seq_len(config, usable_bytes(8), run_total("cuda", model_config=raw), raw)
    assert answer.seq_len is None and answer.floor_bytes > 8 * GIB and "no seq_len fits" in answer.sentence("x")
    assert answer.floor_bytes == estimate(raw, with_seq_len(config, 1), device="cuda").total_bytes
