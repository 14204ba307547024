"""The shortcut registry and the attention choice: decided from the model's class and family before
loading, refused in one line where the model cannot, and said in the plan line."""

from __future__ import annotations

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import Capabilities
from backend.core.registries import shortcuts
from backend.training.model.loading import attention_implementation
from backend.training.model.model_facts import ModelFacts
from backend.training.model.techniques import plan_techniques
from tests.conftest import PRESET
from tests.families import FAMILIES, MOE, tiny_config

CPU = Capabilities(cuda=False, bitsandbytes="0.50.2")
GPU = Capabilities(cuda=True, bf16=True, flash_attn=False)
GPU_FLASH = Capabilities(cuda=True, bf16=True, flash_attn=True)
GPU_LIGER = Capabilities(cuda=True, bf16=True, flash_attn=False, liger_kernel=True)  # as probe_capabilities finds it


def facts(family: str, **overrides) -> ModelFacts:
    return ModelFacts.of_config(tiny_config(family, **overrides))


def plan(family: str, overrides: list[str] = (), caps: Capabilities = CPU, threads: int = 1, **config_overrides):
    return plan_techniques(RunConfig.load(PRESET, list(overrides)), caps, facts(family, **config_overrides),
                           world_size=1, threads=threads)


def test_the_registry_covers_the_tested_families_only():
    assert shortcuts.ALL == set(FAMILIES)
    for shortcut in shortcuts.SHORTCUTS:  # image rows' shortcuts: the vision families test_vision_packing.py runs
        tested = (shortcuts.ALL if "text" in shortcut.rows else set()) | (
            shortcuts.PACKED_IMAGE_FAMILIES if "image" in shortcut.rows else set())
        assert shortcut.families <= tested and shortcut.devices <= {"cpu", "cuda"}
    assert [s.name for s in shortcuts.SHORTCUTS if not s.exact] == ["bf16_base"]


def test_model_facts_come_from_the_class_without_loading(tmp_path):
    gemma = facts("gemma2")
    assert (gemma.known, gemma.class_name, gemma.supports_sdpa, gemma.attention_softcapping) == (
        True, "Gemma2ForCausalLM", False, True)
    assert facts("llama").supports_sdpa and not facts("llama").moe
    mixtral = facts("mixtral")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.router_aux_loss_coef) == (4, 2, 0.001)
    assert facts("gemma3_text").sliding_window and not facts("qwen2").sliding_window  # qwen2: use_sliding_window off
    (tmp_path / "config.json").write_text('{"model_type": "no_such_family"}')
    assert ModelFacts.read(tmp_path) == ModelFacts.unknown()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attention_auto_asks_the_model(family):
    cpu = plan(family)
    expected = "eager" if family == "gemma2" else "sdpa"
    assert cpu.attention == expected
    if family == "gemma2":
        assert any("auto -> eager (Gemma2ForCausalLM does not support SDPA" in n for n in cpu.notes)
        assert attention_implementation(cpu) == "eager"
    gpu_flash = plan(family, caps=GPU_FLASH)
    assert gpu_flash.attention == "flash_attention_2"  # every family here supports FlashAttention-2


def test_explicit_sdpa_on_gemma2_is_refused_in_one_line_before_loading():
    with pytest.raises(JobError) as caught:
        plan("gemma2", ["technique.attention=sdpa"])
    message = caught.value.message
    assert message.startswith("technique.attention: Gemma2ForCausalLM does not support sdpa") and "\n" not in message
    assert "soft-capped" in message and "eager" in caught.value.hint


def test_flash_attention_on_a_class_without_it_is_refused():
    no_flash = ModelFacts(known=True, model_type="llama", class_name="OldForCausalLM", supports_flash_attn=False)
    config = RunConfig.load(PRESET, ["technique.attention=flash_attention_2", "technique.precision=bf16"])
    with pytest.raises(JobError, match="technique.attention: OldForCausalLM does not support flash_attention_2"):
        plan_techniques(config, GPU_FLASH, no_flash)
    assert plan_techniques(RunConfig.load(PRESET), GPU_FLASH, no_flash).attention == "sdpa"


