"""The deploy commands as a new user meets them (issue 34): what a stop says per job, a prune that would
keep almost nothing, an unfinished run refused before a worker starts, an export written elsewhere still
served from its run, and one exit convention for a serving verdict of "does not fit".
"""

from __future__ import annotations

import signal

import pytest

from backend.cli.app import main
from backend.cli.worker_process import WorkerProcess, stop_notice
from backend.core.errors import JobError
from backend.pruning.request import MIN_FFN_KEEP, PruneRequest, Shape
from tests.conftest import BUNDLED_MODEL


@pytest.mark.parametrize("job", ["export", "prune", "evaluate"])
def test_sigterm_says_what_a_job_other_than_a_fine_tune_does(job, capsys):
    WorkerProcess(job=job)._on_sigterm(signal.SIGTERM, None)  # no worker yet: only the message
    said = capsys.readouterr().out
    assert "checkpoint" not in said and said.strip() == f"terminated: {stop_notice(job)}"
    assert ("removed" in said) if job != "evaluate" else ("no report" in said)


def test_sigterm_and_ctrl_c_of_a_fine_tune_still_save_a_checkpoint(capsys):
    WorkerProcess()._on_sigterm(signal.SIGTERM, None)
    WorkerProcess(job="prune")._on_sigint(signal.SIGINT, None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "terminated: stopping at the next step and saving a checkpoint"
    assert "checkpoint" not in lines[-1] and lines[-1].endswith("(Ctrl-C again to kill)")


def test_a_second_ctrl_c_kills_a_job_whose_stop_already_cancels():
    class Proc:
        killed = 0

        def running(self):
            return True

        def kill(self):
            self.killed += 1

    for job, kills_at in (("prune", 2), ("finetune", 3)):
        worker = WorkerProcess(job=job)
        worker._proc = proc = Proc()  # type: ignore[assignment]
        worker.stop = lambda save=True: None  # type: ignore[method-assign]
        presses = 0
        while not proc.killed:
            worker._on_sigint(signal.SIGINT, None)
            presses += 1
        assert presses == kills_at and worker._interrupts >= 3  # a kill asked for ends as cancelled


def test_a_keep_ratio_below_the_floor_is_refused_naming_the_flag_and_the_fix():
    shape = Shape.read(BUNDLED_MODEL)
    with pytest.raises(JobError) as caught:
        PruneRequest.parse({"ffn_keep": 0.0001}).check(shape)
    message = caught.value.message
    assert message.startswith("--ffn-keep 0.0001: keeps 1 of 768 FFN channels") and "--layers" in message
    assert f"{MIN_FFN_KEEP:g}" in message
    PruneRequest.parse({"ffn_keep": MIN_FFN_KEEP}).check(shape)  # the floor itself is allowed


def test_the_cli_refuses_a_tiny_keep_ratio_in_one_line_before_anything_starts(capsys, studio_home):
    code = main(["prune", str(BUNDLED_MODEL), "--ffn-keep", "0.0001"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--ffn-keep 0.0001" in err
    assert not (studio_home / "runs").exists() or not any((studio_home / "runs").iterdir())


def _unfinished_run(root):
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder
    from tests.conftest import PRESET

    folder = RunFolder.create(RunConfig.load(PRESET, ["name=unfinished"]), root=root)
    folder.append_event({"type": "JobStarted", "job": "finetune", "run_dir": str(folder.path), "max_steps": 60})
    (folder.path / "worker.log").write_text("training...\n")
    return folder


@pytest.mark.parametrize("command", [["export", "--format", "merged"], ["prune", "--layers", "1"]])
def test_an_unfinished_run_is_refused_before_a_worker_starts_and_nothing_is_written(command, tmp_path, capsys,
                                                                                  monkeypatch):
    folder = _unfinished_run(tmp_path)
    started = []
    monkeypatch.setattr(WorkerProcess, "run", lambda self, *a, **k: started.append(self.job))
    events, log = folder.events_path.read_bytes(), folder.log_path.read_bytes()
    code = main([command[0], str(folder.path), *command[1:]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and started == [] and len(err.splitlines()) == 1, err
    assert "has no adapter/: the run never finished (still training" in err
    assert f"finetune-studio train {folder.config_path}" in err and f"then {command[0]}" in err
    assert folder.events_path.read_bytes() == events and folder.log_path.read_bytes() == log
    assert not (folder.path / "exports").exists() and not (folder.path / "pruned").exists()


def _exported_elsewhere(tmp_path):
    """A run whose merged export was written outside it (`export --out`), as the export job records it."""
    import shutil

    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder
    from tests.conftest import PRESET

    folder = RunFolder.create(RunConfig.load(PRESET, ["name=elsewhere"]), root=tmp_path / "runs")
    out = tmp_path / "shipped" / "merged"
    shutil.copytree(BUNDLED_MODEL, out)
    (out / "export_report.json").write_text('{"format": "merged"}')
    folder.record_export("merged", out)
    return folder, out


def test_serve_finds_an_export_written_elsewhere_and_skips_one_moved_away_with_a_note(tmp_path, capsys):
    import shutil

    from backend.serving import resolve
    from backend.serving.engines import transformers_launch

    folder, out = _exported_elsewhere(tmp_path)
    source = resolve(str(folder.path), None)
    assert source.serve_path == str(out) and source.notes == []
    assert transformers_launch(source, 8131, "fs-token", "cpu").model == str(out)
    assert main(["serve-estimate", str(folder.path), "--card-gb", "24"]) == 0
    assert f"model:       {out} (merged" in capsys.readouterr().out

    shutil.move(str(out), str(tmp_path / "moved"))
    code = main(["serve", str(folder.path), "--port", "0", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"the merged export recorded at {out} is gone (moved or deleted)" in err
    assert f"`finetune-studio export {folder.path} --format merged`" in err
    assert main(["serve-estimate", str(folder.path), "--card-gb", "24"]) == 0
    assert f"note: the merged export recorded at {out} is gone (moved or deleted); skipped" in capsys.readouterr().out


def _fixture(name: str) -> str:
    from tests import model_configs

    return str(model_configs.CONFIGS_DIR / name)


@pytest.mark.parametrize("args, verdict", [
    (["meta-llama--Llama-3.3-70B-Instruct", "--card-gb", "24"], "does not fit: the weights (131.42 GiB)"),
    (["meta-llama--Llama-3.1-8B-Instruct", "--card-gb", "17", "--context", "65536"],
     "does not fit: not one sequence of 65,536 tokens fits: it needs 8.00 GiB of KV cache"),
    (["meta-llama--Llama-3.1-8B-Instruct", "--card-gb", "24", "--concurrency", "100000"],
     "does not fit: 100,000 sequences at once cannot each hold even one token"),
], ids=["weights", "context", "concurrency"])
def test_serve_estimate_says_does_not_fit_one_way_exit_1_verdict_first(args, verdict, capsys):
    assert main(["serve-estimate", _fixture(args[0]), *args[1:]]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(verdict) and lines[1].startswith("model:") and "card:" in lines[2]
    assert main(["serve-estimate", _fixture(args[0]), *args[1:], "--json"]) == 1
    import json

    assert json.loads(capsys.readouterr().out)["does_not_fit"] == lines[0].removeprefix("does not fit: ")


def test_serve_estimate_help_states_the_exit_convention(capsys):
    with pytest.raises(SystemExit):
        main(["serve-estimate", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 when every plan asked for fits; 1 when one does not fit" in flat
    assert "2 for bad input" in flat and "in GiB" in flat


def test_the_card_is_taken_in_gib_without_a_cuda_context_and_the_gaps_are_said(capsys):
    from backend.serving import Card
    from backend.serving.sizing import VLLM_GAPS, runtime_bytes
    from backend.estimate.estimator import CUBLAS_WORKSPACE_BYTES

    assert Card(24).budget == int(0.9 * 24 * 2**30) and runtime_bytes() == CUBLAS_WORKSPACE_BYTES
    assert main(["serve-estimate", _fixture("meta-llama--Llama-3.1-8B-Instruct"), "--card-gb", "24"]) == 0
    out = capsys.readouterr().out
    assert "card:        0.9 x 24 GiB = 21.60 GiB for vLLM" in out and f"note: {VLLM_GAPS}" in out
    assert "CUDA graphs are not counted" in VLLM_GAPS and "not checked here" in VLLM_GAPS
    assert "other 10%" not in out and "768 MiB" not in out
