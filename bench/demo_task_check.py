"""Check that the bundled demo preset visibly teaches the bundled model something.

Claim under test: a LoRA fine-tune with the first-run preset (rank 8 on all linear layers, alpha 16,
lr 2e-3 with linear decay, 60 steps of micro-batch 8, seq_len 256, loss on assistant tokens only)
lifts the exact-match accuracy of `resources/tiny` on `resources/datasets/demo_eval.jsonl` well
above the base model's.

The examples go through the studio's own reader and prompt masking (backend.core.data.records and
backend.training.tokenized), so what is checked is what the studio trains on; the loop itself is a
plain torch copy of the Trainer's defaults (AdamW, grad-norm clip 1.0, linear decay, no warmup),
which keeps the check small and its timing honest on one thread.

Besides base and tuned accuracy it prints the majority baseline (always giving the commonest
training answer), the score a model earns by learning the answer format alone.

Run: `python bench/demo_task_check.py [--model resources/tiny] [--seed N]` (about 15 seconds on one
thread).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers
import torch  # noqa: E402

from backend.training.tokenized import IGNORE, encode_conversation  # noqa: E402
from backend.core.data.records import read_records, to_conversation  # noqa: E402


def load_examples(tokenizer, path: Path, seq_len: int) -> list[tuple[list[int], list[int]]]:
    """Alpaca records -> (input_ids, labels), prompts masked, cut to seq_len like the studio does."""
    rows = []
    for index, record in enumerate(read_records(path)):
        ids, labels = encode_conversation(tokenizer, to_conversation(record, "alpaca", f"{path}:{index + 1}"))
        rows.append((ids[:seq_len], labels[:seq_len]))
    return rows


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (i, l) in enumerate(rows):
        ids[row, : len(i)], labels[row, : len(l)], mask[row, : len(i)] = torch.tensor(i), torch.tensor(l), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def fine_tune(model, rows, args) -> list[float]:
    """The preset's LoRA run; returns the loss of each step."""
    rng = random.Random(args.seed)
    order: list[int] = []
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / args.steps))
    losses = []
    model.train()
    for _ in range(args.steps):
        if len(order) < args.batch:
            fresh = list(range(len(rows)))
            rng.shuffle(fresh)
            order += fresh
        batch = collate([rows[i] for i in order[: args.batch]], model.config.pad_token_id)
        batch = {name: tensor.to(model.device) for name, tensor in batch.items()}
        del order[: args.batch]
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def exact_match(model, tokenizer, records: list[dict], max_new_tokens: int, batch: int = 20) -> dict:
    """Greedy answers to each eval prompt; exact match of the stripped text, overall and per task."""
    model.eval()
    tokenizer.padding_side = "left"
    hits: dict[str, list[int]] = defaultdict(list)
    failures = []
    for start in range(0, len(records), batch):
        chunk = records[start: start + batch]
        prompts = [
            tokenizer.apply_chat_template(to_conversation(r, "alpaca", "eval")[:-1], tokenize=False,
                                          add_generation_prompt=True)
            for r in chunk
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        for record, row in zip(chunk, out[:, encoded["input_ids"].shape[1]:]):
            answer = tokenizer.decode(row, skip_special_tokens=True).strip()
            ok = int(answer == str(record["output"]).strip())
            hits[record["instruction"]].append(ok)
            if not ok and len(failures) < 6:
                failures.append({"input": record["input"], "expected": record["output"], "got": answer})
    total = [h for task in hits.values() for h in task]
    return {
        "accuracy": round(sum(total) / len(total), 3),
        "per_task": {task: round(sum(h) / len(h), 2) for task, h in sorted(hits.items())},
        "some_misses": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "resources" / "tiny")
    parser.add_argument("--train", type=Path, default=ROOT / "resources" / "datasets" / "demo_train.jsonl")
    parser.add_argument("--eval", type=Path, default=ROOT / "resources" / "datasets" / "demo_eval.jsonl")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    began = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, **hub_kernels.load_kwargs()).to(args.device)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    eval_records = read_records(args.eval)
    rows = load_examples(tokenizer, args.train, args.seq_len)

    base = exact_match(model, tokenizer, eval_records, args.max_new_tokens)
    base_seconds = time.monotonic() - began

    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    tune_began = time.monotonic()
    losses = fine_tune(model, rows, args)
    tune_seconds = time.monotonic() - tune_began
    tuned = exact_match(model, tokenizer, eval_records, args.max_new_tokens)
    outputs = Counter(str(r["output"]).strip() for r in read_records(args.train))
    commonest = outputs.most_common(1)[0][0]
    report = {
        "model": str(args.model),
        "train_examples": len(rows),
        "eval_examples": len(eval_records),
        "steps": args.steps,
        "first_loss": round(losses[0], 3),
        "last_loss": round(sum(losses[-5:]) / 5, 3),
        "majority_baseline": round(sum(str(r["output"]).strip() == commonest for r in eval_records)
                                   / len(eval_records), 3),
        "base": base,
        "tuned": tuned,
        "seconds": {"base_eval": round(base_seconds), "fine_tune": round(tune_seconds),
                    "total": round(time.monotonic() - began)},
        "threads": args.threads,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
