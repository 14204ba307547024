"""run_chat: one request, one streamed answer (or two: base then tuned), then JobFinished.

A one-shot job, like every other: the studio starts a fresh worker per message and sends the whole
conversation each time (the worker keeps no state between messages). Each answer streams as
TokensGenerated events while it is generated, preceded by PhaseChanged(phase="generate",
detail="base"|"tuned") and closed by TokensGenerated(text="", done=True). A StopJob cuts the answer
at the next token; what was generated so far stands and the job finishes with stopped=True.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from backend.config import RunConfig
from backend.errors import bad_input
from backend.evaluation.generation import prompt_ids, stream_answer
from backend.evaluation.run_models import RunModels
from backend.protocol import Capabilities, JobFinished, JobStarted, PhaseChanged, TokensGenerated
from backend.training.capabilities import probe_capabilities
from backend.training.phase import set_phase
from backend.worker.reporter import Reporter
from backend.worker.stop_listener import StopListener

log = logging.getLogger(__name__)
KNOWN = {"model", "temperature", "top_p", "max_new_tokens", "messages", "seed"}
ROLES = {"system", "user", "assistant"}


class ChatRequest:
    """The options of one chat request, parsed from StartJob.params; each refusal names the option."""

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
    request = ChatRequest(params or {})
    reporter.emit(JobStarted(job="chat", run_dir=str(run_dir)))
    models = RunModels(run_dir, config, capabilities or probe_capabilities())
    if "tuned" in request.which:
        models.require_tuned()

    set_phase("load")
    reporter.emit(PhaseChanged(phase="load_model", detail=" and ".join(request.which)))
    tokenizer = models.tokenizer()
    prompt = prompt_ids(tokenizer, request.messages)
    generated = 0
    for which in request.which:
        with models.use(which) as model:  # type: ignore[arg-type]
            set_phase("generate")
            reporter.emit(PhaseChanged(phase="generate", detail=which))
            if request.seed is not None:
                torch.manual_seed(request.seed)
            _, count = stream_answer(
                model, tokenizer, prompt, lambda piece: reporter.emit(TokensGenerated(text=piece)),
                max_new_tokens=request.max_new_tokens, temperature=request.temperature, top_p=request.top_p,
                should_stop=lambda: stop.requested,
            )
            generated += count
            reporter.emit(TokensGenerated(text="", done=True))
        if stop.requested:
            break
    models.close()
    log.info("chat: %d tokens generated (%s)", generated, request.model)
    reporter.emit(JobFinished(run_dir=str(run_dir), stopped=stop.requested, seconds=time.monotonic() - began))
