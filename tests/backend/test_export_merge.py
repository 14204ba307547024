"""The streaming merge, tensor by tensor, against peft's own merge_and_unload; the source and the writer
holding one tensor at a time (by construction: weak references and the process's memory maps); the
safetensors shards; the refusals of what cannot be merged exactly; the failure hints.

Tiny random-weight models of several families (tests/families.py), adapters made with peft in the
test and given non-zero B (and, for DoRA, non-trivial magnitudes) so every merged weight differs
from the base.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch

from backend.core.errors import JobError
from tests.families import build_tiny_model

torch.set_num_threads(1)


def make_adapter(base: Path, out: Path, *, targets="all-linear", dora=False, rslora=False,
                 dtype=torch.bfloat16) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, use_dora=dora, use_rslora=rslora)
    peft_model = get_peft_model(model, config)
    torch.manual_seed(1)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
        elif "lora_magnitude_vector" in name:
            param.data *= 1.0 + 0.1 * torch.rand_like(param)
    peft_model.save_pretrained(out)
    return out


def peft_merged(base: Path, adapter: Path, *, quantization: str | None = None,
                load_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """peft's merge_and_unload (fp32) on the base as the run held it, in the checkpoint's on-disk names."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    from backend.export.quantized_base import bnb_config

    if quantization:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=load_dtype, device_map={"": "cpu"},
                                                     quantization_config=bnb_config(quantization, torch.float32))
        model = model.dequantize()  # transformers' own dequantization of the bitsandbytes layers
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=load_dtype)
    merged = PeftModel.from_pretrained(model, adapter).float().merge_and_unload(safe_merge=True)
    return revert_weight_conversion(merged, dict(merged.state_dict()))


def stream(base: Path, adapter: Path | None, dtype=torch.bfloat16, **kwargs):
    from backend.export.adapter_weights import AdapterWeights
    from backend.export.checkpoint_files import CheckpointFiles
    from backend.export.merged_source import MergedSource
    from backend.export.model_layout import ModelLayout

    files = CheckpointFiles(base)
    layout = ModelLayout.build(base, files.shapes(), quantization=kwargs.get("quantization"))
    return MergedSource(files, layout, AdapterWeights(adapter, layout) if adapter else None, dtype, **kwargs)


