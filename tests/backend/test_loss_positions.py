"""Logits only at loss positions: the same loss and gradients as the full projection, for packed and padded batches."""

from __future__ import annotations

import pytest
import torch

from backend.training.tokenized import PackingCollator, PadCollator
from backend.training.shortcuts.last_layer_rows import LastLayerRows
from backend.training.shortcuts.loss_positions import keep_loss_positions, supports_loss_positions


def _features() -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(1)
    features = []
    for n, prompt in ((9, 6), (17, 14), (5, 3), (30, 27)):
        ids = torch.randint(10, 200, (n,), generator=g).tolist()
        features.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return features


@pytest.mark.parametrize("collator", [PackingCollator(), PadCollator(pad_id=0)], ids=["packed", "padded"])
def test_kept_positions_give_the_same_loss_and_gradients(bundled_model, collator):
    """Full logits vs logits at the loss positions vs that plus the last layer on those rows only."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from backend.training.shortcuts.packed_attention import register

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32, attn_implementation=register())
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False))
    assert supports_loss_positions(model)
    rows = LastLayerRows()
    assert rows.install(model) and rows.modules == ["mlp", "self_attn.o_proj"]
    seen_rows: list[int] = []
    last_mlp = base.model.layers[-1].mlp.down_proj
    last_mlp.register_forward_hook(lambda module, args, out: seen_rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    batch = collator(_features())
    items = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()))
    results = []
    for inputs, pruned in ((batch, False), (keep_loss_positions(batch), False), (keep_loss_positions(batch), True)):
        rows.mask = inputs["logits_to_keep"] if pruned else None
        model.zero_grad()
        out = model(**inputs, use_cache=False, num_items_in_batch=items)
        out.loss.backward()
        rows.mask = None
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        results.append((out.loss.detach(), grads, out.logits.shape[-2] if out.logits.dim() == 3 else out.logits.shape[0]))
    (full_loss, full_grads, full_rows), (kept_loss, kept_grads, kept_rows), (row_loss, row_grads, _) = results
    assert kept_rows == int(items) < full_rows  # fewer positions projected: the point of it
    assert seen_rows[2] == int(items) < seen_rows[0] == seen_rows[1]  # and the last MLP ran on those rows only
    for loss, grads in ((kept_loss, kept_grads), (row_loss, row_grads)):
        assert torch.allclose(full_loss, loss, atol=1e-5)
        assert (full_grads - grads).abs().max() < 1e-5
    assert full_grads.abs().max() > 0


def test_last_layer_rows_leave_other_shapes_alone(bundled_model):
    """Evaluation and generation run the unmodified layer: no mask, or a mask of another shape."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32)
    ids = torch.randint(10, 200, (1, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        rows = LastLayerRows()
        assert rows.install(model)
        assert torch.equal(model(input_ids=ids).logits, expected)
        rows.mask = torch.ones(1, 5, dtype=torch.bool)  # a stale mask from another batch
        assert torch.equal(model(input_ids=ids).logits, expected)


def test_a_batch_without_targets_is_left_alone():
    batch = {"input_ids": torch.ones(1, 4, dtype=torch.long), "labels": torch.full((1, 4), -100)}
    assert keep_loss_positions(batch) is batch
