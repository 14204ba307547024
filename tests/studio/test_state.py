"""State objects without any window: numbers in, wording and series out."""

from __future__ import annotations

from backend.core.protocol import (
    CheckpointSaved,
    EvalFinished,
    JobFailed,
    JobFinished,
    JobStarted,
    MetricsLogged,
    PhaseChanged,
)
from studio.state.form_values import config_path, display_path
from studio.state.metric_store import MetricStore
from studio.state.run_state import RunState


def test_metric_store_ring_buffer_keeps_the_newest(qtbot):
    store = MetricStore(capacity=5)
    with qtbot.waitSignal(store.changed):
        store.apply(MetricsLogged(step=1, max_steps=9, loss=2.0))
    for step in range(2, 10):
        store.apply(MetricsLogged(step=step, max_steps=9, loss=2.0 / step, tokens_per_s=10.0 * step))
    steps, values = store.series("loss")
    assert steps == [5, 6, 7, 8, 9] and values[-1] == 2.0 / 9
    assert store.latest("tokens_per_s") == 90.0
    store.apply(MetricsLogged(step=10, max_steps=9, loss=None))  # a gap, not a zero
    assert store.count("loss") == 5
    store.apply(EvalFinished(step=9, eval_loss=0.5))
    assert store.series("eval_loss") == ([9], [0.5])
    store.clear()
    assert store.count("loss") == 0 and store.step == 0


def test_run_state_wording(qtbot):
    state = RunState()
    logs: list[str] = []
    state.log_added.connect(logs.append)
    state.begin("/runs/x", 10)
    assert state.running and state.status == "starting"
    state.apply(JobStarted(run_dir="/runs/x", max_steps=10))
    state.apply(PhaseChanged(phase="load_model", detail="tiny"))
    assert state.message == "Loading the model: tiny"
    state.apply(MetricsLogged(step=4, max_steps=10, loss=1.23456, tokens_per_s=500.0))
    assert state.message == "Training: step 4 of 10, loss 1.2346" and state.tokens_per_s == 500.0
    state.apply(CheckpointSaved(step=4, path="/runs/x/checkpoints/checkpoint-4"))
    state.apply(JobFinished(run_dir="/runs/x", steps=10, final_loss=0.5, tokens_per_s=512.0, mfu=0.25,
                            compile_seconds=12.5))
    assert state.status == "finished" and not state.running
    assert state.message == "Finished: 10 steps, final loss 0.5000, 512 useful tokens/s"
    assert (state.mfu, state.compile_seconds) == (0.25, 12.5)
    assert "Phase: Loading the model: tiny" in logs
    assert "Checkpoint saved at step 4: /runs/x/checkpoints/checkpoint-4" in logs


def test_an_epoch_run_learns_its_steps_from_the_worker_and_its_eta_follows_them(qtbot):
    """num_epochs: the window cannot know the steps before the worker reads the data (max_steps 0 until then);
    the schedule line joins the plan, and the ETA counts the derived steps."""
    clock = [0.0]
    state = RunState(clock=lambda: clock[0])
    state.begin("/runs/x", 0)
    state.apply(JobStarted(run_dir="/runs/x", max_steps=0))
    state.apply(PhaseChanged(phase="plan", detail="device cpu"))
    state.apply(PhaseChanged(phase="schedule", detail="train.num_epochs rules: 2 epochs of 40 rows = 20 steps"))
    assert state.plan == "device cpu; train.num_epochs rules: 2 epochs of 40 rows = 20 steps"
    for step in (1, 2, 3):
        clock[0] = float(step)  # a second a step
        state.apply(MetricsLogged(step=step, max_steps=20))
    assert state.max_steps == 20 and state.eta_s == 17.0


