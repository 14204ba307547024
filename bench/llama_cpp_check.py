"""Opt-in: does llama.cpp itself read our GGUF files the way transformers computes the model?

The export's own check reads a GGUF back with transformers' GGUF loader (not part of llama.cpp,
and blind to some families). This script closes the loop where llama-cpp-python is installed:

    python bench/llama_cpp_check.py model.gguf --hf MERGED_FOLDER      # one export against its merged model
    python bench/llama_cpp_check.py model.gguf                         # load + generate + tokenize only
    python bench/llama_cpp_check.py --families [--formats gguf-f16,gguf-q8_0] [--only llama,qwen2]

With --hf it evaluates the same token ids in llama.cpp and in the transformers model (fp32) and
prints the largest |logit difference| relative to the largest |logit|, the top-1 agreement, and
whether llama.cpp's tokenizer encodes the chat-rendered prompts like the transformers tokenizer.
--families builds every tiny model of tests/families.py (plus Llama 3 rotary scaling, Phi-3
longrope, and the tokenizer shapes of tests/backend/test_gguf_tokenizers.py), writes each with
GgufExport and checks it that way: the figures docs/export.md records. llama-cpp-python may live in
its own venv: pass --llama-site DIR (its site-packages) and run this with the project's Python.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers
from backend.export.gguf_check import EXTRA_TEXTS  # noqa: E402  (digits, whitespace runs, other scripts)
INSTALL = (
    "llama-cpp-python is not importable. Build it for a generic CPU (slow), e.g. into its own venv:\n"
    '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF '
    '-DGGML_AVX512_VNNI=OFF" pip install llama-cpp-python --no-binary llama-cpp-python\n'
    "then run this script again (with --llama-site VENV/lib/python3.X/site-packages if it is another venv)."
)
LONG = " ".join(f"word{i} is followed by the river and the stone, then the light." for i in range(8))
PROMPTS = ("What is the capital of France?", "Reverse the order of these words: river stone light",
           f"Read this and summarise it: {LONG}")  # the last runs past the tiny Gemmas' 32-token window
BOUNDS = {"gguf-f16": (0.01, 0.97), "gguf-q8_0": (0.06, 0.9), "gguf-q5_0": (0.08, 0.9), "gguf-q4_0": (0.08, 0.9)}
"""format -> (90th percentile over positions of |logit diff| / largest |logit|, top-1 agreement) for PASS,
against the model with its weights rounded as stored (rounded_like): what is left is llama.cpp's own
arithmetic (fp16 KV cache; activations quantized to 8 bits for quantized matmuls), a few tenths of a percent
to a few percent; a wrong layout, rotary setting or hyper-parameter costs tens of percent at most positions
(docs/export.md). The percentile, not the maximum: an MoE router flips an expert at the odd near-tie."""


def rendered(tokenizer: Any) -> list[str]:
    if getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                              add_generation_prompt=True) for p in PROMPTS]
    return list(PROMPTS)


def compare(path: Path, model: Any, tokenizer: Any, n_ctx: int = 512) -> dict[str, Any]:
    """llama.cpp vs transformers on the same token ids, and llama.cpp's tokenization vs transformers'."""
    import numpy as np
    import torch
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=2, verbose=False)
    diffs, agree, positions, scale, same_tokens = [], 0, 0, 0.0, 0
    texts = rendered(tokenizer)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = tokenizer.bos_token_id
        prepend = bos is not None and ids[:1] != [bos] and tokenizer("a")["input_ids"][:1] == [bos]
        ids = [bos] + ids if prepend else ids  # what the runtime adds to a prompt (BOS once)
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=prepend, special=True)
        same_tokens += list(theirs) == ids
        ids = ids[:n_ctx]
        llm.reset()
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
        with torch.no_grad():
            want = model(torch.tensor([ids])).logits[0].float().numpy()
        diffs.extend(np.abs(got - want).max(-1).tolist())  # one figure per position
        scale = max(scale, float(np.abs(want).max()))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        positions += len(ids)
    plain = list(PROMPTS[:2]) + list(EXTRA_TEXTS)
    plain_same = sum(list(llm.tokenize(t.encode("utf-8"), add_bos=False, special=False))
                     == tokenizer(t, add_special_tokens=False)["input_ids"] for t in plain)
    del llm
    return {"rel_diff": max(diffs) / scale, "rel_p90": float(np.percentile(diffs, 90)) / scale, "top1": agree / positions,
            "tokens_same": f"{same_tokens}/{len(texts)}", "plain_same": f"{plain_same}/{len(plain)}"}


def cases() -> list[tuple[str, str, dict[str, Any], str | None, int]]:
    """(label, family, config overrides, tokenizer variant, llama.cpp n_ctx) for --families."""
    from tests.families import FAMILIES

    out = [(family, family, {}, None, 512) for family in FAMILIES]
    llama3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=64)
    longrope = dict(rope_type="longrope", rope_theta=10000.0, long_factor=[1.0 + i / 4 for i in range(8)],
                    short_factor=[1.0 + i / 16 for i in range(8)])
    gemma3 = {"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
              "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}
    yarn = dict(rope_type="yarn", factor=4.0, rope_theta=10000.0, original_max_position_embeddings=128)
    out += [("llama, llama3 rope", "llama", dict(rope_parameters=llama3), None, 512),
            ("gemma3_text, linear rope (4B+)", "gemma3_text", dict(rope_parameters=gemma3), None, 512),
            ("qwen2, yarn rope", "qwen2", dict(rope_parameters=yarn), None, 512),
            ("phi3, longrope", "phi3", dict(rope_parameters=longrope, original_max_position_embeddings=256), None, 256)]
    out += [(f"llama, {v} tokenizer", "llama", {}, v, 512) for v in ("llama-bpe", "dbrx", "qwen2", "smollm", "spm-legacy",
                                                                     "spm-metaspace")]
    out += [("gemma2, spm-gemma tokenizer", "gemma2", {}, "spm-gemma", 512)]
    return out


def sharpen(model: Any, factor: float = 6.0) -> Any:
    """Scale the query/key projections so the random tiny model's attention is peaked, not uniform: a
    wrong rotary layout or scaling then moves the logits by far more than fp16 rounding does."""
    import torch

    gemma = model.config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "qkv_proj", "query_key_value", "c_attn")):
                param.mul_(factor)
            elif "q_norm" in name or "k_norm" in name:  # q/k normalized after the projection (Qwen3, Gemma 3):
                param.add_(1.0) if gemma else param.mul_(2.0)  # scale 2 (Gemma's norm multiplies by 1 + w)
    return model


def rounded_like(model: Any, export: Any) -> Any:
    """A copy of the model whose weights are rounded as the GGUF stores them (F16, or quantized along
    llama.cpp's rows with gguf-py): llama.cpp's logits are compared with this, so the figure measures how
    it reads the file, not the quantization error every reader shares."""
    import copy

    import gguf
    import numpy as np
    import torch

    reference = copy.deepcopy(model)
    params = dict(reference.named_parameters())
    for t in export.plan:
        if t.op == "values" or t.ggml_type.name == "F32":
            continue
        for name in t.sources:
            if name not in params:
                continue  # a tied head: rounded with its embedding
            w = params[name].detach().float().numpy()
            x = np.ascontiguousarray(w.T if t.op == "transpose" else w)
            if t.ggml_type.name == "F16":
                r = x.astype(np.float16).astype(np.float32)
            else:
                r = gguf.quants.dequantize(gguf.quants.quantize(x, t.ggml_type), t.ggml_type).reshape(x.shape)
            params[name].data.copy_(torch.from_numpy(np.ascontiguousarray(r.T if t.op == "transpose" else r)))
    return reference


def variant_tokenizer(variant: str | None) -> Any:
    from transformers import AutoTokenizer

    from backend.export.gguf_pretokenizer import LLAMA3_SPLIT, QWEN2_SPLIT
    from tests.backend import test_gguf_tokenizers as tt
    from tests.families import BUNDLED

    if variant is None:
        return AutoTokenizer.from_pretrained(BUNDLED)
    if variant.startswith("spm-"):
        return tt.sentencepiece(variant[4:])
    if variant == "smollm":
        return tt.rewrap({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                tt.byte_level(True)]})
    if variant == "qwen2":
        return tt.rewrap(tt.split(QWEN2_SPLIT), normalizer={"type": "NFC"})
    if variant == "dbrx":
        return tt.rewrap(tt.split(LLAMA3_SPLIT))
    return tt.rewrap(tt.split(LLAMA3_SPLIT), ignore_merges=True)


def families(formats: list[str], only: set[str] | None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from backend.export.gguf_writer import GgufExport
    from backend.export.tensor_source import StateDictSource
    from tests.families import tiny_config

    torch.set_num_threads(2)
    failed = 0
    print(f"{'case':34} {'format':10} {'arch':9} {'max rel':>8} {'p90 rel':>8} {'top-1':>7} {'chat ids':>8} "
          f"{'plain ids':>9}  verdict")
    with tempfile.TemporaryDirectory() as tmp:
        for label, family, overrides, variant, n_ctx in cases():
            if only and family not in only and label not in only:
                continue
            torch.manual_seed(1)
            model = sharpen(AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32).eval())
            tokenizer = variant_tokenizer(variant)
            for fmt in formats:
                path = Path(tmp) / f"{family}-{fmt}.gguf"
                export = GgufExport(StateDictSource(model), tokenizer, fmt, "tiny")
                export.write(path)
                try:
                    figures = compare(path, rounded_like(model, export), tokenizer, n_ctx)
                except Exception as exc:  # llama.cpp refused the file: that is the finding
                    print(f"{label:34} {fmt:10} {export.arch:9} llama.cpp failed: {type(exc).__name__}: {exc}")
                    failed += 1
                    continue
                bound, top1 = BOUNDS[fmt]
                same = figures["tokens_same"].split("/")
                ok = figures["rel_p90"] <= bound and figures["top1"] >= top1 and same[0] == same[1]
                failed += not ok
                print(f"{label:34} {fmt:10} {export.arch:9} {figures['rel_diff']:8.4f} {figures['rel_p90']:8.4f} "
                      f"{figures['top1']:7.1%} "
                      f"{figures['tokens_same']:>8} {figures['plain_same']:>9}  {'PASS' if ok else 'FAIL'}")
                path.unlink()
    return 1 if failed else 0


def single(path: Path, hf: str | None, tokens: int) -> int:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False)
    print(f"loaded {path} ({path.stat().st_size / 1e6:.1f} MB); architecture {llm.metadata.get('general.architecture')}")
    reply = llm.create_chat_completion(messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=tokens,
                                       temperature=0.0)
    print(f"generated {reply['usage']['completion_tokens']} tokens: {reply['choices'][0]['message']['content']!r}")
    del llm
    if not hf:
        return 0
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, **hub_kernels.load_kwargs()).eval()
    figures = compare(path, model, AutoTokenizer.from_pretrained(hf))
    print(f"llama.cpp vs transformers (fp32, weights not rounded): largest |logit diff| {figures['rel_diff']:.4f} "
          f"of the largest |logit| (90th percentile {figures['rel_p90']:.4f}), "
          f"top-1 agreement {figures['top1']:.1%}, prompts tokenized the same {figures['tokens_same']}")
    same = figures["tokens_same"].split("/")
    return 0 if same[0] == same[1] and figures["top1"] >= 0.85 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", help="an exported model.gguf")
    parser.add_argument("--hf", help="the merged export (transformers folder) to compare logits and tokens with")
    parser.add_argument("--families", action="store_true", help="check every tiny family (see the docstring)")
    parser.add_argument("--formats", default="gguf-f16,gguf-q8_0,gguf-q4_0")
    parser.add_argument("--only", help="comma-separated families or case labels for --families")
    parser.add_argument("--llama-site", help="site-packages holding llama_cpp (appended to sys.path)")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    if args.llama_site:
        sys.path.append(args.llama_site)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print(INSTALL)
        return 0
    if args.families:
        return families(args.formats.split(","), set(args.only.split(",")) if args.only else None)
    if not args.gguf or not Path(args.gguf).is_file():
        print("give an exported model.gguf (or --families)")
        return 1
    return single(Path(args.gguf), args.hf, args.tokens)


if __name__ == "__main__":
    sys.exit(main())
