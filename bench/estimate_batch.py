"""The activations part against the micro-batch, as the worker runs packed rows (the default):
micro-batch B packs B examples of seq_len tokens into one row, attention runs per example through
`sdpa_packed`, and the bytes autograd saves in the forward pass are counted (not the parameters,
not the vocabulary-sized log-probabilities: the logits part). Full tuning in fp32 on the CPU, tiny
random-weight GPT-2 (attention dropout 0.1: SDPA's math kernel, the s x s probabilities) and Llama.

    python bench/estimate_batch.py [--seq-len 128] [--batches 1,2,4,8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from estimate_tensors import _SavedTensorMeter, _storage_key, _unique_bytes  # noqa: E402

from tests.families import FAMILIES  # noqa: E402

FAMILIES_MEASURED = ("gpt2", "llama")


def run_config(batch: int, seq_len: int) -> Any:
    from backend.core.config.run_config import RunConfig

    return RunConfig.from_dict({"technique": {"method": "full", "precision": "fp32", "attention": "sdpa",
                                              "gradient_checkpointing": False, "packing": True},
                                "train": {"micro_batch_size": batch, "seq_len": seq_len}})


def predicted(family: str, batch: int, seq_len: int) -> int:
    from backend.estimate import estimate

    return estimate(dict(FAMILIES[family]), run_config(batch, seq_len), device="cpu").activations


def measured(family: str, batch: int, seq_len: int) -> int:
    """Bytes saved for backward by one forward pass of a packed row of `batch` examples."""
    import torch

    from backend.training.tokenized import PackingCollator
    from backend.training.shortcuts.packed_attention import register
    from tests.families import tiny_config

    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=register(), dtype=torch.float32)
    model.train()
    vocab = int(config.vocab_size)
    gen = torch.Generator().manual_seed(1)
    examples = []
    for _ in range(batch):
        ids = torch.randint(3, vocab, (seq_len,), generator=gen).tolist()
        examples.append({"input_ids": ids, "labels": ids})
    inputs = PackingCollator()(examples)
    static = {_storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    with _SavedTensorMeter() as meter:
        out = model(**inputs, use_cache=False)
    live = [t for t in meter.live() if not (t.dim() and t.shape[-1] == vocab and t.numel() == batch * seq_len * vocab)]
    saved, _ = _unique_bytes(live, static | {_storage_key(out.logits)})
    del out, meter, model
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batches", default="1,2,4,8")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{'family':8} {'batch':>5} {'predicted':>12} {'measured':>12} {'error':>7}")
    for family in FAMILIES_MEASURED:
        for b in batches:
            p, m = predicted(family, b, args.seq_len), measured(family, b, args.seq_len)
            print(f"{family:8} {b:5d} {p:12,d} {m:12,d} {(p - m) / m:+7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
