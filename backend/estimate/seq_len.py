"""The inverse question of the estimate: the longest train.seq_len a run fits in a given memory.

For a config (model, method, techniques) and a memory limit (a card's usable bytes, this machine's
GPU or RAM), bisection over backend.estimate.run_estimate.estimate_run's total, which never falls when
seq_len grows (every part is non-decreasing in the tokens of a micro-batch). The answer is capped at
the model's max_position_embeddings: rows longer than the positions the model was trained on are
not a fit. Torch-free: the studio's Techniques page asks it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.estimate import human_bytes
from backend.estimate.families import max_positions
from backend.estimate.vision_rows import image_tokens_per_row


@dataclass(frozen=True)
class SeqLenAnswer:
    """The longest seq_len that fits `limit_bytes` (None: not even one token fits)."""

    seq_len: int | None
    limit_bytes: int
    capped_at: int | None = None
    """The model's max_position_embeddings when it, not the memory, set the answer."""
    floor_bytes: int = 0
    """The total at seq_len 1 (the weights and states alone, near enough), for the 'nothing fits' line."""
    problem: str = ""
    """Why there is no answer (an unreadable config.json), one line."""
    image_tokens: int = 0
    """A vision-language model's image tokens a row (inside seq_len): the answer leaves room for them."""

    def sentence(self, where: str) -> str:
        """One line: 'longest seq_len that fits <where>: 6,144 tokens' (and why it stops there)."""
        if self.problem:
            return f"no longest seq_len: {self.problem}"
        images = f" ({self.image_tokens:,} image tokens a row and one text token)" if self.image_tokens else ""
        if self.seq_len is None:
            return (f"no seq_len fits {where}: even {'that' if images else 'one token'}{images} needs "
                    f"{human_bytes(self.floor_bytes)} of {human_bytes(self.limit_bytes)}")
        text = f"longest seq_len that fits {where}: {self.seq_len:,} tokens"
        if self.image_tokens:
            text += f", {self.image_tokens:,} of them a row's image tokens"
        if self.capped_at is not None:
            text += " (the model's max_position_embeddings; memory would allow more)"
        return text


def with_seq_len(config: RunConfig, seq_len: int) -> RunConfig:
    """The same run at another train.seq_len."""
    return config.model_copy(update={"train": config.train.model_copy(update={"seq_len": seq_len})})


def longest_seq_len(config: RunConfig, limit_bytes: int, total_at: Callable[[RunConfig], int],
                    model_config: dict[str, Any] | None, *, ceiling: int = 1 << 20,
                    images_per_row: int | None = None) -> SeqLenAnswer:
    """Bisection for the largest seq_len whose total (`total_at`, e.g. estimate_run's) is at most
    `limit_bytes`: total(answer) fits and total(answer + 1) does not, unless capped at the model's
    positions (or at `ceiling` for a model without a limit). `total_at` raises ValueError (one line)
    when there is no estimate. A vision-language model's rows hold their image tokens
    (estimate/vision_rows.py, `images_per_row` as estimate's): the search starts past them."""
    cap = (max_positions(model_config) if model_config is not None else None) or ceiling
    images = image_tokens_per_row(model_config, config, images_per_row)
    low = min(cap, images + 1)

    def fits(seq: int) -> tuple[bool, int]:
        total = total_at(with_seq_len(config, seq))
        return total <= limit_bytes, total

    try:
        ok, floor = fits(low)
        if not ok:
            return SeqLenAnswer(None, limit_bytes, floor_bytes=floor, image_tokens=images)
        if fits(cap)[0]:
            return SeqLenAnswer(cap, limit_bytes, capped_at=cap if cap != ceiling else None, floor_bytes=floor,
                                image_tokens=images)
    except ValueError as exc:
        return SeqLenAnswer(None, limit_bytes, problem=str(exc).splitlines()[0])
    lo, hi = low, cap  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid)[0]:
            lo = mid
        else:
            hi = mid
    return SeqLenAnswer(lo, limit_bytes, floor_bytes=floor, image_tokens=images)


def run_total(device: str, **estimate_kwargs: Any) -> Callable[[RunConfig], int]:
    """total_at for longest_seq_len: estimate_run's total on `device` (the verdicts and calibration
    every other caller's estimate has), ValueError with its problem when there is none."""
    from backend.estimate.run_estimate import estimate_run

    def total(config: RunConfig) -> int:
        result = estimate_run(config, device, **estimate_kwargs)
        if result.total_bytes is None:
            raise ValueError(result.problem or "no estimate")
        return result.total_bytes

    return total


def cli_target(args: Any, found: Any) -> tuple[str, int, str]:
    """(device, limit bytes, words naming it) for --max-seq-len and --fit: a --card-gb card; else this
    machine's smallest GPU; on a machine without one, its RAM for a CPU run (--device cuda there needs --card-gb)."""
    import os

    from backend.core.config.run_config import ConfigError
    from backend.estimate.cards import usable_bytes

    device = "cuda" if args.card_gb else (args.device or found.kind)
    if args.card_gb and args.device == "cpu":
        raise ConfigError("--card-gb is a CUDA card's size; leave out --device cpu, or --card-gb to ask for this "
                          "machine's RAM")
    if args.card_gb:
        return device, usable_bytes(args.card_gb), card_words(args.card_gb)
    if device == "cuda":
        if found.kind != "cuda" or not found.devices:
            raise ConfigError("--device cuda: this machine has no GPU to measure; add --card-gb N "
                              "(the card's size in GB, e.g. --card-gb 24)")
        gpu = min(found.devices, key=lambda d: d.total_bytes)
        return device, gpu.total_bytes, f"GPU {gpu.index} ({gpu.name}, {human_bytes(gpu.total_bytes)})"
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return device, limit, f"this machine's RAM ({human_bytes(limit)}, a CPU run)"


def card_words(card_gb: int) -> str:
    """'a 24 GB card (22.3 GiB usable)': how the CLI and the studio name a card's memory."""
    from backend.estimate.cards import usable_bytes

    return f"a {card_gb} GB card ({human_bytes(usable_bytes(card_gb))} usable)"


def cli_estimate_kwargs(args: Any, config: RunConfig, found: Any, device: str, answer: int | None) -> dict[str, Any]:
    """estimate_run's keywords for the CLI's inverse questions: the machine's facts where it is the device."""
    from backend.core.device_caps import device_caps
    from backend.estimate import load_model_config
    from backend.estimate.calibration import Calibration

    return {"caps": device_caps(device, found.bf16 if found.kind == device else None,
                                found.devices if found.kind == device else ()),
            "target_tokens": answer, "calibration": Calibration.read() if device == "cpu" else None,
            "num_gpus": args.gpus, "zero_stage": args.zero_stage,
            "model_config": load_model_config(config.model.path)}


def cli_longest_seq_len(args: Any, config: RunConfig, found: Any, answer: int | None,
                        images: int | None = None) -> tuple[Any, str]:
    """(SeqLenAnswer, where) for --max-seq-len on cli_target's memory; images: the data's most a row."""
    device, limit, where = cli_target(args, found)
    kwargs = cli_estimate_kwargs(args, config, found, device, answer)
    total = run_total(device, **kwargs, images_per_row=images)
    return longest_seq_len(config, limit, total, kwargs["model_config"], images_per_row=images), where
