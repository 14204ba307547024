"""Exports of a short run of the bundled model: each format written, reloaded by the library that owns
it, and checked; the QLoRA merge path; the refusals and the clean-up after a full disk or a stop.

Two runs are trained once per module in-process (5 steps each, one thread). Exports run in-process
through run_export (the worker's job function) except two that go through the real CLI and worker.
"""

from __future__ import annotations

import errno
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.runs.run_folder import RunFolder
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.conftest import BUNDLED_MODEL, PRESET, ROOT

torch.set_num_threads(1)
IDS = torch.tensor([[1, 4, 300, 517, 700, 911, 1200, 2, 5, 64, 128]])


def _train(root: Path, name: str, *overrides: str, check_adapter: bool = True) -> RunFolder:
    from backend.jobs.finetune import run_finetune

    config = RunConfig.load(PRESET, ["train.max_steps=5", "train.cpu_threads=1", f"name={name}", *overrides])
    folder = RunFolder.create(config, root=root)
    reporter = Reporter(io.StringIO())
    reporter.attach_run(folder.path)
    run_finetune(config, folder.path, reporter, StopListener(io.StringIO()))
    reporter.close()
    if check_adapter:
        assert (folder.adapter_dir / "adapter_model.safetensors").is_file()
    return folder


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("export-runs")


@pytest.fixture(scope="module")
def lora_run(runs_root) -> RunFolder:
    return _train(runs_root, "export-lora")


@pytest.fixture(scope="module")
def qlora_run(runs_root) -> RunFolder:
    from backend.training.model.techniques import bnb_can

    if bnb_can("nf4", "cpu"):
        pytest.skip("bitsandbytes 4-bit does not work on this CPU (the QLoRA path is then covered by `gpu` runs)")
    return _train(runs_root, "export-qlora", "technique.method=qlora")


def export(folder: RunFolder, fmt: str, stop: StopListener | None = None, reporter_hook=None, **params):
    """run_export in-process -> (events, report dict or None)."""
    from backend.jobs.export import run_export

    stream = io.StringIO()
    reporter = Reporter(stream)
    if reporter_hook:
        reporter.emit = reporter_hook(reporter.emit)
    config = folder.load_config()
    try:
        run_export(config, folder.path, reporter, stop or StopListener(io.StringIO()), params={"format": fmt, **params})
    finally:
        reporter.close()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    out = Path(params.get("out") or folder.path / "exports" / fmt)
    report = json.loads((out / "export_report.json").read_text()) if (out / "export_report.json").is_file() else None
    return events, report


