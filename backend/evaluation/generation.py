"""Generation: prompts through the model's chat template, greedy batches, and token streaming.

One place renders a conversation into token ids the way training rendered it (the model's own chat
template with the generation prompt, no extra special tokens), so that evaluation, chat and the
samples shown during training ask the model exactly what it learned to answer.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

Message = dict[str, str]


def prompt_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of `messages` followed by the assistant's turn opening (add_generation_prompt)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    # No template (a base model trained on text): continue the plain text of the conversation.
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-turn token and whatever the model's generation config adds."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in configured if isinstance(configured, (list, tuple)) else [configured]:
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def generation_config(model: Any, tokenizer: Any, max_new_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0) -> GenerationConfig:
    """An explicit config (the model's own defaults are not consulted): greedy when temperature is 0."""
    sample = temperature > 0
    kwargs: dict[str, Any] = {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0} if sample else {}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=stop_token_ids(model, tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        use_cache=True,
        **kwargs,
    )


@torch.no_grad()
def greedy_answers(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                   temperature: float = 0.0) -> list[str]:
    """Greedy answers to a batch of prompts (left-padded together), decoded and stripped; sampled
    at `temperature` when it is above 0 (GRPO's mean reward samples as training did)."""
    if not prompts:
        return []
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    device = model_device(model)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         generation_config=generation_config(model, tokenizer, max_new_tokens, temperature))
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in out[:, width:].tolist()]


class TextStream(BaseStreamer):
    """Receives generate()'s new tokens and hands on each new piece of decoded text as it appears.

    The whole answer is decoded again at every token (so merged bytes and leading spaces come out
    right) and only the new suffix is passed on; a piece ending in half a UTF-8 character waits.
    """

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None]):
        self.tokenizer = tokenizer
        self.on_text = on_text
        self.ids: list[int] = []
        self.text = ""
        self._sent = 0
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        self.ids.extend(int(i) for i in value.reshape(-1).tolist())
        self._send(final=False)

    def end(self) -> None:
        self._send(final=True)

    def _send(self, final: bool) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        self.text = text
        if text.endswith("\ufffd") and not final:
            return
        piece = text[self._sent:]
        if piece:
            self._sent = len(text)
            self.on_text(piece)


class _StopWhen(StoppingCriteria):
    def __init__(self, should_stop: Callable[[], bool]):
        self.should_stop = should_stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.should_stop(), dtype=torch.bool, device=input_ids.device)


def on_model(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """A processor's tensors on the model's device, pixels in the model's floating dtype (a bf16 tower
    refuses fp32 pixels); token ids and masks keep their integer types."""
    device = model_device(model)
    dtype = getattr(model, "dtype", None)
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            cast = dtype if value.is_floating_point() and isinstance(dtype, torch.dtype) and dtype.is_floating_point \
                else None
            value = value.to(device=device, dtype=cast) if cast is not None else value.to(device)
        out[key] = value
    return out


@torch.no_grad()
def stream_answer(model: Any, tokenizer: Any, prompt: list[int] | dict[str, Any], on_text: Callable[[str], None], *,
                  max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                  should_stop: Callable[[], bool] = lambda: False) -> tuple[str, int]:
    """Generate one answer, calling on_text with each new piece; -> (answer, tokens generated).
    prompt: token ids, or a processor's tensors for one row (a VLM's ids with its pixels)."""
    if isinstance(prompt, dict):
        inputs = on_model(model, prompt)
    else:
        ids = torch.tensor([prompt], dtype=torch.long, device=model_device(model))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    streamer = TextStream(tokenizer, on_text)
    model.generate(**inputs,
                   generation_config=generation_config(model, tokenizer, max_new_tokens, temperature, top_p),
                   streamer=streamer, stopping_criteria=StoppingCriteriaList([_StopWhen(should_stop)]))
    return streamer.text, len(streamer.ids)
