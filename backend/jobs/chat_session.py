"""ChatSession: one set of loaded models answering chat request after request.

Loading is what makes a chat message slow on a CPU (seconds), so a session loads once and keeps the
models until it ends; PhaseChanged(load_model) is emitted only when an answer really has to load
(the first one, or a full fine-tune switching between its base and tuned weights). A message that
cannot be answered is refused with one MessageRefused line and the session waits for the next.
A vision-language run's conversations go through its processor (evaluation/image_prompts.py), images or
not, so a text-only turn is asked as training asked it too; a text model refuses a message with images.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from backend.core.errors import JobError, bad_input
from backend.estimate.feasibility import context_length
from backend.evaluation.generation import prompt_ids, stream_answer
from backend.evaluation.image_prompts import NO_IMAGES, ImagePrompter, image_refs, with_markers
from backend.evaluation.run_models import RunModels
from backend.core.protocol import AnswerFinished, MessageRefused, PhaseChanged, TokensGenerated
from backend.training.phase import set_phase
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener


class ChatRequest(Protocol):
    """What an answer needs from a parsed request (backend.jobs.chat.ChatRequest)."""

    which: list[str]
    messages: list[dict[str, str]]
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int | None
    images: list[str]


log = logging.getLogger(__name__)


class ChatSession:
    """Answers ChatRequests with the same RunModels, streaming each answer through the reporter."""

    def __init__(self, models: RunModels, reporter: Reporter, stop: StopListener):
        self.models = models
        self.reporter = reporter
        self.stop = stop
        self.answers = 0
        self.tokens = 0
        self._tokenizer: Any = None
        self._context: int | None = None
        self._prompter: ImagePrompter | None = None

    def _cut(self) -> bool:
        return self.stop.cut_requested

    def answer(self, request: ChatRequest) -> AnswerFinished:
        """Stream one answer per model asked; a refusal (JobError) comes before any event."""
        began = time.monotonic()
        if "tuned" in request.which:
            self.models.require_tuned()
        prompt = self._prompt(request)
        room = self._room(len(prompt) if isinstance(prompt, list) else int(prompt["input_ids"].shape[1]),
                          request.max_new_tokens)
        generated = 0
        for position, which in enumerate(request.which):
            if position and self._cut():
                break  # cut before this model began: it does not answer (nor load)
            if self.models.will_load(which):  # type: ignore[arg-type]
                set_phase("load")
                self.reporter.emit(PhaseChanged(phase="load_model", detail=which))
            with self.models.use(which) as model:  # type: ignore[arg-type]
                if self._cut():
                    break  # cut while loading: the session keeps the model, the answer is empty
                set_phase("generate")
                self.reporter.emit(PhaseChanged(phase="generate", detail=which))
                if request.seed is not None:
                    torch.manual_seed(request.seed)
                _, count = stream_answer(
                    model, self._tokenizer, prompt, lambda piece: self.reporter.emit(TokensGenerated(text=piece)),
                    max_new_tokens=room, temperature=request.temperature, top_p=request.top_p,
                    should_stop=self._cut,
                )
                generated += count
                self.reporter.emit(TokensGenerated(text="", done=True))
        self.answers += 1
        self.tokens += generated
        finished = AnswerFinished(stopped=self._cut(), tokens=generated, seconds=time.monotonic() - began)
        self.reporter.emit(finished)
        return finished

    def _prompt(self, request: ChatRequest) -> list[int] | dict[str, Any]:
        """Token ids (a text model) or the processor's tensors with the pixels (a VLM); refusals first."""
        images = list(getattr(request, "images", None) or [])
        if images and self.models.family is None:
            raise bad_input(f"{NO_IMAGES}: the run trained {self.models.base_path} as a text model",
                            "send the message without images, or chat with a run of a vision-language model")
        if self.models.family is None:
            if self._tokenizer is None:
                self._tokenizer = self.models.tokenizer()
            return prompt_ids(self._tokenizer, request.messages)
        refs = image_refs(images)
        messages = with_markers(request.messages, len(refs))
        if self._prompter is None:
            self._prompter = ImagePrompter(self.models.base_path, self.models.config)
            self._tokenizer = self._prompter.tokenizer
        return self._prompter.inputs(messages, refs)

    def _room(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """New tokens the answer may take; refuses a conversation the model cannot read (past its context
        it answers garbage, or fails on a learned position table)."""
        if self._context is None:
            try:
                raw = json.loads((Path(self.models.base_path) / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raw = None
            found = context_length(raw if isinstance(raw, dict) else None)
            self._context = found[0] if found else 0
        if self._context and prompt_tokens >= self._context:
            raise bad_input(f"the conversation is {prompt_tokens:,} tokens and the model reads at most "
                            f"{self._context:,}: start a new conversation, or send a shorter message")
        if self._context and prompt_tokens + max_new_tokens > self._context:
            log.info("answer capped by the context: %d prompt + %d new > %d", prompt_tokens, max_new_tokens,
                     self._context)
            return self._context - prompt_tokens
        return max_new_tokens

    def serve(self, parse: Callable[[dict[str, Any]], ChatRequest]) -> None:
        """Answer each ChatMessage from the listener (its options read by `parse`) until StopJob or EOF."""
        while True:
            item = self.stop.next_message()
            if item is None:
                return
            if isinstance(item, str):
                self.reporter.emit(MessageRefused(message=item, hint="send a ChatMessage this release knows"))
                continue
            try:
                self.answer(parse(item.params()))
            except JobError as exc:
                log.info("message refused: %s", exc.message)
                self.reporter.emit(MessageRefused(message=exc.message, hint=exc.hint))
