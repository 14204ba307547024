"""technique.objective kto: the KTO job on the bundled model makes it prefer the desirable answers of
held-out questions, in the SFT job's run folder and events; every data shape is read, pairs are
unpaired with a note, and malformed data, one-label data and a batch of 1 are refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.config.errors import ConfigError
from backend.core.errors import JobError
from backend.core.protocol import Capabilities
from tests.backend.test_preference import answer_logp, base_and_tuned_accuracy, held_out_pairs
from tests.backend.objective_runs import evaluate_run, run_preset
from tests.conftest import ROOT

KTO_PRESET = ROOT / "resources" / "presets" / "tiny_kto.yaml"
CPU = Capabilities(cuda=False)
METRICS = {"kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"}


def run_kto(tmp_path: Path, overrides: list[str], name: str = "run") -> list:
    return run_preset(tmp_path, KTO_PRESET, overrides, name)


def held_out_kto() -> list[dict]:
    """The demo task's held-out examples as labelled answers, built by the same script as demo_kto.jsonl."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from build_preference_data import kto_example
    finally:
        sys.path.pop(0)
    lines = [line for line in (ROOT / "resources" / "datasets" / "demo_eval.jsonl").read_text().splitlines() if line]
    return [kto_example(json.loads(line), i) for i, line in enumerate(lines)]


