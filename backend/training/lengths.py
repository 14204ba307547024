"""LengthFacts: what fitting examples into train.seq_len did, said in notes and one-line refusals.

An example longer than seq_len is cut (data.truncate) or, with truncation off, refused with how many
are too long and the longest. One whose prompt alone fills seq_len keeps no answer token after the
cut: it is dropped, and said apart from the truly truncated ones (with the reason and its first
line), and one over HUGE times seq_len keeps almost nothing of itself, which a note says. Torch-free:
the facts travel in the token cache as JSON and become sentences here, naming today's file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from backend.errors import JobError, bad_input

HUGE = 100
"""An example this many times train.seq_len loses nearly all of itself to truncation: said in a note."""


class Where(Protocol):
    path: Any
    total: int

    def where(self, index: int) -> str: ...

    def short(self, index: int) -> str: ...


@dataclass
class LengthFacts:
    seq_len: int
    truncated: int = 0
    """Examples cut to seq_len that still hold answer tokens (trained on)."""
    longer: int = 0
    """Examples longer than seq_len, truncated or dropped."""
    first_longer: list[int] = field(default_factory=list)
    longest: list[int] = field(default_factory=list)
    """[example index, tokens]."""
    huge: int = 0
    dropped: int = 0
    first_dropped: list[int] = field(default_factory=list)
    """[example index, prompt tokens] of the first example whose prompt alone fills seq_len."""
    shortest_dropped_prompt: int = 0

    def see(self, index: int, tokens: int, prompt_tokens: int) -> bool:
        """Count one example of `tokens` (the first `prompt_tokens` untrained); False: drop it."""
        if tokens <= self.seq_len:
            return True
        self.longer += 1
        self.first_longer = self.first_longer or [index, tokens]
        if not self.longest or tokens > self.longest[1]:
            self.longest = [index, tokens]
        self.huge += tokens >= HUGE * self.seq_len
        if prompt_tokens >= self.seq_len:
            self.dropped += 1
            self.first_dropped = self.first_dropped or [index, prompt_tokens]
            self.shortest_dropped_prompt = min(self.shortest_dropped_prompt or prompt_tokens, prompt_tokens)
            return False
        self.truncated += 1
        return True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LengthFacts | None":
        """The facts a token cache holds; None when they are not these facts (then it is re-made)."""
        try:
            facts = cls(**data)
        except TypeError:
            return None
        return facts if isinstance(facts.seq_len, int) else None

    def notes(self, reader: Where) -> list[str]:
        """The sentences for the person: the dropped examples, and the ones truncation guts."""
        notes = []
        if self.dropped:
            index, prompt = self.first_dropped
            notes.append(f"{reader.path}: dropped {self.dropped} of {reader.total} {_examples(reader.total)} whose "
                         f"prompt alone is longer than train.seq_len={self.seq_len} (first: {reader.short(index)}, "
                         f"a {prompt:,}-token prompt): no answer token would be left to learn from; raise "
                         f"train.seq_len above {self.shortest_dropped_prompt:,} to keep them")
        if self.huge:
            index, tokens = self.longest
            notes.append(f"{reader.path}: {self.huge} {_examples(self.huge)} over {HUGE} times train.seq_len="
                         f"{self.seq_len} (the longest: {tokens:,} tokens, {reader.short(index)}): only the first "
                         f"{self.seq_len} tokens of each are trained on; raise train.seq_len, or split them into "
                         "shorter examples")
        return notes

    def refusal(self, reader: Where) -> JobError:
        """Truncation off and some examples longer than seq_len: how many, the first and the longest."""
        index, tokens = self.first_longer
        more = ""
        if self.longer > 1:
            longest, most = self.longest
            more = (f" ({self.longer} of {reader.total} examples are longer; the longest: {most:,} tokens, "
                    f"{reader.short(longest)})")
        return bad_input(f"{reader.where(index)}: {tokens:,} tokens, longer than train.seq_len={self.seq_len}{more}",
                         f"raise train.seq_len (to {self.longest[1]:,} to keep every example whole), "
                         "or set data.truncate: true to cut them to it")

    def nothing_left(self, reader: Where) -> JobError:
        """Every example dropped: their prompts alone fill seq_len."""
        index, prompt = self.first_dropped
        return bad_input(f"{reader.path}: no example can be trained on: the prompt alone of every example is longer "
                         f"than train.seq_len={self.seq_len} (first: {reader.short(index)}, {prompt:,} tokens)",
                         f"raise train.seq_len above {self.shortest_dropped_prompt:,}, or shorten the prompts")


def _examples(count: int) -> str:
    return "example" if count == 1 else "examples"
