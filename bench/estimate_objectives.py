"""How close is the estimate of DPO, KTO and GRPO (backend/estimate/objectives.py) to real TRL steps?

Builds tiny random-weight models (the bundled Llama, a Qwen2 and a GPT-NeoX of bench/estimate_cases.py,
all with the bundled tokenizer's 4096 tokens), LoRA r8 on all linears through TRL's own trainers
(DPOTrainer, KTOTrainer, GRPOTrainer, with the worker's options), feeds each a batch from the trainer's
own data loader (every example the same length, so the rows are exactly as long as predicted) and
measures on the CPU, against real tensors:

- activations: what autograd saves during the trainer's compute_loss (policy forward and the no-grad
  passes, which save nothing), still alive after it, each storage once, parameters left out; against
  the estimate's activations plus what the fused LM head saves;
- logits: TRL's chunked log-prob function run alone on hidden states of the step's shape, forward and
  backward under bench/estimate_tensors.py's PeakTracker; against the logits part less the hidden copy;
- reference: the peak of new storage of one no-grad forward with the adapters off (DPO, KTO; GRPO
  with beta > 0), against the reference part;
- generation (GRPO): the KV cache generate() returns and the peak of new storage while it generates
  (min_new_tokens = max_completion_length), against the kv_cache detail and the generation part;
- ref_adapter: with a start adapter (the model handed over already wrapped, as the worker does with
  model.adapter), the bytes of TRL's frozen "ref" copy, against the ref_adapter part;
- step: a second, steady-state trainer.training_step plus the fused AdamW step under PeakTracker (for
  GRPO this includes the generation), against the estimate's total (its largest phase).

    python bench/estimate_objectives.py            # every case (~1 min on 2 cores)
    python bench/estimate_objectives.py --only dpo # cases whose name contains "dpo"

Exits 1 when a part misses ±10%. tests/backend/test_estimate_objectives.py runs a slice of CASES.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from backend.core.config.run_config import RunConfig  # noqa: E402
from backend.estimate import Breakdown, estimate  # noqa: E402
from estimate_cases import TINY_NEOX, TINY_QWEN2, llama_config_dict  # noqa: E402
from estimate_tensors import PeakTracker, _SavedTensorMeter, _unique_bytes  # noqa: E402

TOLERANCE = 0.10
CONFIGS = {"llama": llama_config_dict, "qwen2": lambda: dict(TINY_QWEN2), "gpt_neox": lambda: dict(TINY_NEOX)}


@dataclasses.dataclass(frozen=True)
class Case:
    objective: str
    arch: str
    batch: int = 2
    prompt: int = 40
    answer: int = 24
    checkpointing: bool = False
    attention: str = "sdpa"
    generations: int = 4
    beta: float = 0.0
    start_adapter: bool = False
    """Train on in an already wrapped PeftModel (model.adapter), which TRL copies as a frozen "ref" adapter."""

    @property
    def name(self) -> str:
        gc = "+gc" if self.checkpointing else ""
        extra = f"/g{self.generations}/b{self.beta:g}" if self.objective == "grpo" else ""
        extra += "/start-adapter" if self.start_adapter else ""
        return f"{self.objective}/{self.arch}{gc}/{self.attention}/p{self.prompt}+a{self.answer}xb{self.batch}{extra}"

    def run_config(self, seq_len: int) -> RunConfig:
        return RunConfig.from_dict({
            "model": {"adapter": "start-adapter"} if self.start_adapter else {},
            "technique": {"objective": self.objective, "method": "lora", "lora_rank": 8, "lora_alpha": 16,
                          "lora_targets": "all-linear", "gradient_checkpointing": self.checkpointing,
                          "attention": self.attention, "precision": "fp32"},
            "grpo": {"num_generations": self.generations, "max_completion_length": self.answer, "beta": self.beta},
            "train": {"micro_batch_size": self.batch, "seq_len": seq_len},
        })


CASES = [
    Case("dpo", "llama"), Case("dpo", "qwen2", batch=1, attention="eager"), Case("dpo", "gpt_neox", checkpointing=True),
    Case("dpo", "llama", batch=4, prompt=100, answer=60),
    Case("kto", "llama"), Case("kto", "qwen2", checkpointing=True), Case("kto", "gpt_neox", batch=4),
    Case("grpo", "llama", batch=4), Case("grpo", "qwen2", batch=8, generations=8, beta=0.04),
    Case("grpo", "gpt_neox", batch=4, answer=48, checkpointing=True),
    Case("dpo", "qwen2", start_adapter=True), Case("grpo", "llama", batch=4, beta=0.04, start_adapter=True),
]
CI_SLICE = [Case("dpo", "llama", batch=1, prompt=16, answer=8),
            Case("grpo", "llama", batch=2, prompt=16, answer=8, generations=2)]
"""What the test suite measures (short rows: a few seconds on 2 cores)."""


def _text(word: str, n: int) -> str:
    return (" " + word) * n


def _trainer(case: Case) -> tuple[Any, Any]:
    """(TRL trainer, tokenizer) for the case, on a fresh random-weight model."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    raw = CONFIGS[case.arch]()
    kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    config = AutoConfig.for_model(raw["model_type"], **kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=case.attention, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ROOT / "resources" / "tiny")
    tok.chat_template = None  # plain text: every row exactly as long as its words
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
    if case.start_adapter:  # as backend/jobs/finetune.py passes a start adapter: wrapped, no peft_config
        from peft import get_peft_model

        model, lora = get_peft_model(model, lora), None
    out = tempfile.mkdtemp(prefix="objective-bench-")
    common = dict(output_dir=out, per_device_train_batch_size=case.batch, gradient_checkpointing=case.checkpointing,
                  gradient_checkpointing_kwargs={"use_reentrant": False}, report_to=[], use_cpu=True,
                  bf16=False, fp16=False,  # GRPOConfig defaults bf16 to True: the worker always sets both
                  logging_steps=1000, save_strategy="no", disable_dropout=True)
    n = 16
    if case.objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        rows = [{"prompt": _text("a", case.prompt), "chosen": _text("b", case.answer),
                 "rejected": _text("c", case.answer)} for _ in range(n)]
        args = DPOConfig(**common, dataset_num_proc=None, max_length=4096, padding_free=False,
                         precompute_ref_log_probs=False, train_sampling_strategy="random")
        trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             peft_config=lora)
    elif case.objective == "kto":
        from trl import KTOConfig, KTOTrainer

        rows = [{"prompt": _text("a", case.prompt), "completion": _text("b", case.answer), "label": i % 2 == 0}
                for i in range(n)]
        args = KTOConfig(**common, dataset_num_proc=None, max_length=4096, train_sampling_strategy="sequential")
        trainer = KTOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             peft_config=lora)
    else:
        from trl import GRPOConfig, GRPOTrainer

        rows = [{"prompt": _text("a", case.prompt)} for _ in range(n)]
        args = GRPOConfig(**common, num_generations=case.generations, max_completion_length=case.answer,
                          beta=case.beta, generation_kwargs={"min_new_tokens": case.answer}, log_completions=False)
        def reward(completions, **kw):
            return [float(len(c)) for c in completions]

        trainer = GRPOTrainer(model=model, reward_funcs=[reward],
                              args=args, train_dataset=Dataset.from_list(rows), processing_class=tok, peft_config=lora)
    return trainer, tok


