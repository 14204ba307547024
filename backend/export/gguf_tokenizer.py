"""The run's tokenizer as llama.cpp's GGUF metadata: byte-level BPE ("gpt2") or SentencePiece-style ("llama").

Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM, GPT-NeoX, the bundled model): the token list with
special tokens as CONTROL, the merges, and the pre-tokenizer name (gguf_pretokenizer). Special
and added tokens follow convert_hf_to_gguf.py's get_vocab_base.

SentencePiece-style BPE (Llama 2, Mistral, TinyLlama, Gemma, Phi-3: a tokenizer.json BPE with byte
fallback and "▁" for spaces) goes in as llama.cpp's "llama" model, which needs a score per token:
it repeatedly merges the adjacent pair whose concatenation is a token with the highest score. A
tokenizer.json has no scores but lists its merges in priority order (transformers' converter sorted
them by the SentencePiece score of the merged piece), so a token's score is minus the rank (from 1) of
the first merge that produces it; byte tokens (<0x41>) are BYTE, added tokens score -1000 as the
converter writes them. Whether a space is prepended (`add_space_prefix`) is read off the normalizer
or the Metaspace pre-tokenizer; llama.cpp then prepends it at the start and after every special token,
like a Prepend normalizer. Metaspace's "first" (what transformers 5's LlamaTokenizer builds for Llama 2,
Mistral, TinyLlama and Phi-3, whatever their tokenizer.json says) prepends at the start only, which llama.cpp cannot do: it is written as no prefix, so chat-rendered prompts (they
start with a special token) tokenize exactly and only a raw prompt's first word differs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from backend.core.errors import bad_input
from backend.export.gguf_pretokenizer import pre_tokenizer_name

SPACE = "\u2581"
BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType


@dataclass
class TokenizerMetadata:
    model: str  # llama.cpp tokenizer model: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    pre: str
    identified: str  # how the pre-tokenizer was identified, in words
    tokens: list[str]
    types: list[int]
    merges: list[str] | None
    scores: list[float] | None
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | None

    def write(self, writer: Any) -> None:
        writer.add_tokenizer_model(self.model)
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        writer.add_token_types(self.types)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        for kind, token_id in self.special_ids.items():
            getattr(writer, f"add_{kind}_token_id")(token_id)
        writer.add_add_bos_token(self.add_bos)
        writer.add_add_eos_token(self.add_eos)
        if self.add_space_prefix is not None:
            writer.add_add_space_prefix(self.add_space_prefix)
        if self.chat_template:
            writer.add_chat_template(self.chat_template)


def looks_special(token: str) -> bool:
    """Added tokens llama.cpp's converter treats as control even when not marked special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<unused") and token.endswith(">")))


def adds_special(tokenizer: Any, kind: str) -> bool:
    """Whether encoding plain text adds BOS (or EOS): observed, since transformers 5 adds it in the
    post-processor and its add_bos_token attribute can say False while BOS is added."""
    token_id = getattr(tokenizer, f"{kind}_token_id", None)
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0 if kind == "bos" else -1] == token_id


