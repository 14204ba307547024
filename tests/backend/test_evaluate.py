"""Evaluate a short real run: base vs tuned perplexity and exact match, the report, the CLI table,
and the sample answers a fine-tune emits at each evaluation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET, ROOT

torch.set_num_threads(1)
STEPS = 30


@pytest.fixture(scope="module")
def trained(thirty_step_run, tmp_path_factory):
    """A 30-step LoRA run of the demo preset, evaluated at step 15 and at the end (conftest's, copied: the
    evaluations here write into the folder, which test_worker_e2e reads as the fine-tune left it)."""
    import shutil

    folder, config, events, terminal = thirty_step_run
    assert terminal["type"] == "JobFinished", terminal
    copy = tmp_path_factory.mktemp("runs") / folder.path.name
    shutil.copytree(folder.path, copy)
    return RunFolder(copy), config, events


def test_fine_tune_emits_sample_answers_at_each_evaluation(trained):
    _, _, events = trained
    evals = [e["step"] for e in events if e["type"] == "EvalFinished"]
    assert 15 in evals and STEPS in evals
    samples = [(a, b) for a, b in zip(events, events[1:]) if a["type"] == "PhaseChanged" and a["phase"] == "sample"]
    assert len(samples) == 6, samples  # 3 fixed prompts at step 15 and at step 30 (the final eval repeats 30)
    assert all(b["type"] == "TokensGenerated" and b["done"] for _, b in samples)
    prompts = [a["detail"] for a, _ in samples]
    assert prompts[:3] == prompts[3:] and prompts[0].startswith("Is this a question?")  # demo_eval.jsonl


def test_evaluate_compares_base_and_tuned(trained):
    folder, config, _ = trained
    events: list[dict] = []
    terminal = WorkerProcess(job="evaluate", params={"limit": 12, "max_new_tokens": 16}).run(
        folder, config, on_event=events.append)
    assert terminal["type"] == "JobFinished", terminal

    report = json.loads((folder.path / "eval_report.json").read_text())
    ppl, em = report["perplexity"], report["exact_match"]
    assert ppl["examples"] > 0 and ppl["tokens"] > 0
    assert ppl["tuned"]["perplexity"] < ppl["base"]["perplexity"], ppl
    assert em["n"] == 12 and em["prompts_file"].endswith("demo_eval.jsonl")
    for which in ("base", "tuned"):
        assert 0.0 <= em[which]["accuracy"] <= 1.0 and em[which]["n"] == 12
    assert len(report["examples"]) == 5 and {"prompt", "expected", "base", "tuned"} <= set(report["examples"][0])

    phases = [e for e in events if e["type"] == "PhaseChanged"]
    assert any(e["phase"] == "perplexity" and e["detail"].startswith("tuned ") and "/" in e["detail"] for e in phases)
    counts = [e["detail"] for e in phases if e["phase"] == "perplexity" and e["detail"].startswith("base ")]
    assert counts[0].startswith("base 0/") and counts[0].endswith(" examples")  # the count shows before the first batch
    assert phases[-1]["phase"] == "report" and "perplexity base" in phases[-1]["detail"]
    assert folder.status() == "finished"  # an evaluation does not change what the fine-tune was


def test_evaluate_says_which_examples_it_left_out(trained, tmp_path):
    """With data.skip_invalid the evaluation's data loader leaves out what the fine-tune's would, and says so."""
    folder, config, _ = trained
    data = tmp_path / "with_nulls.jsonl"
    rows = (ROOT / "resources" / "datasets" / "demo_train.jsonl").read_text(encoding="utf-8")
    data.write_text(rows + '{"instruction": "Is this a question?", "input": null, "output": null}\n', encoding="utf-8")
    changed = config.model_copy(update={"data": config.data.model_copy(update={"path": str(data), "skip_invalid": True})})
    events: list[dict] = []
    terminal = WorkerProcess(job="evaluate", params={"limit": 2, "max_new_tokens": 4}).run(
        folder, changed, on_event=events.append)
    assert terminal["type"] == "JobFinished", terminal
    warnings = [e["detail"] for e in events if e["type"] == "PhaseChanged" and e["phase"] == "data_warning"]
    assert len(warnings) == 1 and "1 " in warnings[0] and "line" in warnings[0], warnings
    assert json.loads((folder.path / "eval_report.json").read_text())["data_notes"] == warnings


def test_cli_prints_the_side_by_side_table(trained, tmp_path):
    folder, _, _ = trained
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Repeat this word.\n\nword{i}", "expected": f"word{i}"}) + "\n"
                               for i in range(3)))
    done = subprocess.run([sys.executable, "-m", "studio", "eval", str(folder.path), "--prompts", str(prompts),
                           "--max-new-tokens", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["base", "tuned"]
    assert lines[1].startswith("perplexity") and len(lines[1].split()) == 3
    assert lines[2].startswith("exact match") and lines[2].count("%") == 2
    assert "3 prompts from" in done.stdout and "Traceback" not in done.stderr
    assert json.loads((folder.path / "eval_report.json").read_text())["exact_match"]["n"] == 3


def test_requests_are_checked_before_anything_loads(tmp_path):
    from backend.jobs.evaluate import EvalRequest

    config = RunConfig.load(PRESET)
    with pytest.raises(JobError, match="unknown evaluate option"):
        EvalRequest(config, {"promps": "x"})
    with pytest.raises(JobError, match="limit must be a whole number"):
        EvalRequest(config, {"limit": 0})
    with pytest.raises(JobError, match="does not exist"):
        EvalRequest(config, {"prompts": str(tmp_path / "missing.jsonl")})
    assert EvalRequest(config, {}).prompts_file.name == "demo_eval.jsonl"

    own = tmp_path / "mine.jsonl"
    own.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n")
    skipped = EvalRequest(config.model_copy(update={"data": config.data.model_copy(update={"path": str(own)})}), {})
    assert skipped.prompts_file is None and skipped.skipped.startswith("exact match skipped")


def test_prompt_files_in_training_formats(tmp_path):
    from backend.evaluation.prompts import read_prompts

    path = tmp_path / "p.jsonl"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    path.write_text(json.dumps({"messages": chat}) + "\n")
    [prompt] = read_prompts(path)
    assert prompt.messages == [{"role": "user", "content": "hi"}] and prompt.expected == "yo"
    path.write_text(json.dumps({"text": "no answer here"}) + "\n")
    with pytest.raises(JobError, match="no expected answer"):
        read_prompts(path)


def test_evaluate_after_the_runs_data_was_deleted_says_so_in_one_line(trained, tmp_path):
    from backend.core.errors import JobError
    from backend.jobs.evaluate import run_evaluate

    folder, config, _ = trained
    gone = config.model_copy(update={"data": config.data.model_copy(update={"path": str(tmp_path / "deleted.jsonl")})})

    class Quiet:
        def emit(self, event) -> None:
            pass

    with pytest.raises(JobError) as caught:
        run_evaluate(gone, folder.path, Quiet(), None, params={"limit": 1})
    assert caught.value.kind == "bad_input"
    assert caught.value.message.startswith(f"the run's data {tmp_path / 'deleted.jsonl'} no longer exists")
    assert "config.yaml" in caught.value.hint