def _storages(tensors) -> set:
    return {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}


def _peak(fn, known_tensors) -> int:
    """Most new storage alive at once while fn() runs."""
    import gc

    gc.collect()
    tracker = PeakTracker({t.untyped_storage().data_ptr() for t in known_tensors})
    with tracker.mode():
        fn()
    return tracker.peak


def measure(case: Case) -> tuple[dict[str, int], int]:
    """({part: measured bytes}, the row length the trainer built) for one case."""
    import torch
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import use_adapter

    trainer, tok = _trainer(case)
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's loop, which is not run here
    model = trainer.model
    if case.checkpointing:  # what Trainer.train() does first
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-4, fused=True)
    raw = next(iter(trainer.get_train_dataloader()))
    inputs = trainer._prepare_inputs(raw) if case.objective == "grpo" else raw
    if case.objective == "grpo":
        seq = inputs["prompt_ids"].shape[1] + inputs["completion_ids"].shape[1]
        prompt_len = inputs["prompt_ids"].shape[1]
    else:
        seq = inputs["input_ids"].shape[1]
    got: dict[str, int] = {}
    if case.start_adapter:
        got["ref_adapter"] = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".ref." in n)
    tensors = [t for t in (inputs.values() if isinstance(inputs, dict) else []) if isinstance(t, torch.Tensor)]
    # -- activations: what the trainer's compute_loss leaves saved for the backward pass
    with _SavedTensorMeter() as meter:
        loss = trainer.compute_loss(model, inputs)
    got["activations"], _ = _unique_bytes(meter.live(), _storages(params))
    loss.backward()
    del loss, meter
    opt.step()
    opt.zero_grad(set_to_none=True)
    # -- the fused head alone, on hidden states of this step's shape
    base = model.get_base_model()
    rows = inputs["input_ids"].shape[0] if case.objective != "grpo" else case.batch
    n = rows * (seq - 1)
    hidden = torch.randn(n, base.config.hidden_size, requires_grad=True)
    weight = base.get_output_embeddings().weight
    targets = torch.randint(0, weight.shape[0], (n,))

    def head():
        out = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0,  # noqa: F821 (runs before the del)
                                           ("log_probs", "entropy", "mean_logits", "is_top1"))
        out[0].sum().backward()

    got["logits"] = _peak(head, params + [hidden, targets])
    del hidden
    # -- one no-grad pass with the adapters off (the reference)
    if case.objective != "grpo" or case.beta > 0:
        if case.objective == "grpo":
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)[:case.batch]
        else:
            ids = inputs["input_ids"]
        labels = ids.clone()

        def reference():
            with torch.no_grad(), use_adapter(model, None):
                model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True,
                      use_cache=False)

        got["reference"] = _peak(reference, params + [ids, labels])
    # -- generation (GRPO): the KV cache and the peak while generating
    if case.objective == "grpo":
        prompts = inputs["prompt_ids"].shape[0]
        ids = torch.full((prompts, prompt_len), 5, dtype=torch.long)
        kv: dict[str, int] = {}

        def generate():
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=case.answer,
                                     min_new_tokens=case.answer, do_sample=True, return_dict_in_generate=True,
                                     pad_token_id=tok.pad_token_id)
            cache = out.past_key_values
            kv["bytes"] = sum(t.untyped_storage().nbytes() for layer in cache.layers
                              for t in (layer.keys, layer.values))

        got["generation"] = _peak(generate, params + [ids])
        got["kv_cache"] = kv["bytes"]
    # -- the whole steady-state step
    static = params + [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    before = sum(s[1] for s in _storages(static + tensors))

    def step():
        trainer.training_step(model, raw if case.objective == "grpo" else inputs, None)
        opt.step()
        opt.zero_grad(set_to_none=True)

    got["step_peak"] = before + _peak(step, static + tensors)
    return got, seq if case.objective != "grpo" else prompt_len


def predict(case: Case, seq: int) -> tuple[Breakdown, dict[str, int]]:
    """The estimate for the case (seq: the row length, or GRPO's prompt length) and its comparable figures."""
    b = estimate(CONFIGS[case.arch](), case.run_config(seq), device="cpu")
    head = b.details["logits"]["fused_head"]
    hidden_copy = head["positions"] * b.details["model"]["hidden_size"] * 4
    # With checkpointing the layers' inputs and the recomputed layer are held by the checkpoint, out of
    # reach of the saved-tensor hooks (bench/estimate_accuracy.py measures those): the step peak checks them.
    want = {} if case.checkpointing else {"activations": b.activations + head["saved"]}
    want.update({ "logits": b.logits - hidden_copy,
            "step_peak": b.total_bytes})
    if b.reference:
        want["reference"] = b.reference
    if case.start_adapter:
        want["ref_adapter"] = b.ref_adapter
    if case.objective == "grpo":
        gen = b.details["objective"]["generation"]
        want["generation"] = gen["total"] - gen["kv_cache"]
        want["kv_cache"] = gen["kv_cache"]
    return b, want


def compare(case: Case) -> dict[str, tuple[int, int, float]]:
    got, seq = measure(case)
    _, want = predict(case, seq)
    if "generation" in want:
        want["generation"] += want["kv_cache"]  # generate()'s peak holds its cache
    return {k: (want[k], got[k], (want[k] - got[k]) / got[k] if got[k] else 0.0) for k in want if k in got}


def main(argv: list[str] | None = None) -> int:
    import hub_kernels

    hub_kernels.switch_off()  # in the script only: the test suite imports this module
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--ci", action="store_true", help="the test suite's slice")
    a = ap.parse_args(argv)
    cases = CI_SLICE if a.ci else [c for c in CASES if a.only in c.name]
    worst: dict[str, tuple[float, str]] = {}
    start = time.perf_counter()
    for case in cases:
        rows = compare(case)
        print(case.name)
        for part, (p, m, err) in rows.items():
            print(f"  {part:<12}{p / 2**20:>10.2f} MiB predicted {m / 2**20:>10.2f} MiB measured {err:>+7.1%}")
            key = f"{case.objective}:{part}"
            if key not in worst or abs(err) > abs(worst[key][0]):
                worst[key] = (err, case.name)
    print(f"\nworst per objective and part ({time.perf_counter() - start:.0f} s):")
    for key, (err, name) in sorted(worst.items()):
        print(f"  {key:<22}{err:>+7.1%}  {name}")
    return 1 if any(abs(e) > TOLERANCE for e, _ in worst.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