def reference_logits(folder: RunFolder) -> torch.Tensor:
    """The trained model computed independently of the export code: plain base + plain peft, fp32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder.adapter_dir).eval()
    with torch.no_grad():
        return model(IDS).logits


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


FP16_LOGITS = 2e-2
"""Max |logit difference| of a 16-bit (fp16) export of the tiny run: its logits reach |10|, where fp16
values lie 2^-7 = 0.0078 apart, so one or two rounding steps of the weights show as 0.01-0.016."""


def leftovers(out: Path) -> list[Path]:
    return [p for p in out.parent.glob(f".{out.name}.*")] if out.parent.exists() else []


# --- every format ------------------------------------------------------------------------------


def test_adapter_export_loads_with_plain_peft(lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    events, report = export(lora_run, "adapter")
    out = lora_run.path / "exports" / "adapter"
    assert events[-1]["type"] == "JobFinished" and report["passed"] is True
    # The same tensors on the same base, computed the same way: identical figures.
    assert abs(check(report, "perplexity")["measured"]) <= 1e-6 and check(report, "top1")["measured"] == 1.0
    assert report["figures"]["max_abs_logit_diff"] == 0.0
    assert set(report["timings"]) == {"reference", "write", "check"}  # the check's time apart from the write's
    assert "tokens fed (budget 512)" in report["check"]["budget"] and report["check"]["dtype"] == "bf16"
    memory = report["memory"]
    assert set(memory["peak_rss_bytes"]) >= {"reference", "write", "check"}
    for stage, own in memory["peak_anonymous_bytes"].items():  # a part of what is resident, never more
        assert 0 < own <= memory["peak_rss_bytes"][stage], stage
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= {f["name"] for f in report["files"]}
    base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    with torch.no_grad():
        got = PeftModel.from_pretrained(base, out).eval()(IDS).logits
    assert torch.allclose(got, reference_logits(lora_run), atol=1e-5)
    phases = [e["phase"] for e in events if e["type"] == "PhaseChanged"]
    assert phases[:6] == ["check", "load_model", "measure", "write", "verify", "report"]


@pytest.mark.parametrize("dtype, bound", [(None, 0.1), ("fp16", FP16_LOGITS)])
def test_merged_export_loads_with_plain_transformers(lora_run, dtype, bound, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.core.registries.export_formats import tolerance

    out = tmp_path / f"merged-{dtype}"
    events, report = export(lora_run, "merged", out=str(out), **({"dtype": dtype} if dtype else {}))
    assert events[-1]["type"] == "JobFinished", events[-1]
    saved = dtype or "bf16"  # the bundled base is fp32: the default 16-bit type is then bf16
    assert report["passed"] and report["dtype"] == saved
    max_increase, min_top1 = tolerance("merged", saved)
    assert check(report, "perplexity")["tolerance"] == max_increase and check(report, "top1")["tolerance"] == min_top1
    assert 0 < report["rounding"]["relative_error"] < 1
    assert (out / "model.safetensors").is_file() and not (out / "model.safetensors.index.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == ("bfloat16" if saved == "bf16" else "float16") and config["use_cache"] is True
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16 if saved == "bf16" else torch.float16}
    assert not any("lora" in name for name, _ in model.named_parameters())
    with torch.no_grad():
        got = model.float()(IDS).logits
    assert (got - reference_logits(lora_run)).abs().max().item() <= bound  # the files: only 16-bit rounding
    # Written with --out elsewhere, the run still knows it: `serve RUN` and `serve-estimate RUN` find it.
    from backend.serving import resolve

    assert lora_run.recorded_exports()[-1]["path"] == str(out.absolute())
    assert resolve(str(lora_run.path), "merged").serve_path == str(out.absolute())
    tokenizer = AutoTokenizer.from_pretrained(out)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|bos|><|user|>\nhi<|end|>\n<|assistant|>\n"
    assert not leftovers(out)


@pytest.mark.parametrize("fmt, layer", [("bnb-8bit", "Linear8bitLt"), ("bnb-4bit", "Linear4bit")])
def test_bnb_export_loads_quantized(lora_run, fmt, layer):
    from transformers import AutoModelForCausalLM

    events, report = export(lora_run, fmt)
    assert events[-1]["type"] == "JobFinished", events[-1]
    ppl = check(report, "perplexity")
    assert ppl["passed"] and ppl["tolerance"] == (0.05 if fmt == "bnb-8bit" else 0.25)
    assert ppl["figures"]["reference_perplexity"] > 1 and math.isfinite(ppl["figures"]["export_perplexity"])
    model = AutoModelForCausalLM.from_pretrained(lora_run.path / "exports" / fmt, device_map={"": "cpu"})
    assert sum(type(m).__name__ == layer for m in model.modules()) == 28  # 4 layers x 7 projections
    assert not (lora_run.path / "exports" / fmt / ".scratch-16bit").exists()


@pytest.mark.parametrize("fmt, qtype, logit_bound", [
    ("gguf-f16", "F16", FP16_LOGITS), ("gguf-q8_0", "Q8_0", 0.2), ("gguf-q5_0", "Q5_0", 0.5), ("gguf-q4_0", "Q4_0", 1.0),
])
def test_gguf_export_reads_back_with_gguf_reader(lora_run, fmt, qtype, logit_bound):
    import gguf
    from transformers import AutoModelForCausalLM

    events, report = export(lora_run, fmt)
    assert events[-1]["type"] == "JobFinished", events[-1]
    out = lora_run.path / "exports" / fmt
    assert report["passed"] and check(report, "tokenizer")["measured"] == "identical"
    assert sum(e["type"] == "MetricsLogged" for e in events) >= 1  # per-tensor progress
    reader = gguf.GGUFReader(out / "model.gguf")
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "llama"
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "gpt-2"
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == 4096 and tokens[2] == "<|end|>"
    assert field("tokenizer.ggml.token_type")[:7] == [3] * 7  # the 7 special tokens are control tokens
    assert len(field("tokenizer.ggml.merges")) > 3000
    assert field("tokenizer.ggml.bos_token_id") == 1 and field("tokenizer.ggml.eos_token_id") == 2
    assert field("tokenizer.ggml.add_bos_token") is True
    assert "<|end|>" in field("tokenizer.chat_template")
    assert field("llama.attention.head_count_kv") == 2 and field("llama.block_count") == 4
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # tied embeddings: llama.cpp uses token_embd
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == qtype
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    embd = tensors["token_embd.weight"].tensor_type.name
    assert embd == ("Q8_0" if qtype in ("Q4_0", "Q5_0") else qtype)
    assert check(report, "perplexity")["verified"] is True and check(report, "top1")["verified"] is True
    assert "transformers' GGUF loader -> LlamaForCausalLM" in report["loaded_as"]
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf", dtype=torch.float32)
    with torch.no_grad():
        diff = (model(IDS).logits - reference_logits(lora_run)).abs().max().item()
    assert diff <= logit_bound, diff
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./model.gguf") and "PARAMETER stop <|end|>" in modelfile
    assert '{{ if eq .Role "user" }}' in modelfile or '{{ else if eq .Role "user" }}' in modelfile


def test_gguf_permutation_agrees_with_transformers_own_gguf_loader(lora_run):
    """An independent reader (transformers' GGUF integration, written to llama.cpp's conventions)."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    out = lora_run.path / "exports" / "gguf-f16"
    if not (out / "model.gguf").is_file():
        export(lora_run, "gguf-f16")
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf", dtype=torch.float32)
    with torch.no_grad():
        diff = (model(IDS).logits - reference_logits(lora_run)).abs().max().item()
    assert diff <= FP16_LOGITS, diff


