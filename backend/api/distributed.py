"""Beyond one device through `accelerate launch`: the config file, the command, the cluster script.

We never write a launcher of our own: the worker runs unchanged under `accelerate launch`, which
starts one process per device and sets up torch.distributed. Torch-free: the studio's Hardware
section and the CLI build these files.

A fact that shapes the DDP config: `accelerate launch --cpu --num_processes 2` silently runs ONE
process, while the multi-GPU launcher with `use_cpu` in the Trainer gives real two-process gloo DDP
on the CPU. So `ddp` is always written as MULTI_GPU; with no GPU the Trainer picks gloo.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from backend.core.config.run_config import RunConfig

ACCELERATE_CONFIG = "accelerate_config.yaml"
JOB_FILE = "start_job.json"


def accelerate_config(config: RunConfig, machine_rank: int = 0) -> dict[str, Any]:
    """The accelerate config dict for the run's hardware section."""
    hw = config.hardware
    precision = config.technique.precision
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    base: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "num_processes": hw.world_size,
        "num_machines": hw.num_machines,
        "machine_rank": machine_rank,
        "gpu_ids": hw.gpu_ids,
        "mixed_precision": mixed,
        "use_cpu": False,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "downcast_bf16": "no",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if hw.num_machines > 1:
        base["main_process_ip"] = hw.main_process_ip
        base["main_process_port"] = hw.main_process_port
    if hw.strategy == "ddp":
        base["distributed_type"] = "MULTI_GPU"
    elif hw.strategy == "fsdp":
        base["distributed_type"] = "FSDP"
        base["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_offload_params": hw.fsdp_cpu_offload,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": config.technique.gradient_checkpointing,
        }
    elif hw.strategy.startswith("deepspeed"):
        stage = 3 if hw.strategy == "deepspeed_zero3" else 2
        offload = config.technique.offload
        base["distributed_type"] = "DEEPSPEED"
        base["deepspeed_config"] = {
            "zero_stage": stage,
            "offload_optimizer_device": "cpu" if offload != "none" else "none",
            "offload_param_device": "cpu" if offload == "zero3_optimizer_params" else "none",
            "zero3_init_flag": stage == 3,
            "gradient_accumulation_steps": config.train.gradient_accumulation_steps,
            "gradient_clipping": 1.0,
        }
    return base


def write_launch_files(run_dir: Path, config: RunConfig, start_line: str, machine_rank: int = 0) -> tuple[Path, Path]:
    """accelerate_config.yaml and the StartJob file every rank reads (stdin is shared by ranks)."""
    cfg = run_dir / ACCELERATE_CONFIG
    cfg.write_text(yaml.safe_dump(accelerate_config(config, machine_rank), sort_keys=False), encoding="utf-8")
    job = run_dir / JOB_FILE
    job.write_text(start_line, encoding="utf-8")
    return cfg, job


def launch_argv(python: str, run_dir: Path, config_file: Path, job_file: Path) -> list[str]:
    """`accelerate launch` of the worker. The launcher runs without the current folder on sys.path, and
    each rank runs the worker as a script (its own folder leaves sys.path in __main__.py): `-m` in
    either would import a `backend/` or `accelerate/` from wherever the command was started. A frozen
    bundle routes `-m` itself and imports from the bundle alone."""
    if getattr(sys, "frozen", False):
        return [python, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
                "-m", "backend.worker", "--job-file", str(job_file)]
    from backend.runtime.processes import WORKER_SCRIPT, module_command

    return [*module_command("accelerate.commands.launch", python), "--config_file", str(config_file),
            str(WORKER_SCRIPT), "--job-file", str(job_file)]


def multinode_commands(config: RunConfig, config_path: str = "run.yaml") -> list[str]:
    """One command per machine, for the user to run there (the studio never logs in anywhere)."""
    return [f"finetune-studio train {shlex.quote(config_path)} --machine-rank {rank}   # on machine {rank}"
            for rank in range(config.hardware.num_machines)]


def slurm_script(config: RunConfig, config_path: str = "run.yaml", job_name: str = "finetune-studio") -> str:
    """An sbatch script: one task per node, each the same `finetune-studio train` with its node rank."""
    hw = config.hardware
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={hw.num_machines}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={hw.num_processes}
#SBATCH --output=%x-%j.out
set -euo pipefail
MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MAIN_IP
srun bash -c 'finetune-studio train {shlex.quote(config_path)} --machine-rank "$SLURM_NODEID" \\
  --set hardware.main_process_ip="$MAIN_IP"'
"""


def rendezvous_wait(config: RunConfig) -> tuple[str, str]:
    """(what machine 0 says while it waits, the one-line failure when nobody came) for a multi-node run."""
    hw = config.hardware
    others = ", ".join(str(n) for n in range(2, hw.num_machines + 1))
    where = f"{hw.main_process_ip}:{hw.main_process_port}"
    notice = (f"waiting for machine {others} of {hw.num_machines} to join at {where} "
              f"(giving up after {hw.rendezvous_timeout_s} s: hardware.rendezvous_timeout_s)")
    failure = (f"machine {others} of {hw.num_machines} did not join at {where} within "
               f"{hw.rendezvous_timeout_s} s (hardware.rendezvous_timeout_s)")
    return notice, failure


RENDEZVOUS_HINT = ("start the same command with --machine-rank N on every other machine first, "
                   "or set hardware.num_machines: 1")
