"""Logits only at loss positions: the same loss and gradients as the full projection, for packed and padded batches."""

from __future__ import annotations

import pytest
import torch

from backend.training.data import PackingCollator, PadCollator
from backend.training.loss_positions import keep_loss_positions, supports_loss_positions


def _features() -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(1)
    features = []
    for n, prompt in ((9, 6), (17, 14), (5, 3), (30, 27)):
        ids = torch.randint(10, 200, (n,), generator=g).tolist()
        features.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return features


@pytest.mark.parametrize("collator", [PackingCollator(), PadCollator(pad_id=0)], ids=["packed", "padded"])
def test_kept_positions_give_the_same_loss_and_gradients(bundled_model, collator):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False))
    assert supports_loss_positions(model)
    batch = collator(_features())
    items = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()))
    results = []
    for inputs in (batch, keep_loss_positions(batch)):
        model.zero_grad()
        out = model(**inputs, use_cache=False, num_items_in_batch=items)
        out.loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        results.append((out.loss.detach(), grads, out.logits.shape[-2] if out.logits.dim() == 3 else out.logits.shape[0]))
    (full_loss, full_grads, full_rows), (kept_loss, kept_grads, kept_rows) = results
    assert kept_rows == int(items) < full_rows  # fewer positions projected: the point of it
    assert torch.allclose(full_loss, kept_loss, atol=1e-5)
    assert (full_grads - kept_grads).abs().max() < 1e-5
    assert full_grads.abs().max() > 0


def test_a_batch_without_targets_is_left_alone():
    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long), "labels": torch.full((1, 4), -100)}
    assert keep_loss_positions(batch) is batch
