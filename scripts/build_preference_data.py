"""Build resources/datasets/demo_dpo.jsonl (DPO's pairs), demo_kto.jsonl (KTO's labelled answers) and demo_grpo.jsonl (GRPO's prompts) from the demo task.

For each demo example (alpaca: instruction, input, output yes/no) one preference pair: prompt = its
question as the SFT job would ask it (instruction, a blank line, input), chosen = the correct answer,
rejected = the other one; one KTO example: the same question with, in turn, the correct answer
(label true) or the wrong one (label false), so half of them are desirable; and one GRPO prompt: the same question with the correct answer in the
column `answer`, which the exact_match reward reads. Deterministic: the same demo file gives the same pairs, byte for byte.

    python scripts/build_preference_data.py [--source resources/datasets/demo_train.jsonl] [--out ...] [--kto-out ...] [--grpo-out ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OTHER = {"yes": "no", "no": "yes"}


def pair(example: dict) -> dict:
    answer = example["output"].strip().lower()
    if answer not in OTHER:
        raise ValueError(f"expected a yes/no answer, got {example['output']!r}")
    question = example["instruction"]
    if example.get("input"):
        question = f"{question}\n\n{example['input']}"  # as backend.core.data.conversation joins alpaca fields
    return {"prompt": question, "chosen": answer, "rejected": OTHER[answer]}


def kto_example(example: dict, index: int) -> dict:
    """The `index`-th demo example as a labelled answer: even ones with the correct answer, odd ones the wrong."""
    chosen = pair(example)
    good = index % 2 == 0
    return {"prompt": chosen["prompt"], "completion": chosen["chosen" if good else "rejected"], "label": good}


def grpo_prompt(example: dict) -> dict:
    chosen = pair(example)
    return {"prompt": chosen["prompt"], "answer": chosen["chosen"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=ROOT / "resources" / "datasets" / "demo_train.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "datasets" / "demo_dpo.jsonl")
    parser.add_argument("--kto-out", type=Path, default=ROOT / "resources" / "datasets" / "demo_kto.jsonl")
    parser.add_argument("--grpo-out", type=Path, default=ROOT / "resources" / "datasets" / "demo_grpo.jsonl")
    args = parser.parse_args()
    lines = [line for line in args.source.read_text(encoding="utf-8").splitlines() if line.strip()]
    pairs = [pair(json.loads(line)) for line in lines]
    args.out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
    print(f"wrote {len(pairs)} pairs to {args.out}")
    examples = [kto_example(json.loads(line), i) for i, line in enumerate(lines)]
    args.kto_out.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
    print(f"wrote {len(examples)} labelled answers to {args.kto_out}")
    prompts = [grpo_prompt(json.loads(line)) for line in lines]
    args.grpo_out.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    print(f"wrote {len(prompts)} prompts to {args.grpo_out}")


if __name__ == "__main__":
    main()