def tokenizer_metadata(tokenizer: Any, vocab_size: int) -> TokenizerMetadata:
    """The tokenizer as llama.cpp reads it, or a one-line refusal."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise bad_input("GGUF export needs a fast (tokenizer.json) tokenizer; this model has only a slow one",
                        "export merged instead")
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise bad_input(f"the tokenizer has ids up to {max(vocab.values())} but the model only {vocab_size} embeddings "
                        f"(ids 0..{vocab_size - 1})", "resize the embeddings to the tokenizer, or export merged")
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        meta = _sentencepiece(tokenizer, spec, vocab, vocab_size)
    elif model.get("type") == "BPE":
        meta = _byte_level(tokenizer, spec, vocab, vocab_size)
    else:
        raise bad_input(f"GGUF export writes byte-level BPE and SentencePiece-style BPE tokenizers; this one is a "
                        f"{model.get('type')} model", "export merged, bnb-8bit or bnb-4bit instead")
    return meta


def _specials(tokenizer: Any) -> dict[str, int]:
    special = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "unk", "pad")}
    return {k: int(v) for k, v in special.items() if v is not None}


def _common(tokenizer: Any) -> dict[str, Any]:
    template = getattr(tokenizer, "chat_template", None)
    return dict(special_ids=_specials(tokenizer), add_bos=adds_special(tokenizer, "bos"),
                add_eos=adds_special(tokenizer, "eos"), chat_template=template if isinstance(template, str) else None)


def _byte_level(tokenizer: Any, spec: dict[str, Any], vocab: dict[str, int], vocab_size: int) -> TokenizerMetadata:
    pre, identified = pre_tokenizer_name(tokenizer, spec)
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            token = reverse[i]
            special = added[i].special or looks_special(token)
            tokens.append(token if special else token.replace(SPACE, " "))
            types.append(CONTROL if special else USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(NORMAL)
    merges = []
    for merge in spec["model"].get("merges", []):
        pair = merge if isinstance(merge, list) else merge.split(" ")
        if len(pair) != 2 or any(" " in part for part in pair):
            raise bad_input("the tokenizer has merges containing spaces, which GGUF's merge list cannot hold",
                            "export merged instead")
        merges.append(" ".join(pair))
    return TokenizerMetadata("gpt2", pre, identified, tokens, types, merges, None, add_space_prefix=None,
                             **_common(tokenizer))


def space_prefix(spec: dict[str, Any]) -> bool:
    """Whether this SentencePiece-style tokenizer prepends "▁" to the text, or a refusal."""
    normalizer, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    steps = normalizer.get("normalizers", [normalizer]) if normalizer.get("type") == "Sequence" else [normalizer]
    kinds = [s.get("type") for s in steps if s]
    replaces = any(s.get("type") == "Replace" and s.get("pattern") == {"String": " "} and s.get("content") == SPACE
                   for s in steps if s)
    # transformers 5's GemmaTokenizer adds Split(" ") after the Replace normalizer: no spaces are left to split on
    inert_split = pre.get("type") == "Split" and pre.get("pattern") == {"String": " "} and not pre.get("invert")
    if replaces and (not pre or inert_split) and set(kinds) <= {"Prepend", "Replace"}:
        return any(s.get("type") == "Prepend" and s.get("prepend") == SPACE for s in steps if s)
    if not kinds and pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE and not pre.get("split", True):
        # "first" prepends only at the very start of the text; llama.cpp prepends at the start and after
        # every special token, or nowhere. Nowhere keeps chat prompts (which start with a special token) exact.
        return pre.get("prepend_scheme", "always") == "always"
    raise bad_input(f"GGUF export writes SentencePiece-style tokenizers whose spaces become '▁' by a Replace "
                    f"normalizer or an unsplit Metaspace pre-tokenizer; this one has normalizer {kinds or None} and "
                    f"pre-tokenizer {pre.get('type')}", "export merged, bnb-8bit or bnb-4bit instead")


def merge_scores(merges: list[Any]) -> dict[str, float]:
    """Each merged token's score: minus the rank of the first merge producing it (higher merges first)."""
    scores: dict[str, float] = {}
    for rank, merge in enumerate(merges):
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        scores.setdefault(left + right, -float(rank + 1))
    return scores


def _sentencepiece(tokenizer: Any, spec: dict[str, Any], vocab: dict[str, int], vocab_size: int) -> TokenizerMetadata:
    prefix = space_prefix(spec)
    scores_of = merge_scores(spec["model"].get("merges", []))
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    unk = getattr(tokenizer, "unk_token_id", None)
    tokens, types, scores = [], [], []
    for i in range(vocab_size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            scores.append(-1000.0)
            continue
        if i == unk:
            kind, score = UNKNOWN, 0.0
        elif i in added and (added[i].special or looks_special(token)):
            kind, score = CONTROL, 0.0
        elif i in added:
            kind, score, token = USER_DEFINED, -1000.0, token.replace(SPACE, " ")
        elif BYTE_TOKEN.match(token):
            kind, score = BYTE, 0.0
        else:
            kind, score = NORMAL, scores_of.get(token, 0.0)
        tokens.append(token)
        types.append(kind)
        scores.append(score)
    return TokenizerMetadata("llama", "default", "SentencePiece-style: no pre-tokenizer regex", tokens, types, None,
                             scores, add_space_prefix=prefix, **_common(tokenizer))
