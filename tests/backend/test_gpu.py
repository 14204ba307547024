"""GPU paths (CUDA bf16/fp16, bitsandbytes on CUDA): skipped without CUDA; their CPU fallbacks are
covered in test_techniques.py."""

from __future__ import annotations

import pytest

from backend.config import RunConfig
from backend.runs import RunFolder
from backend.worker_process import WorkerProcess
from tests.conftest import PRESET

pytestmark = pytest.mark.gpu


def run(overrides: list[str]) -> tuple[list[dict], dict]:
    config = RunConfig.load(PRESET, ["train.max_steps=20", "train.save_steps=20", *overrides])
    folder = RunFolder.create(config)
    events: list[dict] = []
    terminal = WorkerProcess().run(folder, config, on_event=events.append)
    return events, terminal


def test_auto_picks_bf16_on_cuda_and_reports_torch_memory(bundled_model):
    events, terminal = run([])
    assert terminal["type"] == "JobFinished", terminal
    plan = next(e for e in events if e["type"] == "PhaseChanged" and e["phase"] == "plan")
    assert "device cuda" in plan["detail"] and "precision bf16" in plan["detail"]
    metrics = [e for e in events if e["type"] == "MetricsLogged"]
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    memory = metrics[-1]["memory"]
    assert memory["allocated_bytes"] > 0 and memory["reserved_bytes"] >= memory["allocated_bytes"]
    assert memory["peak_bytes"] >= memory["allocated_bytes"]


@pytest.mark.parametrize("overrides", [
    ["technique.precision=fp16"],
    ["technique.method=qlora"],
    ["technique.method=lora8"],
    ["technique.optimizer=paged_adamw_8bit"],
    ["technique.packing=true"],
    ["technique.gradient_checkpointing=true"],
    ["technique.torch_compile=true"],
    ["technique.packing=false"],
], ids=lambda o: ",".join(o))
def test_cuda_techniques_train(bundled_model, overrides):
    pytest.importorskip("bitsandbytes")
    events, terminal = run(overrides)
    assert terminal["type"] == "JobFinished", terminal
    losses = [e["loss"] for e in events if e["type"] == "MetricsLogged"]
    assert losses and all(loss == loss for loss in losses)


def test_real_nvml_sees_the_card_and_this_process():
    """The studio's sampler on a real driver (the other tests use a fake pynvml): totals match torch's,
    and 512 MiB allocated here shows in the card's used memory and, where the container lets NVML map
    PIDs, in this process's share."""
    import os

    import torch

    from studio.services.nvml_sampler import NvmlSampler

    block = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    sampler = NvmlSampler()
    sample = sampler(os.getpid())
    assert sample.nvml and sample.devices, sample.note
    device = sample.devices[torch.cuda.current_device()]
    assert abs(device.total_bytes - torch.cuda.get_device_properties(0).total_memory) < 0.1 * device.total_bytes
    assert device.used_bytes >= block.numel()
    assert device.process_bytes is None or device.process_bytes >= block.numel()
    sampler.close()


def test_the_peak_measurement_leaves_no_memory_or_peak_behind(tmp_path, monkeypatch):
    """MFU's one-off 8192^2 matmuls (~400 MB) must not show as the run's peak, nor stay reserved."""
    import torch

    from backend.training.mfu import peak_flops

    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path))  # an empty cache: the measurement runs
    before, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert peak_flops("cuda", torch.bfloat16) > 1e12
    assert torch.cuda.max_memory_allocated() - before < 2**20
    assert torch.cuda.memory_reserved() <= reserved + 64 * 2**20
