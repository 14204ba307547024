"""Generate the bundled demo dataset: `resources/datasets/demo_train.jsonl` and `demo_eval.jsonl`.

Why this task: the studio's first-run preset (LoRA, 60 steps, micro-batch 8, lr 2e-3, seq_len 256)
must show, in about a minute on a laptop CPU, that fine-tuning changed the bundled tiny model in a
way anyone can check. Small word games with one right answer do that: the base model has never
seen them (exact-match accuracy near zero) and a LoRA learns them within 60 steps, because each
answer is made by copying words from the prompt, which generalises to words never seen in
training. Answers are exact strings, so improvement is measured by exact-match accuracy
(`bench/demo_task_check.py`).

Words come from the pre-training corpus (resources/corpus/python-docs-3.11.txt): its frequent
lowercase words, split into disjoint train and eval pools, so held-out prompts share no input word
with the training set. Alpaca format, one JSON object per line: {instruction, input, output}.
Deterministic: fixed seed, sorted word lists, no clock. Run: `python scripts/make_demo_data.py`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "resources" / "corpus" / "python-docs-3.11.txt"
OUT = ROOT / "resources" / "datasets"
SEED = 20240611
TRAIN_EXAMPLES = 600
EVAL_EXAMPLES = 100
MIN_COUNT = 60  # frequent words only: the tokenizer knows them as one or two tokens
EVAL_WORD_SHARE = 0.25
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five"}
SEP = "\n"  # one word per line: see the module docstring

Example = dict[str, str]
Task = Callable[[random.Random, list[str]], Example]


def word_pool(corpus: Path) -> list[str]:
    """Frequent lowercase words of 3 to 8 letters from the corpus, sorted for determinism."""
    counts = Counter(re.findall(r"(?<![\w.'-])[a-z]{3,8}(?![\w'-])", corpus.read_text(encoding="utf-8")))
    return sorted(w for w, c in counts.items() if c >= MIN_COUNT)


def _words(rng: random.Random, pool: list[str], low: int, high: int) -> list[str]:
    return rng.sample(pool, rng.randint(low, high))


def repeat_word(rng: random.Random, pool: list[str]) -> Example:
    word, times = rng.choice(pool), rng.choice([2, 3])
    return {"instruction": f"Repeat the word {NUMBER_WORDS[times]} times.", "input": word,
            "output": SEP.join([word] * times)}


def first_word(rng: random.Random, pool: list[str]) -> Example:
    words = _words(rng, pool, 3, 5)
    return {"instruction": "Return the first word.", "input": SEP.join(words), "output": words[0]}


def last_word(rng: random.Random, pool: list[str]) -> Example:
    words = _words(rng, pool, 3, 5)
    return {"instruction": "Return the last word.", "input": SEP.join(words), "output": words[-1]}


def reverse_words(rng: random.Random, pool: list[str]) -> Example:
    words = _words(rng, pool, 2, 3)
    return {"instruction": "Reverse the order of these words.", "input": SEP.join(words),
            "output": SEP.join(reversed(words))}


def count_words(rng: random.Random, pool: list[str]) -> Example:
    words = _words(rng, pool, 2, 5)
    return {"instruction": "How many words are there? Answer with a number.", "input": SEP.join(words),
            "output": str(len(words))}


TASKS: list[Task] = [repeat_word, first_word, last_word, reverse_words, count_words]


def make_examples(rng: random.Random, pool: list[str], n: int, avoid: set[str]) -> list[Example]:
    """n examples, tasks in turn (balanced), none whose (instruction, input) is in `avoid`."""
    examples: list[Example] = []
    seen = set(avoid)
    while len(examples) < n:
        example = TASKS[len(examples) % len(TASKS)](rng, pool)
        key = example["instruction"] + "\n" + example["input"]
        if key in seen:
            continue
        seen.add(key)
        examples.append(example)
    rng.shuffle(examples)
    return examples


def write_jsonl(path: Path, examples: list[Example]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for example in examples:
            handle.write(json.dumps(example, ensure_ascii=False) + "\n")


def main() -> None:
    global SEP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["lines", "spaces"], default="lines")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    SEP = "\n" if args.layout == "lines" else " "
    rng = random.Random(SEED)
    pool = word_pool(CORPUS)
    shuffled = pool[:]
    rng.shuffle(shuffled)
    cut = int(len(shuffled) * EVAL_WORD_SHARE)
    eval_pool, train_pool = sorted(shuffled[:cut]), sorted(shuffled[cut:])
    train = make_examples(rng, train_pool, TRAIN_EXAMPLES, avoid=set())
    held_out = make_examples(rng, eval_pool, EVAL_EXAMPLES,
                             avoid={e["instruction"] + "\n" + e["input"] for e in train})
    write_jsonl(args.out / "demo_train.jsonl", train)
    write_jsonl(args.out / "demo_eval.jsonl", held_out)
    print(f"{len(pool)} words ({len(train_pool)} train / {len(eval_pool)} eval); "
          f"wrote {len(train)} train and {len(held_out)} eval examples to {args.out}")


if __name__ == "__main__":
    main()
