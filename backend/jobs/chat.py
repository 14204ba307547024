"""run_chat: a chat job, one answer (the CLI's one-shot) or a session that answers message after message.

Each answer streams as TokensGenerated events while it is generated, preceded by
PhaseChanged(phase="generate", detail="base"|"tuned") and closed by TokensGenerated(text="", done=True);
AnswerFinished closes the whole answer (both models for "both"). Without `session` the job answers
StartJob.params' messages and finishes. A request's `images` (paths, in the order of the conversation's
`<image>` markers) reach a vision-language run's models through its processor (chat_session.py); a
text model refuses them. With `session: true` the models stay loaded and every
ChatMessage command is answered the same way (see chat_session.py), until StopJob or stdin closing
ends the job; StopAnswer cuts one answer at the next token and keeps the session.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.evaluation.run_models import RunModels
from backend.jobs.chat_session import ChatSession
from backend.core.protocol import Capabilities, JobFinished, JobStarted
from backend.training.model.capabilities import probe_capabilities
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)
KNOWN = {"model", "temperature", "top_p", "max_new_tokens", "messages", "seed", "images"}
ROLES = {"system", "user", "assistant"}


class ChatRequest:
    """The options of one chat request (StartJob.params or a ChatMessage); each refusal names the option."""

    def __init__(self, params: dict[str, Any]):
        unknown = set(params) - KNOWN
        if unknown:
            raise bad_input(f"unknown chat option(s) {sorted(unknown)}; known: {', '.join(sorted(KNOWN))}")
        self.model = params.get("model", "tuned")
        if self.model not in ("base", "tuned", "both"):
            raise bad_input(f"chat model {self.model!r} is not one of base, tuned, both")
        self.which: list[str] = ["base", "tuned"] if self.model == "both" else [self.model]
        self.temperature = _number(params, "temperature", 0.7, 0.0, 10.0)
        self.top_p = _number(params, "top_p", 0.9, 0.0, 1.0)
        if self.top_p == 0.0:
            raise bad_input("chat option top_p must be above 0 (1 keeps every token)")
        self.max_new_tokens = int(_number(params, "max_new_tokens", 256, 1, 32768))
        seed = params.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise bad_input(f"chat option seed must be a whole number, got {seed!r}")
        self.seed: int | None = seed
        self.messages = _messages(params.get("messages"))
        images = params.get("images") or []
        if not isinstance(images, list) or not all(isinstance(p, str) and p.strip() for p in images):
            raise bad_input(f"chat option images must be a list of image file paths, got {images!r}")
        self.images: list[str] = images


def _number(params: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise bad_input(f"chat option {name} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise bad_input("chat needs messages: a list of {role, content} ending with the user's message")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise bad_input(f"chat message {i + 1} must be an object with a text 'content'")
        if message.get("role") not in ROLES:
            raise bad_input(f"chat message {i + 1} has role {message.get('role')!r}; use system, user or assistant")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] != "user":
        raise bad_input("the last chat message must be the user's (it is what the model answers)")
    if not messages[-1]["content"].strip():
        raise bad_input("the message is empty: type something for the model to answer")
    return messages


def run_chat(
    config: RunConfig,
    run_dir: Path,
    reporter: Reporter,
    stop: StopListener,
    *,
    resume: bool = False,
    capabilities: Capabilities | None = None,
    params: dict | None = None,
) -> None:
    began = time.monotonic()
    params = dict(params or {})
    session = params.pop("session", False)
    if not isinstance(session, bool):
        raise bad_input(f"chat option session must be true or false, got {session!r}")
    first = ChatRequest(params) if params.get("messages") is not None or not session else None
    reporter.emit(JobStarted(job="chat", run_dir=str(run_dir)))
    models = RunModels(run_dir, config, capabilities or probe_capabilities())
    chat = ChatSession(models, reporter, stop)
    try:
        if first is not None:
            chat.answer(first)  # a refusal here ends the job: nothing is loaded yet to keep
        if session:
            chat.serve(ChatRequest)
    finally:
        models.close()
    log.info("chat: %d answers, %d tokens generated", chat.answers, chat.tokens)
    reporter.emit(JobFinished(run_dir=str(run_dir), stopped=stop.requested, steps=chat.answers,
                              seconds=time.monotonic() - began))
