"""The proof the shortcut registry cites: for every family, a LoRA training pass with the shortcuts the
registry chooses for it gives the loss and the gradients of the plain transformers + peft pass
within 1e-5, on packed and on padded batches (dropout off: the shortcuts draw other masks)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.protocol import Capabilities
from backend.training.tokenized import PackingCollator, PadCollator
from backend.training.model.loading import attention_implementation
from backend.training.shortcuts.loss_positions import keep_loss_positions
from backend.training.model.model_facts import ModelFacts
from backend.training.model.moe import enable_aux_loss
from backend.training.shortcuts.installer import install
from backend.core.registries.shortcuts import SHORTCUTS
from backend.training.model.techniques import plan_techniques
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
    monkeypatch.setattr("backend.training.model.techniques.native_bf16", lambda: False)  # bf16_base is not exact
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
    """The families in the registry are the ones the test above runs, for each shortcut it installs (the vision
    families of packed image rows: tests/backend/test_vision_packing.py)."""
    from backend.core.registries.shortcuts import PACKED_IMAGE_FAMILIES

    for shortcut in SHORTCUTS:
        if shortcut.name in ("loss_positions", "last_layer_rows", "sdpa_packed", "rank_first_lora"):
            assert shortcut.families - PACKED_IMAGE_FAMILIES <= set(FAMILIES)


def with_chunked_loss(plan):
    """The CPU plan with chunked_loss added (the registry chooses it on CUDA only)."""
    plan.shortcuts = dataclasses.replace(plan.shortcuts, applied=(*plan.shortcuts.applied, "chunked_loss"))
    return plan


@pytest.fixture
def chunk_calls(monkeypatch):
    """Chunks of 16 rows (several per batch at the tiny vocabulary), and a count of chunked losses."""
    from backend.training.shortcuts import chunked_loss

    monkeypatch.setattr("backend.core.registries.shortcuts.LOSS_CHUNK_ELEMENTS", 16 * 4096)
    calls = []
    plain = chunked_loss.chunked_causal_loss

    def counted(hidden, *args, **kwargs):
        calls.append(int(hidden.reshape(-1, hidden.shape[-1]).shape[0]))
        return plain(hidden, *args, **kwargs)

    monkeypatch.setattr(chunked_loss, "chunked_causal_loss", counted)
    return calls


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("positions", [True, False], ids=["loss_positions", "every_position"])
def test_chunked_loss_gives_the_plain_loss_and_gradients(family, positions, chunk_calls, monkeypatch):
    """Chunked lm_head + cross-entropy against the plain loss: on its own (the model shifts the labels)
    and after loss_positions (shift_labels given), Gemma 2's final soft-capping applied per chunk."""
    monkeypatch.setattr("backend.training.model.techniques.native_bf16", lambda: False)
    on, off = plans(family, Capabilities(cuda=False))
    model_on, trainer_on, installed = build(family, with_chunked_loss(on))
    model_off, trainer_off, _ = build(family, off)
    assert installed[-1] == "chunked_loss"
    trainer_on.loss_positions = positions
    for collate in (PackingCollator(), PadCollator(pad_id=0)):
        batch = collate(features())
        plain_loss, plain_grads = loss_and_grads(model_off, trainer_off, batch)
        calls = len(chunk_calls)
        loss, grads = loss_and_grads(model_on, trainer_on, batch)
        assert len(chunk_calls) == calls + 1 and chunk_calls[-1] > 16  # it ran, over several chunks
        assert abs(loss - plain_loss) < 1e-5, (family, type(collate).__name__, loss, plain_loss)
        assert (grads - plain_grads).abs().max() < 1e-5, family
    if family == "gemma2":
        assert model_on.get_base_model().config.final_logit_softcapping == 30.0  # restored after the step
    model_on.eval()
    with torch.no_grad():  # evaluation: the plain head, full logits
        logits = model_on(**PackingCollator()(features()), use_cache=False).logits
    assert logits.shape[-1] == 4096 and len(chunk_calls) == calls + 1


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "mistral"])  # tied: llama, gpt2, gemma2
def test_chunked_loss_trains_a_tied_or_untied_head_in_full_tuning(family, chunk_calls):
    """Full tuning: lm_head's weight gets its gradient from every chunk (a tied one, the embedding's
    too); the mean over targets without num_items_in_batch."""
    from transformers import AutoModelForCausalLM

    from backend.training.shortcuts.chunked_loss import ChunkedLoss

    def model():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config(family, **NO_DROPOUT.get(family, {})),
                                                dtype=torch.float32, attn_implementation="eager")

    plain, chunked = model(), model()
    assert ChunkedLoss().install(chunked)
    tied = plain.get_output_embeddings().weight is plain.get_input_embeddings().weight
    assert tied is (family != "mistral")
    batch = PadCollator(pad_id=0)(features())
    results = []
    for m in (plain, chunked):
        m.train()
        m.zero_grad()
        loss = m(**batch, use_cache=False).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (plain_loss, plain_grads), (loss, grads) = results
    assert len(chunk_calls) == 1 and abs(loss - plain_loss) < 1e-5
    for name, grad in plain_grads.items():
        assert (grads[name] - grad).abs().max() < 1e-5, name
    head = chunked.get_output_embeddings().weight
    assert head.grad.abs().max() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen3_moe"])
