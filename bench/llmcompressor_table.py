"""The table of bench/calibrated_vs_llmcompressor.py: perplexities compared token by token, times, peak RSS.

Every folder was scored on the same tokens, so a ratio of two perplexities is exp of the mean per-token NLL
difference, and its standard error comes from those paired differences: far tighter than either perplexity's own,
which is what tells a 1% gap from noise. Torch-free, so tests can build a table from made-up per-token NLLs.
"""

from __future__ import annotations

import math

TOOLS = ("ours", "llmcompressor")


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll)) if nll else float("nan")


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """(perplexity(a) / perplexity(b) - 1, its standard error) over the same tokens, from the paired differences."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired perplexities need the same tokens: {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    spread = math.sqrt(sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1))
    ratio = math.exp(mean)
    return ratio - 1, ratio * spread / math.sqrt(len(d))


def signed(pair: tuple[float, float]) -> str:
    rel, se = pair
    return f"{rel * 100:+.2f}% ± {se * 100:.2f}%"


def table(formats: list[str], sides: dict, scores: dict, merged: str, elsewhere: dict | None = None) -> str:
    """Markdown table: one row per (format, tool). `sides[(format, tool)]` has folder, wall, rss, quantize and error;
    `scores[folder]` the folder_perplexity result; `elsewhere` the same, scored in llmcompressor's venv, for the
    folders ours could not load (its merged model's scores beside them). Two folders scored in different
    environments are compared through each one's ratio to the merged model of its own environment (marked ≈)."""
    elsewhere = elsewhere or {}
    base = scores[merged]
    lines = ["| format | tool | perplexity | vs merged | vs the other tool | answer-token perplexity | wall s | "
             "quantize s | peak RSS GB |", "|---|---|---|---|---|---|---|---|---|",
             f"| merged (16-bit) | ours | {perplexity(base['all']):.4f} | | | {perplexity(base['answers']):.4f} | "
             "| | |"]
    for fmt in formats:
        for tool in TOOLS:
            side = sides[fmt, tool]
            other = sides[fmt, TOOLS[1 - TOOLS.index(tool)]]
            timing = (f"{side['wall']:.0f} | {side['quantize']:.0f} | {side['rss'] / 1e9:.2f}"
                      if side["quantize"] is not None else f"{side['wall']:.0f} | | {side['rss'] / 1e9:.2f}")
            lines.append(f"| {fmt} | {tool} | {_cells(side, other, scores, merged, elsewhere)} | {timing} |")
    return "\n".join(lines)


def _scored(folder: str, scores: dict, merged: str, elsewhere: dict) -> tuple[dict, dict, str] | None:
    """(the folder's scores, the merged model's in the same environment, "" or " in llmcompressor's venv")."""
    if "all" in scores.get(folder, {}):
        return scores[folder], scores[merged], ""
    if "all" in elsewhere.get(folder, {}) and "all" in elsewhere.get(merged, {}):
        return elsewhere[folder], elsewhere[merged], " in llmcompressor's venv"
    return None


def _cells(side: dict, other: dict, scores: dict, merged: str, elsewhere: dict) -> str:
    """perplexity | vs merged | vs the other tool | answer-token perplexity, for one side."""
    if side["error"]:
        return f"did not write: {side['error']} | | | "
    folder, other_folder = str(side["folder"]), str(other["folder"])
    mine = _scored(folder, scores, merged, elsewhere)
    why = scores.get(folder, {}).get("error")
    unloaded = f" (did not load in our stack: {why})" if why else ""
    if mine is None:
        return f"not scored{unloaded or ''} | | | "
    own, base, where = mine
    theirs = None if other["error"] else _scored(other_folder, scores, merged, elsewhere)
    versus = ""
    if theirs is not None and theirs[2] == where:
        versus = signed(paired(own["all"], theirs[0]["all"]))
    elif theirs is not None:  # different environments: through each one's own merged model
        a, b = paired(own["all"], base["all"])[0], paired(theirs[0]["all"], theirs[1]["all"])[0]
        versus = f"≈ {((1 + a) / (1 + b) - 1) * 100:+.2f}%"
    there = " (there)" if where else ""
    return (f"{perplexity(own['all']):.4f}{where}{unloaded} | {signed(paired(own['all'], base['all']))}{there} | "
            f"{versus} | {perplexity(own['answers']):.4f}")
