"""GGUF tokenizers: llama.cpp's pre-tokenizer names (by hash or structure) and SentencePiece-style vocabularies.

The tiny models all carry the bundled byte-level BPE tokenizer (GPT-2 regex). The other shapes we
meet in real models are built here: the bundled vocabulary re-wrapped with Llama 3's, Qwen2's and
SmolLM's pre-tokenizers, and a small SentencePiece-style BPE (byte fallback, "▁" for spaces, merges
derived from scores the way transformers converts a tokenizer.model) in the legacy-Llama, Gemma and
Metaspace forms. Each is written into a GGUF and read back by transformers' GGUF tokenizer reader,
which must encode the prompts and test texts to the same ids.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from backend.core.errors import JobError
from tests.families import BUNDLED, tiny_config

torch.set_num_threads(1)
TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
CORPUS = ("the sea is wide and the river is long; stone light river. what is the capital of france? "
          "reverse the order of these words. how many words are there? answer with a number: one two three "
          "four. write one short sentence about the sea. numbers 3 33 333 and 3.14 are here.")


def bundled():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED)


def rewrap(pre_tokenizer: dict[str, Any], normalizer: dict[str, Any] | None = None, ignore_merges: bool = False):
    """The bundled vocabulary and merges behind another pre-tokenizer (the shape of another family's tokenizer.json)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    original = bundled()
    spec = json.loads(original.backend_tokenizer.to_str())
    spec["pre_tokenizer"], spec["normalizer"] = pre_tokenizer, normalizer
    spec["model"]["ignore_merges"] = ignore_merges
    wrapped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                      bos_token=original.bos_token, eos_token=original.eos_token,
                                      pad_token=original.pad_token, unk_token=original.unk_token)
    wrapped.chat_template = original.chat_template
    return wrapped


def byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def split(pattern: str) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, byte_level(False)]}


