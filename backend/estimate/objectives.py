"""What DPO, KTO and GRPO add to the SFT estimate: TRL's trainers run more passes than SFT's one.

Read off TRL 1.16's DPOTrainer, KTOTrainer and GRPOTrainer (the worker's doors, backend/training/
preference.py and grpo.py: no padding-free rows, no packing, ref log-probs not precomputed):

- every objective scores tokens through TRL's fused LM head (`add_fused_lm_head`, the chunked
  log-prob kernel): no batch x seq x vocab logits; it saves a copy of the final hidden states and
  keeps one 4096-token x 32768-vocabulary tile at a time (its forward and backward temporaries), and
  the backward builds the hidden states' fp32 gradient. On CUDA only the scored positions go in;
  elsewhere every position does. That replaces SFT's logits part.
- DPO concatenates chosen and rejected into one batch of 2 x micro_batch rows: twice SFT's
  activations, and a no-grad reference forward over the same rows (adapters off) while the policy's
  activations are held.
- KTO trains on micro_batch rows, then runs no-grad passes over them one after another: the KL batch
  (each prompt with another row's completion) through the policy, and the reference over both.
- GRPO first generates: micro_batch x gradient_accumulation_steps completions (TRL's generation
  batch; num_generations of them per prompt), with a KV cache of prompt + completion length per row
  and the prefill's no-grad transient; the old-policy log-probs are skipped (one generation per
  optimizer step) and the reference pass runs only when grpo.beta > 0. It then trains on micro_batch
  rows of prompt + completion tokens.
- Rows are as long as the data's longest (`row_tokens`, backend/estimate/objective_rows.py: TRL pads
  each batch to its longest row), cut at train.seq_len for DPO and KTO (max_length); GRPO's prompts are
  not cut. Without the data's figure every row counts train.seq_len tokens, GRPO's prompts too.
- With model.adapter, TRL copies the start adapter as a frozen "ref" adapter (DPO and KTO always,
  GRPO when beta > 0): one more adapter-sized part.

Each no-grad pass frees what it makes as it goes, so it costs its largest moment (one layer's
temporaries, or the head's tile), not a saved-activation ledger. The total is still the step's peak:
the largest of the phases, now with `reference_forward` and `generation` among them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.estimate.architectures import Arch, Dims
from backend.estimate.breakdown import OBJECTIVE_PARTS, Breakdown
from backend.estimate.families import load_model_config, read_dims
from backend.estimate.setup import Setup, resolve_setup

TOKEN_CHUNK = 4096
"""Rows of one tile of TRL's chunked log-prob kernel (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE)."""
VOCAB_CHUNK = 32768
"""Vocabulary columns of one tile (trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE)."""
HEAD_FWD_TEMPS = 3 * 4 + 1
"""Bytes per tile element of the kernel's forward fold on devices without Triton (torch ops): three fp32
temporaries (z, exp(z - m), e*z) and one bool mask at once; measured (bench/estimate_objectives.py)."""
HEAD_BWD_TEMPS = 7 * 4 + 1
"""Of its backward fold: seven fp32 temporaries (y, z, log p, p, the gradient, the one-hot as float and
their product) and the bool one-hot; measured."""

PART_NOTES = {
    "ref_model": "With full tuning, the frozen copy of the base that TRL loads from the model folder as the "
                 "reference, in the trained weights' dtype: the weights twice.",
    "ref_adapter": "A frozen copy of the start adapter (model.adapter) that TRL keeps as the reference "
                   "(its \"ref\" adapter), the same size as the trained one.",
    "reference": "The no-grad forward passes: the reference (the base with the adapters off) and KTO's KL "
                 "batch. They save nothing for the backward pass; this is their largest moment (one layer's "
                 "temporaries or the LM head's tile), beside the policy's activations for DPO and KTO "
                 "(GRPO's runs while it scores the completions, before training on them).",
    "generation": "GRPO's sampling phase, before training: the KV cache of every completion of the generation "
                  "batch (prompt + completion tokens each) and the prefill's temporaries. Freed before the "
                  "training forward runs.",
}
"""What each part holds, for the window's hover and the docs."""
assert set(PART_NOTES) == set(OBJECTIVE_PARTS)


def fused_head(dims: Dims, setup: Setup, positions: int) -> dict[str, int]:
    """TRL's fused LM head over `positions` scored tokens: what it saves, and its forward and backward
    transients: the matmul buffer (n x 32768 in the compute dtype, whatever the vocabulary), the fold's
    temporaries on one n x min(vocab, 32768) tile (an fp32 copy of a bf16 tile too), and in the backward
    the hidden states' fp32 gradient; n = min(positions, 4096)."""
    n = max(1, min(positions, TOKEN_CHUNK))
    c = min(dims.vocab, VOCAB_CHUNK)
    ce = setup.compute_bytes if setup.autocast else setup.weight_bytes
    upcast = 4 if ce != 4 else 0
    # On CUDA Triton kernels fold each tile in registers and write the gradient over it (derived from
    # the kernel, not measured here); the torch fallback elsewhere makes the temporaries above.
    fwd_temps, bwd_temps = (0, 0) if setup.device == "cuda" else (HEAD_FWD_TEMPS + upcast, HEAD_BWD_TEMPS + upcast)
    saved = positions * dims.hidden * setup.residual_bytes + positions * (8 + 4 * 8)  # hidden copy; targets, per-token outputs
    forward = n * VOCAB_CHUNK * ce + n * c * fwd_temps
    backward = positions * dims.hidden * 4 + n * VOCAB_CHUNK * ce + n * c * bwd_temps
    return {"positions": positions, "saved": saved, "forward": forward, "backward": backward,
            "total": saved + max(forward, backward)}


