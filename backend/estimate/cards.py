"""Which common NVIDIA card sizes a run fits: the estimate's CUDA total against each card's usable memory.

A card sold as N GB gives a program a bit less than N GiB: the driver and ECC keep some back.
Only one usable figure was measured here, the H200's 141 GB of which torch sees about 139 GiB
(this project's GPU machine); for the other sizes the rule is 97% of N GiB, a little under what
such cards report (the H200's is 98.6%), so a "fits" errs on the safe side.
"""

from __future__ import annotations

from typing import Any

from backend.core.config.run_config import RunConfig
from backend.estimate.breakdown import GIB

CARD_SIZES_GB = (8, 12, 16, 24, 32, 40, 48, 80, 96, 141)
"""Common NVIDIA card memory sizes, in GB as sold."""
USABLE_SHARE = 0.97
"""The rule for a card without a measured figure: this share of its nominal size in GiB."""
MEASURED_USABLE = {141: 139 * GIB}
"""Nominal GB -> bytes torch reported as the card's total (H200: about 139 GiB)."""


def usable_bytes(nominal_gb: int) -> int:
    """Memory a program can use on a card sold as `nominal_gb` GB (see the module docstring)."""
    return MEASURED_USABLE.get(nominal_gb, int(nominal_gb * GIB * USABLE_SHARE))


def fitting_cards(total_bytes: int) -> tuple[list[int], list[int]]:
    """(card sizes in GB the total fits, those it does not), smallest first."""
    fits = [gb for gb in CARD_SIZES_GB if total_bytes <= usable_bytes(gb)]
    return fits, [gb for gb in CARD_SIZES_GB if gb not in fits]


def _join(sizes: list[int]) -> str:
    words = [str(gb) for gb in sizes]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def cards_sentence(total_bytes: int) -> str:
    """'fits 16, 24, 40 GB cards; not 8 or 12' for a CUDA total (per GPU)."""
    fits, not_fits = fitting_cards(total_bytes)
    if not fits:
        return f"fits none of the common cards (up to {CARD_SIZES_GB[-1]} GB)"
    text = "fits " + ", ".join(str(gb) for gb in fits) + " GB cards"
    return text + (f"; not {_join(not_fits)}" if not_fits else "")


def cuda_cards(config: RunConfig, result: Any, answer: int | None, gpus: int | None, zero_stage: int | None,
               model_config: dict[str, Any] | None = None) -> dict:
    """Which common card sizes the run fits on CUDA (a CUDA estimate even on a CPU machine)."""
    from backend.core.device_caps import device_caps
    from backend.estimate.run_estimate import estimate_run

    if result.device != "cuda":
        result = estimate_run(config, "cuda", caps=device_caps("cuda"), target_tokens=answer, num_gpus=gpus,
                              zero_stage=zero_stage, model_config=model_config)
    total = result.total_bytes
    if total is None:
        return {"fits": [], "not": [], "sentence": f"no CUDA estimate: {result.problem}"}
    fits, not_fits = fitting_cards(total)
    return {"fits": fits, "not": not_fits, "sentence": cards_sentence(total), "cuda_total_bytes": total}
