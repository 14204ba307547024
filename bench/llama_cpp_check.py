"""Opt-in: does llama.cpp itself load an exported GGUF and generate from it?

The export's own check reads the GGUF back with gguf-py and transformers (llama.cpp is not part of
CI). This script closes the loop where llama-cpp-python is installed: it loads the file, tokenizes a
chat prompt with the GGUF's own tokenizer and chat template, generates a few tokens, and compares
llama.cpp's tokenization of the prompt with the run's transformers tokenizer when a tokenizer folder
is given. Without llama_cpp it prints how to install it and exits 0 (nothing to check).

    python bench/llama_cpp_check.py RUN_DIR/exports/gguf-q8_0/model.gguf
    python bench/llama_cpp_check.py model.gguf --tokenizer RUN_DIR/adapter --tokens 16
    python bench/llama_cpp_check.py            # the newest exported GGUF under FINETUNE_STUDIO_HOME
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
INSTALL = (
    "llama-cpp-python is not installed. To run this check, build it for a generic CPU (about 10 minutes):\n"
    '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF" pip install llama-cpp-python\n'
    "then run this script again."
)


def newest_gguf() -> Path | None:
    from backend.paths import runs_dir

    found = sorted(runs_dir().glob("*/exports/gguf-*/model.gguf"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", help="an exported model.gguf (default: the newest one)")
    parser.add_argument("--tokenizer", help="a Hugging Face tokenizer folder to compare tokenization with")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    if importlib.util.find_spec("llama_cpp") is None:
        print(INSTALL)
        return 0
    path = Path(args.gguf) if args.gguf else newest_gguf()
    if path is None or not path.is_file():
        print("no GGUF given and none found; export one first: finetune-studio export RUN_DIR --format gguf-q8_0")
        return 1
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_threads=1, verbose=False)
    template = llm.metadata.get("tokenizer.chat_template", "")
    print(f"loaded {path} ({path.stat().st_size / 1e6:.1f} MB); chat template in metadata: {bool(template)}")
    messages = [{"role": "user", "content": "Reverse the order of these words: river stone light"}]
    reply = llm.create_chat_completion(messages=messages, max_tokens=args.tokens, temperature=0.0)
    text = reply["choices"][0]["message"]["content"]
    print(f"generated {reply['usage']['completion_tokens']} tokens: {text!r}")
    ok = reply["usage"]["completion_tokens"] > 0
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        theirs = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        ours = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        same = list(theirs) == list(ours)
        print(f"prompt tokenization, llama.cpp vs transformers: {'identical' if same else 'DIFFERENT'}"
              f" ({len(theirs)} vs {len(ours)} tokens)")
        ok = ok and same
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
