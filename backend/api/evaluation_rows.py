"""The rows of an eval_report.json, base beside tuned, for the CLI's table and the window's (torch-free).

SFT reports perplexity and exact match, GRPO the mean reward of its reward functions, DPO the share
of held-out pairs ranked right and KTO the share of held-out answers moved as labelled; each report
names its own rows here, so both faces show every objective the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ReportRow(NamedTuple):
    label: str
    tip: str
    base: str
    tuned: str


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "—"


def report_rows(report: dict[str, Any] | None) -> list[ReportRow]:
    """The figures of `report` (None: SFT's two rows, empty)."""
    report = report or {}
    reward, preference = report.get("mean_reward"), report.get("preference")
    if reward:
        rows = [ReportRow("Mean reward ↑", "The reward functions' weighted sum, averaged over sampled answers to "
                          "held-out prompts: higher is better",
                          _fmt(reward["base"]["mean"], ".3f"), _fmt(reward["tuned"]["mean"], ".3f"))]
        return rows + [ReportRow(f"  {name}", f"The reward function {name} alone",
                                 _fmt(reward["base"]["per_function"].get(name), ".3f"),
                                 _fmt(reward["tuned"]["per_function"].get(name), ".3f"))
                       for name in reward["base"]["per_function"]]
    if preference and preference["kind"] == "pairs":
        return [ReportRow("Pairs ranked right ↑", "Held-out pairs whose chosen answer is more likely than the "
                          "rejected one: higher is better", _fmt(preference["base"]["accuracy"], ".1%"),
                          _fmt(preference["tuned"]["accuracy"], ".1%")),
                ReportRow("Mean margin ↑", "log p(chosen) - log p(rejected), averaged over the held-out pairs",
                          _fmt(preference["base"]["margin"], ".2f"), _fmt(preference["tuned"]["margin"], ".2f"))]
    if preference:
        tuned = preference["tuned"]
        return [ReportRow("Moved as labelled ↑", "Held-out answers the tuning made more likely when labelled good "
                          "and less likely when labelled bad: higher is better", "—", _fmt(tuned["accuracy"], ".1%")),
                ReportRow("  desirable", "Of the answers labelled good: made more likely", "—",
                          _fmt(tuned["desirable"], ".1%")),
                ReportRow("  undesirable", "Of the answers labelled bad: made less likely", "—",
                          _fmt(tuned["undesirable"], ".1%"))]
    ppl, em = report.get("perplexity"), report.get("exact_match")
    exact = {w: (f"{em[w]['accuracy']:.1%} ({em[w]['hits']}/{em[w]['n']})" if em else "—") for w in ("base", "tuned")}
    return [ReportRow("Perplexity ↓", "Perplexity on the validation split: lower is better",
                      _fmt(ppl["base"]["perplexity"], ".2f") if ppl else "—",
                      _fmt(ppl["tuned"]["perplexity"], ".2f") if ppl else "—"),
            ReportRow("Exact match ↑", "Held-out prompts answered exactly: higher is better", exact["base"],
                      exact["tuned"])]


def report_note(report: dict[str, Any]) -> str:
    """One line on what the objective's figures were measured on ('' for SFT)."""
    reward, preference = report.get("mean_reward"), report.get("preference")
    if reward:
        return (f"mean reward: {reward['prompts']} {reward['source']} x {reward['samples']} samples at temperature "
                f"{reward['temperature']:g}, {reward['max_new_tokens']} new tokens at most; base: {report['base_model']}")
    if preference:
        what = "pairs" if preference["kind"] == "pairs" else "labelled answers (the tuned model against the base)"
        return f"measured on {preference['n']} validation {what}; base: {report['base_model']}"
    return ""
