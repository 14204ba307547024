"""Every technique option: a few real training steps where this machine can run it, and a refusal
with one sentence (option, why, what instead) where it cannot."""

from __future__ import annotations

import io

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import Capabilities
from backend.training.model import techniques
from backend.training.model.techniques import plan_techniques
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.conftest import PRESET

CPU = Capabilities(cuda=False, bitsandbytes="0.50.2")
GPU_NO_FLASH = Capabilities(cuda=True, bf16=True, flash_attn=False)


def run_job(tmp_path, overrides: list[str], name: str = "run") -> list:
    """Run the fine-tune job in-process for 3 small steps; returns every event it wrote."""
    from backend.jobs.finetune import run_finetune
    from backend.core.protocol import decode_event

    config = RunConfig.load(PRESET, ["train.max_steps=3", "train.save_steps=100", "data.max_examples=48",
                                     "train.seq_len=128", "train.micro_batch_size=4", "data.validation_split=0",
                                     *overrides])
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True)
    stream = io.StringIO()
    reporter = Reporter(stream)
    reporter.attach_run(run_dir)
    run_finetune(config, run_dir, reporter, StopListener(io.StringIO()), capabilities=CPU)
    reporter.close()
    return [decode_event(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def run_steps(tmp_path, overrides: list[str]) -> tuple[list[float], dict]:
    """Run the fine-tune job in-process for 3 steps; returns the losses and the JobFinished event."""
    events = run_job(tmp_path, overrides)
    losses = [e.loss for e in events if e.type == "MetricsLogged"]
    return losses, events[-1].model_dump()


RUNNABLE_HERE = [
    ["technique.method=lora"],
    ["technique.method=dora"],
    ["technique.method=qlora"],
    ["technique.method=lora8"],
    ["technique.method=full"],
    ["technique.gradient_checkpointing=true"],
    ["technique.attention=eager"],
    ["technique.attention=sdpa"],
    ["technique.precision=bf16"],
    ["technique.precision=fp32"],
    ["technique.packing=true"],
    ["technique.neftune_alpha=5"],
    ["technique.optimizer=adamw_8bit"],
    ["technique.optimizer=paged_adamw_8bit"],
    ["train.gradient_accumulation_steps=2"],
    ["technique.lora_targets=q_proj,v_proj", "technique.lora_dropout=0.1"],
]


@pytest.mark.parametrize("overrides", RUNNABLE_HERE, ids=lambda o: ",".join(o))
def test_option_trains_on_cpu(bundled_model, tmp_path, overrides):
    losses, finished = run_steps(tmp_path, overrides)
    assert finished["type"] == "JobFinished", finished
    assert len(losses) == 3 and all(loss == loss and loss < 20 for loss in losses)
    saved = "model" if "technique.method=full" in overrides else "adapter"
    assert (tmp_path / "run" / saved).is_dir()


def test_full_tuning_saves_a_whole_model(bundled_model, tmp_path):
    _, finished = run_steps(tmp_path, ["technique.method=full"])
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert finished["adapter_path"].endswith("model")


REFUSED_ON_CPU = [
    ("technique.liger_kernel=true", "technique.liger_kernel: Liger's fused kernels are Triton kernels and need a CUDA GPU",
     "liger_kernel off"),
    ("technique.torch_compile=true", "technique.torch_compile: torch.compile on the CPU", "torch_compile off"),
    ("technique.precision=fp16", "technique.precision: fp16", "bf16 or fp32"),
    ("technique.attention=flash_attention_2", "technique.attention: flash_attention_2 needs a CUDA GPU", "sdpa"),
    ("technique.offload=zero2_optimizer,hardware.strategy=deepspeed_zero2",
     "technique.offload: DeepSpeed offload needs a CUDA GPU", "offload: none"),
    ("technique.offload=zero3_optimizer_params,hardware.strategy=deepspeed_zero3", "technique.offload", "offload: none"),
]


@pytest.mark.parametrize("override, message, instead", REFUSED_ON_CPU)
def test_impossible_here_is_refused_before_loading(override, message, instead):
    config = RunConfig.load(PRESET, override.split(","))
    with pytest.raises(JobError) as caught:
        plan_techniques(config, CPU)
    assert caught.value.kind == "bad_input"
    assert message in caught.value.message and instead in caught.value.hint


@pytest.mark.parametrize("method, feature", [("qlora", "nf4"), ("lora8", "int8")])
def test_quantized_methods_refused_when_bitsandbytes_cannot(monkeypatch, method, feature):
    monkeypatch.setattr(techniques, "bnb_can", lambda f, d: "bitsandbytes is not installed" if f == feature else None)
    with pytest.raises(JobError, match=f"technique.method: {method} needs bitsandbytes"):
        plan_techniques(RunConfig.load(PRESET, [f"technique.method={method}"]), CPU)


def test_bitsandbytes_is_probed_not_assumed():
    techniques.bnb_can.cache_clear()
    assert techniques.bnb_can("nf4", "cpu") is None  # seen working with bitsandbytes 0.50.2 on the CPU
    assert techniques.bnb_can("teleport", "cpu") == "unknown feature teleport"


def test_auto_choices_are_reported():
    cpu = plan_techniques(RunConfig.load(PRESET), CPU)
    assert (cpu.precision, cpu.attention) == ("fp32", "sdpa")
    assert any("auto -> sdpa (no CUDA)" in note for note in cpu.notes)
    gpu = plan_techniques(RunConfig.load(PRESET), GPU_NO_FLASH)
    assert (gpu.precision, gpu.attention, gpu.load_dtype) == ("bf16", "sdpa", torch.bfloat16)
    assert any("flash-attn not installed" in note for note in gpu.notes)
    with_flash = plan_techniques(RunConfig.load(PRESET), Capabilities(cuda=True, bf16=True, flash_attn=True))
    assert with_flash.attention == "flash_attention_2"


@pytest.mark.parametrize("override, native, expected", [
    ([], True, True),
    ([], False, False),  # no AVX512-BF16/AMX: bf16 would be emulated, slower than fp32
    (["technique.precision=fp32"], True, False),  # asked for fp32: fp32 everywhere
    (["technique.method=dora"], True, False),  # DoRA runs peft's own forward
    (["technique.method=full"], True, False),  # the base is trained: fp32 weights
])
def test_cpu_base_products_in_bf16_only_where_native_and_asked_auto(monkeypatch, override, native, expected):
    monkeypatch.setattr(techniques, "native_bf16", lambda: native)
    plan = plan_techniques(RunConfig.load(PRESET, override), CPU)
    assert plan.bf16_base is expected
    assert ("base products bf16" in plan.summary()) is expected
    if expected:
        assert plan.precision == "fp32" and plan.load_dtype == torch.float32
    gpu = plan_techniques(RunConfig.load(PRESET, override), GPU_NO_FLASH)
    assert gpu.bf16_base is False


def test_paged_optimizer_falls_back_with_a_note():
    plan = plan_techniques(RunConfig.load(PRESET, ["technique.optimizer=paged_adamw_8bit"]), CPU)
    assert plan.optimizer == "adamw_bnb_8bit"
    assert any("paged_adamw_8bit -> adamw_8bit" in note for note in plan.notes)


def test_lora_rank_larger_than_a_layer_is_refused(bundled_model, tmp_path):
    with pytest.raises(JobError, match="technique.lora_rank 1024 is larger than the smallest adapted layer"):
        run_steps(tmp_path, ["technique.lora_rank=1024"])


@pytest.mark.parametrize("attention, bounds", [("sdpa", True), ("eager", True), ("sdpa_packed", True),
                                               ("sdpa_packed", False)])
def test_packing_gives_the_same_loss_as_padding(bundled_model, attention, bounds, monkeypatch):
    """Padding-free packing must not let examples see each other: same loss and gradients within 1e-5,
    whether the boundaries come from the position ids (a block-diagonal mask: sdpa, eager) or from the
    collator's cu_seq_lens or, without them, the position ids (one causal SDPA per example, no mask:
    sdpa_packed, what training loads for sdpa)."""
    from transformers import AutoModelForCausalLM

    from backend.training.tokenized import PackingCollator, PadCollator
    from backend.training.shortcuts.packed_attention import register

    register()
    model = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32, attn_implementation=attention)
    g = torch.Generator().manual_seed(0)
    features = []
    for n in (9, 17, 5, 30):
        ids = torch.randint(10, 200, (n,), generator=g).tolist()
        features.append({"input_ids": ids, "labels": [-100] * 2 + ids[2:]})

    def loss_and_grads(batch):
        model.zero_grad()
        # Training runs without a KV cache; with one, transformers does not look for packed rows.
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    padded, padded_grads = loss_and_grads(PadCollator(pad_id=0)(features))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append((a[0].shape[2], k.get("attn_mask"))) or sdpa(*a, **k))
    batch = PackingCollator()(features)
    if not bounds:
        batch = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    packed, packed_grads = loss_and_grads(batch)
    if attention == "sdpa_packed":  # one call per example and layer, each over its own tokens only, no mask
        assert calls == [(n, None) for n in (9, 17, 5, 30)] * model.config.num_hidden_layers
    assert abs(padded - packed) < 1e-5, (padded, packed)
    assert len(padded_grads) == len(packed_grads) > 0
    assert max((a - b).abs().max().item() for a, b in zip(padded_grads, packed_grads)) < 1e-5


