"""The chunked loss's memory on the CPU: the peak of one LoRA training step, plain and chunked.

A tiny Llama with a large vocabulary and a short hidden size (so that the logits are most of the
step), every position a target, measured as bench/estimate_accuracy.py measures the CPU: every new
tensor storage counted until freed (estimate_tensors.PeakTracker), on a steady-state second step.
Prints both peaks, the ratio chunked/plain, and the losses (which must agree).

    PYTHONPATH=. python bench/loss_memory.py [--vocab 65536] [--hidden 64] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def build(vocab: int, hidden: int, chunked: bool):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from backend.training.shortcuts.chunked_loss import ChunkedLoss

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    if chunked:
        assert ChunkedLoss().install(model)
    model.train()
    return model


def step_peak(vocab: int, hidden: int, tokens: int, chunked: bool) -> tuple[int, float]:
    """(peak bytes of the second step, its loss)."""
    import torch
    from estimate_tensors import cpu_step_peak

    model = build(vocab, hidden, chunked)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (1, tokens), generator=g)
    inputs = {"input_ids": ids, "labels": ids.clone()}
    model(**inputs, use_cache=False).loss.backward()  # the first step makes the optimizer state
    optimizer.step()
    static = list(model.parameters()) + list(model.buffers())
    peak = cpu_step_peak(model, optimizer, inputs, contextlib.nullcontext, static)
    loss = float(model(**inputs, use_cache=False).loss.detach())  # with grad on: the chunked path where installed
    return peak, loss


def main(argv: list[str] | None = None) -> int:
    import torch

    from backend.core.registries.shortcuts import loss_chunk_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens in the one packed row, every one a target")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plain, plain_loss = step_peak(args.vocab, args.hidden, args.tokens, False)
    chunked, chunked_loss = step_peak(args.vocab, args.hidden, args.tokens, True)
    mib = 2**20
    print(f"vocab {args.vocab}, hidden {args.hidden}, {args.tokens} target tokens, chunk "
          f"{loss_chunk_rows(args.vocab)} rows, torch {torch.__version__}, CPU fp32 LoRA r8")
    print(f"plain   peak {plain / mib:8.1f} MiB  loss {plain_loss:.6f}")
    print(f"chunked peak {chunked / mib:8.1f} MiB  loss {chunked_loss:.6f}")
    print(f"ratio chunked/plain {chunked / plain:.3f}")
    return 0 if abs(plain_loss - chunked_loss) < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
