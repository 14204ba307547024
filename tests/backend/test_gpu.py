"""GPU paths (CUDA bf16/fp16, bitsandbytes on CUDA): skipped without CUDA; their CPU fallbacks are
covered in test_techniques.py."""

from __future__ import annotations

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
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
    # cuBLAS keeps a workspace per stream from the first matmul on (32 MiB on Hopper), the run's as much as
    # the measurement's: made here first, so that only what the measurement leaves behind is counted.
    warm = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
    (warm @ warm).sum().item()
    del warm
    torch.cuda.synchronize()
    before, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert peak_flops("cuda", torch.bfloat16) > 1e12
    assert torch.cuda.max_memory_allocated() - before < 2**20
    assert torch.cuda.memory_reserved() <= reserved + 64 * 2**20


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text", "phi3", "gpt2", "qwen3_moe", "mixtral"])
def test_shortcuts_on_and_off_agree_in_bf16_on_cuda(family):
    """The registry's GPU shortcuts (loss positions, last-layer rows, per-example SDPA) against the plain
    path, both bf16 on CUDA: losses and gradients within bf16 rounding, not merely finite."""
    import torch

    from backend.core.protocol import Capabilities
    from backend.training.tokenized import PackingCollator, PadCollator
    from tests.backend.test_shortcut_exactness import build, features, loss_and_grads, plans

    on, off = plans(family, Capabilities(cuda=True, bf16=True), ["technique.precision=bf16"])
    assert "loss_positions" in on.shortcuts.applied and off.shortcuts.applied == ()
    model_on, trainer_on, _ = build(family, on, torch.bfloat16, "cuda")
    model_off, trainer_off, _ = build(family, off, torch.bfloat16, "cuda")
    for collate in (PackingCollator(), PadCollator(pad_id=0)):
        batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in collate(features()).items()}
        plain_loss, plain_grads = loss_and_grads(model_off, trainer_off, batch)
        loss, grads = loss_and_grads(model_on, trainer_on, batch)
        assert torch.isfinite(plain_loss) and abs(loss - plain_loss) < 5e-3 * plain_loss, (loss, plain_loss)
        assert (grads - plain_grads).norm() < 3e-2 * plain_grads.norm(), family


def test_counts_are_reduced_as_cuda_tensors_under_nccl(tmp_path):
    """NCCL cannot reduce CPU tensors: the callback's token and stop counts go on the rank's GPU."""
    import io

    import torch.distributed as dist

    from backend.training.callbacks import ReportingCallback
    from backend.runtime.stop_listener import StopListener

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        callback = ReportingCallback(reporter=None, stop=StopListener(io.StringIO()), device="cuda")
        callback.trainer = type("T", (), {"trained_tokens": 7, "input_tokens": 70, "head_tokens": 7, "row_tokens": 7})()
        callback._sync()
        assert callback._all_tokens == 7 and callback._counts == (70, 7, 7)
    finally:
        dist.destroy_process_group()