def sentencepiece(kind: str, merges: int = 160):
    """A SentencePiece-style BPE: <unk> <s> </s>, 256 byte tokens, characters, then merged pieces by score."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import generate_merges

    words = [("▁" + w) for w in CORPUS.split()]
    pieces = [list(w) for w in words]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for char in sorted({c for w in words for c in w}):
        vocab[char] = len(vocab)
    scores = {token: 0.0 for token in vocab}
    for rank in range(merges):  # greedy BPE on the corpus: the most frequent adjacent pair, merged
        pairs = Counter((a, b) for w in pieces for a, b in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        vocab[a + b], scores[a + b] = len(vocab), -float(rank + 1)
        for w in pieces:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == (a, b):
                    w[i:i + 2] = [a + b]
                i += 1
    for special in ("[INST]", "[/INST]"):
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=generate_merges(vocab, scores), byte_fallback=True,
                               unk_token="<unk>", fuse_unk=True))
    replace = normalizers.Replace(" ", "▁")
    if kind == "legacy":  # Llama 2, TinyLlama, Phi-3: a space prepended to the text
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace])
    elif kind == "gemma":  # no space prepended; transformers 5's GemmaTokenizer adds the (inert) Split
        tok.normalizer = replace
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:  # transformers 5's LlamaTokenizer form, whatever the checkpoint's tokenizer.json says
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>", "[INST]", "[/INST]")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                      pad_token="</s>")
    wrapped.chat_template = TEMPLATE
    return wrapped


def export(tokenizer: Any, tmp_path: Path, family: str = "llama") -> tuple[Path, Any]:
    from transformers import AutoModelForCausalLM

    from backend.export.gguf_writer import GgufExport
    from backend.export.tensor_source import StateDictSource

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family))
    export = GgufExport(StateDictSource(model), tokenizer, "gguf-q8_0", "tiny")
    export.write(tmp_path / "model.gguf")
    return tmp_path / "model.gguf", export.meta


def test_llama_cpp_test_text_is_copied_exactly():
    from backend.export.gguf_pretokenizer import CHKTXT

    # sha256 of convert_hf_to_gguf.py's chktxt, computed from llama.cpp's source when this was written
    assert hashlib.sha256(CHKTXT.encode()).hexdigest() == \
        "a36179c1e2b1cfcfbfad1dc779addad2ffc778201e4cf0d538bddeafa2c526da"


@pytest.mark.parametrize("make, name", [
    (lambda: bundled(), "gpt-2"),
    (lambda: rewrap(split(__import__("backend.export.gguf_pretokenizer", fromlist=["x"]).LLAMA3_SPLIT),
                    ignore_merges=True), "llama-bpe"),
    (lambda: rewrap(split(__import__("backend.export.gguf_pretokenizer", fromlist=["x"]).LLAMA3_SPLIT)), "dbrx"),
    (lambda: rewrap(split(__import__("backend.export.gguf_pretokenizer", fromlist=["x"]).QWEN2_SPLIT),
                    normalizer={"type": "NFC"}), "qwen2"),
    (lambda: rewrap({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                           byte_level(True)]}), "smollm"),
])
def test_byte_level_pre_tokenizer_named_by_structure_and_read_back_identically(make, name, tmp_path):
    from backend.export.gguf_check import tokenizer_check

    tokenizer = make()
    path, meta = export(tokenizer, tmp_path)
    assert (meta.model, meta.pre) == ("gpt2", name) and meta.identified.startswith("by structure")
    check = tokenizer_check(path, tokenizer)
    assert check["passed"] and check["verified"] and check["measured"] == "identical", check
    if name == "smollm":  # why digits are left out: transformers' reader splits "333" as GPT-2 does
        from transformers import AutoTokenizer

        rebuilt = AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")
        assert "digits left out" in check["what"]
        assert tokenizer("a 333 b", add_special_tokens=False)["input_ids"] != \
            rebuilt("a 333 b", add_special_tokens=False)["input_ids"]


def test_known_hash_names_the_tokenizer_and_unknown_shapes_are_refused(monkeypatch):
    from backend.export import gguf_pretokenizer as pre

    tokenizer = bundled()
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    digest = hashlib.sha256(str(tokenizer.encode(pre.CHKTXT)).encode()).hexdigest()
    assert pre.chkhsh(tokenizer) == digest and digest not in pre.KNOWN_HASHES
    monkeypatch.setitem(pre.KNOWN_HASHES, digest, ("llama-bpe", "a model llama.cpp lists"))
    assert pre.pre_tokenizer_name(tokenizer, spec) == ("llama-bpe", "by llama.cpp's tokenizer hash (the a model "
                                                       "llama.cpp lists tokenizer)")
    monkeypatch.delitem(pre.KNOWN_HASHES, digest)
    with pytest.raises(JobError) as caught:
        pre.pre_tokenizer_name(tokenizer, {**spec, "pre_tokenizer": {"type": "Whitespace"}})
    assert "pre-tokenizer (Whitespace) is not one of gpt-2" in caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize("kind, family, prefix", [("legacy", "llama", True), ("gemma", "gemma2", False),
                                                  ("metaspace", "llama", False)])
def test_sentencepiece_style_tokenizer_is_written_as_llama_with_scores(kind, family, prefix, tmp_path):
    import gguf

    from backend.export.gguf_check import tokenizer_check

    tokenizer = sentencepiece(kind)
    path, meta = export(tokenizer, tmp_path, family)
    reader = gguf.GGUFReader(path)
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert (field("tokenizer.ggml.model"), field("tokenizer.ggml.pre")) == ("llama", "default")
    assert field("tokenizer.ggml.add_space_prefix") is prefix
    types, scores, tokens = field("tokenizer.ggml.token_type"), field("tokenizer.ggml.scores"), field("tokenizer.ggml.tokens")
    assert types[:3] == [2, 3, 3] and set(types[3:259]) == {6} and tokens[3 + 0x41] == "<0x41>"  # UNKNOWN, CONTROL, BYTE
    vocab = tokenizer.get_vocab()
    assert scores[vocab["▁the"]] > scores[vocab["▁sea"]] > -1000  # merged early, higher score
    check = tokenizer_check(path, tokenizer)
    assert check["passed"] and check["verified"], check


@pytest.mark.parametrize("kind, cls, family", [("legacy", "LlamaTokenizer", "llama"), ("gemma", "GemmaTokenizer", "gemma2")])
def test_sentencepiece_tokenizers_as_transformers_5_loads_them(kind, cls, family, tmp_path):
    """A run loads its tokenizer through the model's class, which rebuilds the pipeline (LlamaTokenizer: Metaspace
    "first" even for a legacy tokenizer.json; GemmaTokenizer: Replace plus an inert Split): both are written."""
    from transformers import AutoTokenizer

    from backend.export.gguf_check import tokenizer_check

    sentencepiece(kind).save_pretrained(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": cls}))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert type(tokenizer).__name__ == cls
    path, meta = export(tokenizer, tmp_path, family)
    assert (meta.model, meta.add_space_prefix) == ("llama", False)
    assert tokenizer_check(path, tokenizer)["passed"]
