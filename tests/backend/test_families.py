"""Every family trains through the real job with every technique this CPU runs: a tiny random-weight
model of each family (tests/families.py), built here, 3 steps on one repeated batch of the demo
data. Each technique runs on each family at least once, spread over five runs per family (one per
method) rather than the full product. Each run must lower the loss, save its adapter or model, and
say in its plan line the attention and the shortcuts that ran (the same that were installed).
What a family cannot do is refused before loading, in one line."""

from __future__ import annotations

import io
import json
import logging

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import Capabilities, decode_event
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.conftest import PRESET
from tests.families import FAMILIES, MOE, build_tiny_model

CPU = Capabilities(cuda=False, bitsandbytes="0.50.2")
ATTENTION = "technique.lora_targets=q_proj,k_proj,v_proj,o_proj"  # for DoRA on MoE: peft has no DoRA for fused experts

# One run per method; between them every family meets: sdpa (auto) and eager, packing on and off,
# gradient checkpointing, fp32 and bf16, AdamW and 8-bit Adam, NEFTune.
RUNS = {
    "lora": ["technique.gradient_checkpointing=true"],
    "dora": ["technique.attention=eager", "technique.packing=false", "technique.optimizer=adamw_8bit"],
    "qlora": ["technique.precision=bf16"],
    "lora8": ["technique.optimizer=paged_adamw_8bit"],
    "full": ["technique.precision=bf16", "technique.packing=false", "technique.neftune_alpha=5"],
}
# What the registry must choose for the lora run (fp32, sdpa, packing): see shortcuts.py.
DENSE_SHORTCUTS = ["loss_positions", "last_layer_rows", "sdpa_packed", "rank_first_lora"]
EXPECTED_SHORTCUTS = {
    **{family: DENSE_SHORTCUTS for family in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox")},
    "gemma2": ["loss_positions", "last_layer_rows", "rank_first_lora"],  # eager attention
    "gemma3_text": ["loss_positions", "last_layer_rows", "rank_first_lora"],  # sliding windows
    "gpt2": ["loss_positions", "sdpa_packed"],  # Conv1D, no `layers`
    **{family: ["loss_positions", "sdpa_packed", "rank_first_lora"] for family in MOE},  # aux loss: all rows
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    return {family: build_tiny_model(family, folder / family) for family in FAMILIES}


@pytest.fixture(autouse=True)
def one_peak(monkeypatch):
    """MFU's peak, measured once per test home otherwise: a fixed figure here (MFU is test_mfu's)."""
    monkeypatch.setattr("backend.jobs.finetune.peak_flops", lambda device, dtype: 5e10)


def run_family(tmp_path, model, overrides: list[str], caplog) -> tuple[list, list[str]]:
    from backend.jobs.finetune import run_finetune

    config = RunConfig.load(PRESET, [f"model.path={model}", "train.max_steps=3", "train.save_steps=100",
                                     "data.max_examples=4", "train.micro_batch_size=4", "train.seq_len=64",
                                     "data.validation_split=0", "train.cpu_threads=1", *overrides])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reporter = Reporter(io.StringIO())
    reporter.attach_run(run_dir)
    with caplog.at_level(logging.INFO, logger="backend.jobs.finetune"):
        try:
            run_finetune(config, run_dir, reporter, StopListener(io.StringIO()), capabilities=CPU)
        finally:
            reporter.close()
    installed = [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.getMessage().startswith("shortcuts in place")]
    events = [decode_event(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return events, installed[-1].split(", ") if installed and installed[-1] != "none" else []


@pytest.mark.parametrize("method", sorted(RUNS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trains_with_technique(models, tmp_path, caplog, family, method):
    overrides = [f"technique.method={method}", *RUNS[method]]
    if method == "dora" and family in MOE:
        overrides.append(ATTENTION)
    events, installed = run_family(tmp_path, models[family], overrides, caplog)
    finished = events[-1]
    assert finished.type == "JobFinished", finished
    losses = [e.loss for e in events if e.type == "MetricsLogged"]
    assert len(losses) == 3 and losses[-1] < losses[0], losses  # one batch, seen three times
    saved = tmp_path / "run" / ("model" if method == "full" else "adapter")
    assert (saved / ("model.safetensors" if method == "full" else "adapter_model.safetensors")).is_file()
    assert finished.mfu and 0 < finished.mfu
    if method != "full":  # GPT-2's Conv1D weights are (in, out): the adapter must say so to merge right;
        # quantized, bitsandbytes has already made them (out, in) linears
        adapter = json.loads((saved / "adapter_config.json").read_text())
        assert adapter["fan_in_fan_out"] is (family == "gpt2" and method not in ("qlora", "lora8"))

    plan = next(e.detail for e in events if e.type == "PhaseChanged" and e.phase == "plan")
    attention = "eager" if family == "gemma2" or method == "dora" else "sdpa"
    assert f"attention {attention}," in plan
    applied = plan.split("shortcuts ", 1)[1].split(" (not used", 1)[0].split(";")[0].split(", ")
    assert applied == installed  # the plan line names what ran
    if method == "lora":
        from backend.core.cpu_features import native_bf16

        bf16 = ["bf16_base"] if native_bf16() and family != "gpt2" else []  # a CPU with bf16 products
        assert applied == EXPECTED_SHORTCUTS[family] + bf16
    if family in MOE:
        assert "router aux loss on" in plan
        if method in ("qlora", "lora8"):
            assert "the fused experts stay unquantized" in plan
    if family == "gemma2" and method == "lora":
        assert "attention auto -> eager (Gemma2ForCausalLM does not support SDPA" in plan


@pytest.mark.parametrize("family, overrides, message", [
    ("gemma2", ["technique.attention=sdpa"], "technique.attention: Gemma2ForCausalLM does not support sdpa"),
    ("mixtral", ["technique.method=dora", "technique.lora_targets=q_proj,v_proj,w1,w2,w3"],
     "technique.method: dora cannot adapt MixtralForCausalLM's fused experts"),
    ("qwen3_moe", ["technique.lora_dropout=0.1", "technique.lora_targets=q_proj,gate_proj,up_proj,down_proj"],
     "technique.lora_dropout: peft adapts Qwen3MoeForCausalLM's fused"),
])
def test_what_a_family_cannot_do_is_refused_before_loading(models, tmp_path, caplog, family, overrides, message):
    with pytest.raises(JobError) as caught:
        run_family(tmp_path, models[family], overrides, caplog)
    assert caught.value.message.startswith(message) and "\n" not in caught.value.message
    phases = [e.phase for e in (decode_event(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines())
              if e.type == "PhaseChanged"]
    assert "load_model" not in phases


def test_qlora_keeps_moe_experts_in_their_dtype(models):
    """peft's k-bit preparation upcasts every 16-bit parameter to fp32, the unquantized fused experts too
    (twice their memory); the loader casts them back."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from backend.training.model.moe import keep_experts_dtype

    def load():
        return AutoModelForCausalLM.from_pretrained(
            models["mixtral"], dtype=torch.bfloat16, device_map={"": "cpu"},
            quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16))

    def experts(model):
        return {p.dtype for name, p in model.named_parameters() if name.endswith("experts.gate_up_proj")}

    assert experts(prepare_model_for_kbit_training(load(), use_gradient_checkpointing=False)) == {torch.float32}
    kept = keep_experts_dtype(load(), lambda m: prepare_model_for_kbit_training(m, use_gradient_checkpointing=False))
    assert experts(kept) == {torch.bfloat16}
    assert {p.dtype for n, p in kept.named_parameters() if "norm" in n} == {torch.float32}  # the rest as peft does


def test_a_moe_run_on_all_linear_exports_merged(models, tmp_path, caplog):
    """all-linear on Mixtral leaves the fused experts out (peft would wrap them, and a merged export of
    such adapters is refused): the default run trains, and its adapter merges and passes its check."""
    from backend.core.runs.run_folder import RunFolder
    from tests.backend.test_export import export

    events, _ = run_family(tmp_path, models["mixtral"], [], caplog)
    plan = next(e.detail for e in events if e.type == "PhaseChanged" and e.phase == "plan")
    assert "not the 4 fused experts" in plan
    keys = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert set(keys) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    RunConfig.load(PRESET, [f"model.path={models['mixtral']}", "data.max_examples=4", "train.seq_len=64",
                            "data.validation_split=0"]).save(tmp_path / "run" / "config.yaml")
    done, report = export(RunFolder(tmp_path / "run"), "merged")
    assert done[-1]["type"] == "JobFinished", done[-1]
    assert report["passed"] and report["method"] == "lora"
