"""Every verdict before Start (backend.estimate.start_verdicts), in `train` and `estimate`: a model folder
with config.json alone, the estimate over this machine's memory (overridden only by --start-anyway,
which the run folder records), a data file that is gone and a runs folder that cannot take a run; all
said at once, exit 2, no run folder made. `estimate --fetch-config` fetches config.json alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import backend.cli.app
import backend.estimate.start_verdicts as start_verdicts
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.paths import hub_folder, runs_dir
from backend.core.runs.run_folder import RunFolder
from tests.conftest import PRESET

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}


@pytest.fixture
def config_only(tmp_path) -> Path:
    """A model folder holding config.json and nothing else (as --fetch-config leaves it)."""
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    return folder


@pytest.fixture
def small_memory(monkeypatch):
    """This machine as a 1 MiB device: any estimate is over it."""
    monkeypatch.setattr(start_verdicts, "machine_limit", lambda machine: (1 << 20, "a fake 1 MiB device"))


def command(argv: list[str], capsys, *sets: str) -> tuple[int, list[str], list[str]]:
    code = main([*argv, *[part for item in sets for part in ("--set", item)]])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def no_run_folder() -> bool:
    return not runs_dir().exists() or not any(runs_dir().iterdir())


def test_every_problem_at_once_and_no_run_folder(config_only, small_memory, capsys, tmp_path):
    code, _, lines = command(["train", str(PRESET)], capsys, f"model.path={config_only}",
                             f"data.path={tmp_path / 'gone.jsonl'}")
    assert code == 2 and no_run_folder()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors[0] == (f"error: model.path: no weight files in {config_only} (only config.json is enough to "
                         "estimate, not to train); download the model first, or point model.path at a folder with "
                         "its *.safetensors")
    assert errors[1].startswith(f"error: data.path: {tmp_path / 'gone.jsonl'} does not exist; ")
    assert errors[2].startswith("error: memory: the estimate is ") and "over the 1.0 MiB of a fake 1 MiB device" in \
        errors[2] and "the largest parts: weights " in errors[2] and errors[2].endswith(
        "or add --start-anyway if you know better")
    assert len(errors) == 3 and lines[-1].startswith("hint: nothing was started; fix these 3 problems")


def test_the_memory_verdict_alone_refuses(small_memory, capsys):
    code, _, lines = command(["train", str(PRESET)], capsys)
    assert code == 2 and no_run_folder()
    assert len(lines) == 2 and lines[0].startswith("error: memory: ") and "--start-anyway" in lines[0]


def test_start_anyway_overrides_memory_only_and_is_recorded(small_memory, capsys, monkeypatch, config_only):
    code, _, lines = command(["train", str(PRESET), "--start-anyway"], capsys, f"model.path={config_only}")
    assert code == 2 and no_run_folder()  # --start-anyway overrides nothing else
    assert [line for line in lines if line.startswith("error: ")][0].startswith("error: model.path: no weight files")

    class Worker:
        def __init__(self, **kwargs) -> None:
            pass

        def run(self, folder, config, **kwargs) -> dict:
            return {"type": "JobFailed", "message": "not started in this test", "kind": "internal"}

    monkeypatch.setattr(backend.cli.app, "WorkerProcess", Worker)
    code, _, lines = command(["train", str(PRESET), "--start-anyway"], capsys)
    folders = list(runs_dir().iterdir())
    assert code == 1 and len(folders) == 1
    record = json.loads((folders[0] / "started_anyway.json").read_text())
    assert record["started_anyway"] is True and record["verdicts"][0].startswith("memory: the estimate is ")
    assert any(line.startswith("started anyway (1 verdict(s) overridden") for line in lines)


def test_a_runs_folder_that_is_a_file(capsys, studio_home):
    (studio_home / "runs").write_text("not a folder")
    code, _, lines = command(["train", str(PRESET)], capsys)
    assert code == 2
    assert lines[0] == (f"error: runs folder: {studio_home / 'runs'} is a file, so no run folder can be made there; "
                        "move it away, or set FINETUNE_STUDIO_HOME to a folder you can write")


def test_a_taken_run_folder_name_gets_another_suffix(monkeypatch, tmp_path):
    import backend.core.runs.run_folder as run_folder

    suffixes = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda n: next(suffixes))
    monkeypatch.setattr(run_folder.time, "strftime", lambda fmt: "20260101-000000")
    config = RunConfig.load(PRESET)
    first, second = RunFolder.create(config, tmp_path), RunFolder.create(config, tmp_path)
    assert first.path.name.endswith("-aaaa") and second.path.name.endswith("-bbbb")


def test_estimate_shows_the_estimate_and_the_start_verdicts(config_only, capsys):
    code, out, _ = command(["estimate", str(PRESET), "--worst-case"], capsys, f"model.path={config_only}")
    assert code == 0 and any(line.startswith("total") or "total" in line for line in out)
    assert f"cannot start: model.path: no weight files in {config_only}" in "\n".join(out)
    code, out, _ = command(["estimate", str(PRESET), "--worst-case", "--json"], capsys, f"model.path={config_only}")
    data = json.loads(out[0])
    assert data["total_bytes"] > 0 and data["start_blockers"][0].startswith("model.path: no weight files")


def test_estimate_says_the_memory_verdict(small_memory, capsys):
    code, out, _ = command(["estimate", str(PRESET)], capsys)
    assert code == 0
    assert [line for line in out if line.startswith("cannot start: memory: ")][0].endswith(
        "or train with --start-anyway if you know better")


@pytest.fixture
def online(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_fetch_config_fetches_config_json_alone(online, monkeypatch, capsys):
    asked = []

    def fake_download(repo_id: str, filename: str, local_dir: Path, **kwargs) -> str:
        asked.append((repo_id, filename))
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / filename).write_text(json.dumps(LLAMA_70B))
        return str(Path(local_dir) / filename)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    code, out, err = command(["estimate", str(PRESET), "--fetch-config", "--worst-case"], capsys,
                             "model.path=hub:acme/llama-70b")
    folder = hub_folder("acme/llama-70b")
    assert code == 0 and asked == [("acme/llama-70b", "config.json")] and sorted(os.listdir(folder)) == ["config.json"]
    assert err[0] == f"config.json: {folder / 'config.json'}" and any("GiB" in line for line in out)
    assert (f"cannot start: model.path: no weight files in {folder} (only config.json is enough to estimate, not to "
            f"train); download the model first (the Model page, or `hf download acme/llama-70b --local-dir {folder}`)"
            ) in out
    command(["estimate", str(PRESET), "--fetch-config", "--worst-case"], capsys, "model.path=hub:acme/llama-70b")
    assert len(asked) == 1  # already there: not fetched again


def test_fetch_config_offline_says_why_in_one_line(capsys):
    code, _, err = command(["estimate", str(PRESET), "--fetch-config"], capsys, "model.path=hub:acme/llama-70b")
    assert code == 2 and err[0] == ("error: cannot fetch acme/llama-70b's config.json: offline: HF_HUB_OFFLINE is "
                                    "set, so downloads are off (unset it to enable them)")
    assert not hub_folder("acme/llama-70b").exists()


def test_fetch_config_without_network(online, monkeypatch, capsys):
    import huggingface_hub

    def unreachable(repo_id: str, filename: str, local_dir: Path, **kwargs) -> str:
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        raise ConnectionError("no route to host")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    code, _, err = command(["estimate", str(PRESET), "--fetch-config"], capsys, "model.path=hub:acme/llama-70b")
    assert code == 2 and err[0].startswith("error: cannot fetch acme/llama-70b's config.json: could not reach ")
    assert len(err) <= 2 and not hub_folder("acme/llama-70b").exists()  # no empty folder left to read as downloaded
