"""Chat with a short real run: tokens stream as they are generated, base and tuned both answer, the
prompt is the model's chat template, a stop cuts the answer, bad requests are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from backend.config import RunConfig
from backend.errors import JobError
from backend.runs import RunFolder
from backend.worker_process import WorkerProcess
from tests.conftest import PRESET, ROOT

torch.set_num_threads(1)
QUESTION = [{"role": "user", "content": "What does a tuple hold?"}]


class Collect:
    def __init__(self):
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)


class Stop:
    def __init__(self, after_tokens: int | None = None, collect: Collect | None = None):
        self.after_tokens, self.collect, self.save = after_tokens, collect, True

    @property
    def requested(self) -> bool:
        if self.after_tokens is None:
            return False
        return sum(e.type == "TokensGenerated" for e in self.collect.events) >= self.after_tokens


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    config = RunConfig.load(PRESET, ["train.max_steps=8", "train.save_steps=1000", "data.max_examples=80",
                                     "train.seq_len=128", "train.cpu_threads=1", "name=chat-fixture"])
    folder = RunFolder.create(config, root=tmp_path_factory.mktemp("runs"))
    terminal = WorkerProcess().run(folder, config)
    assert terminal["type"] == "JobFinished", terminal
    return folder, config


def chat(folder, config, stop=None, **params):
    from backend.jobs.chat import run_chat

    collect = Collect()
    stop = stop or Stop()
    if stop.after_tokens is not None:
        stop.collect = collect
    params = {"messages": QUESTION, "temperature": 0, "max_new_tokens": 12, **params}
    run_chat(config, folder.path, collect, stop, params=params)
    return [e.model_dump() for e in collect.events]


def answers(events) -> dict[str, list[dict]]:
    """Streamed events per model, from its PhaseChanged(generate) to its done event."""
    out: dict[str, list[dict]] = {}
    current = None
    for event in events:
        if event["type"] == "PhaseChanged" and event["phase"] == "generate":
            current = out.setdefault(event["detail"], [])
        elif event["type"] == "TokensGenerated":
            current.append(event)
    return out


def test_tokens_stream_and_match_a_greedy_answer_through_the_chat_template(trained, monkeypatch):
    folder, config = trained
    import backend.jobs.chat as job
    from backend.evaluation.generation import greedy_answers

    seen = {}
    real = job.stream_answer

    def spy(model, tokenizer, prompt, *args, **kwargs):
        seen.update(prompt=prompt, tokenizer=tokenizer, greedy=greedy_answers(model, tokenizer, [prompt], 12)[0])
        return real(model, tokenizer, prompt, *args, **kwargs)

    monkeypatch.setattr(job, "stream_answer", spy)
    events = chat(folder, config, model="base")
    stream = answers(events)["base"]
    assert len([e for e in stream if not e["done"]]) > 1, stream  # piece by piece, not one block
    assert stream[-1] == {"v": 1, "type": "TokensGenerated", "text": "", "done": True}
    assert "".join(e["text"] for e in stream).strip() == seen["greedy"]

    tokenizer = seen["tokenizer"]
    rendered = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(seen["prompt"]) == rendered
    assert rendered.startswith("<|bos|><|user|>\n") and rendered.endswith("<|assistant|>\n")
    assert events[0]["type"] == "JobStarted" and events[0]["job"] == "chat"
    assert events[-1]["type"] == "JobFinished" and events[-1]["stopped"] is False


def test_both_answers_base_then_tuned_from_the_cli(trained):
    folder, _ = trained
    done = subprocess.run([sys.executable, "-m", "studio", "chat", str(folder.path), "What does a tuple hold?",
                           "--model", "both", "--temperature", "0", "--max-new-tokens", "6"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "[base]" and "[tuned]" in lines
    assert lines.index("[tuned]") >= 2  # the base answer came first, on its own line(s)
    events = [e for e in folder.iter_events() if e.get("type") == "PhaseChanged" and e["phase"] == "generate"]
    assert [e["detail"] for e in events[-2:]] == ["base", "tuned"]
    assert folder.status() == "finished"  # chatting does not change what the fine-tune was


def test_a_stop_cuts_the_answer(trained):
    folder, config = trained
    events = chat(folder, config, stop=Stop(after_tokens=2), model="both", max_new_tokens=40)
    streams = answers(events)
    assert list(streams) == ["base"]  # stopped before the tuned model began
    assert len(streams["base"]) <= 4 and streams["base"][-1]["done"]
    assert events[-1]["type"] == "JobFinished" and events[-1]["stopped"] is True


def test_sampling_with_a_seed_repeats(trained):
    folder, config = trained
    first = answers(chat(folder, config, model="tuned", temperature=1.0, top_p=0.95, seed=7))["tuned"]
    second = answers(chat(folder, config, model="tuned", temperature=1.0, top_p=0.95, seed=7))["tuned"]
    assert first == second and first[-1]["done"]


@pytest.mark.parametrize("params, match", [
    ({"messages": []}, "chat needs messages"),
    ({"messages": QUESTION + [{"role": "assistant", "content": "x"}]}, "last chat message must be the user"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
    ({"messages": QUESTION, "model": "other"}, "not one of base, tuned, both"),
    ({"messages": QUESTION, "temperature": -1}, "temperature must be a number"),
    ({"messages": QUESTION, "colour": 1}, "unknown chat option"),
])
def test_bad_requests_are_refused(params, match):
    from backend.jobs.chat import ChatRequest

    with pytest.raises(JobError, match=match):
        ChatRequest(params)


def test_tuned_needs_a_finished_run(tmp_path):
    config = RunConfig.load(PRESET, ["name=never-trained"])
    folder = RunFolder.create(config, root=tmp_path)
    with pytest.raises(JobError, match="no complete adapter/"):
        chat(folder, config, model="tuned")
    events = chat(folder, config, model="base", max_new_tokens=3)  # the base model needs no run
    assert events[-1]["type"] == "JobFinished"
