"""backend.estimate.feasibility: each rule on a CPU machine, the same sentence the worker's plan refuses with,
and the estimate computed for what will run."""

from __future__ import annotations

import pytest

from backend.estimate.calibration import Calibration
from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.estimate.feasibility import blocker, context_length, runnable, verdicts
from backend.core.protocol import Capabilities
from backend.estimate.run_estimate import estimate_run
from backend.training.model.techniques import plan_techniques
from tests.conftest import PRESET

CPU = Capabilities(cuda=False, bitsandbytes="0.50.2")
GPU = Capabilities(cuda=True, bf16=True)
TINY = {"model_type": "llama", "max_position_embeddings": 1024}


def found(overrides: list[str], caps: Capabilities = CPU, **kwargs) -> dict[str, object]:
    config = RunConfig.load(PRESET, overrides)
    return {v.field: v for v in verdicts(config, TINY, caps, **kwargs)}


BLOCKED_ON_CPU = [
    ("technique.liger_kernel=true", "technique.liger_kernel", "need a CUDA GPU"),
    ("technique.torch_compile=true", "technique.torch_compile", "recompiles for each new batch shape"),
    ("technique.precision=fp16", "technique.precision", "fp16 with loss scaling needs a CUDA GPU"),
    ("technique.attention=flash_attention_2,technique.precision=bf16", "technique.attention",
     "flash_attention_2 needs a CUDA GPU"),
    ("technique.offload=zero2_optimizer,hardware.strategy=deepspeed_zero2", "technique.offload",
     "DeepSpeed offload needs a CUDA GPU"),
    ("train.seq_len=2048", "train.seq_len", "longer than the model's context of 1,024 tokens"),
]


@pytest.mark.parametrize("override, field, words", BLOCKED_ON_CPU)
def test_what_cannot_run_on_the_cpu_blocks_with_one_sentence(override, field, words):
    verdict = found(override.split(","))[field]
    assert verdict.blocks and not verdict.allowed and verdict.downgrade_to is None
    assert words in verdict.reason and "\n" not in verdict.reason and verdict.fix


@pytest.mark.parametrize("override, field, words", BLOCKED_ON_CPU)
def test_the_plan_refuses_with_the_same_sentence(override, field, words, bundled_model):
    config = RunConfig.load(PRESET, override.split(","))
    first = blocker(verdicts(config, context_source(), CPU))
    with pytest.raises(JobError) as caught:
        plan_techniques(config, CPU)
    assert caught.value.message == first.message() and caught.value.hint == first.fix


def context_source() -> dict:
    from backend.estimate import load_model_config

    return load_model_config("bundled:tiny")


def test_the_preset_runs_as_asked_on_the_cpu():
    assert found([]) == {}


def test_paged_adam_is_downgraded_not_refused():
    verdict = found(["technique.optimizer=paged_adamw_8bit"])["technique.optimizer"]
    assert not verdict.allowed and not verdict.blocks and verdict.downgrade_to == "adamw_8bit"
    assert "paging needs CUDA" in verdict.reason
    assert found(["technique.optimizer=paged_adamw_8bit"], GPU) == {}


def test_missing_packages_on_a_gpu_are_missing_dependencies():
    liger = found(["technique.liger_kernel=true"], GPU)["technique.liger_kernel"]
    assert liger.blocks and liger.kind == "missing_dependency" and "liger-kernel" in liger.reason
    assert found(["technique.liger_kernel=true"], GPU.model_copy(update={"liger_kernel": True})) == {}
    flash = found(["technique.attention=flash_attention_2"], GPU)["technique.attention"]
    assert flash.blocks and "flash-attn package" in flash.reason


def test_bitsandbytes_missing_refuses_the_quantized_methods():
    gone = found(["technique.method=qlora"], probe=lambda feature, device: "bitsandbytes is not installed")
    assert gone["technique.method"].blocks and "bitsandbytes is not installed" in gone["technique.method"].reason
    assert found(["technique.method=qlora"], probe=lambda feature, device: None) == {}


def test_a_data_problem_blocks():
    verdict = found([], data_problem="data.path: 3 examples have no answer")["data.path"]
    assert verdict.blocks and verdict.reason == "data.path: 3 examples have no answer"


def test_context_is_read_in_each_familys_key():
    assert context_length({"n_positions": 1024}) == (1024, "n_positions")
    assert context_length({"text_config": {"max_position_embeddings": 8192}, "vision_config": {}}) == (
        8192, "max_position_embeddings")
    assert context_length({"model_type": "llama"}) is None


def test_the_estimate_counts_what_will_run():
    """Liger ticked on a CPU: the estimate ignores its logits saving (the run would be refused)."""
    plain = RunConfig.load(PRESET)
    ticked = RunConfig.load(PRESET, ["technique.liger_kernel=true", "technique.optimizer=paged_adamw_8bit"])
    assert runnable(ticked, verdicts(ticked, TINY, CPU)).technique.liger_kernel is False
    base = estimate_run(plain, "cpu", caps=CPU, calibration=Calibration())
    liger = estimate_run(ticked, "cpu", caps=CPU, calibration=Calibration())
    assert liger.breakdown.logits == base.breakdown.logits
    assert liger.breakdown.details["optimizer"] != base.breakdown.details["optimizer"]  # 8-bit state counted
    assert liger.start_blocker().startswith("technique.liger_kernel: ") and base.start_blocker() == ""
    gpu = GPU.model_copy(update={"liger_kernel": True})  # where Liger runs, its saving is counted
    cuda_plain = estimate_run(plain, "cuda", caps=gpu, calibration=Calibration())
    cuda_liger = estimate_run(ticked, "cuda", caps=gpu, calibration=Calibration())
    assert cuda_liger.breakdown.logits < cuda_plain.breakdown.logits
