"""Random-weight models built from real config.json files, and a data file of long rows, for bench/gpu_check.sh.

Each model is built where it will train (on the GPU in bf16: no fp32 copy, no weights through the
CPU) and saved with the bundled tokenizer. No Llama-3 tokenizer can be had offline; the bundled one's
4,096 ids are all valid rows of a 128,256-row embedding, and the cost of a step depends on the shapes
(the logits span the whole vocabulary whatever ids come in), not on which ids they are. The config's
bos/eos/pad ids are set to the tokenizer's so that generation and the GGUF writer see one set.
--dry shrinks every width and depth (the vocabulary kept) so that the mechanics run on a CPU.

    python bench/gpu_models.py --out /tmp/gpu-check --seq-len 2048 --rows 64
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers

CONFIGS = ROOT / "tests/fixtures/model_configs"
TINY = ROOT / "resources/tiny"
MODELS = {"1b": "meta-llama--Llama-3.2-1B-Instruct", "8b": "meta-llama--Llama-3.1-8B-Instruct"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def shrunk(config: dict) -> dict:
    """The same family and vocabulary at CPU size: hidden 64, 2 layers, 4 heads of 16, the config's GQA ratio."""
    heads = 4
    kv = max(1, heads * config["num_key_value_heads"] // config["num_attention_heads"])
    return {**config, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 16}


def model_config(name: str, dry: bool) -> dict:
    config = json.loads((CONFIGS / MODELS[name] / "config.json").read_text())
    tiny = json.loads((TINY / "config.json").read_text())
    config.update({k: tiny[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
    return shrunk(config) if dry else config


def built_where_it_trains(auto_class, config, dry: bool):
    """(the random-weight model, its device): built on the GPU in bf16 (no fp32 copy), seeded; on the CPU when dry."""
    import torch

    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = auto_class.from_config(config, dtype=torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
    return model, device


def build(name: str, out: Path, dry: bool) -> dict:
    """Build, save and drop one model; -> what was built and how long it took."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = model_config(name, dry)
    config = AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items()
                                                            if k not in ("architectures", "transformers_version")})
    start = time.monotonic()
    model, device = built_where_it_trains(AutoModelForCausalLM, config, dry)
    built = time.monotonic() - start
    folder = out / name
    model.save_pretrained(folder)
    for file in TOKENIZER_FILES:
        shutil.copy(TINY / file, folder / file)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"model": name, "path": str(folder), "params": params, "device": device, "build_s": round(built, 1),
            "with_save_s": round(time.monotonic() - start, 1)}


def write_rows(path: Path, seq_len: int, rows: int) -> dict:
    """`rows` raw-text rows (every position a target) of at least seq_len tokens with the bundled tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    text = (ROOT / "resources/corpus/python-docs-3.11.txt").read_text(encoding="utf-8")
    ids = tokenizer(text[:200_000], add_special_tokens=False)["input_ids"]
    chars = int(200_000 / len(ids) * (seq_len + 64)) + 1  # a little over seq_len tokens per row
    records, lengths, offset = [], [], 0
    while len(records) < rows:
        if offset + chars > len(text):
            offset = 0
        piece = text[offset:offset + chars]
        offset += chars
        records.append({"text": piece})
    lengths = [len(x) for x in tokenizer([r["text"] for r in records], add_special_tokens=False)["input_ids"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return {"rows": rows, "shortest_tokens": min(lengths), "seq_len": seq_len}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="1b,8b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--dry", action="store_true", help="CPU-sized widths, on the CPU")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = write_rows(out / "long_rows.jsonl", args.seq_len, args.rows)
    if data["shortest_tokens"] < args.seq_len:
        print(f"error: a data row has {data['shortest_tokens']} tokens, under seq_len {args.seq_len}", file=sys.stderr)
        return 1
    result = {"data": {"path": str(out / "long_rows.jsonl"), **data}, "models": []}
    for name in args.models.split(","):
        result["models"].append(build(name, out, args.dry))
        print(json.dumps(result["models"][-1]), flush=True)
    (out / "build.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
