"""config.json keys read through the aliases transformers reads them through (the config classes'
attribute_map), and dimensions filled from a class default said in a note."""

from __future__ import annotations

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import ESTIMATE_FAMILIES as FAMILIES, count_params, estimate, read_dims
from backend.estimate.families import ATTRIBUTE_MAPS
from tests.families import FAMILIES as TINY


def test_alias_table_is_transformers_attribute_maps():
    """The estimator stays torch-free (no transformers import), so it keeps a copy: it must not drift."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for model_type in FAMILIES:
        assert ATTRIBUTE_MAPS.get(model_type, {}) == dict(CONFIG_MAPPING[model_type].attribute_map), model_type


def _qwen3_moe_as_transformers5_saves_it() -> dict:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = {k: v for k, v in TINY["qwen3_moe"].items() if k != "model_type"}
    saved = CONFIG_MAPPING["qwen3_moe"](**raw).to_dict()
    assert "num_local_experts" in saved and saved["num_local_experts"] == 4 and "num_experts" not in saved
    return saved


def test_qwen3_moe_num_local_experts_counts_the_files_experts():
    saved = _qwen3_moe_as_transformers5_saves_it()
    arch, dims, warnings = read_dims(saved)
    assert dims.experts == 4 and not any("num_experts" in w or "num_local_experts" in w for w in warnings)
    _, old_style, _ = read_dims(dict(TINY["qwen3_moe"]))  # the same model, saved under num_experts
    assert count_params(arch, dims).total == count_params(arch, old_style).total
    run = RunConfig.from_dict({"technique": {"method": "full"}})
    assert estimate(saved, run).weights == estimate(dict(TINY["qwen3_moe"]), run).weights


def test_a_dimension_the_file_leaves_out_is_said():
    raw = {k: v for k, v in TINY["qwen3_moe"].items() if k != "num_experts"}
    b = estimate(raw, RunConfig.from_dict({}))
    notes = [w for w in b.details["warnings"] if "defaults" in w]
    assert b.details["model"]["experts"] == 128
    assert len(notes) == 1 and "num_local_experts 128" in notes[0]


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_either_key_name_reads_the_expert_count(family):
    raw = {k: v for k, v in TINY[family].items() if k not in ("num_experts", "num_local_experts")}
    for key in ("num_experts", "num_local_experts"):
        _, dims, warnings = read_dims({**raw, key: 3})
        assert dims.experts == 3 and not [w for w in warnings if "defaults" in w]