def _hf_rope(x: np.ndarray, pos: int, base: float = 10000.0) -> np.ndarray:
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[: d // 2], x[d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin])


def _ggml_rope(x: np.ndarray, pos: int, base: float = 10000.0) -> np.ndarray:
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2], out[1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of gguf_tensors.permute, written independently: GGML's rotary rows back to halves."""
    shape = weights.shape
    return weights.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def test_qk_permutation_turns_hf_rotary_into_ggml_rotary_and_round_trips():
    from backend.export.gguf_tensors import permute

    rng = np.random.default_rng(0)
    n_head, n_kv, head_dim, hidden = 4, 2, 16, 32
    wq = rng.standard_normal((n_head * head_dim, hidden)).astype(np.float32)
    wk = rng.standard_normal((n_kv * head_dim, hidden)).astype(np.float32)
    assert np.array_equal(unpermute(permute(wq, n_head), n_head), wq)
    assert np.array_equal(unpermute(permute(wk, n_kv), n_kv), wk)
    x1, x2 = rng.standard_normal(hidden), rng.standard_normal(hidden)
    for head in range(n_head):
        kv = head // (n_head // n_kv)
        rows_q, rows_k = slice(head * head_dim, (head + 1) * head_dim), slice(kv * head_dim, (kv + 1) * head_dim)
        hf = _hf_rope(wq[rows_q] @ x1, 5) @ _hf_rope(wk[rows_k] @ x2, 2)
        gg = _ggml_rope(permute(wq, n_head)[rows_q] @ x1, 5) @ _ggml_rope(permute(wk, n_kv)[rows_k] @ x2, 2)
        assert abs(hf - gg) < 1e-3 * max(1.0, abs(hf))


# --- QLoRA: merged into the dequantized NF4 base -------------------------------------------------


def test_qlora_merge_uses_the_nf4_weights_the_adapter_trained_on(qlora_run, tmp_path):
    import bitsandbytes.functional as F
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    out = tmp_path / "qlora-merged"
    events, report = export(qlora_run, "merged", out=str(out), dtype="fp16")
    assert events[-1]["type"] == "JobFinished" and report["passed"]
    assert any("dequantized from the run's nf4" in n for n in report["notes"])
    name = "model.layers.1.self_attn.q_proj"
    nf4 = AutoModelForCausalLM.from_pretrained(
        BUNDLED_MODEL, dtype=torch.float32, device_map={"": "cpu"},
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32))
    weight = nf4.get_submodule(name).weight
    dequantized = F.dequantize_4bit(weight.data, weight.quant_state).float()
    original = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).get_submodule(name).weight
    adapter = load_file(qlora_run.adapter_dir / "adapter_model.safetensors")
    a = adapter[f"base_model.model.{name}.lora_A.weight"]
    b = adapter[f"base_model.model.{name}.lora_B.weight"]
    delta = (b @ a) * (16 / 8)  # lora_alpha / r of the preset
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).get_submodule(name).weight
    assert (merged - (dequantized + delta)).abs().max().item() < 1e-3  # fp16 rounding only
    assert (merged - (original + delta)).abs().max().item() > 5e-3  # the fp32 base would be another model