def no_grad_pass(arch: Arch, dims: Dims, setup: Setup, rows: int, seq: int, positions: int, head: bool = True,
                 adapters_on: bool = False) -> int:
    """The largest moment of a no-grad forward over rows x seq tokens: one layer's temporaries beside
    the residual stream (gated MLP: act, up and their product; else fc1's output and its activation;
    an adapted MLP input linear adds its LoRA output and the scaled copy when the adapters are on;
    eager attention's scores and softmax), or the fused head's tile with its hidden copy."""
    T = rows * seq
    e = setup.compute_bytes
    width = dims.expert_intermediate * max(1, dims.top_k) if dims.experts else dims.intermediate
    lora = 2 if adapters_on and setup.targets & {"gate", "up", "gate_up", "fc1"} else 0
    mlp = T * width * e * ((3 if arch.gated_mlp else 2) + lora)
    attn = T * (dims.heads + 2 * dims.kv_heads) * dims.head_dim * e * 2
    if setup.attention == "eager" or not arch.sdpa:
        attn += rows * dims.heads * seq * seq * (4 + (e if e != 4 else 0))
    layer = 2 * T * dims.hidden * setup.residual_bytes + max(mlp, attn)
    if not head:
        return layer
    fused = fused_head(dims, setup, positions)
    return max(layer, T * dims.hidden * setup.residual_bytes + fused["saved"] + fused["forward"])


def _scored(setup: Setup, device: str, rows: int, seq: int, target: int | None) -> int:
    """Positions the fused head scores: on CUDA only the targets, elsewhere every position but the last."""
    if device == "cuda" and target is not None:
        return rows * min(seq - 1, max(1, target))
    return rows * (seq - 1)


def prompt_tokens(run: RunConfig, row_tokens: int | None) -> int:
    """GRPO's longest prompt: the data's (TRL does not cut prompts), else train.seq_len."""
    return row_tokens if row_tokens is not None else run.train.seq_len


def sft_run(run: RunConfig, row_tokens: int | None = None) -> RunConfig:
    """The run whose SFT estimate is the objective's training forward (DPO: 2 x micro-batch rows;
    GRPO: prompt + completion tokens per row; rows as long as the data's longest, `row_tokens`),
    unpacked and with the speed shortcuts off, as the worker runs these objectives (so no bf16 base
    on the CPU either: techniques.py)."""
    t, train = run.technique, run.train
    batch = train.micro_batch_size
    seq = train.seq_len if row_tokens is None else max(1, min(train.seq_len, row_tokens))
    if t.objective == "dpo":
        batch *= 2
    elif t.objective == "grpo":
        seq = prompt_tokens(run, row_tokens) + run.grpo.max_completion_length
    return run.model_copy(update={
        "technique": t.model_copy(update={"objective": "sft", "packing": False, "liger_kernel": False,
                                          "shortcuts": "off"}),
        "train": train.model_copy(update={"micro_batch_size": batch, "seq_len": seq}),
    })


