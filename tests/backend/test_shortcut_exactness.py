"""The proof the shortcut registry cites: for every family, a LoRA training pass with the shortcuts the
registry chooses for it gives the loss and the gradients of the plain transformers + peft pass
within 1e-5, on packed and on padded batches (dropout off: the shortcuts draw other masks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from backend.config import RunConfig
from backend.protocol import Capabilities
from backend.training.data import PackingCollator, PadCollator
from backend.training.loading import attention_implementation
from backend.training.loss_positions import keep_loss_positions
from backend.training.model_facts import ModelFacts
from backend.training.moe import enable_aux_loss
from backend.training.shortcuts import SHORTCUTS, install
from backend.training.techniques import plan_techniques
from tests.conftest import PRESET
from tests.families import FAMILIES, tiny_config

NO_DROPOUT = {"gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)}


def features() -> list[dict[str, list[int]]]:
    """Four examples, two longer than the tiny Gemmas' 32-token sliding window."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for n, prompt in ((40, 30), (17, 14), (5, 3), (45, 20)):
        ids = torch.randint(10, 200, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def build(family: str, plan, dtype=torch.float32, device="cpu"):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **NO_DROPOUT.get(family, {})), dtype=dtype,
                                             attn_implementation=attention_implementation(plan)).to(device)
    enable_aux_loss(model, plan.facts)
    torch.manual_seed(1)  # B != 0, so that every adapter gets a gradient
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM",
                                             init_lora_weights=False))
    trainer = SimpleNamespace(loss_positions=False, rows=None)
    installed = install(plan.shortcuts, model, trainer)
    return model, trainer, installed


def loss_and_grads(model, trainer, batch):
    """CountingTrainer's training path: logits at the loss positions, the last layer's rows set."""
    inputs = keep_loss_positions(batch) if trainer.loss_positions else batch
    if trainer.rows is not None:
        trainer.rows.mask = inputs.get("logits_to_keep")
    model.zero_grad()
    items = (batch["labels"][:, 1:] != -100).sum()
    loss = model(**inputs, use_cache=False, num_items_in_batch=items).loss
    loss.backward()
    if trainer.rows is not None:
        trainer.rows.mask = None
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.requires_grad])
    return loss.detach().float(), grads


def plans(family: str, caps: Capabilities, extra: list[str] = ()):
    facts = ModelFacts.of_config(tiny_config(family))
    on = plan_techniques(RunConfig.load(PRESET, ["technique.precision=fp32", *extra]), caps, facts, 1, 1)
    off = plan_techniques(RunConfig.load(PRESET, ["technique.precision=fp32", "technique.shortcuts=off", *extra]),
                          caps, facts, 1, 1)
    return on, off


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shortcuts_give_the_plain_loss_and_gradients(family, monkeypatch):
    monkeypatch.setattr("backend.training.techniques.native_bf16", lambda: False)  # bf16_base is not exact
    on, off = plans(family, Capabilities(cuda=False))
    model_on, trainer_on, installed = build(family, on)
    model_off, trainer_off, nothing = build(family, off)
    chosen = set(on.shortcuts.applied)
    assert installed == [n for n in ("rank_first_lora", "loss_positions", "last_layer_rows") if n in chosen]
    assert nothing == [] and "loss_positions" in installed
    assert (model_on.config._attn_implementation == "sdpa_packed") is on.shortcuts.has("sdpa_packed")
    for collate in (PackingCollator(), PadCollator(pad_id=0)):
        batch = collate(features())
        plain_loss, plain_grads = loss_and_grads(model_off, trainer_off, batch)
        loss, grads = loss_and_grads(model_on, trainer_on, batch)
        assert abs(loss - plain_loss) < 1e-5, (family, type(collate).__name__, loss, plain_loss)
        assert (grads - plain_grads).abs().max() < 1e-5, family
        assert plain_grads.abs().max() > 0


def test_every_shortcut_that_changes_the_step_is_covered_here():
    """The families in the registry are the ones the test above runs, for each shortcut it installs."""
    for shortcut in SHORTCUTS:
        if shortcut.name in ("loss_positions", "last_layer_rows", "sdpa_packed", "rank_first_lora"):
            assert shortcut.families <= set(FAMILIES)
