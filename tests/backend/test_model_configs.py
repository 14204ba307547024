"""Every real config.json fixture builds in transformers (meta device) at the size its publisher states."""

from __future__ import annotations

import pytest

from tests import model_configs

# Parameter counts as the publishers state them (model cards, release posts, reports), to the precision
# they state them. A fixture whose config was mistyped or truncated would miss these by far more than 3 %.
PUBLISHED = {
    "TinyLlama--TinyLlama-1.1B-Chat-v1.0": 1.1e9,      # model card: "only 1.1B parameters"
    "openai-community--gpt2": 124e6,                    # model card: "smallest version of GPT-2, with 124M parameters"
    "Qwen--Qwen2.5-0.5B-Instruct": 0.49e9,              # model card: "Number of Parameters: 0.49B"
    "Qwen--Qwen2.5-1.5B-Instruct": 1.54e9,              # model card: "Number of Parameters: 1.54B"
    "Qwen--Qwen2.5-7B-Instruct": 7.61e9,                # model card: "Number of Parameters: 7.61B"
    "Qwen--Qwen3-0.6B": 0.6e9,                          # model card: "Number of Parameters: 0.6B"
    "Qwen--Qwen3-8B": 8.2e9,                            # model card: "Number of Parameters: 8.2B"
    "Qwen--Qwen3-30B-A3B": 30.5e9,                      # model card: "30.5B in total and 3.3B activated"
    "meta-llama--Llama-3.2-1B-Instruct": 1.23e9,        # model card table: "1B (1.23B)"
    "meta-llama--Llama-3.1-8B-Instruct": 8e9,           # model card: "8B"
    "meta-llama--Llama-3.3-70B-Instruct": 70e9,         # model card: "70B"
    "google--gemma-2-2b-it": 2.6e9,                     # Gemma 2 report: 2.6B
    "google--gemma-3-1b-it": 1e9,                       # model card: "1B"
    "mistralai--Mistral-7B-Instruct-v0.3": 7.3e9,       # Mistral AI: "a 7.3B parameter model"
    "mistralai--Mixtral-8x7B-v0.1": 46.7e9,             # Mistral AI: "46.7B total parameters"
    "google--gemma-3-4b-it": 4.30e9,                    # model card: 4.3B, vision tower included
    # Vision-language models: the hub page's count of the published safetensors (vision tower included);
    # the names (7B, 4B, 7b) count the language model alone.
    "Qwen--Qwen2.5-VL-7B-Instruct": 8.29e9,             # hub: 8.29B params (ViT 675M + Qwen2.5-7B)
    "Qwen--Qwen3-VL-4B-Instruct": 4.44e9,               # hub: 4.44B params
    "llava-hf--llava-1.5-7b-hf": 7.06e9,                # hub: 7.06B params
    "HuggingFaceTB--SmolVLM-256M-Instruct": 256e6,      # Hugging Face's blog: "256M parameters", tower included
}


def test_every_published_size_has_its_fixture():
    assert set(PUBLISHED) <= set(model_configs.names())


@pytest.mark.parametrize("name", model_configs.names())
def test_builds_on_meta_at_published_size(name):
    cfg = model_configs.load(name)
    model = model_configs.meta_model(name, text_only=False)
    assert type(model).__name__ == cfg["architectures"][0]
    assert all(p.device.type == "meta" for p in model.parameters())
    count = model_configs.parameter_count(model)
    if name in PUBLISHED:
        assert count == pytest.approx(PUBLISHED[name], rel=0.03), f"{name}: {count:,} parameters"
    else:
        assert count > 0