@torch.no_grad()
def label_accuracy(adapter: Path, examples: list[dict]) -> float:
    """Share of labelled answers the tuned model judges as labelled: log p_tuned - log p_reference (the base,
    adapters off) above 0 for a desirable answer, below 0 for an undesirable one."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(adapter)
    base = AutoModelForCausalLM.from_pretrained(ROOT / "resources" / "tiny", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    tuned = [answer_logp(model, tokenizer, e["prompt"], e["completion"]) for e in examples]
    with model.disable_adapter():
        reference = [answer_logp(model, tokenizer, e["prompt"], e["completion"]) for e in examples]
    return sum((t > r) == e["label"] for t, r, e in zip(tuned, reference, examples)) / len(examples)


def test_kto_makes_the_model_prefer_the_desirable_answers(bundled_model, tmp_path):
    events = run_kto(tmp_path, ["train.save_steps=40", "train.eval_steps=0"])  # the preset's 40 steps
    finished = events[-1]
    assert finished.type == "JobFinished" and finished.steps == 40 and not finished.stopped, finished
    metrics = [e for e in events if e.type == "MetricsLogged"]
    assert len(metrics) == 40 and all(METRICS <= set(m.extra) for m in metrics)
    mean = lambda ms, key: sum(m.extra[key] for m in ms) / len(ms)  # noqa: E731
    assert mean(metrics[-5:], "rewards/margins") > 0.3 > mean(metrics[:5], "rewards/margins")
    assert finished.final_loss < finished.first_loss and finished.tokens_per_s > 0
    adapter = tmp_path / "run" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8 and not (adapter / "ref").exists()

    pairs = held_out_pairs()[:40]
    before, after = base_and_tuned_accuracy(adapter, pairs)
    labels = label_accuracy(adapter, held_out_kto()[:40])  # the first 40: 20 desirable, 20 undesirable
    print(f"held-out preference accuracy: base {before:.2f}, tuned {after:.2f}; label accuracy {labels:.2f}")
    assert after >= 0.9 and after > before + 0.2, (before, after)
    assert labels >= 0.8, labels

    moved = evaluate_run(tmp_path / "run")["preference"]  # finetune-studio eval: the run's validation answers
    print(f"eval, validation answers moved as labelled: {moved['tuned']}")
    assert moved["kind"] == "labelled" and moved["n"] == 30
    assert moved["tuned"]["desirable"] >= 0.8 and moved["tuned"]["undesirable"] >= 0.8, moved


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "resources" / "tiny")


def datasets_of(data: Path, overrides: tuple[str, ...] = ()):
    from backend.training.objectives.kto import build_datasets

    return build_datasets(RunConfig.load(KTO_PRESET, [f"data.path={data}", *overrides]), tokenizer())


def test_dpo_pairs_are_unpaired_with_a_note(bundled_model):
    train, evaluation, stats = datasets_of(ROOT / "resources" / "datasets" / "demo_dpo.jsonl",
                                           ("data.max_examples=100",))
    assert stats.examples == 200 and stats.train_examples + stats.eval_examples == 200
    assert "100 preference pairs unpaired for KTO" in " ".join(stats.notes)
    assert "100 desirable / 100 undesirable" in stats.format and len(train) == stats.train_examples


def test_llama_factory_kto_data_is_read_and_batches_mix_labels(bundled_model, tmp_path):
    data = tmp_path / "kto_en.json"  # as LLaMA-Factory's data/kto_en_demo.json: messages + label, a JSON list
    records = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                             {"role": "assistant", "content": "yes" if i < 20 else "no"}], "label": i < 20}
               for i in range(40)]
    data.write_text(json.dumps(records, indent=2))
    train, _, stats = datasets_of(data, ("data.validation_split=0",))
    assert stats.format.startswith("labelled answers, 20 desirable / 20 undesirable (chat template)")
    first = train[0]
    assert first["prompt"][-1]["role"] == "user" and first["completion"][0]["role"] == "assistant"
    batches = [train["label"][i:i + 8] for i in range(0, 40, 8)]
    assert sum(1 for b in batches if len(set(b)) == 2) >= 4, batches  # sorted by label in the file


def test_a_malformed_labelled_answer_is_refused_with_its_line_and_field(bundled_model, tmp_path):
    data = tmp_path / "kto.jsonl"
    data.write_text(json.dumps({"prompt": "Is it?", "completion": "yes", "label": True}) + "\n"
                    + json.dumps({"prompt": "Is it?", "completion": "no", "label": "wrong"}) + "\n")
    with pytest.raises(JobError) as caught:
        run_kto(tmp_path, [f"data.path={data}"])
    message = caught.value.message
    assert f"{data} line 2" in message and "'label'" in message and "\n" not in message


def test_data_of_one_label_is_refused(bundled_model, tmp_path):
    data = tmp_path / "good.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "completion": "yes", "label": 1}) + "\n" for i in range(4)))
    with pytest.raises(JobError, match="every example is labelled desirable"):
        datasets_of(data)


def test_a_batch_of_one_is_refused_for_kto_in_one_line():
    with pytest.raises(ConfigError) as caught:
        RunConfig.load(KTO_PRESET, ["train.micro_batch_size=1"])
    text = str(caught.value)
    assert "technique.objective kto needs train.micro_batch_size 2 or more" in text and "\n" not in text
    RunConfig.load(KTO_PRESET, ["train.micro_batch_size=2"])
    RunConfig.load(ROOT / "resources" / "presets" / "tiny_dpo.yaml", ["train.micro_batch_size=1"])


def test_kto_data_under_sft_points_at_the_objective(bundled_model, tmp_path):
    from backend.core.data.examples import DatasetReader

    with pytest.raises(JobError) as caught:
        DatasetReader(ROOT / "resources" / "datasets" / "demo_kto.jsonl")
    assert "technique.objective: kto" in caught.value.hint and "KTO data" in caught.value.message
    data = tmp_path / "lf.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Q?"},
                                             {"role": "assistant", "content": "yes"}], "label": False}) + "\n")
    with pytest.raises(JobError, match="KTO data"):
        DatasetReader(data)


def test_the_kto_section_reaches_trls_config():
    from backend.training.objectives.kto import kto_config

    config = RunConfig.load(KTO_PRESET, ["kto.beta=0.3", "kto.desirable_weight=1.5", "kto.undesirable_weight=0.7"])
    made = kto_config(config, {"output_dir": "/tmp/unused", "use_cpu": True, "report_to": [],
                               "train_sampling_strategy": "group_by_length", "activation_checkpointing": False})
    assert (made.beta, made.desirable_weight, made.undesirable_weight) == (0.3, 1.5, 0.7)
    assert made.train_sampling_strategy == "sequential" and made.loss_type == "kto" and made.max_length == 128
    assert not made.activation_checkpointing  # TRL's default (on) gives way to technique.gradient_checkpointing