def assert_within_rounding(got: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """`got` is `expected` (peft's merge computed in fp32) rounded once to got's dtype: at most one step
    apart anywhere (a different summation order may flip a rounding) and identical almost everywhere."""
    dtype = got.dtype
    assert got.shape == expected.shape, name
    rounded = expected.to(dtype)
    eps = torch.finfo(dtype).eps
    size = torch.maximum(got.float().abs(), rounded.float().abs())
    excess = ((got.float() - rounded.float()).abs() - eps * size).max().item()
    assert excess <= 0, f"{name}: more than one {dtype} step from peft's merge ({excess})"
    same = (got == rounded).float().mean().item()
    assert same >= 0.999, f"{name}: only {same:.2%} of the elements are peft's merge rounded"


CASES = [
    ("llama", dict()),
    ("llama", dict(dora=True, rslora=True)),
    ("qwen2", dict()),  # q/k/v biases stay as stored
    ("gemma2", dict(dora=True)),  # tied embeddings, (1 + w) norms kept as stored
    ("qwen2_moe", dict()),  # per-expert tensors on disk, the shared expert adapted
    ("mixtral", dict(targets=["q_proj", "v_proj", "gate"])),  # router: mlp.gate in memory, block_sparse_moe on disk
    ("mixtral", dict(targets="all-linear")),  # peft's ParamWrapper on the fused experts, w1/w3/w2 per expert on disk
    ("qwen3_moe", dict(targets=["q_proj", "gate_proj", "up_proj", "down_proj"])),  # nested wrappers, gate_up rank 2r
    ("gpt2", dict(dora=True)),  # Conv1D weights stored transposed
]


@pytest.mark.parametrize("family, options", CASES, ids=[f"{f}-{'dora' if o.get('dora') else 'lora'}-{i}"
                                                         for i, (f, o) in enumerate(CASES)])
def test_streaming_merge_equals_peft_merge_and_unload(family, options, tmp_path):
    base = build_tiny_model(family, tmp_path / "base", dtype="bfloat16")
    adapter = make_adapter(base, tmp_path / "adapter", **options)
    expected = peft_merged(base, adapter)  # the bf16 base widened to fp32 exactly, merged by peft in fp32
    source = stream(base, adapter, load_dtype=torch.bfloat16)
    tied = {"lm_head.weight"} if source.config.tie_word_embeddings else set()  # save_pretrained drops it
    assert sorted(source.names()) == sorted(set(expected) - tied)
    adapted = set(source.adapter.modules)
    assert adapted and source.rounding.tensors == 0
    from safetensors.torch import load_file

    stored = load_file(base / "model.safetensors")
    for name in source.names():
        got = source.get(name)
        assert got.dtype == torch.bfloat16
        assert_within_rounding(got, expected[name], name)
        if name in adapted:
            assert not torch.equal(got, stored[name]), f"{name} was not changed by the merge"
        else:
            assert torch.equal(got, stored[name]), f"{name} is not adapted and must stay as stored"
    assert source.rounding.tensors == len(adapted) and 0 < source.rounding.relative_error < 1


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_qlora_and_lora8_merge_into_the_dequantized_base_exactly(quantization, tmp_path):
    from backend.training.model.techniques import bnb_can

    if bnb_can(quantization, "cpu"):
        pytest.skip(f"bitsandbytes {quantization} does not work on this CPU")
    base = build_tiny_model("llama", tmp_path / "base", dtype="bfloat16")
    adapter = make_adapter(base, tmp_path / "adapter", dtype=torch.float32)
    expected = peft_merged(base, adapter, quantization=quantization)
    source = stream(base, adapter, load_dtype=torch.float32, quantization=quantization)
    assert len(source.layout.quantized) == 14  # 2 layers x 7 projections; never lm_head or embeddings
    plain = stream(base, adapter, load_dtype=torch.float32)
    for name in source.names():
        got = source.get(name)
        assert_within_rounding(got, expected[name], name)
        if name.endswith("q_proj.weight"):  # the quantized base, not the original, is what was merged into
            assert (got != plain.get(name)).float().mean() > 0.5


def test_full_fine_tune_is_read_as_stored_and_cast(tmp_path):
    from safetensors.torch import load_file

    base = build_tiny_model("qwen2", tmp_path / "model", dtype="float32")
    source = stream(base, None, torch.float16)
    stored = load_file(base / "model.safetensors")
    for name in source.names():
        assert torch.equal(source.get(name), stored[name].to(torch.float16))


# --- memory, by construction --------------------------------------------------------------------


def _mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


def test_source_keeps_no_tensor_and_no_file_mapping_between_calls(tmp_path):
    base = build_tiny_model("llama", tmp_path / "base", dtype="bfloat16")
    adapter = make_adapter(base, tmp_path / "adapter", dora=True)
    source = stream(base, adapter)
    weights = base / "model.safetensors"
    for name in source.names():
        tensor = source.get(name)
        alive = weakref.ref(tensor)
        del tensor  # reference counting frees it here unless something else holds it
        assert alive() is None, f"the source kept a reference to {name}"
        if Path("/proc/self/maps").exists():
            assert not _mapped(weights) and not _mapped(adapter / "adapter_model.safetensors"), name


class CountingSource:
    """Wraps a source; records how many of the tensors it handed out were still alive at each `get`."""

    def __init__(self, inner):
        self.inner, self.config, self.alive, self.most_alive = inner, inner.config, [], 0

    def names(self):
        return self.inner.names()

    def shape(self, name):
        return self.inner.shape(name)

    def dtype_of(self, name):
        return self.inner.dtype_of(name)

    def get(self, name):
        self.alive = [ref for ref in self.alive if ref() is not None]
        self.most_alive = max(self.most_alive, len(self.alive))
        tensor = self.inner.get(name)
        self.alive.append(weakref.ref(tensor))
        return tensor


def test_safetensors_writer_holds_one_tensor_and_shards_load_with_transformers(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from backend.export.safetensors_writer import INDEX, write_safetensors

    base = build_tiny_model("qwen2", tmp_path / "base", dtype="bfloat16")
    adapter = make_adapter(base, tmp_path / "adapter")
    source = CountingSource(stream(base, adapter))
    out = tmp_path / "out"
    out.mkdir()
    files = write_safetensors(source, out, max_shard_bytes=100_000)
    assert source.most_alive == 0  # every tensor was dropped before the next was asked for
    assert len(files) >= 3 and (out / INDEX).is_file()
    index = json.loads((out / INDEX).read_text())
    assert set(index["weight_map"]) == set(source.names())
    expected = peft_merged(base, adapter)
    for path in files:
        with safe_open(path, "pt") as handle:
            assert handle.metadata() == {"format": "pt"}
            for name in handle.keys():
                assert index["weight_map"][name] == path.name
                assert_within_rounding(handle.get_tensor(name), expected[name], name)
    (out / "config.json").write_text((base / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    merged = dict(model.state_dict())
    assert torch.equal(merged["model.layers.1.self_attn.q_proj.bias"],
                       safe_open(base / "model.safetensors", "pt").get_tensor("model.layers.1.self_attn.q_proj.bias"))


# --- refusals and hints -------------------------------------------------------------------------


def test_an_adapter_of_another_model_is_refused(tmp_path):
    base = build_tiny_model("llama", tmp_path / "base", dtype="bfloat16")
    other = build_tiny_model("llama", tmp_path / "other", dtype="bfloat16", intermediate_size=96)
    adapter = make_adapter(other, tmp_path / "adapter")
    with pytest.raises(JobError, match="do not fit its base weight"):
        stream(base, adapter)


def test_a_failed_check_never_suggests_the_format_that_failed():
    from backend.core.registries.export_formats import ALTERNATIVES, DTYPES, FORMATS, failure_hint

    for fmt in FORMATS:
        for dtype in DTYPES:
            for method in ("lora", "qlora", "full"):
                hint = failure_hint(fmt, dtype, method)
                same = f"--format {fmt} --dtype {dtype}" if fmt in ("merged",) else f"--format {fmt}"
                assert same + " " not in hint + " " and same + "," not in hint and same + ")" not in hint, (fmt, dtype, hint)
                assert hint.startswith("try ") or "NF4 grid" in hint
    assert all(key.split(":")[0] in FORMATS for key in ALTERNATIVES)
