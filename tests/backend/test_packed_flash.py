"""Packed rows through FlashAttention-2's variable-length path: what the packing collator's batch
makes transformers pass. flash-attn needs CUDA, so its kernels are stood in for by per-example SDPA
with the flash-attn signature; everything between the collator and the kernel call is
transformers' own FlashAttention-2 code (flash_attention_forward, its mask function and
_flash_attention_forward)."""

from __future__ import annotations

import pytest
import torch

from backend.training.tokenized import PackingCollator
from tests.backend.test_shortcut_exactness import features
from tests.families import tiny_config


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
           causal=False):
    """flash_attn_varlen_func's contract: (tokens, heads, dim) in and out, attention within each sequence."""
    varlen.calls.append((cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), max_seqlen_q, max_seqlen_k, causal, q.shape))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    bounds = cu_seqlens_q.tolist()
    parts = [torch.nn.functional.scaled_dot_product_attention(
        q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=causal, scale=softmax_scale,
    ).transpose(0, 1) for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(parts)


def padded(*args, **kwargs):
    raise AssertionError("a padded or dense flash path was taken")


@pytest.fixture
def flash_probe(monkeypatch):
    import transformers.modeling_flash_attention_utils as fa
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    varlen.calls = []
    kernels = ((padded, varlen, padded, padded, padded), (fa._lazy_define_process_function(varlen), dict))
    monkeypatch.setattr(fa, "lazy_import_flash_attention", lambda *args, **kwargs: kernels)
    AttentionInterface.register("fa2_probe", flash_attention_forward)
    AttentionMaskInterface.register("fa2_probe", flash_attention_mask)
    return varlen.calls


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_neox"])
def test_packed_rows_take_flash_attentions_varlen_path_with_the_collators_bounds(family, flash_probe):
    from transformers import AutoModelForCausalLM

    batch = PackingCollator()(features())
    assert "attention_mask" not in batch  # nothing to unpad: one row, no pad token
    lengths = [len(f["input_ids"]) for f in features()]
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    torch.manual_seed(0)
    flash = AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation="fa2_probe")
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(tiny_config(family), attn_implementation="eager")
    with torch.no_grad():
        logits = flash(**batch, use_cache=False).logits
        reference = eager(**batch, use_cache=False).logits  # eager's block-diagonal mask from the position ids
    layers = tiny_config(family).num_hidden_layers
    assert len(flash_probe) == layers
    for cu_q, cu_k, max_q, max_k, causal, shape in flash_probe:
        assert cu_q == cu_k == bounds and max_q == max_k == max(lengths) and causal
        assert type(max_q) is int  # the collator's own bounds, not re-inferred from the position ids (a tensor)
        assert shape[0] == sum(lengths)  # every token, none padded
    assert (logits - reference).abs().max() < 1e-4
