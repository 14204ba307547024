"""The schedule: max_steps or num_epochs (exactly one rules), the learning-rate shape, warmup, gradient clipping.

The config's rules, the steps an epoch count comes to, what the Trainer and the TRL configs receive,
and real tiny runs that stop on the derived step with the learning rates the schedule promises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.cli.checks import load_for_train
from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.config.schedule import TrainSection, plan_schedule
from backend.core.protocol import Capabilities
from tests.backend.objective_runs import run_preset
from tests.conftest import PRESET, ROOT

PRESETS = ROOT / "resources" / "presets"
CPU = Capabilities(cuda=False)


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- the config -------------------------------------------------------------------------------

def test_defaults_keep_todays_schedule():
    """Linear decay, no warmup, max_steps 60, clipping at transformers' own default (1.0)."""
    from transformers import TrainingArguments

    train = TrainSection()
    assert (train.max_steps, train.num_epochs, train.lr_scheduler) == (60, None, "linear")
    assert (train.warmup_steps, train.warmup_ratio) == (0, 0.0)
    assert train.max_grad_norm == TrainingArguments(output_dir="/tmp/unused").max_grad_norm == 1.0


def test_an_old_file_without_the_fields_loads_as_it_always_ran(tmp_path):
    old = ("schema_version: 1\ntrain:\n  max_steps: 40\n  micro_batch_size: 8\n  learning_rate: 0.002\n"
           "  warmup_steps: 5\n")
    config = RunConfig.load(write(tmp_path, old))
    assert (config.train.max_steps, config.train.num_epochs, config.train.warmup_steps) == (40, None, 5)
    assert (config.train.lr_scheduler, config.train.warmup_ratio, config.train.max_grad_norm) == ("linear", 0.0, 1.0)
    saved = tmp_path / "saved.yaml"
    config.save(saved)  # written back with every field: the new ones at their defaults
    assert "num_epochs: null" in saved.read_text() and RunConfig.load(saved) == config


def test_num_epochs_alone_in_a_file_rules_and_saves_max_steps_null(tmp_path):
    config = RunConfig.load(write(tmp_path, "train:\n  num_epochs: 3\n"))
    assert (config.train.num_epochs, config.train.max_steps) == (3, None)
    saved = tmp_path / "saved.yaml"
    config.save(saved)
    assert "max_steps: null" in saved.read_text() and RunConfig.load(saved) == config
    assert RunConfig.load(write(tmp_path, "train:\n  max_steps: null\n  num_epochs: 2\n")).train.num_epochs == 2


INVALID = [
    ("train:\n  max_steps: 60\n  num_epochs: 2\n",
     "train.max_steps 60 and train.num_epochs 2 both set the run's length: keep one and set the other to null"),
    ("train:\n  max_steps: null\n", "train.max_steps and train.num_epochs are both null: set one"),
    ("train:\n  warmup_steps: 10\n  warmup_ratio: 0.1\n",
     "train.warmup_steps 10 and train.warmup_ratio 0.1 both set the warmup: keep one and set the other to 0"),
    ("train:\n  warmup_ratio: 1.0\n", "line 2: field train.warmup_ratio: Input should be less than 1"),
    ("train:\n  warmup_ratio: -0.1\n", "line 2: field train.warmup_ratio"),
    ("train:\n  num_epochs: 0\n", "line 2: field train.num_epochs"),
    ("train:\n  max_grad_norm: -1\n", "line 2: field train.max_grad_norm"),
    ("train:\n  lr_scheduler: cosinus\n", "line 2: field train.lr_scheduler: Input should be 'linear', 'cosine' or "
                                          "'constant_with_warmup'"),
]


@pytest.mark.parametrize("text, match", INVALID)
def test_a_conflict_or_a_bad_value_is_one_line_naming_the_field(tmp_path, text, match):
    with pytest.raises(ConfigError) as caught:
        RunConfig.load(write(tmp_path, text))
    message = str(caught.value)
    assert match in message and "\n" not in message


