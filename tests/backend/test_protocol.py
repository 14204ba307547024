"""Every message round-trips; unknown types, versions and shapes are refused with a sentence."""

import json

import pytest

from backend.core import protocol as p

EVENTS = [
    p.WorkerReady(pid=1, capabilities=p.Capabilities(cuda=True, devices=[p.DeviceInfo(index=0, name="H200", total_bytes=1)])),
    p.JobStarted(run_dir="/r", max_steps=3, resumed_from="/r/checkpoints/checkpoint-2"),
    p.PhaseChanged(phase="train", detail="3 steps"),
    p.MetricsLogged(step=1, max_steps=3, loss=1.5, learning_rate=1e-3, grad_norm=0.5, tokens_per_s=10.0,
                    memory=p.MemorySample(allocated_bytes=1, reserved_bytes=2, peak_bytes=3, rss_bytes=4)),
    p.TelemetrySampled(time=1.0, cpu_percent=50.0),
    p.CheckpointSaved(step=2, path="/r/checkpoints/checkpoint-2"),
    p.EvalFinished(step=2, eval_loss=1.0),
    p.CompletionScored(step=2, prompt="2+2?", completion="4", rewards={"exact_match": 1.0}, reward=1.0),
    p.TokensGenerated(text="hi", done=True),
    p.AnswerFinished(stopped=True, tokens=12, seconds=0.4),
    p.MessageRefused(message="chat message 1 has role 'robot'", hint="use system, user or assistant"),
    p.JobFinished(run_dir="/r", stopped=True, steps=2, final_loss=1.0, adapter_path="/r/adapter"),
    p.JobFailed(kind="out_of_memory", message="ran out", hint="halve the batch"),
]
COMMANDS = [
    p.StartJob(run_dir="/r", config={"name": "x"}, resume=True),
    p.StopJob(save=False),
    p.ChatMessage(messages=[{"role": "user", "content": "hi"}], model="both", temperature=0.0, seed=3),
    p.StopAnswer(),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
def test_event_round_trips(event):
    line = p.encode(event)
    assert line.endswith("\n") and line.count("\n") == 1
    assert p.decode_event(line) == event


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.type)
def test_command_round_trips(command):
    assert p.decode_command(p.encode(command)) == command


def test_every_event_type_is_covered():
    assert {e.type for e in EVENTS} == p._EVENT_TYPES


def test_every_command_type_is_covered():
    assert {c.type for c in COMMANDS} == p._COMMAND_TYPES


def test_a_chat_message_carries_the_options_of_a_chat_start():
    message = p.ChatMessage(messages=[{"role": "user", "content": "hi"}], max_new_tokens=5)
    assert message.params() == {"messages": [{"role": "user", "content": "hi"}], "model": "tuned",
                                "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 5}
    assert p.ChatMessage(messages=[], seed=1).params()["seed"] == 1


def test_a_version_1_chat_command_is_refused():
    line = json.dumps({"type": "StopJob", "v": 1, "save": True})
    with pytest.raises(p.ProtocolError, match="v1 but this side speaks v2"):
        p.decode_command(line)


def test_unknown_type_is_refused():
    with pytest.raises(p.ProtocolError, match="unknown event type 'Bogus'"):
        p.decode_event(json.dumps({"type": "Bogus", "v": p.PROTOCOL_VERSION}))


def test_other_version_is_refused_naming_both():
    line = json.dumps({"type": "PhaseChanged", "v": p.PROTOCOL_VERSION + 1, "phase": "x"})
    with pytest.raises(p.ProtocolError, match=f"v{p.PROTOCOL_VERSION + 1}.*v{p.PROTOCOL_VERSION}"):
        p.decode_event(line)


@pytest.mark.parametrize("line, match", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ("", "empty"),
    (json.dumps({"type": "MetricsLogged", "v": p.PROTOCOL_VERSION, "step": "x", "max_steps": 1}), "field step"),
    (json.dumps({"type": "PhaseChanged", "v": p.PROTOCOL_VERSION, "phase": "x", "extra": 1}), "field extra"),
])
def test_malformed_lines_are_refused(line, match):
    with pytest.raises(p.ProtocolError, match=match):
        p.decode_event(line)


def test_a_command_is_not_an_event():
    with pytest.raises(p.ProtocolError, match="unknown event type 'StopJob'"):
        p.decode_event(p.encode(p.StopJob()))
