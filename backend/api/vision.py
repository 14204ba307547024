"""The Model page's door to a vision-language model folder: what it is (backend/core/vision_folder.py,
torch-free, at once) and the parameters of each part, counted on the meta device in a subprocess
(`python -m backend.training.model.vision_parts FOLDER`), so the studio never imports torch.

Counting builds the model's skeleton in transformers, seconds on a CPU; the page asks for it off the GUI
thread, and a count is kept per folder until its config.json changes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

from backend.core.vision_folder import VisionFolder
from backend.runtime.processes import module_command, worker_env

PARTS_MODULE = "backend.training.model.vision_parts"
EXAMPLE_IMAGE = (1024, 768)
"""The photo the Model page prices: a common camera aspect at a size most processors resize."""

_counted: dict[tuple[str, int], dict[str, int]] = {}


def read_vision(folder: Path) -> VisionFolder:
    """Whether `folder` is a vision-language model, its family or its refusal (torch-free, files only)."""
    return VisionFolder.read(Path(folder))


def part_counts(folder: Path, timeout_s: float = 300) -> dict[str, int]:
    """Parameters per part (vision tower, projector, language model, ...) of a proven family's folder.
    Raises RuntimeError with the subprocess's one line when it cannot count."""
    folder = Path(folder).resolve()
    key = (str(folder), (folder / "config.json").stat().st_mtime_ns)
    if key in _counted:
        return dict(_counted[key])
    done = subprocess.run(module_command(PARTS_MODULE) + [str(folder)], env=worker_env(), capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or ["no answer"])[-1]}
    if "parts" not in answer:
        raise RuntimeError(f"{folder}: parameters per part not counted ({answer.get('error')})")
    _counted[key] = {str(k): int(v) for k, v in answer["parts"].items()}
    return dict(_counted[key])


def image_tokens_line(vision: VisionFolder) -> str:
    """One line: what the example photo costs and the most one image can cost at the configured cap."""
    family = vision.family
    if family is None:
        return ""
    width, height = EXAMPLE_IMAGE
    tokens = vision.tokens_per_image(width, height)
    cap = vision.cap
    line = f"{tokens:,} for a {width}×{height} image"
    largest = vision.largest_tokens()
    if largest is not None and largest != tokens:
        line += f"; up to {largest:,}"
    return line + f" ({family.cap_key} {cap:,}, {vision.processor_files or 'transformers defaults'})"


def cap_cost_line(folder: Path | None, max_pixels: int | None) -> str:
    """The Techniques page's line under the resolution cap: what the example photo costs in training at
    `vision.max_pixels` ("" for a text model or an unproven VLM). The cap is the training processor's
    only where the family's own cap is max_pixels (apply_cap in backend/training/vision/door.py)."""
    if folder is None or not (Path(folder) / "config.json").is_file():
        return ""
    vision = read_vision(Path(folder))
    family = vision.family
    if family is None:
        return ""
    width, height = EXAMPLE_IMAGE
    applies = family.cap_key == "max_pixels"
    tokens = vision.tokens_per_image(width, height, max_pixels if applies else None)
    line = f"about {tokens:,} tokens per {width}×{height} image"
    if max_pixels is not None and not applies:
        line += f" ({family.label} sizes images by its {family.cap_key}; this cap is not used)"
    return line


ImageRules = tuple[Callable[[int, int], int | None] | None, int | None]
"""(tokens per image of (width, height) or None, images a row may hold or None for any)."""


def data_rules(folder: Path | None) -> ImageRules:
    """What the Data page's reader needs from the model side: (tokens per image of (width, height), the
    images a row may hold). A text model: (None, 0), rows with images are refused; an unproven or
    unreadable VLM: (None, None), the images are shown but not counted; a proven family: its rule and
    its `images_per_row` (None: any number)."""
    if folder is None or not (Path(folder) / "config.json").is_file():
        return None, None
    vision = read_vision(Path(folder))
    if not vision.is_vlm:
        return None, 0
    if vision.family is None:
        return None, None

    def tokens(width: int, height: int) -> int | None:
        try:
            return vision.tokens_per_image(width, height)
        except ValueError:  # an image the family's processor refuses (an aspect above 200 for Qwen)
            return None

    return tokens, vision.family.images_per_row