def test_the_command_line_wins_over_the_files_other_length():
    """tiny_lora.yaml sets max_steps: 60; --set train.num_epochs=2 trains two epochs (and the reverse)."""
    config = load_for_train(str(PRESET), ["train.num_epochs=2"])  # the CLI's own loader
    assert (config.train.num_epochs, config.train.max_steps) == (2, None)
    back = RunConfig.load(PRESET, ["train.num_epochs=2", "train.max_steps=9", "train.num_epochs=null"])
    assert (back.train.max_steps, back.train.num_epochs) == (9, None)
    config = RunConfig.load(PRESET, ["train.num_epochs=2"])
    config_file = config.to_yaml()
    assert "max_steps: null" in config_file and "num_epochs: 2" in config_file


def test_the_command_line_wins_over_the_files_other_warmup(tmp_path):
    path = write(tmp_path, "train:\n  warmup_steps: 10\n")
    config = RunConfig.load(path, ["train.warmup_ratio=0.1"])
    assert (config.train.warmup_steps, config.train.warmup_ratio) == (0, 0.1)
    config = RunConfig.load(write(tmp_path, "train:\n  warmup_ratio: 0.1\n", "ratio.yaml"), ["train.warmup_steps=4"])
    assert (config.train.warmup_steps, config.train.warmup_ratio) == (4, 0.0)
    config = RunConfig.load(path, ["train.warmup_ratio=0"])  # turning one off leaves the other as it is
    assert (config.train.warmup_steps, config.train.warmup_ratio) == (10, 0.0)


# --- the derived steps ------------------------------------------------------------------------

def schedule(overrides: list[str], rows: int, processes: int = 1):
    return RunConfig.load(PRESET, overrides).schedule(rows, processes)


def test_two_epochs_of_forty_rows_at_micro_batch_four_are_twenty_steps():
    plan = schedule(["train.num_epochs=2", "train.micro_batch_size=4"], 40)
    assert (plan.steps, plan.steps_per_epoch, plan.warmup) == (20, 10, 0)
    assert "train.num_epochs rules: 2 epochs of 40 rows = 20 steps" in plan.describe()
    assert "micro-batch 4 x accumulation 1 x 1 process" in plan.describe()


@pytest.mark.parametrize("micro_batch, accumulation, processes, rows, steps", [
    (4, 2, 1, 40, 10),  # 8 rows a step
    (2, 2, 2, 40, 10),  # 8 rows a step across two processes
    (4, 1, 1, 41, 22),  # a last, short step each epoch (the Trainer keeps it: no drop_last)
    (8, 3, 1, 40, 4),   # 24 rows a step: one full, one short
    (64, 1, 1, 40, 2),  # an epoch smaller than one step is still a step
])
def test_steps_round_each_epoch_up(micro_batch, accumulation, processes, rows, steps):
    train = TrainSection(num_epochs=2, micro_batch_size=micro_batch, gradient_accumulation_steps=accumulation)
    assert plan_schedule(train, rows, processes).steps == steps


def test_max_steps_rules_and_says_how_many_epochs_that_is():
    plan = schedule(["train.micro_batch_size=4"], 40)
    assert plan.steps == 60 and plan.epochs is None
    assert plan.describe().startswith("train.max_steps rules: 60 steps = 6 epochs of 40 rows")


def test_packing_packs_each_micro_batch_so_an_epoch_has_as_many_steps():
    """PackingCollator makes each micro-batch one row: the data loader still counts examples, so packing
    does not change the steps (the real run below checks the Trainer's epoch ends with the count)."""
    on = schedule(["train.num_epochs=2", "train.micro_batch_size=4", "technique.packing=true"], 40)
    off = schedule(["train.num_epochs=2", "train.micro_batch_size=4", "technique.packing=false"], 40)
    assert on.steps == off.steps == 20


def test_a_grpo_step_counts_completions():
    config = RunConfig.load(PRESETS / "tiny_grpo.yaml", ["train.num_epochs=2"])  # micro-batch 16, 4 generations
    plan = config.schedule(20, 1)
    assert (plan.rows, plan.steps) == (80, 10)
    assert "2 epochs of 80 rows (20 prompts x 4 generations) = 10 steps" in plan.describe()


