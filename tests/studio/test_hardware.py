"""Hardware section of the Techniques page: the process cap, the multi-node files, the estimate's inputs."""

from __future__ import annotations

import os

import backend.estimate


def test_processes_are_capped_by_the_gpus_seen(qtbot, make_studio):
    studio = make_studio()
    hardware = studio.pages["techniques"].hardware
    spin = hardware.editors["hardware.num_processes"]
    assert spin.maximum() == 1  # single: one process
    studio.config.set("hardware.strategy", "ddp")
    hardware.set_gpu_count(0)
    assert spin.maximum() == max(1, os.cpu_count() or 1) and "gloo" in hardware.cap_label.text()
    studio.config.set("hardware.strategy", "fsdp")
    assert spin.maximum() == 1 and not hardware.editors["hardware.fsdp_cpu_offload"].isHidden()
    hardware.set_gpu_count(4)
    assert spin.maximum() == 4 and "4 GPU(s) seen" in hardware.cap_label.text()
    spin.setValue(3)
    assert studio.config.get("hardware.num_processes") == 3


def test_several_machines_show_the_launch_files(qtbot, make_studio, tmp_path):
    studio = make_studio()
    hardware = studio.pages["techniques"].hardware
    assert hardware.multinode.isHidden() and hardware.editors["hardware.main_process_ip"].isHidden()
    hardware.set_gpu_count(2)
    studio.config.set("hardware.strategy", "ddp")
    studio.config.set("hardware.num_processes", 2)
    studio.config.set("hardware.num_machines", 2)
    studio.config.set("hardware.main_process_ip", "10.0.0.1")
    assert not hardware.multinode.isHidden() and not hardware.editors["hardware.main_process_ip"].isHidden()
    accelerate = hardware.texts["accelerate"].toPlainText()
    assert "num_machines: 2" in accelerate and "main_process_ip: 10.0.0.1" in accelerate
    assert "num_processes: 4" in accelerate and "distributed_type: MULTI_GPU" in accelerate
    assert "--machine-rank 1" in hardware.texts["commands"].toPlainText()
    assert "#SBATCH --nodes=2" in hardware.texts["slurm"].toPlainText()
    hardware.tabs.setCurrentIndex(2)
    target = tmp_path / "job.sbatch"
    hardware.ask_save_path = lambda suggested: str(target)
    hardware.save_button.click()
    assert target.read_text(encoding="utf-8").startswith("#!/bin/bash")
    hardware.copy_button.click()
    from PySide6.QtGui import QGuiApplication
    assert QGuiApplication.clipboard().text().startswith("#!/bin/bash")


def test_the_estimate_gets_the_gpus_and_the_zero_stage(qtbot, make_studio, monkeypatch):
    studio = make_studio()
    calls = []
    real = backend.estimate.estimate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(backend.estimate, "estimate", spy)
    studio.config.set("hardware.strategy", "deepspeed_zero3")
    studio.config.set("hardware.num_processes", 2)
    studio.estimate.recompute()
    assert calls[-1]["num_gpus"] == 2 and calls[-1]["zero_stage"] == 3
    studio.config.set("hardware.strategy", "ddp")
    studio.estimate.recompute()
    assert calls[-1]["zero_stage"] == 0
