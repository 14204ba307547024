"""How much slower is a GGUF export's write than the disk itself?

Writes the bundled model (resources/tiny, fp32 weights) as GGUF F16 with backend.export.gguf_writer
(metadata, tokenizer, Q/K permutation, the F16 cast, tensor by tensor) and, for comparison, the same
number of bytes with one numpy `tofile`: the floor any writer of that file has to pay. Prints both,
best of N, and their ratio, then splits the export into its fixed metadata part and its tensor part
(what grows with the model); Q8_0 and Q4_0 (numpy quantization) are timed too, for information.
The verification that follows an export is not timed here.

    python bench/export_speed.py            # 5 repeats
    python bench/export_speed.py --repeat 9
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers
import numpy as np  # noqa: E402
import torch  # noqa: E402


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.export.gguf_writer import GgufExport
    from backend.export.tensor_source import StateDictSource

    model = AutoModelForCausalLM.from_pretrained(ROOT / "resources" / "tiny", dtype=torch.float32,
                                                 **hub_kernels.load_kwargs()).eval()
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "resources" / "tiny")
    with tempfile.TemporaryDirectory(prefix="export-speed-") as scratch:
        target = Path(scratch) / "model.gguf"
        results = {}
        for fmt in ("gguf-f16", "gguf-q8_0", "gguf-q4_0"):
            def write(fmt=fmt):
                GgufExport(StateDictSource(model), tokenizer, fmt, "bench").write(target)
                os.sync()
            results[fmt] = (best_of(args.repeat, write), target.stat().st_size)
        def metadata_only():
            export = GgufExport(StateDictSource(model), tokenizer, "gguf-f16", "bench")
            export.plan = []  # header, hyperparameters, tokenizer and chat template, no tensors
            export.write(target)
            os.sync()

        metadata_s = best_of(args.repeat, metadata_only)
        size = results["gguf-f16"][1]
        blob = np.zeros(size, dtype=np.uint8)
        plain_target = Path(scratch) / "plain.bin"

        def plain():
            blob.tofile(plain_target)
            os.sync()

        plain_s = best_of(args.repeat, plain)
    f16_s = results["gguf-f16"][0]
    print(f"model: resources/tiny, {sum(p.numel() for p in model.parameters()):,} parameters; best of {args.repeat}")
    print(f"gguf-f16 export write : {f16_s * 1000:8.1f} ms  ({size / 1e6:.2f} MB, {size / f16_s / 1e6:.0f} MB/s)")
    print(f"np.tofile same bytes  : {plain_s * 1000:8.1f} ms  ({size / plain_s / 1e6:.0f} MB/s)")
    print(f"ratio export / plain  : {f16_s / plain_s:8.2f}x")
    tensors_s = max(f16_s - metadata_s, 1e-9)
    print(f"  of which metadata   : {metadata_s * 1000:8.1f} ms  (tokenizer: {len(tokenizer):,} tokens + merges, packed by gguf-py;"
          " fixed, does not grow with the model)")
    print(f"  tensors only        : {tensors_s * 1000:8.1f} ms  -> {tensors_s / plain_s:.2f}x the plain write")
    for fmt in ("gguf-q8_0", "gguf-q4_0"):
        seconds, nbytes = results[fmt]
        print(f"{fmt} export write: {seconds * 1000:8.1f} ms  ({nbytes / 1e6:.2f} MB; numpy quantization included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
