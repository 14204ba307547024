"""Presets: ready-made run configs for real models and common card sizes. Torch-free.

A preset is a plain RunConfig YAML file under resources/presets/ (the CLI trains it as it is); its
leading comment block is its header, `# Key: value` lines a person reads first and the Model page
lists: Title, Card (the GPU memory it is sized for), Model (the hub id its model.path downloads
from), When to use, Cost. The numbers in Cost come from the estimate and a test holds them to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from backend.core.paths import resources_dir

HEADER_KEYS = ("title", "card", "model", "when to use", "cost")


@dataclass(frozen=True)
class Preset:
    path: Path
    title: str
    card_gb: int
    """GPU memory per card it is sized for (0: none needed, the CPU fixture)."""
    cards: int
    """How many such cards (a 2x80 GB preset: 2)."""
    hub_id: str
    """The model's hub id ("" for the bundled model)."""
    when: str
    cost: str
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def card_label(self) -> str:
        if not self.card_gb:
            return "CPU"
        return f"{self.cards}x{self.card_gb} GB" if self.cards > 1 else f"{self.card_gb} GB"


def read_header(path: Path) -> dict[str, str]:
    """The `# Key: value` lines of the leading comment block (continuation lines joined)."""
    header: dict[str, str] = {}
    key = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        match = re.match(r"([A-Za-z][A-Za-z ]*?):\s*(.*)$", text)
        if match and match.group(1).lower() in HEADER_KEYS + ("run it", "override"):
            key = match.group(1).lower()
            header[key] = match.group(2).strip()
        elif key and text:
            header[key] = f"{header[key]} {text}".strip()
    return header


def parse_card(text: str) -> tuple[int, int]:
    """'24 GB' -> (24, 1); '2x80 GB' -> (80, 2); 'CPU' or '' -> (0, 1)."""
    match = re.match(r"\s*(?:(\d+)\s*x\s*)?(\d+)\s*GB", text, re.IGNORECASE)
    if not match:
        return 0, 1
    return int(match.group(2)), int(match.group(1) or 1)


def load_preset(path: Path) -> Preset:
    header = read_header(path)
    card_gb, cards = parse_card(header.get("card", ""))
    return Preset(
        path=path,
        title=header.get("title", path.stem),
        card_gb=card_gb,
        cards=cards,
        hub_id=header.get("model", ""),
        when=header.get("when to use", ""),
        cost=header.get("cost", ""),
        extra={k: v for k, v in header.items() if k not in HEADER_KEYS},
    )


def list_presets(folder: Path | None = None) -> list[Preset]:
    """Every preset, smallest card first (then by title)."""
    folder = folder or resources_dir() / "presets"
    presets = [load_preset(p) for p in sorted(folder.glob("*.yaml"))]
    return sorted(presets, key=lambda p: (p.card_gb * p.cards, p.title))


def cost_line(config: Any, total_bytes: int, parts: dict[str, int], card_gb: int, cards: int,
              image_tokens: int = 0) -> str:
    """The header's Cost line for an estimate of `config` (what a test holds the file to); image_tokens:
    a vision-language model's image tokens a row (one image at the resolution cap)."""
    gib = 1024**3
    t, train = config.technique, config.train
    per_step = train.micro_batch_size * train.gradient_accumulation_steps * cards
    names = ("weights", "logits", "activations", "runtime", "vision_tower", "projector", "vision_activations",
             "pixel_values", "cuda_context", "allocator_reserve")
    shown = ", ".join(f"{name.replace('_', ' ')} {parts[name] / gib:.1f}" for name in names if parts.get(name))
    card = f"{cards}x{card_gb} GB" if cards > 1 else f"{card_gb} GB"
    return (f"estimated peak {total_bytes / gib:.1f} GiB per GPU of {card} ({shown} GiB) for {train.seq_len}-token "
            f"rows{f' (one image at the resolution cap: {image_tokens:,} of them image tokens)' if image_tokens else ''}, "
            f"micro-batch {train.micro_batch_size}{', checkpointing' if t.gradient_checkpointing else ''}, "
            f"{per_step} examples per optimizer step; " + (
                "logits at every position (a vision-language run takes no speed shortcuts); fewer or smaller images "
                "need less, see the Techniques page once your data is chosen." if image_tokens else
                "the worst case (every position a target): instruction data needs less, see the Techniques page "
                "once your data is chosen."))
