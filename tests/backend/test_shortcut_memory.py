"""The estimate counts the memory shortcuts where the worker's registry runs them: the chunked loss
holds one chunk's logits (CUDA), not the micro-batch's."""

from __future__ import annotations

import pytest

from backend.core.config.run_config import RunConfig, apply_overrides
from backend.estimate import estimate
from backend.core.registries.shortcuts import loss_chunk_rows
from tests import model_configs

LLAMA_8B = model_configs.CONFIGS_DIR / "meta-llama--Llama-3.1-8B-Instruct"


def run(*overrides: str) -> RunConfig:
    raw: dict = {}
    apply_overrides(raw, ["technique.method=qlora", "technique.gradient_checkpointing=true",
                          "train.micro_batch_size=2", "train.seq_len=2048", *overrides])
    return RunConfig.from_dict(raw)


def logits(*overrides: str, device: str = "cuda") -> tuple[int, dict]:
    b = estimate(LLAMA_8B, run(*overrides), device=device)
    return b.logits, b.details["logits"]


def test_chunked_loss_holds_one_chunk_of_logits_on_cuda():
    chunked, held = logits("technique.shortcuts=auto")
    plain, every = logits("technique.shortcuts=off")
    vocab = 128256
    assert every["elements"] == 2 * 2048 * vocab  # every position of the micro-batch
    assert held["elements"] == loss_chunk_rows(vocab) * vocab  # one chunk's
    assert chunked == pytest.approx(plain * held["elements"] / every["elements"], rel=1e-9)
    assert chunked < plain / 10  # 130 of 4096 rows
    total_on = estimate(LLAMA_8B, run("technique.shortcuts=auto"), device="cuda").total_bytes
    total_off = estimate(LLAMA_8B, run("technique.shortcuts=off"), device="cuda").total_bytes
    assert total_on < total_off


@pytest.mark.parametrize("overrides", [
    ("technique.torch_compile=true",),  # the registry's conditions: no chunked loss here
    ("hardware.strategy=fsdp", "hardware.num_processes=2"),
])
def test_the_logits_stay_whole_where_the_registry_runs_no_chunked_loss(overrides):
    assert logits("technique.shortcuts=auto", *overrides) == logits("technique.shortcuts=off", *overrides)


def test_the_cpu_keeps_the_whole_logits_and_liger_keeps_its_own_count():
    assert logits("technique.shortcuts=auto", device="cpu") == logits("technique.shortcuts=off", device="cpu")
    liger, _ = logits("technique.liger_kernel=true")
    assert liger == logits("technique.liger_kernel=true", "technique.shortcuts=off")[0]


def test_a_micro_batch_smaller_than_a_chunk_keeps_its_own_logits():
    small = ("train.seq_len=64", "train.micro_batch_size=1")
    assert logits("technique.shortcuts=auto", *small) == logits("technique.shortcuts=off", *small)
