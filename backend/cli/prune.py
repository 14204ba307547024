"""`finetune-studio prune RUN_OR_MODEL_DIR ...`: rank a model's layers, head groups and FFN channels, and
remove what is picked, in a worker (backend/jobs/prune.py).

Torch-free: the picks are checked against config.json here (a layer out of range, every layer, an uneven
head pick: one line, exit 2) before a worker starts; the worker merges, ranks, cuts, writes and measures;
this side prints the ranking or prune_report.json. A model folder (no run) is pruned through a new run
folder that records the job, calibrated on --data (the bundled demo data when not given).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from backend.cli.checks import open_run_folder, output_folder, positive_int, refuse_unfinished
from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.errors import JobError
from backend.pruning.report import RANKING, REPORT, format_ranking, format_report, read_json
from backend.pruning.request import PruneRequest, Shape, out_problem
from backend.core.runs.run_folder import RunFolder

DEMO_DATA = "bundled:datasets/demo_train.jsonl"


def _layers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give layer indices separated by commas, e.g. 12,13") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give layer indices of 0 or more, e.g. 12,13")
    return values


def _heads(text: str) -> int | list[str]:
    if text.isdigit():
        return int(text)
    return [part for part in text.split(",") if part.strip()]


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1 (got {text}), e.g. 0.75")
    return value


def add_prune_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "prune", help="rank layers, attention heads and FFN channels, remove the least important, measure the result",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Merge a run's adapter, rank its layers (Block Influence: 1 - cos(input, output) on the run's\n"
                    "training rows), key/value head groups (their output norms) and FFN channels (activation norm x\n"
                    "down_proj column norm), remove what you pick, write a model transformers loads, and report\n"
                    "perplexity and exact match before and after, the parameters and the training estimate.\n"
                    "The pruned folder holds heal.yaml: train it to recover what pruning cost.")
    parser.add_argument("model", metavar="RUN_OR_MODEL_DIR", help="a run folder (or run id), or a model folder")
    parser.add_argument("--rank-only", action="store_true", help="print the ranking and remove nothing")
    parser.add_argument("--drop-layers", type=_layers, metavar="I,J", help="layer indices to remove, e.g. 12,13")
    parser.add_argument("--layers", type=positive_int, metavar="N", help="remove the N least important layers")
    parser.add_argument("--drop-heads", type=_heads, metavar="N|L:G,...",
                        help="remove each layer's N least important key/value groups (with their query heads), or "
                             "the LAYER:GROUP pairs given (the same number in every layer)")
    parser.add_argument("--ffn-keep", type=_share, metavar="SHARE", help="keep this share of FFN channels, e.g. 0.75")
    parser.add_argument("--samples", type=positive_int, default=32, help="calibration rows (default 32)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="held-out prompts scored for exact match (default: all beside the training data)")
    parser.add_argument("--out", metavar="DIR", help="pruned model folder (default: RUN_DIR/pruned)")
    parser.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default=None,
                        help="16-bit type written (default: the model's own; bf16 for fp32)")
    parser.add_argument("--data", metavar="FILE", help=f"model folders only: calibration and validation data "
                                                        f"(default {DEMO_DATA})")
    parser.add_argument("--json", action="store_true", help="print the ranking or the report as JSON")
    parser.set_defaults(func=cmd_prune)
    return parser


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"rank_only": args.rank_only, "samples": args.samples, "overwrite": args.overwrite}
    for key in ("drop_layers", "layers", "drop_heads", "ffn_keep", "dtype", "limit"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    if args.out:
        params["out"] = str(output_folder(args.out, "--out"))
    return params


def _target(args: argparse.Namespace, params: dict[str, Any]) -> tuple[RunFolder, RunConfig, Path]:
    """(run folder the worker runs in, its config, the folder whose config.json is pruned)."""
    path = Path(args.model).expanduser()
    if (path / "config.json").is_file() and not (path / "config.yaml").is_file():
        model = path.absolute()
        config = RunConfig.from_dict({"name": f"prune-{model.name}"[:40], "model": {"path": str(model)},
                                      "data": {"path": args.data or DEMO_DATA}}, source=str(model))
        if not config.resolved_data_path().exists():
            raise ConfigError(f"--data {args.data}: no such file; give the data to calibrate and validate on")
        params["model"] = str(model)
        return None, config, model  # type: ignore[return-value]
    if args.data:
        raise ConfigError("--data is for model folders; a run is calibrated on its own training data")
    folder = open_run_folder(args.model)
    config = folder.load_config()
    refuse_unfinished(folder, config, True, "prune")  # before a worker starts or anything is written
    model = folder.path / "model" if config.technique.method == "full" else config.resolved_model_path()
    return folder, config, model


def cmd_prune(args: argparse.Namespace) -> int:
    from backend.cli.worker_process import WorkerProcess

    params = _params(args)
    folder, config, model = _target(args, params)
    try:
        request = PruneRequest.parse(dict(params, model=None))
        request.check(Shape.read(model))
    except JobError as exc:
        raise ConfigError(exc.message) from None
    if not args.rank_only and params.get("out"):
        problem = out_problem(Path(params["out"]), args.overwrite, [model] + ([folder.path] if folder else []))
        if problem:  # before a run folder is made for a model folder, or a worker starts
            raise ConfigError(problem)
    if folder is None:
        folder = RunFolder.create(config)
    args.run_folder = folder.path
    out = Path(params.get("out") or folder.path / "pruned")
    err = sys.stderr
    err.write(f"pruning {params.get('model') or folder.path}: {request.picks(Shape.read(model))}\n")
    started = time.time()
    terminal = WorkerProcess(job="prune", params=params).run(
        folder, config, on_event=lambda e: _progress(e, err))
    if terminal["type"] == "JobFailed":
        print(f"error: {terminal['message']}", file=sys.stderr)
        if terminal.get("hint"):
            print(f"hint: {terminal['hint']}", file=sys.stderr)
        return 2 if terminal.get("kind") == "bad_input" else 1
    path = folder.path / RANKING if args.rank_only else out / REPORT
    result = read_json(path) if path.is_file() and path.stat().st_mtime >= started - 1 else None
    if result is None:
        print(f"error: the prune finished but {path} is missing or unreadable", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print(format_ranking(result) if args.rank_only else format_report(result))
    return 0


def _progress(event: dict[str, Any], out: Any) -> None:
    if event["type"] == "PhaseChanged":
        out.write(f"[{event['phase']}] {event.get('detail', '')}\n")
        out.flush()
