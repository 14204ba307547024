"""The one verdict before anything starts (backend.estimate.feasibility.before_start): `train` says every
problem at once, exits 2, makes no run folder and starts no worker; strategies, GPUs and a model
that is not downloaded are verdicts like the techniques."""

from __future__ import annotations

import pytest

import backend.cli.app
import backend.core.device_caps
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.device_caps import DetectedDevice
from backend.estimate.feasibility import before_start, blocking_lines, input_verdicts, lenient_config, verdicts
from backend.core.protocol import Capabilities, DeviceInfo
from backend.core.runs.run_folder import RunFolder
from tests.conftest import PRESET

CPU = Capabilities(cuda=False)
GPU = Capabilities(cuda=True, bf16=True, devices=[DeviceInfo(index=0, name="fake", total_bytes=1 << 34)])
TINY = {"model_type": "llama", "max_position_embeddings": 1024}


@pytest.fixture
def nothing_starts(monkeypatch):
    """A refusal must come before a run folder is made or a worker is built."""
    def refuse(*args, **kwargs):
        raise AssertionError("the run was about to start")

    monkeypatch.setattr(RunFolder, "create", classmethod(lambda cls, *a, **k: refuse()))
    monkeypatch.setattr(backend.cli.app, "WorkerProcess", refuse)


def train(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(["train", str(PRESET), *[part for item in argv for part in ("--set", item)]])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


def test_train_names_every_impossible_choice_at_once(nothing_starts, capsys):
    code, lines = train(["technique.precision=fp16", "technique.attention=flash_attention_2",
                         "technique.torch_compile=true", "technique.liger_kernel=true"], capsys)
    assert code == 2
    errors = [line for line in lines if line.startswith("error: ")]
    fields = ["technique.precision", "technique.attention", "technique.liger_kernel", "technique.torch_compile"]
    assert len(errors) == 4 and all(any(line.startswith(f"error: {f}: ") for line in errors) for f in fields), lines
    assert lines[-1].startswith("hint: nothing was started; fix these 4 problems")


def test_train_says_a_combination_rule_and_a_verdict_together(nothing_starts, capsys):
    code, lines = train(["technique.objective=kto", "train.micro_batch_size=1", "technique.liger_kernel=true",
                         "data.path=bundled:datasets/demo_kto.jsonl"], capsys)
    assert code == 2
    assert "technique.objective kto needs train.micro_batch_size 2" in lines[0]
    assert lines[1].startswith("error: technique.liger_kernel: ") and len(lines) == 3, lines


def test_deepspeed_on_the_cpu_is_one_line_naming_the_field_and_the_fix(nothing_starts, capsys):
    code, lines = train(["hardware.strategy=deepspeed_zero2"], capsys)
    assert code == 2 and len(lines) == 2, lines
    assert lines[0] == ("error: hardware.strategy: deepspeed_zero2 runs through DeepSpeed, which needs a CUDA GPU; "
                        "set hardware.strategy: single on this machine")


def test_deepspeed_not_installed_on_a_gpu_machine(nothing_starts, capsys, monkeypatch):
    """NVML finds a GPU; DeepSpeed is looked up with find_spec (not imported) and is absent here."""
    monkeypatch.setattr(backend.core.device_caps, "detected_device",
                        lambda: DetectedDevice("cuda", "NVML found 1 GPU(s): fake", tuple(GPU.devices), True))
    monkeypatch.setattr(backend.core.device_caps, "_installed", lambda module: module != "deepspeed")
    code, lines = train(["hardware.strategy=deepspeed_zero2"], capsys)
    assert code == 2, lines
    assert lines[0].startswith("error: hardware.strategy: deepspeed_zero2 needs the DeepSpeed package, which is "
                               "not installed; pip install"), lines


def test_a_model_that_is_not_downloaded_is_a_verdict(nothing_starts, capsys):
    code, lines = train(["model.path=hub:nobody/nothing", "technique.liger_kernel=true"], capsys)
    assert code == 2
    assert lines[0].startswith("error: model.path: hub:nobody/nothing is not downloaded yet") and "hf download" in lines[0]
    assert lines[1].startswith("error: technique.liger_kernel"), lines


def test_resume_is_judged_before_its_worker_starts(nothing_starts, capsys, tmp_path):
    folder = RunFolder(tmp_path / "run")
    (folder.checkpoints_dir / "checkpoint-2").mkdir(parents=True)
    (folder.checkpoints_dir / "checkpoint-2" / "checkpoint_complete.json").write_text("{}")
    RunConfig.load(PRESET, ["technique.liger_kernel=true"]).save(folder.config_path)
    folder.events_path.write_text('{"type": "JobStarted", "run_dir": "x", "max_steps": 4}\n')
    assert main(["train", "--resume", str(folder.path)]) == 2
    assert "technique.liger_kernel" in capsys.readouterr().err


@pytest.mark.parametrize("strategy, words", [("deepspeed_zero3", "needs a CUDA GPU"), ("fsdp", "needs CUDA")])
def test_strategies_that_need_cuda(strategy, words):
    config = RunConfig.load(PRESET, [f"hardware.strategy={strategy}", "hardware.num_processes=2"])
    found = [v for v in verdicts(config, TINY, CPU) if v.field == "hardware.strategy"]
    assert len(found) == 1 and found[0].blocks and words in found[0].reason
    assert found[0].estimate_as == "ddp" and "ddp" in found[0].fix


def test_ddp_on_the_cpu_runs():
    config = RunConfig.load(PRESET, ["hardware.strategy=ddp", "hardware.num_processes=2"])
    assert not [v for v in before_start(config, CPU, TINY) if v.blocks]


def test_more_processes_than_gpus_and_a_gpu_that_is_not_there():
    config = RunConfig.load(PRESET, ["hardware.strategy=ddp", "hardware.num_processes=2"])
    lines = blocking_lines(before_start(config, GPU, TINY))
    assert lines == ["hardware.num_processes: 2 processes, one per GPU, but hardware.gpu_ids all gives 1 GPU(s) here; "
                     "set hardware.num_processes to 1 or less"]
    config = RunConfig.load(PRESET, ["hardware.strategy=ddp", "hardware.gpu_ids=0,3"])
    assert blocking_lines(before_start(config, GPU, TINY))[0].startswith("hardware.gpu_ids: GPU 3 is not on")


def test_input_verdicts_name_the_missing_files(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {f"model.path={tmp_path / 'gone'}": "does not exist", f"model.path={empty}": "has no config.json",
             f"data.path={tmp_path / 'd.jsonl'}": "d.jsonl does not exist"}
    for override, words in cases.items():
        found = input_verdicts(RunConfig.load(PRESET, [override]))
        assert len(found) == 1 and found[0].blocks and words in found[0].reason and found[0].fix
    assert input_verdicts(RunConfig.load(PRESET)) == []


def test_lenient_config_keeps_the_choices_of_a_draft_that_breaks_a_rule():
    config = lenient_config({"technique": {"objective": "kto", "liger_kernel": True}, "train": {"micro_batch_size": 1}})
    assert config is not None and config.technique.liger_kernel and config.train.micro_batch_size == 1
    assert lenient_config({"train": {"max_steps": "many"}}) is None


def test_a_refusal_imports_no_torch():
    """The verdicts are torch-free: a refused `train` answers without loading torch or transformers."""
    import subprocess
    import sys

    code = ("import sys; from backend.cli.app import main; "
            "code = main(['train', sys.argv[1], '--set', 'technique.liger_kernel=true']); "
            "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(PRESET)], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert "error: technique.liger_kernel" in done.stderr