def test_offload_needs_the_deepspeed_strategy():
    from backend.core.config.run_config import ConfigError

    with pytest.raises(ConfigError, match="technique.offload runs through DeepSpeed"):
        RunConfig.load(PRESET, ["technique.offload=zero2_optimizer"])


def test_tokenization_is_cached_and_reused(bundled_model, tmp_path):
    from transformers import AutoTokenizer

    from backend.training.tokenized import build_datasets

    tokenizer = AutoTokenizer.from_pretrained(bundled_model)
    config = RunConfig.load(PRESET, ["data.max_examples=40"])
    first, _, stats1 = build_datasets(config, tokenizer)
    second, _, stats2 = build_datasets(config, tokenizer)
    assert (stats1.from_cache, stats2.from_cache) == (False, True)
    assert first["input_ids"] == second["input_ids"] and first["labels"] == second["labels"]
    _, _, stats3 = build_datasets(RunConfig.load(PRESET, ["data.max_examples=40", "train.seq_len=64"]), tokenizer)
    assert stats3.from_cache is False  # a different length rule is a different cache entry


def test_throughput_and_mfu_are_reported(tmp_path, bundled_model):
    _, finished = run_steps(tmp_path, [])
    assert finished["tokens_per_s"] > 0
    assert 0 < finished["mfu"] < 1.5  # against this machine's measured peak (re-measured if beaten)


