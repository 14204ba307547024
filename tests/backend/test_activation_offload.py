"""Activation offload: asked for by technique.activation_offload, run on CUDA with checkpointing
only, installed with pinned host memory; on the CPU its hooks are proven to move exactly each layer's
input (and to free it) without changing the loss or a gradient; the estimate moves those bytes."""

from __future__ import annotations

import weakref

import pytest
import torch

from backend.core.config.run_config import RunConfig, apply_overrides
from backend.estimate import estimate
from backend.core.protocol import Capabilities
from backend.training.shortcuts import activation_offload
from backend.training.shortcuts.activation_offload import ActivationOffload
from backend.training.tokenized import PackingCollator
from backend.training.model.model_facts import ModelFacts
from backend.training.shortcuts.installer import install
from backend.training.model.techniques import plan_techniques
from tests import model_configs
from tests.backend.test_shortcut_exactness import NO_DROPOUT, features
from tests.conftest import PRESET
from tests.families import tiny_config

GPU = Capabilities(cuda=True, bf16=True)
CPU = Capabilities(cuda=False)
ASKED = ["technique.activation_offload=true", "technique.gradient_checkpointing=true"]


def plan(overrides, caps=GPU, family="llama"):
    return plan_techniques(RunConfig.load(PRESET, list(overrides)), caps, ModelFacts.of_config(tiny_config(family)),
                           world_size=1, threads=1)


@pytest.mark.parametrize("overrides, why", [
    (["technique.gradient_checkpointing=true"], "technique.activation_offload off"),
    (["technique.activation_offload=true", "technique.gradient_checkpointing=false"], "needs gradient checkpointing"),
    ([*ASKED, "technique.torch_compile=true"], "torch.compile"),
])
def test_it_runs_only_where_asked_with_checkpointing_on_cuda(overrides, why):
    assert "activation_offload" in plan(ASKED).shortcuts.applied
    skipped = dict(plan(overrides).shortcuts.skipped)
    assert why in skipped["activation_offload"]
    cpu = plan(ASKED, caps=CPU)
    assert "activation_offload" not in cpu.shortcuts.applied and "activation_offload" not in cpu.summary()
    assert "activation_offload" not in plan([*ASKED, "technique.shortcuts=off"]).shortcuts.applied


def test_the_gpu_plan_installs_it_on_every_layer_with_pinned_memory(monkeypatch):
    made = []

    class Recorded(ActivationOffload):
        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory)
            made.append(self)

    monkeypatch.setattr(activation_offload, "ActivationOffload", Recorded)
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    installed = install(plan(ASKED).shortcuts, model, SimpleNamespace(loss_positions=False, rows=None))
    assert "activation_offload" in installed and len(made) == 1
    assert made[0].pin_memory is True and made[0].layers == 2
    assert all(layer.forward.__func__.__name__ == "forward_offloaded" for layer in model.model.layers)
    bare = AutoModelForCausalLM.from_config(tiny_config("llama"))
    assert "activation_offload" not in install(plan(ASKED, caps=CPU).shortcuts, bare,
                                               SimpleNamespace(loss_positions=False, rows=None))


def step(family: str, offload: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **NO_DROPOUT.get(family, {})),
                                             attn_implementation="eager")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    hooks = ActivationOffload(pin_memory=False)
    if offload:
        assert hooks.install(model) == model.config.num_hidden_layers
    inputs = []
    for layer in (m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block", "Layer"))
                  and hasattr(m, "gradient_checkpointing")):
        layer.register_forward_pre_hook(lambda m, args: inputs.append(weakref.ref(args[0])))
    loss = model(**PackingCollator()(features()), use_cache=False).loss
    alive = sum(ref() is not None for ref in inputs)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.detach(), grads, alive, hooks


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen3_moe", "gpt_neox"])
def test_the_hooks_move_each_layer_input_and_nothing_else_exactly(family):
    plain_loss, plain_grads, plain_alive, _ = step(family, offload=False)
    loss, grads, alive, hooks = step(family, offload=True)
    assert loss == plain_loss and torch.equal(grads, plain_grads)
    layers = tiny_config(family).num_hidden_layers
    assert hooks.offloaded == layers  # one tensor per layer; what the layer saves inside stays checkpointed
    assert hooks.kept == (layers if family == "gpt2" else 0)  # GPT-2 passes its mask positionally: it stays
    assert plain_alive == layers and alive == 0  # the device copies are freed until backward


def cuda_activations(*overrides: str) -> dict:
    raw: dict = {}
    apply_overrides(raw, ["technique.method=qlora", "train.seq_len=4096", *overrides])
    b = estimate(model_configs.CONFIGS_DIR / "meta-llama--Llama-3.1-8B-Instruct", RunConfig.from_dict(raw), device="cuda")
    return b.details["activations"]


def test_the_estimate_moves_all_but_one_layer_input_to_host_memory():
    plain = cuda_activations("technique.gradient_checkpointing=true")
    off = cuda_activations(*ASKED)
    moved = 31 * plain["layer_input"]  # 32 layers, the one being recomputed back on the GPU
    assert off["host_offloaded"] == moved and off["total"] == plain["total"] - moved
    assert off["checkpointed_inputs"] == plain["checkpointed_inputs"] - moved
    assert "host_offloaded" not in cuda_activations(*ASKED, "technique.shortcuts=off")
    raw: dict = {}
    apply_overrides(raw, ["technique.method=qlora", *ASKED])
    cpu = estimate(model_configs.CONFIGS_DIR / "meta-llama--Llama-3.1-8B-Instruct", RunConfig.from_dict(raw), device="cpu")
    assert "host_offloaded" not in cpu.details["activations"]
