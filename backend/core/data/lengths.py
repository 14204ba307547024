"""LengthFacts: what fitting examples into train.seq_len did, said in notes and one-line refusals.

An example longer than seq_len is cut (data.truncate) or, with truncation off, refused with how many
are too long and the longest. One whose prompt alone fills seq_len keeps no answer token after the
cut: it is dropped, and said apart from the truly truncated ones (with the reason and its first
line), and one over HUGE times seq_len keeps almost nothing of itself, which a note says. A message too
long to tokenize whole is cut to MAX_CHARS_PER_TOKEN characters a token of seq_len first (its token count
is then a lower bound, said as "over N tokens"), and a note says how many and the first. Torch-free:
the facts travel in the token cache as JSON and become sentences here, naming today's file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from backend.core.errors import JobError, bad_input

HUGE = 100
"""An example this many times train.seq_len loses nearly all of itself to truncation: said in a note."""
MAX_CHARS_PER_TOKEN = 32
"""More characters than a tokenizer packs into one token on average, by a wide margin: a message cut to
seq_len times this still fills seq_len tokens, and a many-megabyte answer is never tokenized whole."""


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
    """[example index, tokens, characters of its message that was cut (0: none was)]."""
    longest: list[int] = field(default_factory=list)
    """[example index, tokens] of the longest example tokenized whole."""
    huge: int = 0
    dropped: int = 0
    first_dropped: list[int] = field(default_factory=list)
    """[example index, prompt tokens, characters cut (0: none)] of the first example whose prompt alone
    fills seq_len."""
    shortest_dropped_prompt: int = 0
    cut: int = 0
    """Examples with a message over `limit` characters, cut to it before tokenizing."""
    first_cut: list[int] = field(default_factory=list)
    """[example index, characters of its longest message before the cut]."""
    longest_cut: list[int] = field(default_factory=list)

    @property
    def limit(self) -> int:
        """The characters of one message that are tokenized; the rest could never reach seq_len tokens."""
        return self.seq_len * MAX_CHARS_PER_TOKEN

    def see(self, index: int, tokens: int, prompt_tokens: int, cut_chars: int = 0) -> bool:
        """Count one example of `tokens` (the first `prompt_tokens` untrained; both lower bounds when a
        message of `cut_chars` characters was cut to `limit`); False: drop it."""
        if cut_chars:
            self.cut += 1
            self.first_cut = self.first_cut or [index, cut_chars]
            if not self.longest_cut or cut_chars > self.longest_cut[1]:
                self.longest_cut = [index, cut_chars]
        if tokens <= self.seq_len:
            return True
        self.longer += 1
        self.first_longer = self.first_longer or [index, tokens, cut_chars]
        if not cut_chars:  # a cut one's tokens are a lower bound: the longest is told by characters
            if not self.longest or tokens > self.longest[1]:
                self.longest = [index, tokens]
            self.huge += tokens >= HUGE * self.seq_len
        if prompt_tokens >= self.seq_len:
            self.dropped += 1
            self.first_dropped = self.first_dropped or [index, prompt_tokens, cut_chars]
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
        if self.cut:
            index, chars = self.first_cut
            notes.append(f"{reader.path}: cut {self.cut} of {reader.total} {_examples(reader.total)} with a message "
                         f"over {self.limit:,} characters ({MAX_CHARS_PER_TOKEN} per token of train.seq_len="
                         f"{self.seq_len}) to that many before tokenizing (first: {reader.short(index)}, {chars:,} "
                         f"characters): at most the first {self.seq_len} tokens of each are trained on; raise "
                         "train.seq_len, or split them into shorter examples")
        if self.dropped:
            index, prompt, *cut = self.first_dropped
            size = f"prompt of over {prompt:,} tokens" if cut and cut[0] else f"{prompt:,}-token prompt"
            notes.append(f"{reader.path}: dropped {self.dropped} of {reader.total} {_examples(reader.total)} whose "
                         f"prompt alone is longer than train.seq_len={self.seq_len} (first: {reader.short(index)}, "
                         f"a {size}): no answer token would be left to learn from; raise "
                         f"train.seq_len above {self.shortest_dropped_prompt:,} to keep them")
        if self.huge:
            index, tokens = self.longest
            notes.append(f"{reader.path}: {self.huge} {_examples(self.huge)} over {HUGE} times train.seq_len="
                         f"{self.seq_len} (the longest: {tokens:,} tokens, {reader.short(index)}): only the first "
                         f"{self.seq_len} tokens of each are trained on; raise train.seq_len, or split them into "
                         "shorter examples")
        return notes

    def refusal(self, reader: Where) -> JobError:
        """Truncation off and some examples longer than seq_len: how many, the first and the longest
        (by characters when a message was too long to tokenize whole)."""
        index, tokens, *cut = self.first_longer
        size = f"{cut[0]:,} characters, over {tokens:,} tokens" if cut and cut[0] else f"{tokens:,} tokens"
        more = ""
        if self.longer > 1:
            longest, most = self.longest_cut or self.longest
            what = "characters" if self.longest_cut else "tokens"
            more = (f" ({self.longer} of {reader.total} examples are longer; the longest: {most:,} {what}, "
                    f"{reader.short(longest)})")
        whole = "" if self.longest_cut else f" (to {self.longest[1]:,} to keep every example whole)"
        return bad_input(f"{reader.where(index)}: {size}, longer than train.seq_len={self.seq_len}{more}",
                         f"raise train.seq_len{whole}, or set data.truncate: true to cut them to it")

    def nothing_left(self, reader: Where) -> JobError:
        """Every example dropped: their prompts alone fill seq_len."""
        index, prompt, *cut = self.first_dropped
        size = f"over {prompt:,} tokens" if cut and cut[0] else f"{prompt:,} tokens"
        return bad_input(f"{reader.path}: no example can be trained on: the prompt alone of every example is longer "
                         f"than train.seq_len={self.seq_len} (first: {reader.short(index)}, {size})",
                         f"raise train.seq_len above {self.shortest_dropped_prompt:,}, or shorten the prompts")


def _examples(count: int) -> str:
    return "example" if count == 1 else "examples"