def test_qlora_adapter_export_and_bnb_4bit_failure_is_kept_and_named(qlora_run):
    events, report = export(qlora_run, "adapter")
    assert report["passed"] and abs(check(report, "perplexity")["measured"]) <= 1e-6
    with pytest.raises(JobError) as caught:
        export(qlora_run, "bnb-4bit")
    message = caught.value.message
    assert "failed its perplexity check" in message and "tolerance +25%" in message
    assert "NF4 grid" in caught.value.hint
    report = json.loads((qlora_run.path / "exports" / "bnb-4bit" / "export_report.json").read_text())
    assert report["passed"] is False and check(report, "perplexity")["measured"] > 0.25


# --- real depth, method full, failure hints ------------------------------------------------------


def deeper_bundled_model(folder: Path, repeat: int = 4) -> Path:
    """The bundled (pre-trained) model with its 4 layers repeated: 16 layers of real weights, stored bf16,
    so rounding accumulates through a depth closer to real models' than the bundled model's 4."""
    import copy

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    layers = [copy.deepcopy(layer) for _ in range(repeat) for layer in model.model.layers]
    for index, layer in enumerate(layers):
        layer.self_attn.layer_idx = index
    model.model.layers = torch.nn.ModuleList(layers)
    model.config.num_hidden_layers = len(layers)
    model.to(torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(BUNDLED_MODEL / name, folder / name)
    return folder


def test_tolerances_pass_a_bf16_merge_of_a_deeper_model(runs_root, tmp_path):
    base = deeper_bundled_model(tmp_path / "deep")
    run = _train(runs_root, "export-deep", f"model.path={base}", "train.max_steps=3", "train.seq_len=64")
    events, report = export(run, "merged", out=str(tmp_path / "merged"))
    assert events[-1]["type"] == "JobFinished", events[-1]
    assert report["dtype"] == "bf16"  # the base's own dtype
    ppl, top1 = check(report, "perplexity"), check(report, "top1")
    assert ppl["passed"] and top1["passed"] and top1["figures"]["decided_positions"] > 0
    assert report["figures"]["max_abs_logit_diff"] > 0  # rounding did change the logits


def test_full_fine_tune_exports_its_model_folder(runs_root, tmp_path):
    from safetensors.torch import load_file

    run = _train(runs_root, "export-full", "technique.method=full", "train.max_steps=2", "train.seq_len=64",
                 check_adapter=False)
    out = tmp_path / "full-merged"
    events, report = export(run, "merged", out=str(out), dtype="fp16")
    assert events[-1]["type"] == "JobFinished", events[-1]
    assert report["method"] == "full" and report["rounding"] is None
    trained = load_file(next((run.path / "model").glob("*.safetensors")))
    written = load_file(out / "model.safetensors")
    assert set(written) == set(trained)
    assert all(torch.equal(written[name], trained[name].to(torch.float16)) for name in trained)


def test_a_failed_check_names_it_and_suggests_another_format(lora_run, tmp_path, monkeypatch):
    import backend.jobs.export as job

    monkeypatch.setattr(job, "tolerance", lambda fmt, dtype: (-1.0, 0.5))  # no export can pass this
    out = tmp_path / "failing"
    with pytest.raises(JobError) as caught:
        export(lora_run, "merged", out=str(out), dtype="bf16")
    assert "merged export failed its perplexity check" in caught.value.message
    assert "--format merged --dtype fp16" in caught.value.hint and "--dtype bf16" not in caught.value.hint
    report = json.loads((out / "export_report.json").read_text())
    assert report["passed"] is False and check(report, "top1")["passed"] is True


def test_pre_quantized_base_is_refused_for_merging(lora_run, tmp_path):
    import yaml

    base = tmp_path / "prequantized"
    shutil.copytree(BUNDLED_MODEL, base)
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (base / "config.json").write_text(json.dumps(config))
    broken = _copy_run(lora_run, tmp_path)
    run_config = yaml.safe_load(broken.config_path.read_text())
    run_config["model"]["path"] = str(base)
    broken.config_path.write_text(yaml.safe_dump(run_config))
    with pytest.raises(JobError) as caught:
        export(broken, "gguf-f16")
    assert "pre-quantized" in caught.value.message and "--format adapter" in caught.value.hint


# --- refusals and clean-up -----------------------------------------------------------------------


def _copy_run(folder: RunFolder, tmp_path: Path) -> RunFolder:
    target = tmp_path / folder.path.name
    shutil.copytree(folder.path, target, ignore=shutil.ignore_patterns("exports", "checkpoints"))
    return RunFolder(target)


def test_run_without_adapter_is_refused(lora_run, tmp_path):
    broken = _copy_run(lora_run, tmp_path)
    shutil.rmtree(broken.adapter_dir)
    with pytest.raises(JobError) as caught:
        export(broken, "merged")
    assert caught.value.kind == "bad_input"
    assert "has no adapter/" in caught.value.message
    resumable = broken.latest_checkpoint() is not None  # --resume only where there is something to resume
    assert ("--resume" in caught.value.hint) == resumable and "finetune-studio train" in caught.value.hint
    assert not (broken.path / "exports").exists()


def test_half_written_adapter_is_refused(lora_run, tmp_path):
    broken = _copy_run(lora_run, tmp_path)
    (broken.adapter_dir / "adapter_model.safetensors").unlink()
    with pytest.raises(JobError) as caught:
        export(broken, "gguf-q8_0")
    assert "adapter_model.safetensors missing" in caught.value.message
    assert not (broken.path / "exports").exists()


def test_overwrite_replaces_only_an_earlier_export_never_the_users_own_folder(lora_run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(JobError) as caught:
            export(lora_run, "adapter", out=str(mine), overwrite=overwrite)
        assert "is not an earlier export (it has no export_report.json)" in caught.value.message
        assert (mine / "keep.txt").read_text() == "mine" and not leftovers(mine)
    out = tmp_path / "taken"
    events, report = export(lora_run, "adapter", out=str(out))
    assert report["passed"]
    with pytest.raises(JobError) as caught:
        export(lora_run, "adapter", out=str(out))
    assert "already holds an export; pass --overwrite" in caught.value.message
    (out / "old-marker.txt").write_text("from the earlier export")
    events, report = export(lora_run, "adapter", out=str(out), overwrite=True)
    assert report["passed"] and not (out / "old-marker.txt").exists() and not leftovers(out)


def test_export_into_the_runs_own_adapter_is_refused(lora_run):
    with pytest.raises(JobError) as caught:
        export(lora_run, "adapter", out=str(lora_run.adapter_dir), overwrite=True)
    assert "would overwrite the run's own files" in caught.value.message
    assert (lora_run.adapter_dir / "adapter_model.safetensors").is_file()


def test_full_disk_mid_gguf_removes_the_partial_folder_and_says_how_much_is_needed(lora_run, tmp_path, monkeypatch):
    import gguf

    original = gguf.GGUFWriter.write_tensor_data
    calls = []

    def failing(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing)
    out = tmp_path / "full" / "gguf"
    with pytest.raises(JobError) as caught:
        export(lora_run, "gguf-f16", out=str(out))
    assert "is full" in caught.value.message and "needs about" in caught.value.message and "MB free" in caught.value.message
    assert len(calls) == 5 and not out.exists() and not leftovers(out)


def test_full_disk_mid_safetensors_write_leaves_nothing(lora_run, tmp_path, monkeypatch):
    import backend.export.safetensors_writer as writer

    def failing(fd):
        raise OSError(errno.ENOSPC, "No space left on device")  # after the shard's bytes: a torn file

    monkeypatch.setattr(writer.os, "fsync", failing)
    out = tmp_path / "merged"
    with pytest.raises(JobError) as caught:
        export(lora_run, "merged", out=str(out))
    assert "needs about" in caught.value.message
    assert not out.exists() and not leftovers(out)


@pytest.mark.parametrize("fmt", ["gguf-q8_0", "merged"])
def test_stop_while_writing_cancels_and_leaves_nothing(lora_run, tmp_path, fmt):
    stop = StopListener(io.StringIO())

    def hook(emit):
        def wrapped(event):
            if event.type == "MetricsLogged":
                stop.request(save=False)
            emit(event)
        return wrapped

    out = tmp_path / "stopped"
    with pytest.raises(JobError) as caught:
        export(lora_run, fmt, stop=stop, reporter_hook=hook, out=str(out))
    assert caught.value.kind == "cancelled"
    assert not out.exists() and not leftovers(out)


def test_stop_while_measuring_the_trained_model_cancels_before_anything_is_written(lora_run, tmp_path):
    stop = StopListener(io.StringIO())

    def hook(emit):
        def wrapped(event):
            if event.type == "PhaseChanged" and event.phase == "measure":
                stop.request(save=False)
            emit(event)
        return wrapped

    out = tmp_path / "stopped-early"
    with pytest.raises(JobError) as caught:
        export(lora_run, "merged", stop=stop, reporter_hook=hook, out=str(out))
    assert caught.value.kind == "cancelled" and "measuring the trained model" in caught.value.message
    assert not out.exists() and not leftovers(out)


def test_bad_options_and_other_architectures_are_refused_in_one_sentence(lora_run):
    from transformers import FalconConfig

    from backend.export.gguf_writer import check_architecture

    with pytest.raises(JobError, match="is not one of"):
        export(lora_run, "gguf-q3_k")
    with pytest.raises(JobError, match="dtype"):
        export(lora_run, "merged", dtype="fp8")
    with pytest.raises(JobError) as caught:
        check_architecture(FalconConfig())
    message = caught.value.message
    assert message.startswith("GGUF export writes the families ") and message.endswith("; this model is falcon")
    assert "mistral (as llama)" in message and "qwen2_moe (as qwen2moe)" in message and "\n" not in message


def test_untranslatable_chat_template_gives_a_modelfile_without_template():
    from transformers import AutoTokenizer

    from backend.export.modelfile import modelfile

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    text, note = modelfile(tokenizer)
    assert note == "" and 'TEMPLATE """{{ range .Messages }}' in text and "<|bos|>" not in text
    tokenizer.chat_template = "{% for m in messages|reverse %}{{ m['content'] }}{% endfor %}"
    text, note = modelfile(tokenizer)
    assert "TEMPLATE" not in text.split("#")[0] and note.startswith("no TEMPLATE written")


# --- the CLI, through the real worker ------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backend.cli", "export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_export_passes_and_exits_zero(lora_run, tmp_path):
    out = tmp_path / "cli-q8"
    done = _cli(str(lora_run.path), "--format", "gguf-q8_0", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PASSED: gguf-q8_0" in done.stdout and "ok   perplexity" in done.stdout
    assert "[write]" in done.stderr and "[verify]" in done.stderr and "Traceback" not in done.stderr
    assert (out / "model.gguf").is_file() and (out / "Modelfile").is_file()
    again = _cli(str(lora_run.path), "--format", "gguf-q8_0", "--out", str(out))
    assert again.returncode == 2 and "pass --overwrite" in again.stderr


def test_cli_failed_check_is_shown_and_exits_nonzero(qlora_run, tmp_path):
    out = tmp_path / "cli-bnb4"
    done = _cli(str(qlora_run.path), "--format", "bnb-4bit", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "FAILED: bnb-4bit" in done.stdout and "FAIL perplexity" in done.stdout
    assert "error: bnb-4bit export failed its perplexity check" in done.stderr
    assert json.loads((out / "export_report.json").read_text())["passed"] is False
