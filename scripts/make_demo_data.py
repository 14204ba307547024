"""Generate the bundled demo dataset: `resources/datasets/demo_train.jsonl` and `demo_eval.jsonl`.

The task: "Is this a question? Answer yes or no." about short sentences such as
"How do I use the socket?" (yes) or "The socket holds a buffer." (no).

Why this task: the studio's first-run preset (LoRA rank 8, 60 steps of micro-batch 8, lr 2e-3,
seq_len 256, about a minute on a laptop CPU) must visibly change the bundled tiny model in a way
that exact-match accuracy can measure. The tiny model (4M parameters, 1.6M tokens of pre-training)
cannot copy words from its prompt, and 60 rank-8 steps cannot teach it to: word games such as
"repeat the word", "return the last word", "reverse these words" or even "repeat these digits"
stayed at 0-7% after tuning, and mixtures of several instructions did not learn either
(bench/demo_task_check.py, numbers in resources/README.md). What 60 steps do teach is one answer
format plus one salient feature of the input: here the question mark and the question word, so
the tuned model answers "yes" or "no" and stops, and is right on held-out sentences, where the
base model rambles on (0% exact match).

Sentences come from templates filled with nouns of the pre-training corpus
(resources/corpus/python-docs-3.11.txt): words that often follow "the" there. The nouns are split
into disjoint train and eval pools, so no held-out sentence appears in training. Classes are
balanced, templates come in matching pairs ("Is the x a kind of y?" / "A x is a kind of y."),
so neither the length nor the nouns give the answer away.

Alpaca format, one JSON object per line: {instruction, input, output}. Deterministic: fixed seed,
sorted word lists, no clock. Run: `python scripts/make_demo_data.py` (a second or two).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "resources" / "corpus" / "python-docs-3.11.txt"
OUT = ROOT / "resources" / "datasets"
SEED = 20240611
TRAIN_EXAMPLES = 600
EVAL_EXAMPLES = 100
MIN_NOUN_COUNT = 12  # "the <word>" before a verb or punctuation at least this often in the corpus
EVAL_NOUN_SHARE = 0.25
INSTRUCTION = "Is this a question? Answer yes or no."
# Words found in that position that still read badly as a thing in the templates.
NOT_NOUNS = {"beginning", "caller", "case", "default", "end", "equivalent", "first", "following", "form",
             "future", "latter", "left", "mean", "number", "other", "presence", "programmer", "rest",
             "right", "same", "second", "start", "time", "top", "use", "user"}

QUESTIONS = [
    "What does the {a} do?",
    "How do I use the {a}?",
    "Where is the {a} defined?",
    "Can the {a} hold {b}?",
    "Why does the {a} need {b}?",
    "Is the {a} a kind of {b_bare}?",
    "Which {a} should I use?",
    "When is the {a} closed?",
    "Does every {a} have {b}?",
    "Who owns the {a}?",
]
STATEMENTS = [
    "The {a} does the work.",
    "I use the {a} every day.",
    "The {a} is defined in the {b_bare}.",
    "The {a} can hold {b}.",
    "The {a} needs {b}.",
    "{a_art} is a kind of {b_bare}.",
    "You should use the {a}.",
    "The {a} is closed after use.",
    "Every {a} has {b}.",
    "The {b_bare} owns the {a}.",
]

Example = dict[str, str]


def noun_pool(corpus: Path) -> list[str]:
    """Lowercase words of 3 to 10 letters found as "the <word>" right before a verb or punctuation
    (so mostly nouns: "the file is", "the socket."), sorted."""
    text = corpus.read_text(encoding="utf-8")
    after = r"(?:[.,;:)]| is\b| was\b| of\b| and\b| to\b| in\b| has\b| can\b)"
    counts = Counter(m.group(1) for m in re.finditer(r"\bthe ([a-z]{3,10})" + after, text))
    return sorted(w for w, c in counts.items() if c >= MIN_NOUN_COUNT and w not in NOT_NOUNS)


def with_article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def make_example(rng: random.Random, nouns: list[str], question: bool) -> Example:
    a, b = rng.sample(nouns, 2)
    template = rng.choice(QUESTIONS if question else STATEMENTS)
    sentence = template.format(a=a, a_art=with_article(a), b=with_article(b), b_bare=b)
    return {"instruction": INSTRUCTION, "input": sentence[0].upper() + sentence[1:],
            "output": "yes" if question else "no"}


def make_examples(rng: random.Random, nouns: list[str], n: int) -> list[Example]:
    """n distinct examples, half questions, in random order."""
    examples: list[Example] = []
    seen: set[str] = set()
    while len(examples) < n:
        example = make_example(rng, nouns, question=len(examples) % 2 == 0)
        if example["input"] in seen:
            continue
        seen.add(example["input"])
        examples.append(example)
    rng.shuffle(examples)
    return examples


def write_jsonl(path: Path, examples: list[Example]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for example in examples:
            handle.write(json.dumps(example, ensure_ascii=False) + "\n")


def main() -> None:
    rng = random.Random(SEED)
    nouns = noun_pool(CORPUS)
    shuffled = nouns[:]
    rng.shuffle(shuffled)
    cut = int(len(shuffled) * EVAL_NOUN_SHARE)
    eval_nouns, train_nouns = sorted(shuffled[:cut]), sorted(shuffled[cut:])
    train = make_examples(rng, train_nouns, TRAIN_EXAMPLES)
    held_out = make_examples(rng, eval_nouns, EVAL_EXAMPLES)
    assert not {e["input"] for e in train} & {e["input"] for e in held_out}
    write_jsonl(OUT / "demo_train.jsonl", train)
    write_jsonl(OUT / "demo_eval.jsonl", held_out)
    print(f"{len(nouns)} nouns ({len(train_nouns)} train / {len(eval_nouns)} eval); "
          f"wrote {len(train)} train and {len(held_out)} eval examples to {OUT}")


if __name__ == "__main__":
    main()
