"""A TRL trainer class that counts the tokens each training step computes on, for tokens/s and MFU.

DPO, KTO and GRPO batches carry their masks under different names (attention_mask; completion_mask;
GRPO's prompt_mask + completion_mask after generation), so the count is taken from the prepared
inputs of a training step, whatever the objective; evaluation batches are not counted.
"""

from __future__ import annotations

from typing import Any

from backend.training.phase import set_phase


def _count(inputs: Any) -> tuple[int, int]:
    """(tokens trained on, tokens computed on) of one prepared batch; padding excluded where a mask says so."""
    if not isinstance(inputs, dict):
        return 0, 0
    if "prompt_mask" in inputs and "completion_mask" in inputs:  # GRPO after generation
        completion = int(inputs["completion_mask"].sum())
        return completion, int(inputs["prompt_mask"].sum()) + completion
    mask = inputs.get("attention_mask")
    ids = inputs.get("input_ids")
    computed = int(mask.sum()) if mask is not None else (int(ids.numel()) if ids is not None else 0)
    completion = inputs.get("completion_mask")
    return (int(completion.sum()) if completion is not None else computed), computed


def counting_trainer(base: type) -> type:
    """`base` (a TRL trainer class) with trained_tokens / input_tokens counters and the worker's phases."""

    class TrlCountingTrainer(base):  # type: ignore[misc, valid-type]
        trained_tokens: int = 0
        input_tokens: int = 0
        _in_step: bool = False

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None):
            set_phase("forward", self.state.global_step + 1)
            self._in_step = True
            try:
                return super().training_step(model, inputs, num_items_in_batch)
            finally:
                self._in_step = False

        def _prepare_inputs(self, inputs: Any) -> Any:
            prepared = super()._prepare_inputs(inputs)
            if self._in_step:
                trained, computed = _count(prepared)
                self.trained_tokens += trained
                self.input_tokens += computed
            return prepared

        def evaluate(self, *args: Any, **kwargs: Any):
            set_phase("evaluation")
            return super().evaluate(*args, **kwargs)

    TrlCountingTrainer.__name__ = TrlCountingTrainer.__qualname__ = f"Counting{base.__name__}"
    return TrlCountingTrainer


def build_trl_trainer(trainer_class: type, config: Any, base: Any, lora: Any, tokenizer: Any, train_set: Any,
                      eval_set: Any, callbacks: list[Any], **own: Any) -> Any:
    """`trainer_class` (DPOTrainer, KTOTrainer, GRPOTrainer) made counting and built on the loaded, unwrapped
    `base` with the peft config `lora` (None for full tuning) and the objective's `own` arguments (its
    args, ref_model, reward_funcs). TRL's refusal of LoRA targets the model lacks becomes a one-line
    technique.lora_targets error, and the adapters are checked against the config as the SFT job checks them."""
    from backend.core.errors import bad_input
    from backend.training.model.loading import check_adapters

    if lora is None and own.get("ref_model") is None and "args" in own:
        from backend.runtime.hub_kernels import LOAD_KWARGS

        own["args"].model_init_kwargs = dict(LOAD_KWARGS)  # TRL loads its frozen reference copy from the path
    try:
        trainer = counting_trainer(trainer_class)(model=base, train_dataset=train_set, eval_dataset=eval_set,
                                                  processing_class=tokenizer, peft_config=lora, callbacks=callbacks,
                                                  **own)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        if "target modules" in first.lower() or "target_modules" in first:
            raise bad_input(f"technique.lora_targets: {first}", "use all-linear or names like q_proj,v_proj") from None
        raise
    check_adapters(trainer.model, config)
    return trainer
