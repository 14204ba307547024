"""Per-token negative log-likelihoods of model folders on the same tokenized rows, in fp32 with plain transformers.

One script for every folder a bench compares (a merged model, our calibrated exports, llmcompressor's), so their
perplexities differ only by the weights: each folder is loaded by AutoModelForCausalLM in fp32 (compressed-tensors
unpacks a quantized folder's integers), and each row is scored alone, without padding. It imports nothing of the
project, so another environment's interpreter (bench/calibrated_vs_llmcompressor.py's llmcompressor venv) can run it
too on a folder ours cannot load.

    python bench/folder_perplexity.py ROWS.json OUT.json FOLDER [FOLDER ...] [--packed-zero-points]

--packed-zero-points (our environment only): load asymmetric pack-quantized folders as our export check and
`serve` do (backend/training/model/packed_zero_points.py works around compressed-tensors 0.20.1's meta
zero-point shape); plain transformers 5.25 + compressed-tensors 0.20.1 cannot load them (ours or llmcompressor's).

ROWS.json: {"rows": [{"input_ids": [...], "labels": [...]}, ...]} (labels -100 where a token is not an answer).
OUT.json: {FOLDER: {"all": [nll per predicted token], "answers": [nll per answer token], "load_s", "score_s"}
or {"error": "one line"} where the folder did not load or run}.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

IGNORE = -100
OFFLINE = {"USE_HUB_KERNELS": "0", "DISABLE_KERNEL_MAPPING": "1", "HF_HUB_OFFLINE": "1"}
"""No Hub kernels and no downloads (bench/hub_kernels.py says why), set before transformers is imported."""


def score(folder: str, rows: list[dict]) -> dict:
    """The folder's per-token NLLs over `rows` (all predicted tokens, and the answer tokens alone)."""
    import torch
    from transformers import AutoModelForCausalLM

    began = time.monotonic()
    with mismatches() as found:
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        except RuntimeError as exc:
            if found:  # transformers' own message only points at its report: say the first mismatch instead
                raise RuntimeError(f"size mismatch: {found[0]}") from exc
            raise
    loaded = time.monotonic()
    every: list[float] = []
    answers: list[float] = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            every.extend(nll.tolist())
            labels = torch.tensor(row["labels"][1:])
            answers.extend(nll[labels != IGNORE].tolist())
    return {"all": every, "answers": answers, "load_s": loaded - began, "score_s": time.monotonic() - loaded}


@contextlib.contextmanager
def mismatches() -> Iterator[list[str]]:
    """The MISMATCH lines of transformers' load report (logged, not raised), each squeezed to one short line."""
    found: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            for line in record.getMessage().splitlines():
                parts = [part.strip() for part in line.split("|")]
                if len(parts) == 3 and parts[1] == "MISMATCH":
                    key, _, why = parts
                    found.append(f"{key} {re.sub(r'^Reinit due to size mismatch - ', '', why)}")

    handler = Catch()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    if "--packed-zero-points" in argv:  # our stack: the fix our own loaders apply (packed_zero_points.py)
        argv = [a for a in argv if a != "--packed-zero-points"]
        from backend.training.model.packed_zero_points import allow

        allow()
    rows = json.loads(Path(argv[0]).read_text())["rows"]
    results = {}
    for folder in argv[2:]:
        try:
            results[folder] = score(folder, rows)
        except Exception as exc:  # noqa: BLE001 (a folder that does not load is a finding, reported in its row)
            results[folder] = {"error": one_line(exc)}
        print(f"{folder}: {results[folder].get('error') or 'scored'}", file=sys.stderr, flush=True)
    Path(argv[1]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
