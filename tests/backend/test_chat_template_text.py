"""The Data page's torch-free chat template rendering gives what the tokenizer gives."""

from __future__ import annotations

import json

from backend.core.data.chat_template_text import template_renderer
from tests.conftest import ROOT

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
         {"role": "assistant", "content": "Yes."}]


def test_the_bundled_template_renders_as_the_tokenizer_does():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "resources" / "tiny")
    render = template_renderer(ROOT / "resources" / "tiny")
    assert render(TURNS, False) == tokenizer.apply_chat_template(TURNS, tokenize=False)
    assert render(TURNS[:2], True) == tokenizer.apply_chat_template(TURNS[:2], tokenize=False,
                                                                   add_generation_prompt=True)


def test_a_tokenizer_config_template_named_default_with_its_tokens(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>"}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]}))
    render = template_renderer(tmp_path)
    assert render(TURNS[1:2], True) == "<s>user: Hi?</s>assistant:"


def test_no_template_or_a_broken_one_gives_none(tmp_path):
    assert template_renderer(tmp_path) is None
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    assert template_renderer(tmp_path) is None
