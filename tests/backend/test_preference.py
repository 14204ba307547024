"""technique.objective dpo: the DPO job on the bundled model makes it prefer the chosen answers of
held-out pairs, in the SFT job's run folder and events; malformed pairs are refused with their line."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import Capabilities, decode_event
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from backend.cli.eval import format_report
from tests.backend.objective_runs import evaluate_run, run_preset
from tests.conftest import ROOT

DPO_PRESET = ROOT / "resources" / "presets" / "tiny_dpo.yaml"
CPU = Capabilities(cuda=False)
REWARDS = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"}


def run_dpo(tmp_path: Path, overrides: list[str], name: str = "run") -> list:
    return run_preset(tmp_path, DPO_PRESET, overrides, name)


def held_out_pairs() -> list[dict[str, str]]:
    """The demo task's held-out examples as pairs, built by the same script as demo_dpo.jsonl."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from build_preference_data import pair
    finally:
        sys.path.pop(0)
    lines = (ROOT / "resources" / "datasets" / "demo_eval.jsonl").read_text().splitlines()
    return [pair(json.loads(line)) for line in lines if line.strip()]


@torch.no_grad()
def answer_logp(model, tokenizer, prompt: str, answer: str) -> float:
    """log p(answer | prompt) under the chat template, the answer's end-of-turn included."""
    user = [{"role": "user", "content": prompt}]
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": answer}], tokenize=False)
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert ids[:len(head_ids)] == head_ids
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return float(logp[len(head_ids) - 1:].sum())


def preference_accuracy(model, tokenizer, pairs) -> float:
    """Share of pairs where log p(chosen) > log p(rejected)."""
    wins = sum(answer_logp(model, tokenizer, p["prompt"], p["chosen"])
               > answer_logp(model, tokenizer, p["prompt"], p["rejected"]) for p in pairs)
    return wins / len(pairs)


def base_and_tuned_accuracy(adapter: Path, pairs) -> tuple[float, float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter)
    base = AutoModelForCausalLM.from_pretrained(ROOT / "resources" / "tiny", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    with model.disable_adapter():
        before = preference_accuracy(model, tokenizer, pairs)
    return before, preference_accuracy(model, tokenizer, pairs)


def test_dpo_makes_the_model_prefer_the_chosen_answers(bundled_model, tmp_path):
    events = run_dpo(tmp_path, ["train.max_steps=30", "train.save_steps=15", "data.max_examples=264",
                                "data.validation_split=0.1", "train.eval_steps=0"])
    finished = events[-1]
    assert finished.type == "JobFinished" and finished.steps == 30 and not finished.stopped, finished
    metrics = [e for e in events if e.type == "MetricsLogged"]
    assert len(metrics) == 30 and all(REWARDS <= set(m.extra) for m in metrics)
    first, last = metrics[:5], metrics[-5:]
    mean = lambda ms, key: sum(m.extra[key] for m in ms) / len(ms)  # noqa: E731
    assert mean(last, "rewards/accuracies") > mean(first, "rewards/accuracies")
    assert mean(last, "rewards/margins") > 0.5 > mean(first, "rewards/margins")
    assert finished.final_loss < finished.first_loss and finished.tokens_per_s > 0
    assert [e.step for e in events if e.type == "CheckpointSaved"] == [15, 30]

    adapter = tmp_path / "run" / "adapter"
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved["r"] == 8 and not (adapter / "ref").exists()  # one adapter: the reference was the base
    before, after = base_and_tuned_accuracy(adapter, held_out_pairs())
    print(f"held-out preference accuracy: base {before:.2f}, tuned {after:.2f}")
    assert after >= 0.9 and after > before + 0.2, (before, after)

    report = evaluate_run(tmp_path / "run")  # finetune-studio eval: the run's own validation pairs
    pairs = report["preference"]
    print(f"eval, validation pairs ranked right: base {pairs['base']['accuracy']:.2f}, "
          f"tuned {pairs['tuned']['accuracy']:.2f}")
    assert pairs["kind"] == "pairs" and pairs["n"] == 26, pairs
    assert pairs["tuned"]["accuracy"] >= pairs["base"]["accuracy"] + 0.3, pairs
    assert pairs["tuned"]["margin"] > pairs["base"]["margin"]
    table = format_report(report)
    assert "pairs ranked right" in table and f"{pairs['tuned']['accuracy']:.1%}" in table


def test_a_malformed_pair_is_refused_with_its_line_and_field(bundled_model, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "Is it?", "chosen": "yes", "rejected": "no"}) + "\n"
                    + json.dumps({"prompt": "Is it?", "chosen": "yes"}) + "\n")
    with pytest.raises(JobError) as caught:
        run_dpo(tmp_path, [f"data.path={data}"])
    message = caught.value.message
    assert f"{data} line 2" in message and "'rejected'" in message and "\n" not in message
    data.write_text(json.dumps({"prompt": "Is it?", "chosen": "", "rejected": "no"}) + "\n")
    with pytest.raises(JobError, match="line 1: the field 'chosen' is empty"):
        run_dpo(tmp_path, [f"data.path={data}"], name="empty")