def test_training_shortcuts_change_no_loss(bundled_model, tmp_path, monkeypatch):
    """The job's own shortcuts (logits at the loss positions, the last layer on those rows, per-example
    attention for packed rows, rank-first LoRA products) give the losses of `technique.shortcuts: off`,
    the plain transformers + peft computation, with activation checkpointing too (its recomputation
    inside backward must see the same rows)."""
    monkeypatch.setattr(techniques, "native_bf16", lambda: False)  # exact fp32; bf16 products: next test
    shortcut, _ = run_steps(tmp_path / "a", [])
    checkpointed, _ = run_steps(tmp_path / "b", ["technique.gradient_checkpointing=true"])
    plain, _ = run_steps(tmp_path / "c", ["technique.shortcuts=off"])
    assert len(plain) == 3
    for losses in (shortcut, checkpointed):
        assert max(abs(a - b) for a, b in zip(losses, plain)) < 1e-5, (losses, plain)


def test_bf16_base_products_train_as_fp32_does(bundled_model, tmp_path, monkeypatch):
    """The CPU's bf16 base products (forced on here, so that a CPU without native bf16 tests them too):
    the same losses as exact fp32 within bf16 rounding, and the base's products really ran in bf16."""
    from backend.core.cpu_features import native_bf16
    from backend.training.shortcuts import lora_matmul

    native = native_bf16()
    monkeypatch.setattr(techniques, "native_bf16", lambda: True)
    calls = []
    original = lora_matmul.Bf16Product.apply
    monkeypatch.setattr(lora_matmul.Bf16Product, "apply", lambda *a: calls.append(1) or original(*a))
    mixed, finished = run_steps(tmp_path / "a", [])
    # MFU is taken against the bf16 peak: an emulated one (no AVX512-BF16/AMX) is slower than fp32
    assert calls and 0 < finished["mfu"] < (1.5 if native else float("inf"))
    exact, _ = run_steps(tmp_path / "b", ["technique.precision=fp32"])
    assert len(mixed) == len(exact) == 3
    assert max(abs(a - b) / b for a, b in zip(mixed, exact)) < 5e-3, (mixed, exact)
    recomputed, _ = run_steps(tmp_path / "c", ["technique.gradient_checkpointing=true"])
    assert max(abs(a - b) for a, b in zip(recomputed, mixed)) < 1e-5  # recomputation runs the same bf16 products


def test_sdpa_packed_generates_as_sdpa_does(bundled_model):
    """Models load as sdpa_packed for chat and evaluation too: prefill and cached decoding unchanged."""
    from transformers import AutoModelForCausalLM

    from backend.training.shortcuts.packed_attention import register

    ids = torch.randint(10, 200, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row: the mask path, not the per-example one
    outputs = []
    for name in ("sdpa", register()):
        model = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32, attn_implementation=name)
        with torch.no_grad():
            outputs.append(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                          pad_token_id=0))
    assert torch.equal(outputs[0], outputs[1])


def test_the_trainers_bookkeeping_shortcuts_change_no_figure(tmp_path, monkeypatch):
    """The cached parameter count and the trainable-only clip list give the Trainer's own numbers."""
    from transformers import Trainer

    from backend.training.counting_trainer import SupervisedCountingTrainer as CountingTrainer

    seen: list[float] = []
    original_flops = CountingTrainer.floating_point_ops
    monkeypatch.setattr(CountingTrainer, "floating_point_ops",
                        lambda self, inputs: seen.append(original_flops(self, inputs)) or seen[-1])
    fast = [(e.loss, e.grad_norm) for e in run_job(tmp_path, [], "fast")
            if e.type == "MetricsLogged"]
    monkeypatch.setattr(CountingTrainer, "_clip_grad_norm", Trainer._clip_grad_norm)
    monkeypatch.setattr(CountingTrainer, "floating_point_ops",
                        lambda self, inputs: seen.append(Trainer.floating_point_ops(self, inputs)) or seen[-1])
    plain = [(e.loss, e.grad_norm) for e in run_job(tmp_path, [], "plain")
             if e.type == "MetricsLogged"]
    assert fast == plain and all(norm for _, norm in fast)
    assert len(seen) == 6 and seen[:3] == seen[3:] and seen[0] > 0
