"""The estimate of DPO, KTO and GRPO (backend/estimate/objectives.py): its parts, how they scale, and a
measured slice against real TRL steps (bench/estimate_objectives.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import OBJECTIVE_PARTS, PARTS, estimate
from backend.estimate.objectives import PART_NOTES

ROOT = Path(__file__).resolve().parents[2]
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 4096, "tie_word_embeddings": True}


def run(objective: str, batch: int = 2, seq: int = 64, **more) -> RunConfig:
    """A LoRA run of `objective` on the CPU's fp32."""
    grpo = more.pop("grpo", {})
    model = more.pop("model", {})
    return RunConfig.from_dict({
        "model": model,
        "technique": {"objective": objective, "method": "lora", "precision": "fp32", "attention": "sdpa", **more},
        "grpo": grpo, "train": {"micro_batch_size": batch, "seq_len": seq}})


def est(objective: str, **kw):
    if objective == "grpo":
        kw.setdefault("batch", 4)  # a multiple of num_generations (4)
    return estimate(LLAMA, run(objective, **kw), device="cpu")


def test_sft_shows_no_objective_part():
    b = est("sft")
    assert list(b.breakdown()) == list(PARTS)
    assert "objective" not in b.details


@pytest.mark.parametrize("objective, parts", [("dpo", {"reference"}), ("kto", {"reference"}),
                                              ("grpo", {"generation"})])
def test_each_objective_names_its_parts(objective, parts):
    b = est(objective)
    shown = set(b.breakdown()) - set(PARTS)
    assert shown == parts
    assert b.details["objective"]["name"] == objective
    assert all(PART_NOTES[p] for p in OBJECTIVE_PARTS)
    assert any(w.startswith(objective) for w in b.details["warnings"])
    table = b.format_table()
    for part in parts:
        assert part in table
    assert b.total_bytes == b.details["peak_phases"]["peak"]


def test_no_bf16_base_for_the_objectives():
    """The worker turns the speed shortcuts off for DPO, KTO and GRPO: the CPU's bf16 base among them."""
    auto = {"precision": "auto"}
    sft = estimate(LLAMA, run("sft", **auto), device="cpu", cpu_bf16=True)
    dpo = estimate(LLAMA, run("dpo", **auto), device="cpu", cpu_bf16=True)
    assert sft.details["weights"].get("bf16_base") and not dpo.details["weights"].get("bf16_base")
    assert dpo.weights > sft.weights


def test_dpo_doubles_the_rows():
    sft, dpo = est("sft", batch=4, packing=False), est("dpo", batch=2)
    assert dpo.activations == sft.activations  # 2 x 2 rows of chosen + rejected = SFT's 4 rows
    assert est("dpo", batch=4).activations > 1.9 * dpo.activations
    assert "reference_forward" in dpo.details["peak_phases"]


def test_reference_and_head_grow_with_the_micro_batch():
    small, big = est("kto", batch=2), est("kto", batch=4)
    assert big.reference > small.reference
    assert big.logits > small.logits
    assert big.details["logits"]["fused_head"]["positions"] == 2 * small.details["logits"]["fused_head"]["positions"]


def test_grpo_generation_scales_with_generations_and_completion_length():
    base = est("grpo", batch=4, grpo={"num_generations": 4, "max_completion_length": 32})
    longer = est("grpo", batch=4, grpo={"num_generations": 4, "max_completion_length": 64})
    more_rows = est("grpo", batch=8, grpo={"num_generations": 8, "max_completion_length": 32})
    kv = base.details["objective"]["generation"]["kv_cache"]
    # KV cache: layers x 2 x rows x kv_heads x head_dim x (prompt + completion) x 4 bytes
    assert kv == 4 * 2 * 4 * 2 * 64 * (64 + 32) * 4
    assert longer.details["objective"]["generation"]["kv_cache"] == kv * (64 + 64) // (64 + 32)
    assert more_rows.details["objective"]["generation"]["kv_cache"] == 2 * kv
    assert longer.activations > base.activations  # trains on prompt + completion tokens
    assert base.reference == 0 and est("grpo", batch=4, grpo={"beta": 0.04}).reference > 0


def test_start_adapter_adds_a_frozen_copy(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "lora_alpha": 16}')
    dpo = est("dpo", model={"adapter": str(folder)})
    assert dpo.ref_adapter == dpo.adapters > 0
    assert est("grpo", model={"adapter": str(folder)}).ref_adapter == 0  # beta 0: TRL copies nothing
    assert est("grpo", model={"adapter": str(folder)}, grpo={"beta": 0.1}).ref_adapter == dpo.adapters


def test_measured_slice_within_ten_percent():
    pytest.importorskip("trl")
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import estimate_objectives as bench

    for case in bench.CI_SLICE:
        for part, (predicted, measured, err) in bench.compare(case).items():
            assert abs(err) <= bench.TOLERANCE, f"{case.name} {part}: {predicted} vs {measured} ({err:+.1%})"


def test_full_tuning_counts_the_frozen_reference_copy_trl_loads(tmp_path):
    from peft import LoraConfig  # noqa: F401  (peft imported as the worker does)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.training.objectives import dpo as preference

    preset = ROOT / "resources" / "presets" / "tiny_dpo.yaml"
    config = RunConfig.load(preset, ["technique.method=full", "technique.precision=fp32"])
    b = estimate(config.resolved_model_path() / "config.json", config, device="cpu")
    assert b.ref_model == b.weights > 0 and "ref_model" in b.breakdown()
    assert est("grpo", method="full").ref_model == 0  # beta 0: no reference at all
    tokenizer = AutoTokenizer.from_pretrained(config.resolved_model_path())
    train, _, _ = preference.build_datasets(config, tokenizer)
    base = AutoModelForCausalLM.from_pretrained(config.resolved_model_path())
    arguments = {"output_dir": str(tmp_path), "max_steps": 1, "per_device_train_batch_size": 2, "report_to": [],
                 "use_cpu": True, "save_strategy": "no"}
    trainer = preference.make_trainer(config, base, None, tokenizer, train.select(range(4)), None, arguments, [])
    tensors = [*trainer.ref_model.parameters(), *trainer.ref_model.buffers()]  # the rotary table too
    held = sum(t.numel() * t.element_size() for t in tensors)
    assert held == b.ref_model and trainer.ref_model is not trainer.model  # a copy, run under no_grad