def test_instruction_data_is_refused_for_dpo_naming_the_fields(bundled_model, tmp_path):
    with pytest.raises(JobError) as caught:
        run_dpo(tmp_path, ["data.path=bundled:datasets/demo_train.jsonl"])
    assert "line 1" in caught.value.message and "no 'chosen' and no 'rejected'" in caught.value.message


def test_preference_data_under_sft_points_at_the_objective(bundled_model, tmp_path):
    from backend.core.data.examples import DatasetReader

    with pytest.raises(JobError) as caught:
        DatasetReader(ROOT / "resources" / "datasets" / "demo_dpo.jsonl")
    assert "technique.objective: dpo" in caught.value.hint


def test_the_new_fields_have_their_help_and_defaults():
    technique = RunConfig().technique
    assert (technique.objective, technique.dpo_beta, technique.dpo_loss) == ("sft", 0.1, "sigmoid")
    for name in ("objective", "dpo_beta", "dpo_loss"):
        assert type(technique).model_fields[name].description


def test_cli_trains_the_dpo_preset_through_the_worker(bundled_model, studio_home):
    """Also DPO's case of test_objective_memory_record (one worker run for both): the window's
    predicted / measured pair within 10%, the prediction the Train page's figure."""
    from tests.backend.test_objective_memory_record import MEMORY_RUN, assert_the_windows_pair_agrees

    overrides = [*MEMORY_RUN, "name=cli-dpo"]
    done = subprocess.run([sys.executable, "-m", "studio", "train", str(DPO_PRESET),
                           *sum((["--set", o] for o in overrides), [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finished" in done.stdout and "adapter:" in done.stdout and "Traceback" not in done.stderr
    assert "MFU:         n/a (not measured for this run)" in done.stdout  # DPO's FLOPs are not counted yet
    run_dir = Path(done.stdout.split("run folder:")[1].split()[0])
    assert_the_windows_pair_agrees(run_dir, RunConfig.load(DPO_PRESET, overrides))


def test_stop_and_save_keeps_a_complete_checkpoint_and_the_adapter(bundled_model, tmp_path):
    from backend.jobs.finetune import run_finetune
    from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder

    stop = StopListener(io.StringIO())

    class StopAtStep3(Reporter):
        def emit(self, event):
            super().emit(event)
            if event.type == "MetricsLogged" and event.step >= 3:
                stop.request(save=True)

    config = RunConfig.load(DPO_PRESET, ["train.max_steps=500", "train.save_steps=400", "data.max_examples=80",
                                         "data.validation_split=0"])
    run_dir = tmp_path / "stop"
    run_dir.mkdir()
    reporter = StopAtStep3(io.StringIO())
    reporter.attach_run(run_dir)
    run_finetune(config, run_dir, reporter, stop, capabilities=CPU)
    reporter.close()
    events = [decode_event(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    finished = events[-1]
    # the request lands after step 3 was logged: the next step boundary stops it
    assert finished.type == "JobFinished" and finished.stopped and 3 <= finished.steps <= 4, finished
    latest = RunFolder(run_dir).latest_checkpoint()
    assert latest is not None and latest.name == f"checkpoint-{finished.steps}"
    assert (latest / CHECKPOINT_MARKER).is_file()
    assert (latest / "adapter_model.safetensors").is_file() and (latest / "optimizer.pt").is_file()
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_a_dpo_run_resumes_from_its_checkpoint(bundled_model, tmp_path):
    """Also DPO's case of test_objective_samples (one run for both): answers sampled at each evaluation."""
    from tests.backend.test_objective_samples import EVALUATED, assert_samples_at_each_evaluation

    short = ["train.save_steps=2", *EVALUATED]
    run_dpo(tmp_path, ["train.max_steps=2", *short])
    from backend.jobs.finetune import run_finetune

    config = RunConfig.load(DPO_PRESET, ["train.max_steps=4", *short])
    run_dir = tmp_path / "run"
    reporter = Reporter(io.StringIO())
    reporter.attach_run(run_dir)
    run_finetune(config, run_dir, reporter, StopListener(io.StringIO()), resume=True, capabilities=CPU)
    reporter.close()
    events = [decode_event(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = [e for e in events if e.type == "JobStarted"]
    assert started[-1].resumed_from.endswith("checkpoint-2")
    assert [e.step for e in events if e.type == "MetricsLogged"] == [1, 2, 3, 4] and events[-1].steps == 4
    assert_samples_at_each_evaluation(events)  # an evaluation before the stop and one after the resume