def test_warmup_ratio_rounds_up_on_the_derived_steps():
    from transformers import TrainingArguments

    plan = schedule(["train.num_epochs=2", "train.micro_batch_size=4", "train.warmup_ratio=0.12"], 40)
    assert plan.warmup == 3  # ceil(20 x 0.12)
    assert TrainingArguments(output_dir="/tmp/unused", warmup_steps=0.12).get_warmup_steps(20) == 3  # as transformers
    assert "warmup 3 steps" in plan.describe()


def test_a_warmup_the_derived_steps_cannot_hold_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"train.warmup_steps 30 must be below the 20 steps train.num_epochs 2 comes "
                                          r"to on 40 rows; set train.warmup_steps=0 \(no warmup\)"):
        schedule(["train.num_epochs=2", "train.micro_batch_size=4", "train.warmup_steps=30"], 40)


# --- what the Trainer and the TRL configs receive ---------------------------------------------

def arguments(config: RunConfig, rows: int = 40) -> dict:
    """training_kwargs for `config` on this machine (a CPU plan of the bundled model), over `rows` rows."""
    from backend.jobs.finetune import training_kwargs
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques

    facts = ModelFacts.read(config.resolved_model_path())
    plan = plan_techniques(config, CPU, facts, 1)
    return training_kwargs(config, Path("/tmp/unused"), plan, has_eval=False, schedule=config.schedule(rows, 1))


SCHEDULE = ["train.num_epochs=2", "train.micro_batch_size=4", "train.lr_scheduler=cosine", "train.warmup_ratio=0.1",
            "train.max_grad_norm=0.5"]


def test_the_trainer_receives_the_schedule(bundled_model):
    from transformers import TrainingArguments

    args = TrainingArguments(**arguments(RunConfig.load(PRESET, SCHEDULE)))
    assert (args.max_steps, args.lr_scheduler_type.value, args.warmup_steps, args.max_grad_norm) == (
        20, "cosine", 2, 0.5)
    plain = TrainingArguments(**arguments(RunConfig.load(PRESET)))  # the preset as it was: linear, 60 steps
    assert (plain.max_steps, plain.lr_scheduler_type.value, plain.warmup_steps, plain.max_grad_norm) == (
        60, "linear", 0, 1.0)


@pytest.mark.parametrize("preset, door, builder", [
    ("tiny_dpo.yaml", "backend.training.objectives.dpo", "dpo_config"),
    ("tiny_kto.yaml", "backend.training.objectives.kto", "kto_config"),
    ("tiny_grpo.yaml", "backend.training.objectives.grpo", "grpo_config"),
])
def test_each_trl_config_receives_the_schedule(bundled_model, preset, door, builder):
    import importlib

    overrides = SCHEDULE + (["train.micro_batch_size=16"] if preset == "tiny_grpo.yaml" else [])
    config = RunConfig.load(PRESETS / preset, overrides)
    made = getattr(importlib.import_module(door), builder)(config, arguments(config, rows=40))
    steps = 20  # GRPO too: 40 prompts x 4 completions at 16 a step are 10 steps an epoch
    assert made.max_steps == steps and made.lr_scheduler_type.value == "cosine"
    assert made.warmup_steps == steps // 10 and made.max_grad_norm == 0.5


# --- real runs --------------------------------------------------------------------------------

def lr_lambda(name: str, warmup: int, steps: int) -> list[float]:
    """The learning rate each step trains with (before its scheduler step), as a share of the peak."""
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    shares = []
    for _ in range(steps):
        shares.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return shares


