"""DPO, KTO and GRPO data: a many-megabyte field is cut before TRL tokenizes it, and a note says so."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from backend.core.config.run_config import RunConfig
from backend.core.data.lengths import MAX_CHARS_PER_TOKEN
from backend.core.data.long_fields import cut_long_fields
from backend.training.objectives import dpo, grpo, kto
from tests.conftest import ROOT

HUGE = 3_000_000
"""Characters of the long field: about 20 s to tokenize whole on this CI's CPUs, instantly cut."""


def _rows(objective: str, huge: str) -> list[dict]:
    if objective == "dpo":
        return [{"prompt": f"q{i}?", "chosen": huge if i == 3 else "yes", "rejected": "no"} for i in range(8)]
    if objective == "kto":
        return [{"prompt": f"q{i}?", "completion": huge if i == 3 else "yes", "label": i % 2 == 0} for i in range(8)]
    return [{"prompt": huge if i == 3 else f"q{i}?", "answer": "yes"} for i in range(8)]


@pytest.mark.parametrize("objective,module", [("dpo", dpo), ("kto", kto), ("grpo", grpo)])
def test_a_huge_field_is_cut_to_what_seq_len_can_use_and_said(objective, module, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(objective, "ab " * (HUGE // 3))), encoding="utf-8")
    config = RunConfig.load(ROOT / "resources" / "presets" / f"tiny_{objective}.yaml",
                            [f"data.path={data}", "data.validation_split=0"])
    tokenizer = AutoTokenizer.from_pretrained(config.resolved_model_path())
    train, _, stats = module.build_datasets(config, tokenizer)
    limit = config.train.seq_len * MAX_CHARS_PER_TOKEN
    longest = max(len(json.dumps(row)) for row in train)
    assert limit < longest < limit + 1000  # the long field kept its first `limit` characters, no more
    assert len(stats.notes) >= 1 and f"over {limit:,} characters" in stats.notes[-1]
    assert f"longest of {HUGE:,} characters" in stats.notes[-1]


def test_messages_are_cut_one_by_one_and_short_rows_are_left_as_they_are():
    rows = [{"prompt": [{"role": "system", "content": "s" * 50}, {"role": "user", "content": "u" * 10}],
             "chosen": [{"role": "assistant", "content": "c" * 5}], "rejected": "r", "answer": "x" * 99}]
    same, note = cut_long_fields(rows, seq_len=2)  # limit 64 characters: the 50 fit
    assert same == rows and note == ""
    rows[0]["prompt"][0]["content"] = "s" * 5000
    cut, note = cut_long_fields(rows, seq_len=1)  # limit MAX_CHARS_PER_TOKEN characters
    assert cut[0]["prompt"][0]["content"] == "s" * MAX_CHARS_PER_TOKEN and cut[0]["prompt"][1]["content"] == "u" * 10
    assert cut[0]["answer"] == "x" * 99  # a reward's column is never tokenized: left whole
    assert rows[0]["prompt"][0]["content"] == "s" * 5000  # the caller's rows are not changed
    assert note.startswith("1 text field(s) over 32 characters")