def test_chunked_loss_in_bf16_on_cuda(family, chunk_calls):
    """The GPU's recipe (bf16 base, fp32 adapters, autocast): the chunked loss within bf16's rounding."""
    on, off = plans(family, Capabilities(cuda=True, bf16=True), ["technique.precision=bf16"])
    model_on, trainer_on, installed = build(family, on, dtype=torch.bfloat16, device="cuda")
    model_off, trainer_off, _ = build(family, off, dtype=torch.bfloat16, device="cuda")
    assert "chunked_loss" in installed
    for collate in (PackingCollator(), PadCollator(pad_id=0)):
        batch = {k: v.cuda() for k, v in collate(features()).items()}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            plain_loss, plain_grads = loss_and_grads(model_off, trainer_off, batch)
            loss, grads = loss_and_grads(model_on, trainer_on, batch)
        assert abs(loss - plain_loss) <= 2e-2 * abs(plain_loss), (family, loss, plain_loss)
        assert (grads - plain_grads).norm() <= 2e-2 * plain_grads.norm(), family
    assert chunk_calls


def test_chunked_loss_and_offload_under_the_trainer(chunk_calls, tmp_path):
    """The job's path: CountingTrainer with gradient accumulation (num_items_in_batch) and checkpointing;
    the chunked loss (installed twice: the second is a no-op) and the offload hooks (unpinned on the
    CPU) give the plain run's losses step by step."""
    from datasets import Dataset
    from transformers import TrainingArguments

    from backend.training.shortcuts.activation_offload import ActivationOffload
    from backend.training.shortcuts.chunked_loss import ChunkedLoss
    from backend.training.counting_trainer import SupervisedCountingTrainer as CountingTrainer

    losses = {}
    for name in ("plain", "lean"):
        on, off = plans("llama", Capabilities(cuda=False))
        plan = with_chunked_loss(on) if name == "lean" else off
        model, chosen, _ = build("llama", plan)
        args = TrainingArguments(output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=3,
                                 learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True,
                                 remove_unused_columns=False, gradient_accumulation_steps=2, disable_tqdm=True,
                                 activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False})
        trainer = CountingTrainer(model=model, args=args, train_dataset=Dataset.from_list(features() * 4),
                                  data_collator=PackingCollator())
        trainer.loss_positions, trainer.rows = chosen.loss_positions, chosen.rows
        if name == "lean":
            assert ChunkedLoss().install(model)  # a second time: a no-op
            offload = ActivationOffload(pin_memory=False)
            assert offload.install(model) == 2
        trainer.train()
        losses[name] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(chunk_calls) == 6 and offload.offloaded == 6 * 2  # 3 steps x 2 micro-batches, 2 layers each
    assert losses["lean"] == pytest.approx(losses["plain"], abs=1e-5)
