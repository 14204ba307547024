"""prune_report.json and prune_ranking.json: written whole or not at all, and read back as terminal lines.

Torch-free: the CLI and the studio's Prune section print them without loading a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPORT = "prune_report.json"
RANKING = "prune_ranking.json"
HEAL = "heal.yaml"


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


def format_ranking(ranking: dict[str, Any], top: int = 12) -> str:
    """The ranking as lines: layers least important first, each layer's key/value groups, FFN spread."""
    cal = ranking.get("calibration", {})
    lines = [f"calibration: {cal.get('rows', 0)} rows, {cal.get('tokens', 0):,} tokens of the run's training data",
             f"layers (least important first; {ranking['layers']['how']}):"]
    scores = {s["layer"]: s for s in ranking["layers"]["scores"]}
    for i in ranking["layers"]["least_important_first"][:top]:
        kind = f"  {scores[i]['layer_type']}" if scores[i].get("layer_type") else ""
        lines.append(f"  layer {i:3d}  {scores[i]['score']:.4f}{kind}")
    if len(scores) > top:
        lines.append(f"  ... {len(scores) - top} more (--json shows all)")
    heads = ranking["heads"]
    lines.append(f"heads ({heads['how']}):")
    for i, (order, scores_) in enumerate(zip(heads["least_important_first"], heads["scores"])):
        if i >= top:
            lines.append(f"  ... {len(heads['scores']) - top} more layers")
            break
        lines.append(f"  layer {i:3d}  groups least important first: {','.join(map(str, order))}  "
                     f"(scores {', '.join(f'{s:.3g}' for s in scores_)})")
    ffn = ranking["ffn"]
    lines.append(f"FFN channels ({ffn['how']}; {ffn['intermediate_size']} per layer):")
    for i, row in enumerate(ffn["per_layer"][:top]):
        lines.append(f"  layer {i:3d}  weakest quarter holds {row['weakest_quarter_share']:.1%} of the score "
                     f"(min {row['min']:.3g}, median {row['median']:.3g}, max {row['max']:.3g})")
    return "\n".join(lines)


def _pair(before: Any, after: Any, spec: str) -> str:
    f = (lambda v: format(v, spec) if isinstance(v, (int, float)) else "n/a")
    return f"{f(before)} -> {f(after)}"


def format_report(report: dict[str, Any]) -> str:
    """The prune report as lines for a terminal."""
    b, a = report["shapes"]["before"], report["shapes"]["after"]
    lines = [f"pruned: {report['picks']}",
             f"  model:       {report['path']} ({report['dtype']}, loads with transformers AutoModelForCausalLM)",
             f"  layers:      {b['num_hidden_layers']} -> {a['num_hidden_layers']}"
             + (f"  (dropped {','.join(map(str, report['removed']['layers']))})" if report["removed"]["layers"] else ""),
             f"  heads:       {b['num_attention_heads']} -> {a['num_attention_heads']} query, "
             f"{b['num_key_value_heads']} -> {a['num_key_value_heads']} key/value per layer",
             f"  FFN:         intermediate_size {b['intermediate_size']} -> {a['intermediate_size']}",
             f"  parameters:  {_pair(report['parameters']['before'], report['parameters']['after'], ',')}"]
    est = report.get("estimate") or {}
    if est.get("after_bytes") is not None:
        lines.append(f"  estimate:    {_mib(est.get('before_bytes'))} -> {_mib(est.get('after_bytes'))} for one "
                     f"{est.get('method')} training step on {est.get('device')} (backend/estimate)")
    ppl = report.get("perplexity")
    if ppl:
        lines.append(f"  perplexity:  {_pair(ppl['before']['perplexity'], ppl['after']['perplexity'], '.3f')} "
                     f"on the run's validation split ({ppl['tokens']:,} tokens)")
    em = report.get("exact_match")
    if em:
        lines.append(f"  exact match: {_pair(em['before']['accuracy'], em['after']['accuracy'], '.1%')} "
                     f"on {em['n']} held-out prompts ({Path(em['prompts_file']).name})")
    lines += [f"  note: {s}" for s in report.get("skipped", [])]
    heal = report.get("heal") or {}
    if heal.get("command"):
        lines.append(f"  heal it:     {heal['command']}")
    return "\n".join(lines)
