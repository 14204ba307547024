"""Which llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) a byte-level BPE tokenizer needs.

llama.cpp splits text with a regex chosen by name before applying the merges, and its converter
(convert_hf_to_gguf.py, get_vocab_base_pre) finds the name by tokenizing a fixed test text and
hashing the token ids: a hash it knows names the tokenizer exactly. We do the same for the
tokenizers of the families we write (the hashes below are llama.cpp's, for those models). A
tokenizer it does not know by hash (a custom vocabulary, like the bundled model's) is matched by the
structure of its tokenizer.json instead: the pre-tokenizer, the normalizer and the BPE options must
be exactly what llama.cpp implements under that name. Anything else is refused in one line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from backend.core.errors import bad_input

CHKTXT = (
    '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d'
    '\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33'
    '333 333333 3333333 33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7'
    '\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151'
    '\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433'
    '\u0430\u0440\u0441\u043a\u0438 \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told h'
    'e\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'
)
"""llama.cpp's test text (convert_hf_to_gguf.py `chktxt`): whitespace runs, digits, emoji, scripts, contractions."""

KNOWN_HASHES: dict[str, tuple[str, str]] = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": ("llama-bpe", "meta-llama/Meta-Llama-3-8B"),
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": ("smaug-bpe", "abacusai/Smaug-Llama-3-70B-Instruct"),
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": ("qwen2", "Qwen/Qwen1.5-7B"),
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": ("qwen2", "Qwen/Qwen3-Embedding-0.6B"),
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": ("deepseek-r1-qwen",
                                                                         "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"),
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": ("smollm", "HuggingFaceTB/SmolLM-135M"),
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": ("gpt-2", "openai-community/gpt2"),
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": ("mpt", "mosaicml/mpt-7b (GPT-NeoX-20B vocabulary)"),
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": ("phi-2", "microsoft/phi-2"),
}
"""convert_hf_to_gguf.py's hash -> (pre-tokenizer name, the model it was computed on), for our families."""

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(step: Any, use_regex: bool) -> bool:
    return (isinstance(step, dict) and step.get("type") == "ByteLevel" and not step.get("add_prefix_space", False)
            and bool(step.get("use_regex", True)) == use_regex)


def _split(step: Any, pattern: str) -> bool:
    return (isinstance(step, dict) and step.get("type") == "Split" and step.get("pattern") == {"Regex": pattern}
            and step.get("behavior") == "Isolated" and not step.get("invert", False))


def _steps(pre: Any) -> list[Any]:
    if isinstance(pre, dict) and pre.get("type") == "Sequence":
        return list(pre.get("pretokenizers") or [])
    return [pre] if pre else []


@dataclass(frozen=True)
class PreTokenizer:
    name: str
    what: str
    steps: tuple[str, ...]  # "gpt2-bytes" | "bytes" | "digits" | "split:<pattern>"
    ignore_merges: bool = False
    normalizers: tuple[str | None, ...] = (None,)

    def matches(self, spec: dict[str, Any]) -> bool:
        steps = _steps(spec.get("pre_tokenizer"))
        if len(steps) != len(self.steps):
            return False
        for step, want in zip(steps, self.steps):
            ok = (_byte_level(step, True) if want == "gpt2-bytes" else _byte_level(step, False) if want == "bytes"
                  else (isinstance(step, dict) and step.get("type") == "Digits" and step.get("individual_digits"))
                  if want == "digits" else _split(step, want.split(":", 1)[1]))
            if not ok:
                return False
        normalizer = (spec.get("normalizer") or {}).get("type")
        model = spec.get("model") or {}
        return (normalizer in self.normalizers and bool(model.get("ignore_merges", False)) == self.ignore_merges
                and not model.get("byte_fallback") and not model.get("continuing_subword_prefix")
                and not model.get("end_of_word_suffix"))


STRUCTURES = (
    PreTokenizer("gpt-2", "GPT-2's regex inside ByteLevel (GPT-2, GPT-NeoX, the bundled model)", ("gpt2-bytes",),
                 normalizers=(None, "NFC")),
    PreTokenizer("smollm", "single digits, then GPT-2's regex (SmolLM)", ("digits", "gpt2-bytes")),
    PreTokenizer("llama-bpe", "Llama 3's regex split, then bytes, merges ignored for whole words",
                 (f"split:{LLAMA3_SPLIT}", "bytes"), ignore_merges=True),
    PreTokenizer("dbrx", "Llama 3's (cl100k's) regex split, then bytes, merges always applied (DBRX, Phi-4)",
                 (f"split:{LLAMA3_SPLIT}", "bytes")),
    PreTokenizer("qwen2", "Qwen2's regex split (single digits), then bytes", (f"split:{QWEN2_SPLIT}", "bytes"),
                 normalizers=(None, "NFC")),
)
"""Pre-tokenizers recognised by structure: tokenizer.json shapes that are exactly llama.cpp's regexes.
An NFC normalizer is accepted where llama.cpp's own converter accepts it by hash (Qwen; GPT-NeoX-20B's
vocabulary): llama.cpp does not normalize, so only decomposed Unicode input can tokenize differently."""


def chkhsh(tokenizer: Any) -> str:
    """convert_hf_to_gguf.py's identifier: sha256 of str(token ids of CHKTXT, special tokens included)."""
    return hashlib.sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest()


def pre_tokenizer_name(tokenizer: Any, spec: dict[str, Any]) -> tuple[str, str]:
    """(llama.cpp pre-tokenizer name, how it was identified), or a one-line refusal."""
    digest = chkhsh(tokenizer)
    if digest in KNOWN_HASHES:
        name, model = KNOWN_HASHES[digest]
        return name, f"by llama.cpp's tokenizer hash (the {model} tokenizer)"
    for known in STRUCTURES:
        if known.matches(spec):
            return known.name, f"by structure: {known.what}"
    pre = spec.get("pre_tokenizer") or {}
    seen = "+".join(str(step.get("type")) for step in _steps(pre)) or "none"
    names = ", ".join(f"{s.name} ({s.what})" for s in STRUCTURES)
    raise bad_input(f"GGUF export cannot name this byte-level BPE tokenizer's pre-tokenizer for llama.cpp: its hash "
                    f"{digest[:12]}… is not one llama.cpp lists for our families and its pre-tokenizer ({seen}) is not "
                    f"one of {names}", "export merged, bnb-8bit or bnb-4bit instead")