def test_an_unknown_class_leaves_attention_to_transformers_and_runs_no_shortcut():
    p = plan_techniques(RunConfig.load(PRESET), CPU, ModelFacts.unknown())
    assert p.attention == "" and attention_implementation(p) is None
    assert p.shortcuts.applied == () and "shortcuts skipped: this model is not a family" in p.summary()
    olmo = ModelFacts(known=True, model_type="olmo", class_name="OlmoForCausalLM")
    text = plan_techniques(RunConfig.load(PRESET), CPU, olmo).summary()
    assert "shortcuts skipped: olmo is not a family their exactness tests cover (plain transformers + peft)" in text


@pytest.mark.parametrize("family, expected", [
    ("llama", ["loss_positions", "last_layer_rows", "sdpa_packed"]),
    ("gemma2", ["loss_positions", "last_layer_rows"]),  # eager: no per-example SDPA
    ("gemma3_text", ["loss_positions", "last_layer_rows"]),  # sliding windows keep SDPA's mask
    ("gpt2", ["loss_positions", "sdpa_packed"]),  # Conv1D and `h` blocks: no rows, no rank-first
    ("mixtral", ["loss_positions", "sdpa_packed"]),  # the aux loss reads every row of the last layer
])
def test_shortcuts_chosen_per_family(family, expected):
    p = plan(family)
    assert [n for n in p.shortcuts.applied if n in ("loss_positions", "last_layer_rows", "sdpa_packed")] == expected
    assert "shortcuts " + ", ".join(p.shortcuts.applied) in p.summary()
    wants_packed = "sdpa_packed" in expected
    assert (attention_implementation(p) == "sdpa_packed") is wants_packed


@pytest.mark.parametrize("overrides, caps, gone, why", [
    (["technique.packing=false"], CPU, "sdpa_packed", "packing off"),
    (["technique.attention=eager"], CPU, "sdpa_packed", "attention eager"),
    (["technique.torch_compile=true"], GPU, "loss_positions", "torch.compile"),
    (["technique.torch_compile=true"], GPU, "sdpa_packed", "torch.compile"),
    (["technique.liger_kernel=true"], GPU_LIGER, "loss_positions", "Liger"),
    (["technique.liger_kernel=true"], GPU_LIGER, "chunked_loss", "Liger"),
    (["technique.torch_compile=true"], GPU, "chunked_loss", "torch.compile"),
    (["hardware.strategy=fsdp", "hardware.num_processes=2"], GPU, "chunked_loss", "fsdp shards lm_head"),
    (["hardware.strategy=fsdp", "hardware.num_processes=2"], GPU, "last_layer_rows", "fsdp wraps"),
    (["technique.method=dora"], CPU, "rank_first_lora", "dora runs peft's forward"),
    (["technique.precision=bf16"], CPU, "rank_first_lora", "precision bf16"),
    (["train.cpu_threads=1"], CPU, "thread_choice", "train.cpu_threads is set"),
])
def test_conditions_turn_a_shortcut_off_and_say_why(monkeypatch, overrides, caps, gone, why):
    monkeypatch.setattr("backend.training.model.techniques.bnb_can", lambda feature, device: None)
    p = plan("llama", overrides, caps=caps, threads=4)
    assert gone not in p.shortcuts.applied
    assert why in dict(p.shortcuts.skipped)[gone]


def test_off_runs_the_plain_computation_and_a_yaml_off_means_off():
    p = plan("llama", ["technique.shortcuts=off"])  # --set parses a bare off as YAML's False
    assert p.shortcuts.applied == () and "shortcuts off (plain transformers + peft)" in p.summary()
    assert attention_implementation(p) == "sdpa" and not p.bf16_base


def test_gpu_runs_no_cpu_shortcut():
    p = plan("llama", caps=GPU)
    assert p.shortcuts.applied == ("loss_positions", "last_layer_rows", "chunked_loss", "sdpa_packed")
    assert "chunked_loss" not in plan("llama").summary()  # a CUDA shortcut: the CPU plan does not name it
    assert not any(name in p.summary() for name in ("rank_first_lora", "bf16_base", "thread_choice"))