def estimate_objective(model_config: Any, run: RunConfig, base: Breakdown, *, device: str, bf16_supported: bool,
                       autocast: bool | None, target_tokens: int | None, zero_stage: int = 0,
                       row_tokens: int | None = None) -> Breakdown:
    """`base` (the SFT estimate of `sft_run(run, row_tokens)`) with the objective's parts and phases added."""
    objective = run.technique.objective
    arch, d, _ = read_dims(load_model_config(model_config))
    train_run = sft_run(run, row_tokens)
    deepspeed = device == "cuda" and (zero_stage > 0 or run.technique.offload != "none")
    s, _ = resolve_setup(arch, d, train_run, device, bf16_supported, autocast, deepspeed)
    notes: list[str] = []
    rows, seq = s.batch, s.seq
    # -- the training forward's head: the fused LM head replaces SFT's logits
    answer = run.grpo.max_completion_length if objective == "grpo" else target_tokens
    head = fused_head(d, s, _scored(s, device, rows, seq, answer))
    logits = head["total"]
    # -- the no-grad passes
    reference = 0
    generation: dict[str, int] = {}
    if objective in ("dpo", "kto"):
        reference = no_grad_pass(arch, d, s, rows, seq, head["positions"])
        notes.append("dpo: chosen and rejected run as one batch of 2 x micro_batch_size rows, then a no-grad "
                     "reference pass over them" if objective == "dpo" else
                     "kto: after the policy's forward, no-grad passes over the KL batch and the reference "
                     "(micro_batch_size must be 2 or more: TRL refuses 1)")
        if row_tokens is not None:
            notes.append(f"{objective}: rows counted at {seq} tokens, the data's longest (TRL pads each batch "
                         "to its longest row)")
    else:
        g = run.grpo
        gen_rows = run.train.micro_batch_size * run.train.gradient_accumulation_steps
        prompt = prompt_tokens(run, row_tokens)
        kv_e = s.weight_bytes if not s.quant else s.compute_bytes
        kv = d.layers * 2 * gen_rows * d.kv_heads * d.head_dim * (prompt + g.max_completion_length) * kv_e
        one_layer = kv // max(1, d.layers)  # the cache's cat makes each layer's K and V anew, one at a time
        prompt_kv = kv * prompt // (prompt + g.max_completion_length)
        # The prefill, with the adapters on: one layer's no-grad temporaries at a time over every prompt
        # position beside the cache so far; generate() keeps only the last position's logits.
        prefill = no_grad_pass(arch, d, s, gen_rows, prompt, 0, head=False, adapters_on=True)
        sampling = gen_rows * d.vocab * 4 * 4  # the last position's logits, fp32, processed and softmaxed
        total = max(prompt_kv + prefill, kv + sampling + one_layer)
        generation = {"rows": gen_rows, "prompts": gen_rows // g.num_generations, "kv_cache": kv,
                      "prefill": prefill, "sampling": sampling, "total": total}
        if g.beta > 0:
            reference = no_grad_pass(arch, d, s, rows, seq, head["positions"])
        notes.append(f"grpo: {gen_rows} completions per generation ({gen_rows // g.num_generations} prompt(s) x "
                     f"{g.num_generations}), prompts counted at {prompt} tokens "
                     + ("(the data's longest); " if row_tokens is not None else "(train.seq_len); ")
                     + ("reference pass counted (beta > 0)" if g.beta > 0 else "no reference pass (beta 0)"))
    needs_reference = objective != "grpo" or run.grpo.beta > 0
    ref_model = base.weights if s.full and needs_reference else 0
    if ref_model:
        notes.append(f"{objective} with full tuning: TRL loads a frozen copy of the base as the reference")
    ref_adapter = 0
    if run.model.adapter and (objective != "grpo" or run.grpo.beta > 0):
        ref_adapter = base.adapters
        notes.append("model.adapter: TRL keeps a frozen copy of the start adapter as the reference")
    return _assemble(base, s, head, logits, reference, generation, ref_adapter + ref_model, objective, notes,
                     accumulate=run.train.gradient_accumulation_steps > 1, ref_model=ref_model)


def _assemble(base: Breakdown, setup: Setup, head: dict[str, int], logits: int, reference: int,
              generation: dict[str, int], frozen: int, objective: str, notes: list[str], *,
              accumulate: bool, ref_model: int = 0) -> Breakdown:
    """The Breakdown with the new parts and the phases redone around them; `frozen` is every reference
    weight held all step (the start adapter's copy and, with full tuning, the base's)."""
    details = dict(base.details)
    phases = {k: v for k, v in (details.get("peak_phases") or {}).items() if k not in ("peak", "fixed_runtime")}
    fixed = int((details.get("peak_phases") or {}).get("fixed_runtime", 0))
    act = details["activations"]
    new: dict[str, int] = {}
    for name, value in phases.items():
        value += frozen
        if name in ("backward_start", "loss_backward"):
            value += logits - base.logits
        elif name in ("forward_end", "recompute"):
            value += head["saved"]
        new[name] = value
    static = base.weights + base.adapters + base.optimizer + base.master_weights + frozen
    # DPO's and KTO's reference runs after the policy's forward, beside its activations; GRPO's while
    # scoring the completions, before any training forward.
    held = act["total"] if not setup.checkpointing else (
        act["checkpointed_inputs"] + act["checkpoint_extra_inputs"] + act["model_level"])
    beside = 0 if objective == "grpo" else held + head["saved"]
    if reference:
        new["reference_forward"] = static + beside + reference + (base.gradients if accumulate else 0)
    if generation:
        new["generation"] = static + generation["total"]
    new["peak"] = max(new.values()) + fixed
    new["fixed_runtime"] = fixed
    details["peak_phases"] = new
    details["logits"] = {**details.get("logits", {}), "fused_head": head, "positions": head["positions"]}
    details["objective"] = {"name": objective, "reference": reference, "generation": generation,
                            "ref_adapter": frozen - ref_model, "ref_model": ref_model, "notes": PART_NOTES}
    details["warnings"] = list(details.get("warnings", [])) + notes
    return dataclasses.replace(base, logits=logits, ref_adapter=frozen - ref_model, ref_model=ref_model,
                               reference=reference,
                               generation=generation.get("total", 0), details=details)
