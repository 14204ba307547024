"""SampleGenerator: a few greedy answers at each evaluation of a fine-tune, for the Train page.

The prompts are fixed for the whole run. SFT: the first held-out prompts (the eval file beside the
training data) when there is one, else the prompts of the first validation examples (their tokens
up to the first trained one). DPO, KTO and GRPO: the `prompt` of the first validation rows (text or
chat messages; a KTO prompt repeated for its other answers counts once). Each sample is PhaseChanged(phase="sample", detail=prompt) then
TokensGenerated(text=answer, done=True). Cheap (24 new tokens at most) and harmless to the run:
the model goes back to the mode it was in, the torch RNG state is restored, and a failure only
writes a warning to worker.log.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.evaluation.generation import greedy_answers, model_device, prompt_ids
from backend.evaluation.prompts import default_prompts_file, read_prompts
from backend.core.protocol import PhaseChanged, TokensGenerated
from backend.training.tokenized import IGNORE
from backend.runtime.reporter import Reporter

log = logging.getLogger(__name__)
SAMPLES = 3
MAX_NEW_TOKENS = 24


class SampleGenerator:
    def __init__(self, reporter: Reporter, tokenizer: Any, prompts: list[tuple[str, list[int]]]):
        self.reporter = reporter
        self.tokenizer = tokenizer
        self.prompts = prompts  # (shown text, token ids)
        self._last_step: int | None = None

    @classmethod
    def for_run(cls, config: RunConfig, tokenizer: Any, eval_set: Any, reporter: Reporter) -> "SampleGenerator | None":
        """The run's sample prompts, or None when it has none (no held-out file, no validation split)."""
        prompts: list[tuple[str, list[int]]] = []
        try:
            held_out = default_prompts_file(config)
            if held_out is not None:
                for prompt in read_prompts(held_out, SAMPLES):
                    prompts.append((prompt.shown, prompt_ids(tokenizer, prompt.messages)))
        except Exception as exc:  # samples are a nicety: a bad eval file must not stop training
            log.warning("no sample prompts from the held-out file: %s", exc)
            prompts = []
        if not prompts and eval_set is not None:
            for row in eval_set.select(range(min(SAMPLES, len(eval_set)))):
                ids, labels = row["input_ids"], row["labels"]
                first = next((i for i, label in enumerate(labels) if label != IGNORE), len(ids))
                if first == 0:  # plain text: continue its opening words
                    first = max(1, min(16, len(ids) // 2))
                shown = " ".join(tokenizer.decode(ids[:first], skip_special_tokens=True).split())
                prompts.append((shown[-200:], list(ids[:first])))
        return cls(reporter, tokenizer, prompts) if prompts else None

    @classmethod
    def for_prompt_rows(cls, tokenizer: Any, eval_set: Any, reporter: Reporter) -> "SampleGenerator | None":
        """DPO, KTO and GRPO: the prompts of the first validation rows, or None when there are none."""
        prompts: list[tuple[str, list[int]]] = []
        try:
            for row in eval_set.select(range(min(SAMPLES * 4, len(eval_set)))):
                prompt = row["prompt"]
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                users = [str(m["content"]) for m in messages if m.get("role") == "user"]
                shown = " ".join((users[-1] if users else "").split())[-200:]
                if shown not in (seen for seen, _ in prompts):
                    prompts.append((shown, prompt_ids(tokenizer, messages)))
                if len(prompts) == SAMPLES:
                    break
        except Exception as exc:  # samples are a nicety: an odd prompt must not stop training
            log.warning("no sample prompts from the validation rows: %s", exc)
            prompts = []
        return cls(reporter, tokenizer, prompts) if prompts else None

    def __call__(self, model: Any, step: int | None = None) -> None:
        """Sample once per step: the final evaluation may repeat the last scheduled one."""
        if model is None or (step is not None and step == self._last_step):
            return
        self._last_step = step
        was_training = model.training
        devices = [model_device(model)] if model_device(model).type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                model.eval()
                for shown, ids in self.prompts:
                    answer = greedy_answers(model, self.tokenizer, [ids], MAX_NEW_TOKENS)[0]
                    self.reporter.emit(PhaseChanged(phase="sample", detail=shown))
                    self.reporter.emit(TokensGenerated(text=answer, done=True))
        except Exception as exc:  # never let a sample break the run
            log.warning("sample generation failed: %s", exc)
        finally:
            model.train(was_training)
