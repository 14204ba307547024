"""Cut DPO, KTO and GRPO fields too long to tokenize whole, before TRL tokenizes them.

TRL cuts each example to train.seq_len tokens only after tokenizing all of it, so one many-megabyte
answer stalls the run for minutes (SFT cuts its messages the same way first: tokenized.cut_messages).
A field over MAX_CHARS_PER_TOKEN characters a token of seq_len keeps its start, which still fills
seq_len tokens, and a note says how many were cut.
"""

from __future__ import annotations

from typing import Any

from backend.core.data.lengths import MAX_CHARS_PER_TOKEN

FIELDS = ("prompt", "chosen", "rejected", "completion")
"""The fields the trainers tokenize (GRPO's other columns are read by rewards, never tokenized)."""


def cut_long_fields(rows: list[dict[str, Any]], seq_len: int) -> tuple[list[dict[str, Any]], str]:
    """-> (rows with every text of FIELDS cut to seq_len x MAX_CHARS_PER_TOKEN characters, a note or "")."""
    limit = seq_len * MAX_CHARS_PER_TOKEN
    cut, longest = 0, 0
    out = []
    for row in rows:
        changed = dict(row)
        for name in FIELDS:
            value = row.get(name)
            if isinstance(value, str) and len(value) > limit:
                changed[name] = value[:limit]
                cut, longest = cut + 1, max(longest, len(value))
            elif isinstance(value, list):
                messages = []
                for message in value:
                    content = message.get("content") if isinstance(message, dict) else None
                    if isinstance(content, str) and len(content) > limit:
                        message = {**message, "content": content[:limit]}
                        cut, longest = cut + 1, max(longest, len(content))
                    messages.append(message)
                changed[name] = messages
        out.append(changed)
    if not cut:
        return out, ""
    return out, (f"{cut} text field(s) over {limit:,} characters ({MAX_CHARS_PER_TOKEN} per token of "
                 f"train.seq_len={seq_len}) cut to that before tokenizing, the longest of {longest:,} characters; "
                 "each still fills seq_len tokens")