def test_run_state_failure_is_one_line_with_hint(qtbot):
    state = RunState()
    logs: list[str] = []
    state.log_added.connect(logs.append)
    state.begin("/runs/x", 10)
    state.apply(JobFailed(kind="out_of_memory", message="out of memory at step 3",
                          hint="lower train.micro_batch_size"))
    assert state.status == "failed" and state.message == "Failed: out of memory at step 3"
    assert logs[-2:] == ["Failed (out_of_memory): out of memory at step 3", "Hint: lower train.micro_batch_size"]


def test_bundled_paths_read_as_words_and_round_trip():
    for value in ("bundled:tiny", "bundled:datasets/demo_train.jsonl", "bundled:other/x", "/data/my.jsonl"):
        assert config_path(display_path(value)) == value
    assert display_path("bundled:tiny") == "Bundled tiny model"
    assert config_path("  bundled:tiny ") == "bundled:tiny"


def test_config_state_applies_the_form_over_the_preset(qtbot):
    from backend.core.config.run_config import RunConfig
    from studio.state.config_state import ConfigState

    base = RunConfig()
    state = ConfigState(base.model_dump(mode="json"))
    changed: list[str] = []
    state.changed.connect(changed.append)
    for key, value in (("model.path", "/models/m"), ("data.path", "/data/d.jsonl"),
                       ("technique.lora_rank", 16), ("train.max_steps", 7)):
        state.set(key, value)
    state.set("train.max_steps", 7)  # unchanged: no signal
    assert changed == ["model.path", "data.path", "technique.lora_rank", "train.max_steps"]
    config = state.config()
    assert (config.model.path, config.data.path) == ("/models/m", "/data/d.jsonl")
    assert (config.technique.lora_rank, config.train.max_steps) == (16, 7)
    assert config.train.learning_rate == base.train.learning_rate  # the rest comes from the preset


def test_window_defaults_and_tooltips(qtbot):
    from backend.core.config.run_config import TechniqueSection
    from studio.app import build_studio

    studio = build_studio(synchronous_data=True)
    qtbot.addWidget(studio.window)
    window, pages = studio.window, studio.pages
    assert pages["model"].path_edit.text() == "Bundled tiny model"
    assert pages["data"].path_edit.text() == "Bundled demo dataset (demo_train.jsonl)"
    rank = pages["techniques"].editor("technique.lora_rank")
    assert rank.toolTip() == TechniqueSection.model_fields["lora_rank"].description
    assert rank.maximum() == 1024
    config = studio.config.config()
    assert config.model.path == "bundled:tiny" and config.data.path == "bundled:datasets/demo_train.jsonl"
    assert window.start_action.shortcut().toString() == "Ctrl+Return"
    assert window.stop_action.shortcut().toString() == "Ctrl+."
    assert window.log_view.maximumBlockCount() > 0
    studio.monitor.stop()


def test_file_open_config_loads_a_yaml_and_says_what_is_wrong_in_one_line(qtbot, make_studio, tmp_path):
    from backend.core.config.run_config import RunConfig

    studio = make_studio()
    window = studio.window
    good = tmp_path / "mine.yaml"
    RunConfig.from_dict({"name": "from-a-file", "technique": {"lora_rank": 4}}).save(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("technique:\n  lora_rank: -3\n")
    assert window.open_config_action in window.menuBar().actions()[0].menu().actions()
    window.ask_config_path = lambda: str(good)
    window.open_config_action.trigger()
    assert studio.config.get("name") == "from-a-file" and studio.config.get("technique.lora_rank") == 4
    assert studio.config.source == good
    window.ask_config_path = lambda: str(bad)
    window.open_config_action.trigger()
    message = window.statusBar().currentMessage()
    assert message.startswith("Cannot open the config:") and "line 2" in message and "technique.lora_rank" in message
    assert "\n" not in message and message in window.log_text()
    assert studio.config.get("technique.lora_rank") == 4  # the draft stays as it was
    window.ask_config_path = lambda: ""  # the dialog cancelled: nothing happens
    window.open_config_action.trigger()
    assert studio.config.get("name") == "from-a-file"
