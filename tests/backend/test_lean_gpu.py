"""On CUDA, what the memory shortcuts are for: the chunked loss and activation offload lower the
step's max allocated memory and leave the loss as it was (skipped without CUDA; their CPU proofs are
in test_shortcut_exactness.py and test_activation_offload.py)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def peak_step(vocab: int, hidden: int, tokens: int, layers: int, *, chunked: bool = False, offload: bool = False):
    """(max allocated bytes over one bf16 LoRA step with checkpointing, loss)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from backend.training.shortcuts.activation_offload import ActivationOffload
    from backend.training.shortcuts.chunked_loss import ChunkedLoss

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=tokens)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    if chunked:
        assert ChunkedLoss().install(model)
    if offload:
        assert ActivationOffload(pin_memory=True).install(model) == layers
    ids = torch.randint(3, vocab, (1, tokens), generator=torch.Generator().manual_seed(1)).cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del model
    torch.cuda.empty_cache()
    return peak, float(loss)


def test_the_chunked_loss_holds_less_than_the_whole_logits():
    plain, plain_loss = peak_step(128256, 512, 4096, 2)
    chunked, loss = peak_step(128256, 512, 4096, 2, chunked=True)
    assert chunked < 0.5 * plain, (chunked, plain)
    assert loss == pytest.approx(plain_loss, rel=1e-2)


def test_activation_offload_moves_the_layer_inputs_off_the_gpu():
    plain, plain_loss = peak_step(32000, 1024, 8192, 16, chunked=True)
    offloaded, loss = peak_step(32000, 1024, 8192, 16, chunked=True, offload=True)
    layer_input = 8192 * 1024 * 2
    assert offloaded <= plain - 10 * layer_input, (offloaded, plain)
    assert loss == plain_loss  # copies: the same numbers
