"""Chat with a short real run: tokens stream as they are generated, base and tuned both answer, the
prompt is the model's chat template, a stop cuts the answer, bad requests are refused, and a session
worker answers message after message with the model loaded once."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.api.launch import start_line
from backend.runtime.processes import worker_command, worker_env
from backend.core.protocol import ChatMessage, StopJob, encode
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET, ROOT

torch.set_num_threads(1)
QUESTION = [{"role": "user", "content": "What does a tuple hold?"}]


class Collect:
    def __init__(self):
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)


class Stop:
    """StopListener's face to the chat job: a StopAnswer after `after_tokens` streamed events."""

    def __init__(self, after_tokens: int | None = None, collect: Collect | None = None):
        self.after_tokens, self.collect, self.save, self.requested = after_tokens, collect, True, False

    @property
    def cut_requested(self) -> bool:
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
    import backend.jobs.chat_session as job
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
    assert stream[-1] == {"v": 2, "type": "TokensGenerated", "text": "", "done": True}
    assert "".join(e["text"] for e in stream).strip() == seen["greedy"]

    tokenizer = seen["tokenizer"]
    rendered = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(seen["prompt"]) == rendered
    assert rendered.startswith("<|bos|><|user|>\n") and rendered.endswith("<|assistant|>\n")
    assert events[0]["type"] == "JobStarted" and events[0]["job"] == "chat"
    assert events[-2]["type"] == "AnswerFinished" and not events[-2]["stopped"] and events[-2]["tokens"] > 1
    assert events[-1]["type"] == "JobFinished" and events[-1]["stopped"] is False and events[-1]["steps"] == 1


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
    assert events[-2]["type"] == "AnswerFinished" and events[-2]["stopped"] is True
    assert events[-1]["type"] == "JobFinished" and events[-1]["stopped"] is False  # the answer, not the job


class Worker:
    """A real `python -m backend.worker` spoken to line by line, as the studio does."""

    def __init__(self):
        self.proc = subprocess.Popen(worker_command(), cwd=ROOT, env=worker_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def send(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def until(self, kind: str, timeout: float = 120) -> list[dict]:
        """Events up to and including the next one of type `kind`."""
        events, deadline = [], time.monotonic() + timeout
        while not events or events[-1]["type"] != kind:
            events.append(json.loads(self.lines.get(timeout=max(0.1, deadline - time.monotonic()))))
            assert events[-1]["type"] != "JobFailed", events[-1]
        return events


def test_a_session_worker_loads_once_and_answers_message_after_message(trained):
    folder, config = trained
    sampling = {"model": "tuned", "temperature": 1.0, "top_p": 0.95, "max_new_tokens": 12, "seed": 7}
    worker = Worker()
    try:
        ready = worker.until("WorkerReady")[-1]
        began = time.monotonic()
        worker.send(start_line(folder, config, job="chat", params={"session": True, "messages": QUESTION, **sampling}))
        first = worker.until("AnswerFinished")
        first_s = time.monotonic() - began
        began = time.monotonic()
        worker.send(encode(ChatMessage(messages=QUESTION, **sampling)))  # same seed: the same answer
        second = worker.until("AnswerFinished")
        second_s = time.monotonic() - began
        worker.send(encode(ChatMessage(messages=[{"role": "robot", "content": "x"}])))
        refused = worker.until("MessageRefused")[-1]
        worker.send(encode(ChatMessage(messages=QUESTION, model="base", max_new_tokens=3, temperature=0)))
        third = worker.until("AnswerFinished")
        worker.send(encode(StopJob()))
        finished = worker.until("JobFinished")[-1]
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.proc.kill()
    loads = [e for e in first + second + third if e["type"] == "PhaseChanged" and e["phase"] == "load_model"]
    assert len(loads) == 1 and loads[0] in first  # adapter on base: "base" reuses the loaded model
    assert answers(first)["tuned"] == answers(second)["tuned"] and len(answers(first)["tuned"]) > 2
    assert first[-1]["tokens"] > 1 and not first[-1]["stopped"]
    assert list(answers(third)) == ["base"] and third[-1]["tokens"] <= 3
    assert "role 'robot'" in refused["message"]
    assert finished["stopped"] is True and finished["steps"] == 3
    assert ready["pid"] == worker.proc.pid
    print(f"\nchat session: first message {first_s:.2f} s (loading), second {second_s:.2f} s")


@pytest.mark.parametrize("params, match", [
    ({"messages": []}, "chat needs messages"),
    ({"messages": QUESTION + [{"role": "assistant", "content": "x"}]}, "last chat message must be the user"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
    ({"messages": QUESTION, "model": "other"}, "not one of base, tuned, both"),
    ({"messages": QUESTION, "temperature": -1}, "temperature must be a number"),
    ({"messages": QUESTION, "colour": 1}, "unknown chat option"),
    ({"messages": [{"role": "user", "content": "  \n "}]}, "the message is empty"),
])
def test_bad_requests_are_refused(params, match):
    from backend.jobs.chat import ChatRequest

    with pytest.raises(JobError, match=match):
        ChatRequest(params)


def test_a_conversation_longer_than_the_models_context_is_refused(tmp_path):
    config = RunConfig.load(PRESET, ["name=long-chat"])
    folder = RunFolder.create(config, root=tmp_path)
    long = [{"role": "user", "content": "tuple " * 1500}]  # the bundled model reads 1024 positions
    with pytest.raises(JobError, match=r"the conversation is [\d,]+ tokens and the model reads at most 1,024"):
        chat(folder, config, model="base", messages=long)


def test_tuned_needs_a_finished_run(tmp_path):
    config = RunConfig.load(PRESET, ["name=never-trained"])
    folder = RunFolder.create(config, root=tmp_path)
    with pytest.raises(JobError, match="no complete adapter/"):
        chat(folder, config, model="tuned")
    events = chat(folder, config, model="base", max_new_tokens=3)  # the base model needs no run
    assert events[-1]["type"] == "JobFinished"