def test_two_epochs_on_the_bundled_model_stop_at_the_derived_step(bundled_model, tmp_path):
    """2 epochs of 40 rows at micro-batch 4, packing off, --set over tiny_lora.yaml's max_steps: 20 steps,
    the Trainer's own epoch count ends at 2.0, and each step's learning rate follows cosine after warmup."""
    events = run_preset(tmp_path, PRESET, ["data.max_examples=40", "data.validation_split=0", "technique.packing=false",
                                           "train.save_steps=100", "train.seq_len=128", *SCHEDULE])
    assert [e.max_steps for e in events if e.type == "JobStarted"] == [0]  # not known before the data is read
    line = next(e.detail for e in events if e.type == "PhaseChanged" and e.phase == "schedule")
    assert line.startswith("train.num_epochs rules: 2 epochs of 40 rows = 20 steps"), line
    assert "cosine learning rate, warmup 2 steps, gradients clipped at norm 0.5" in line
    metrics = [e for e in events if e.type == "MetricsLogged"]
    assert [m.step for m in metrics] == list(range(1, 21)) and {m.max_steps for m in metrics} == {20}
    assert metrics[-1].epoch == pytest.approx(2.0) and events[-1].type == "JobFinished" and events[-1].steps == 20
    expected = [0.002 * share for share in lr_lambda("cosine", 2, 20)]
    assert [m.learning_rate for m in metrics] == pytest.approx(expected, rel=1e-6)


def test_the_rows_are_counted_after_what_training_drops_and_the_split(bundled_model, tmp_path):
    """44 examples, 4 whose prompt alone fills seq_len (dropped), 10% held out: 36 rows; packing on, micro-batch 2
    x accumulation 2: 9 steps an epoch, 18 for two, and the Trainer's epoch ends at 2.0."""
    demo = (ROOT / "resources" / "datasets" / "demo_train.jsonl").read_text().splitlines()[:40]
    long = [json.dumps({"instruction": "Repeat. " + "word " * 400, "input": "", "output": "no"})] * 4
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(demo[:20] + long + demo[20:]) + "\n")
    events = run_preset(tmp_path, PRESET, [f"data.path={data}", "data.validation_split=0.1", "train.num_epochs=2",
                                           "train.micro_batch_size=2", "train.gradient_accumulation_steps=2",
                                           "technique.packing=true", "train.save_steps=100", "train.seq_len=128"])
    tokenize = next(e.detail for e in events if e.type == "PhaseChanged" and e.phase == "tokenize")
    assert tokenize.startswith("36 train / 4 validation examples"), tokenize
    line = next(e.detail for e in events if e.type == "PhaseChanged" and e.phase == "schedule")
    assert line.startswith("train.num_epochs rules: 2 epochs of 36 rows = 18 steps (4 rows a step"), line
    metrics = [e for e in events if e.type == "MetricsLogged"]
    assert metrics[-1].step == 18 and metrics[-1].epoch == pytest.approx(2.0) and events[-1].steps == 18


def test_an_epoch_run_resumes_to_its_derived_step_and_trains_more_in_steps(bundled_model, tmp_path):
    """Resuming derives the same 8 steps from the same rows; "train 4 more" continues it to step 12."""
    from backend.core.runs.run_continuation import continue_run
    from backend.core.runs.run_folder import RunFolder

    short = ["train.num_epochs=2", "data.max_examples=16", "data.validation_split=0", "train.micro_batch_size=4",
             "train.save_steps=4", "train.save_total_limit=null", "train.seq_len=128"]
    events = run_preset(tmp_path, PRESET, short)
    assert events[-1].steps == 8
    folder = RunFolder(tmp_path / "run")
    (folder.checkpoints_dir / "checkpoint-8").rename(tmp_path / "moved")  # as if it had stopped at step 4
    resumed = run_preset(tmp_path, PRESET, short, resume=True)
    assert [e.step for e in resumed if e.type == "MetricsLogged"][-4:] == [5, 6, 7, 8] and resumed[-1].steps == 8
    more = continue_run(folder, 4)
    events = run_preset(more.path.parent, more.config_path, [], name=more.path.name, resume=True)
    steps = [e.step for e in events if e.type == "MetricsLogged"]
    assert steps[-4:] == [9, 10, 11, 12] and events[-1].steps == 12 and more.load_config().train.max_steps == 12


# The CLI's --set train.num_epochs over the preset's max_steps: test_worker_e2e.py::test_cli_train_with_overrides_and_runs_list