def test_one_shortcut_can_be_left_out_for_the_benchmark(monkeypatch):
    monkeypatch.setenv(shortcuts.DISABLE_ENV, "loss_positions")
    p = plan("llama")
    assert "loss_positions" not in p.shortcuts.applied
    assert dict(p.shortcuts.skipped)["last_layer_rows"] == "needs loss_positions"


@pytest.mark.parametrize("family", sorted(MOE))
def test_moe_plan_says_what_all_linear_adapts_and_that_qlora_leaves_experts(family):
    p = plan(family, ["technique.method=qlora"])
    text = "; ".join(p.notes)
    experts = family != "qwen2_moe"  # peft 0.21 maps Mixtral's and Qwen3-MoE's fused experts, not Qwen2-MoE's
    # all-linear leaves them out where peft would take them (a fresh copy of every layer's experts per step)
    assert ("adapts the attention (q_proj,k_proj,v_proj,o_proj), not the 4 fused experts" in text) is experts
    assert ("not the 4 routed experts" in text) is not experts
    assert "the fused experts stay unquantized in the load dtype (bitsandbytes #1849)" in text
    assert "router aux loss on (x0.001)" in text and p.aux_loss


@pytest.mark.parametrize("override, field", [("technique.method=dora", "technique.method: dora"),
                                             ("technique.lora_dropout=0.1", "technique.lora_dropout")])
def test_what_peft_cannot_do_with_fused_experts_is_refused_before_loading(override, field):
    named = "technique.lora_targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    with pytest.raises(JobError) as caught:
        plan("qwen3_moe", [override, named])
    assert caught.value.message.startswith(field) and "fused experts" in caught.value.message
    assert "all-linear" in caught.value.hint
    notes = "; ".join(plan("qwen3_moe", [named]).notes)
    assert "adapts Qwen3MoeForCausalLM's 4 fused experts" in notes and "exports merge it into every expert" in notes
    plan("qwen3_moe", [override])  # all-linear leaves the experts out: then it can
    plan("qwen2_moe", [override, named])  # peft does not map this family's experts at all


def test_counts_are_reduced_on_the_process_groups_device(monkeypatch):
    """NCCL reduces CUDA tensors only; gloo (the CPU test in test_distributed.py) CPU tensors."""
    import io

    from backend.training.callbacks import ReportingCallback, collective_device
    from backend.runtime.stop_listener import StopListener

    assert collective_device("gloo") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert collective_device("nccl") == torch.device("cuda", 1)

    seen = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "gloo")
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: seen.append(tensor.device))
    callback = ReportingCallback(reporter=None, stop=StopListener(io.StringIO()), device="cpu")
    callback.trainer = type("T", (), {"trained_tokens": 5, "input_tokens": 50, "head_tokens": 5, "row_tokens": 5})()
    callback._sync()
    assert seen == [torch.device("cpu")] * 2 and callback._all_tokens == 5 and callback._counts == (50, 5, 5)


def test_rank_first_lora_only_where_it_was_measured_to_pay():
    """Session 7: it pays at hidden 256 and 1024 and costs at 2048 (docs/benchmarks.md)."""
    assert "rank_first_lora" in plan("llama", hidden_size=shortcuts.RANK_FIRST_MAX_HIDDEN).shortcuts.applied
    wide = plan("llama", hidden_size=2048)
    assert "rank_first_lora" not in wide.shortcuts.applied
    assert dict(wide.shortcuts.skipped)["rank_first_lora"] == "hidden 2048 > 1024, where it does not pay"


def test_each_rank_loads_onto_its_own_gpu(monkeypatch):
    """Under accelerate launch a quantized base stays where it was loaded: rank N must load onto cuda:N."""
    from backend.training.model.loading import rank_device

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert rank_device("cuda") == "cuda" and rank_device("cpu") == "cpu"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_device("cuda") == "cuda:1" and rank_device("cpu") == "cpu"
