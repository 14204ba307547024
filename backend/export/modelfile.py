"""The Ollama Modelfile written beside a GGUF: FROM, a TEMPLATE in Go template syntax, stop tokens.

Ollama does not run Jinja, so the chat template is translated. Rather than parse Jinja, the
template is observed: each role is rendered around a marker to find the text before and after its
content, the generation prompt is rendered alone, and the translation is accepted only if that
"wrapper per role" reading reproduces the Jinja output exactly on several probe conversations. The
simple templates this covers (the bundled model's, ChatML, Zephyr-like role tags) become one Go
`range .Messages` with an `if` per role. Anything else gets a Modelfile without TEMPLATE and a note:
llama.cpp still uses the Jinja template stored in the GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MARK = "\x00CONTENT\x00"
ROLES = ("system", "user", "assistant", "tool")
PROBES = (
    [("user", "Hello")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")],
    [("user", "a"), ("assistant", "b"), ("user", "c")],
    [("system", "s"), ("user", "u")],
)


@dataclass
class ChatWrappers:
    head: str  # text before the first message (BOS text is dropped: the runtime adds BOS itself)
    drop_head: bool
    wrappers: dict[str, tuple[str, str]]  # role -> (before content, after content)
    generation: str

    def emulate(self, messages: list[tuple[str, str]]) -> str:
        body = "".join(self.wrappers[r][0] + c + self.wrappers[r][1] for r, c in messages)
        return self.head + body + self.generation

    def go_template(self) -> str:
        branches = []
        for index, (role, (before, after)) in enumerate(self.wrappers.items()):
            keyword = "if" if index == 0 else "else if"
            branches.append(f'{{{{ {keyword} eq .Role "{role}" }}}}{before}{{{{ .Content }}}}{after}')
        head = "" if self.drop_head else self.head
        return head + "{{ range .Messages }}" + "".join(branches) + "{{ end }}{{ end }}" + self.generation


def _render(tokenizer: Any, messages: list[tuple[str, str]], generation: bool) -> str:
    conversation = [{"role": r, "content": c} for r, c in messages]
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=generation)


def infer_wrappers(tokenizer: Any) -> tuple[ChatWrappers | None, str]:
    """(wrappers, "") when the template is a wrapper per role, else (None, why not)."""
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None, "the tokenizer has no chat template"
    first, second = MARK, MARK.replace("CONTENT", "SECOND")
    try:
        one = _render(tokenizer, [("user", first)], False)
        two = _render(tokenizer, [("user", first), ("user", second)], False)
        generation = _render(tokenizer, [("user", first)], True)
    except Exception as exc:  # a template that refuses two user turns in a row is not a plain wrapper
        return None, f"the template does not render plain user turns ({type(exc).__name__})"
    if one.count(first) != 1 or not two.startswith(one) or not generation.startswith(one) or two.count(second) != 1:
        return None, "the user turn is not plain text around the message"
    lead, user_after = one.split(first)
    user_before = two[len(one):two.index(second)]
    if not lead.endswith(user_before):
        return None, "the user turn is not the same text every time"
    head = lead[: len(lead) - len(user_before)]
    generation = generation[len(one):]
    wrappers: dict[str, tuple[str, str]] = {}
    for role in ROLES:
        try:
            text = _render(tokenizer, [(role, first)], False)
        except Exception:
            continue  # a role this template refuses on its own
        if not text.startswith(head) or text.count(first) != 1:
            return None, f"the {role} turn is not plain text around the message"
        before, after = text[len(head):].split(first)
        wrappers[role] = (before, after)
    if "user" not in wrappers or "assistant" not in wrappers:
        return None, "the template does not render user and assistant turns"
    bos = getattr(tokenizer, "bos_token", None)
    from backend.export.gguf_writer import adds_special

    drop = bool(bos) and head == bos and adds_special(tokenizer, "bos")
    result = ChatWrappers(head, drop, wrappers, generation)
    for probe in PROBES:
        if any(role not in wrappers for role, _ in probe):
            continue
        if _render(tokenizer, probe, True) != result.emulate(probe):
            return None, "the template does more than wrap each message (it reorders, merges or adds text)"
    pieces = [head, generation] + [p for pair in wrappers.values() for p in pair]
    if any("{{" in p or "}}" in p for p in pieces):
        return None, "the template's text contains {{ or }}, which Go templates would read as code"
    return result, ""


PROJECTOR_NOTE = (
    "# The second FROM is the vision projector (mmproj): Ollama imports a model and its projector as two FROM lines.",
    "# Ollama runs Gemma 3, Qwen2.5-VL and Qwen3-VL in its own engine, which reads the vision tower from one merged",
    "# GGUF and ignores a separate projector (ollama/ollama#9967, #13306): with those the imported model answers text",
    "# only. llama.cpp takes the pair as it is: llama-mtmd-cli or llama-server -m model.gguf --mmproj mmproj.gguf.",
)
"""What the Modelfile says about the projector (docs/export.md gives the sources)."""


def modelfile(tokenizer: Any, gguf_name: str = "model.gguf", projector: str | None = None) -> tuple[str, str]:
    """(Modelfile text, note): note is empty when the chat template was translated. `projector`: a vision-language
    run's mmproj file, a second FROM line."""
    wrappers, why = infer_wrappers(tokenizer)
    lines = [f"FROM ./{gguf_name}", ""]
    if projector:
        lines = [*PROJECTOR_NOTE, f"FROM ./{gguf_name}", f"FROM ./{projector}", ""]
    note = ""
    if wrappers is not None:
        lines += [f'TEMPLATE """{wrappers.go_template()}"""', ""]
    else:
        note = f"no TEMPLATE written: {why}; Ollama falls back to its own detection, llama.cpp uses the GGUF's chat template"
        lines += [f"# {note}", ""]
    stops = []
    for token in (getattr(tokenizer, "eos_token", None),):
        if token and token not in stops:
            stops.append(token)
    lines += [f"PARAMETER stop {s}" for s in stops]
    return "\n".join(lines) + "\n", note
