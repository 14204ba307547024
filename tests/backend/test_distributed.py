"""Beyond one device through `accelerate launch`: real two-process DDP on the CPU over gloo, and the
files the Hardware section writes for FSDP, DeepSpeed and clusters."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from backend.core.config.run_config import ConfigError, RunConfig
from backend.api.distributed import accelerate_config, multinode_commands, slurm_script
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET


def test_ddp_with_two_cpu_processes(bundled_model):
    config = RunConfig.load(PRESET, ["hardware.strategy=ddp", "hardware.num_processes=2", "train.max_steps=12",
                                     "train.save_steps=6", "data.max_examples=160", "train.seq_len=128",
                                     "train.micro_batch_size=4", "name=ddp"])
    folder = RunFolder.create(config)
    events: list[dict] = []
    terminal = WorkerProcess().run(folder, config, on_event=events.append)
    assert terminal["type"] == "JobFinished", terminal
    for rank, log in ((0, folder.path / "worker.log"), (1, folder.path / "worker-rank1.log")):
        assert f"rank {rank} of 2 (ddp)" in log.read_text(), f"rank {rank} did not run"
    losses = [e["loss"] for e in events if e["type"] == "MetricsLogged"]
    assert losses[-1] < losses[0]
    assert (folder.adapter_dir / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in folder.path.iterdir() if p.name.startswith("adapter")) == ["adapter"]
    started = [e for e in folder.iter_events() if e["type"] == "JobStarted"]
    assert len(started) == 1, "only rank 0 reports"
    written = yaml.safe_load((folder.path / "accelerate_config.yaml").read_text())
    assert written["distributed_type"] == "MULTI_GPU" and written["num_processes"] == 2


def test_single_strategy_refuses_several_processes():
    with pytest.raises(ConfigError, match="hardware.strategy single runs one process"):
        RunConfig.load(PRESET, ["hardware.num_processes=2"])


@pytest.mark.parametrize("strategy, kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"),
                                            ("deepspeed_zero2", "DEEPSPEED"), ("deepspeed_zero3", "DEEPSPEED")])
def test_accelerate_config_per_strategy(strategy, kind):
    config = RunConfig.load(PRESET, [f"hardware.strategy={strategy}", "hardware.num_processes=4",
                                     "hardware.fsdp_cpu_offload=true"])
    written = accelerate_config(config)
    assert written["distributed_type"] == kind and written["num_processes"] == 4
    if strategy == "fsdp":
        assert written["fsdp_config"]["fsdp_offload_params"] is True
    if strategy.startswith("deepspeed"):
        assert written["deepspeed_config"]["zero_stage"] == int(strategy[-1])


def test_multinode_commands_and_slurm_script():
    config = RunConfig.load(PRESET, ["hardware.strategy=ddp", "hardware.num_processes=8", "hardware.num_machines=2",
                                     "hardware.main_process_ip=10.0.0.1"])
    assert accelerate_config(config, machine_rank=1)["num_processes"] == 16
    commands = multinode_commands(config, "run.yaml")
    assert commands[1].startswith("finetune-studio train run.yaml --machine-rank 1")
    script = slurm_script(config, "run.yaml")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert '--machine-rank "$SLURM_NODEID"' in script
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
def test_fsdp_on_gpus(bundled_model):
    """FSDP needs an accelerator: accelerate's FSDP plugin refuses or ignores it on the CPU."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    config = RunConfig.load(PRESET, ["hardware.strategy=fsdp", "hardware.num_processes=2", "train.max_steps=6"])
    terminal = WorkerProcess().run(RunFolder.create(config), config)
    assert terminal["type"] == "JobFinished", terminal
