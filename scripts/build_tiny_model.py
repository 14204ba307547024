"""Build and pre-train the bundled default model, `resources/tiny/` (`bundled:tiny`).

Why a model of our own: the studio must run a whole fine-tune out of the box, offline, on a laptop
CPU in about a minute, and ship weights whose licence we control. No hub download is possible, so
this script makes everything from text that is committed to the repository:

1. Corpus: `resources/corpus/python-docs-3.11.txt`, the prose paragraphs of the CPython 3.11
   documentation (PSF License Agreement; see resources/corpus/LICENSE-PSF.txt). It was extracted by
   `--extract-corpus` from the Debian package `python3.11-doc` (`apt-get install python3.11-doc`,
   reST sources under /usr/share/doc/python3.11/html/_sources); committing the extract keeps the
   build identical on machines whose Debian ships another Python.
2. Tokenizer: byte-level BPE (GPT-2 pre-tokenizer and decoder, so a GGUF export can declare
   `tokenizer.ggml.pre = "gpt2"`), 4096 tokens, with chat special tokens and a chat template.
3. Model: a 4-layer Llama (`LlamaForCausalLM`) with grouped-query attention, every dimension a
   multiple of 32 (quantisation block sizes), tied input/output embeddings so float32 fits in 20 MB.
4. Pre-training: plain torch loop, one CPU thread (the build shares the machine), a fixed number of
   steps (not a wall-clock budget, so reruns give the same weights), then samples and losses.

Run: `python scripts/build_tiny_model.py` (12 minutes on one thread of an idle 2-core machine, about
20 when other jobs share it). `--out DIR` writes elsewhere; `--steps N` makes a quick smoke build.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "resources" / "corpus" / "python-docs-3.11.txt"
OUT = ROOT / "resources" / "tiny"
DEBIAN_DOC_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
SEED = 1234

# ---------------------------------------------------------------------------------------------
# Tokens and chat template
# ---------------------------------------------------------------------------------------------
PAD, BOS, END = "<|pad|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
# Order fixes the ids: pad=0, bos=1, end=2 (the eos: it closes every chat turn and every document).
SPECIAL_TOKENS = [PAD, BOS, END, *ROLE_TOKENS]
VOCAB_SIZE = 4096

# One message is `<|role|>\n{content}<|end|>\n`. The literal text between special tokens never
# depends on what follows it, so rendering messages[:k] yields a token prefix of the whole render:
# the trainer masks prompts by diffing such prefix renders. `<|end|>` is the eos, so generation
# stops at the end of the assistant's turn.
CHAT_TEMPLATE = r"""{{- bos_token -}}
{%- for message in messages -%}
    {%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}
        {{- raise_exception('Unsupported role: ' + message['role'] + ' (use system, user, assistant or tool)') -}}
    {%- endif -%}
    {%- if message['content'] is string -%}
        {%- set content = message['content'] -%}
    {%- elif message['content'] is none -%}
        {%- set content = '' -%}
    {%- else -%}
        {%- set content = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') -%}
    {%- endif -%}
    {{- '<|' + message['role'] + '|>\n' + content + '<|end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>\n' -}}
{%- endif -%}"""

# ---------------------------------------------------------------------------------------------
# Model and training budget
# ---------------------------------------------------------------------------------------------
MODEL_DIMS = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,  # head_dim 64
    num_key_value_heads=2,  # grouped-query attention: k/v projections are 256 -> 128
    max_position_embeddings=1024,
)
SEQ_LEN = 256  # training context; RoPE still positions up to max_position_embeddings
BATCH = 8
STEPS = 800
PEAK_LR = 3e-3
WARMUP = 40
MIN_LR_RATIO = 0.1
HELD_OUT_EVERY = 20  # every 20th document of the corpus is held out for the held-out loss
SAMPLE_PROMPTS = ["The function", "In Python, a list", "This module provides", "If the file"]
MAX_FOLDER_BYTES = 20 * 1024 * 1024

# ---------------------------------------------------------------------------------------------
# 1. Corpus: prose paragraphs from the CPython documentation's reST sources
# ---------------------------------------------------------------------------------------------
DOC_SECTIONS = ("tutorial", "howto", "faq", "glossary.rst.txt", "reference", "library", "using",
                "extending", "installing")
_ROLE = re.compile(r":[a-zA-Z0-9_:+-]+:`([^`]*)`")
_LITERAL = re.compile(r"``([^`]*)``")
_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_{1,2}")
_REF = re.compile(r"`([^`]+)`_{1,2}")
_SUBST = re.compile(r"\|([^|\s][^|]*)\|_?")
_STRONG = re.compile(r"\*\*([^*]+)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")
_HEADING = re.compile(r"^([=\-~^*#+\"'`:.])\1{2,}\s*$")
# Directives whose indented body is code, tables or links rather than prose.
_SKIP_BODY = {"code-block", "code", "sourcecode", "doctest", "testcode", "testoutput", "testsetup",
              "testcleanup", "productionlist", "index", "toctree", "highlight", "literalinclude",
              "include", "csv-table", "list-table", "table", "raw", "image", "figure", "math", "only",
              "moduleauthor", "sectionauthor", "audit-event", "availability", "seealso", "rubric",
              "tabularcolumns", "opcode", "impl-detail", "program", "cmdoption", "option", "envvar",
              "describe", "currentmodule", "module", "autoclass", "pdbcommand", "versionadded",
              "versionchanged", "deprecated", "deprecated-removed"}


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    titled = re.match(r"(.*?)\s*<[^>]*>$", text, re.S)
    if titled:
        text = titled.group(1)
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return text.lstrip("!")


def _inline(text: str) -> str:
    """Strip reST inline markup (roles, literals, links, emphasis), keeping the words."""
    for pattern, repl in ((_ROLE, _role_text), (_LITERAL, r"\1"), (_LINK, r"\1"), (_REF, r"\1"),
                          (_SUBST, r"\1"), (_STRONG, r"\1"), (_EMPH, r"\1")):
        text = pattern.sub(repl, text)
    text = text.replace("\\ ", "").replace("\\", "")
    text = re.sub(r"::$", ":", text)
    return re.sub(r"\s+", " ", text).strip()


def prose_paragraphs(rst: str) -> list[str]:
    """Keep the prose paragraphs of one reST file; drop code, tables, headings and directives.

    A tiny model learns English faster from sentences than from markup, so anything that does not
    look like a sentence (few words, few letters, no closing punctuation) is left out.
    """
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in rst.expandtabs(8).splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    kept: list[str] = []
    skip_deeper_than: int | None = None
    for block in blocks:
        indent = len(block[0]) - len(block[0].lstrip(" "))
        if skip_deeper_than is not None:
            if indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        first = block[0].strip()
        if first.startswith(".."):
            directive = re.match(r"\.\.\s+([\w:-]+)::", first)
            if not directive or directive.group(1) in _SKIP_BODY:
                skip_deeper_than = indent  # a comment, or a body that is not prose
            continue  # a prose directive (function, class, note...): drop its signature, keep its body
        if any(_HEADING.match(line.strip()) for line in block):
            continue
        if block[-1].endswith("::"):
            skip_deeper_than = indent  # the indented blocks that follow are a literal (code) block
        text = _inline(" ".join(line.strip() for line in block))
        if first.startswith((">>>", "$", "|", "+-", "=", "%", "#", "{", "}")):
            continue
        if len(text.split()) < 8 or text[-1] not in ".:?!)":
            continue
        if sum(c.isalpha() or c == " " for c in text) / len(text) < 0.85:
            continue
        kept.append(re.sub(r"^([-*+]|\d+\.|#\.)\s+", "", text))
    return kept


def extract_corpus(sources: Path, target: Path) -> None:
    """Write one document per reST file (paragraphs on lines, documents split by a blank line)."""
    if not sources.is_dir():
        sys.exit(f"{sources} not found: run `apt-get install python3.11-doc` (Debian) first")
    documents: list[str] = []
    for section in DOC_SECTIONS:
        path = sources / section
        for file in [path] if path.is_file() else sorted(path.rglob("*.rst.txt")):
            paragraphs = prose_paragraphs(file.read_text(encoding="utf-8"))
            if paragraphs:
                documents.append("\n".join(paragraphs))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size:,} bytes, {len(documents)} documents)")


def read_documents(corpus: Path) -> tuple[list[str], list[str]]:
    """-> (train documents, held-out documents): every HELD_OUT_EVERY-th document is held out."""
    documents = [d for d in corpus.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    held_out = [d for i, d in enumerate(documents) if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2]
    train = [d for i, d in enumerate(documents) if i % HELD_OUT_EVERY != HELD_OUT_EVERY // 2]
    return train, held_out


# ---------------------------------------------------------------------------------------------
# 2. Tokenizer
# ---------------------------------------------------------------------------------------------
def train_tokenizer(documents: list[str]):  # -> PreTrainedTokenizerFast
    """Byte-level BPE trained on the training documents, wrapped for transformers.

    `tokenizer(text)` prepends `<|bos|>` (post-processor, like Llama); the chat template writes
    `<|bos|>` itself and the trainer tokenizes its renders with add_special_tokens=False.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((p for d in documents for p in d.split("\n")), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]),
    ])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=MODEL_DIMS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def check_tokenizer(tokenizer) -> None:
    """The promises the trainer and the GGUF export rely on; fail the build if one breaks."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert list(ids.values()) == list(range(len(SPECIAL_TOKENS))), ids
    assert tokenizer.eos_token_id == ids[END] and tokenizer.pad_token_id != tokenizer.eos_token_id
    text = "Return the value of x.\n  It works  (twice)!"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer(text)["input_ids"][0] == ids[BOS]
    # Leading spaces and newlines in contents are where a careless template breaks the prefix rule.
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Reverse the words.\n\nred green blue"},
        {"role": "assistant", "content": "blue green red"},
        {"role": "tool", "content": " {\"ok\": true}"},
        {"role": "user", "content": "\nAgain?"},
        {"role": "assistant", "content": " Yes."},
    ]
    full = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert full.startswith(BOS + "<|system|>\nYou are terse.<|end|>\n<|user|>\n"), full
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert full_ids.count(ids[BOS]) == 1
    for k in range(1, len(conversation) + 1):
        for generation_prompt in (False, True):
            if generation_prompt and (k == len(conversation) or conversation[k]["role"] != "assistant"):
                continue  # a generation prompt only prefixes an assistant turn
            prefix = tokenizer.apply_chat_template(conversation[:k], tokenize=False,
                                                   add_generation_prompt=generation_prompt)
            assert full.startswith(prefix), (k, prefix)
            prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
            assert full_ids[: len(prefix_ids)] == prefix_ids, f"render of messages[:{k}] is not a token prefix"
    # The assistant's turn ends with the eos token, so generation stops there.
    answer = tokenizer.apply_chat_template(conversation[:3], tokenize=False)
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert answer_ids[-2] == tokenizer.eos_token_id and tokenizer.decode(answer_ids[-1:]) == "\n"


# ---------------------------------------------------------------------------------------------
# 3./4. Model and pre-training
# ---------------------------------------------------------------------------------------------
def pack(tokenizer, documents: list[str]) -> torch.Tensor:
    """Documents as `<|bos|> text <|end|>`, concatenated and cut into SEQ_LEN blocks."""
    stream: list[int] = []
    for document in documents:
        stream += tokenizer(document, verbose=False)["input_ids"] + [tokenizer.eos_token_id]
    n = len(stream) // SEQ_LEN
    return torch.tensor(stream[: n * SEQ_LEN], dtype=torch.long).view(n, SEQ_LEN)


def lr_at(step: int, steps: int) -> float:
    """Linear warmup, then cosine decay to MIN_LR_RATIO of the peak."""
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def mean_loss(model, blocks: torch.Tensor, limit: int = 64) -> float:
    model.eval()
    device = next(model.parameters()).device
    losses = [model(input_ids=blocks[i: i + BATCH].to(device), labels=blocks[i: i + BATCH].to(device)).loss.item()
              for i in range(0, min(limit, len(blocks)), BATCH)]
    model.train()
    return sum(losses) / len(losses)


def pretrain(model, train_blocks: torch.Tensor, held_blocks: torch.Tensor, steps: int = STEPS,
             log_every: int = 50, device: str = "cpu") -> dict:
    """AdamW over shuffled packed blocks for `steps` steps; returns the figures for the README."""
    generator = torch.Generator().manual_seed(SEED)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=PEAK_LR, betas=(0.9, 0.95))
    order = torch.randperm(len(train_blocks), generator=generator)
    cursor = 0
    began = time.monotonic()
    recent: list[float] = []
    model.train()
    for step in range(steps):
        if cursor + BATCH > len(order):
            order, cursor = torch.randperm(len(train_blocks), generator=generator), 0
        batch = train_blocks[order[cursor: cursor + BATCH]].to(device)
        cursor += BATCH
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent.append(loss.item())
        if (step + 1) % log_every == 0 or step == 0:
            print(f"step {step + 1:4d}/{steps}  loss {sum(recent) / len(recent):.3f}  "
                  f"lr {lr_at(step, steps):.2e}  {time.monotonic() - began:6.0f}s", flush=True)
            recent = []
    seconds = time.monotonic() - began
    return {
        "train_seconds": round(seconds),
        "train_tokens": steps * BATCH * SEQ_LEN,
        "epochs": round(steps * BATCH / len(train_blocks), 2),
        "train_loss": round(mean_loss(model, train_blocks[torch.randperm(len(train_blocks), generator=generator)]), 3),
        "held_out_loss": round(mean_loss(model, held_blocks), 3),
    }


def samples(model, tokenizer) -> list[str]:
    """Greedy continuations (with a repetition penalty) of a few prompts, to eyeball the result."""
    model.eval()
    texts = []
    for prompt in SAMPLE_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=40, do_sample=False, repetition_penalty=1.3,
                             pad_token_id=tokenizer.pad_token_id)
        texts.append(tokenizer.decode(out[0], skip_special_tokens=True))
    return texts


def portable_tokenizer_config(folder: Path) -> None:
    """Name the class every transformers release knows (v5 writes its own alias, TokenizersBackend)
    and keep the template inline too, for tools that read only tokenizer_config.json."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["add_bos_token"] = True
    config["add_eos_token"] = False
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extract-corpus", action="store_true",
                        help=f"rebuild {CORPUS.relative_to(ROOT)} from {DEBIAN_DOC_SOURCES} (python3.11-doc) first")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--steps", type=int, default=STEPS, help="pre-training steps (fewer for a smoke test)")
    parser.add_argument("--device", default="cpu",
                        help="cpu builds the bundled weights; cuda is only for trying variants fast")
    args = parser.parse_args()

    began = time.monotonic()
    torch.set_num_threads(1)  # the build shares the cores with whatever else runs here
    random.seed(SEED)
    torch.manual_seed(SEED)
    if args.extract_corpus:
        extract_corpus(DEBIAN_DOC_SOURCES, CORPUS)

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    train_docs, held_docs = read_documents(CORPUS)
    tokenizer = train_tokenizer(train_docs)
    check_tokenizer(tokenizer)
    train_blocks, held_blocks = pack(tokenizer, train_docs), pack(tokenizer, held_docs)
    print(f"corpus: {len(train_docs)} train / {len(held_docs)} held-out documents, "
          f"{train_blocks.numel():,} / {held_blocks.numel():,} tokens")

    config = LlamaConfig(
        **MODEL_DIMS,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters")

    model.to(args.device)
    figures = pretrain(model, train_blocks, held_blocks, steps=args.steps, device=args.device)
    model.to("cpu")
    texts = samples(model, tokenizer)

    if args.out.exists():
        shutil.rmtree(args.out)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    portable_tokenizer_config(args.out)
    for file in args.out.iterdir():
        file.chmod(0o644)  # safetensors writes 0600; the bundle is read by whoever runs the studio
    size = folder_bytes(args.out)
    assert size <= MAX_FOLDER_BYTES, f"{args.out} is {size:,} bytes, over the 20 MB budget"
    report = {
        "parameters": params,
        "folder_bytes": size,
        **figures,
        "build_seconds": round(time.monotonic() - began),
        "samples": texts,
        "torch": torch.__version__,
    }
    print(json.dumps(report, indent=2))  # timings vary, so this goes to the log, not into the folder


if __name__ == "__main__":
    main()
