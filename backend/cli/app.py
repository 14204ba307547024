"""`finetune-studio train|runs|estimate ...`: the headless client of the same worker the studio uses.

Torch-free: the CLI starts the worker exactly as the studio does (backend/api/launch.py) and reads its
events through the same protocol session (backend/api/protocol_session.py), so a run from a terminal
and one from the window are the same run.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

from backend.cli.checks import load_for_train, non_negative_int, open_run_folder, positive_int, refuse_what_cannot_run
from backend.cli.errors import OneLineParser, run_guarded
from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.config.help import fields_epilog
from backend.core.errors import JobError
from backend.core.paths import usable_home
from backend.api.run_index import RunIndex
from backend.core.runs.run_folder import RunFolder
from backend.cli.estimate import add_estimate_arguments, cmd_estimate
from backend.cli.worker_process import WorkerProcess


class ProgressPrinter:
    """Turns worker events into terminal lines; one per command, so two runs never share a line count."""

    def __init__(self, out) -> None:
        self.out = out
        self.printed_step = 0

    def __call__(self, event: dict) -> None:
        _progress(event, self.out, self)


def _progress(event: dict, out, printer: ProgressPrinter) -> None:
    kind = event["type"]
    if kind == "PhaseChanged":
        out.write(f"\r\033[K[{event['phase']}] {event.get('detail', '')}\n" if out.isatty()
                  else f"[{event['phase']}] {event.get('detail', '')}\n")
    elif kind == "MetricsLogged":
        step, total = event["step"], max(event["max_steps"], 1)
        width = 30
        filled = int(width * step / total)
        loss = event.get("loss")
        tps = event.get("tokens_per_s")
        text = (f"[{'#' * filled}{'.' * (width - filled)}] step {step}/{total}"
                f"  loss {loss:.4f}" if loss is not None else f"step {step}/{total}")
        if tps:
            text += f"  {tps:,.0f} useful tok/s"
        if event.get("mfu"):
            text += f"  MFU {100 * event['mfu']:.1f}%"
        if event.get("image_rows_seen") is not None:  # a vision-language run
            text += f"  {event['image_rows_seen']:,} image rows, {event.get('image_tokens_seen') or 0:,} image tokens"
        if out.isatty():
            out.write("\r\033[K" + text)
        elif step == total or step - printer.printed_step >= max(1, total // 10):
            # Not a terminal: a line every tenth of the run (metrics arrive coalesced, not every step).
            printer.printed_step = step
            out.write(text + "\n")
    elif kind == "TokensGenerated" and event.get("done"):
        out.write(f"    -> {event['text'].strip()[:100]!r}\n")
    elif kind == "CheckpointSaved":
        out.write(("\r\033[K" if out.isatty() else "") + f"checkpoint saved at step {event['step']}\n")
    elif kind == "EvalFinished" and event.get("eval_loss") is not None:
        out.write(("\r\033[K" if out.isatty() else "") + f"eval loss {event['eval_loss']:.4f} at step {event['step']}\n")
    out.flush()


def cmd_train(args: argparse.Namespace) -> int:
    folder, config = _train_target(args)
    args.run_folder = folder.path  # an internal error's traceback goes to its worker.log
    err = sys.stderr
    err.write(f"run folder: {folder.path}\n")
    worker = WorkerProcess(machine_rank=args.machine_rank)
    terminal = worker.run(folder, config, resume=bool(args.resume), on_event=ProgressPrinter(err))
    err.write("\n" if err.isatty() else "")
    _index_run(folder)
    if terminal["type"] == "JobFinished":
        _summary(terminal)
        return 0
    print(f"error: {terminal['message']}", file=sys.stderr)
    if terminal.get("hint"):
        print(f"hint: {terminal['hint']}", file=sys.stderr)
    return 2 if terminal.get("kind") == "bad_input" else 1  # bad input: 2, as every refusal before the run


def _train_target(args: argparse.Namespace) -> tuple[RunFolder, RunConfig]:
    """The run folder and config `train` was asked for: a new run, a resumed one, or a finished one
    trained more steps as a new run; anything ambiguous is refused before a folder is made."""
    if args.more_steps is not None and not args.resume:
        raise ConfigError("--more-steps N trains a finished run further: give that run with --resume RUN_DIR")
    if args.resume and args.config:
        raise ConfigError("give a config file or --resume RUN_DIR, not both: a resumed run trains with its own "
                          "config.yaml (change a field with --set KEY=VALUE), a config file starts a new run")
    if not args.resume:
        if not args.config:
            raise ConfigError("give a config file (e.g. resources/presets/tiny_lora.yaml) or --resume RUN_DIR")
        config = load_for_train(args.config, args.set)
        _check_rank(args.machine_rank, config)
        # every problem at once, before a folder is made or a worker starts
        overridden = refuse_what_cannot_run(config, start_anyway=args.start_anyway)
        usable_home()  # a home that is a file is said before any folder is made
        folder = RunFolder.create(config)
        if overridden:
            folder.record_started_anyway(overridden)
            sys.stderr.write(f"started anyway ({len(overridden)} verdict(s) overridden, recorded in "
                             f"{folder.path / 'started_anyway.json'})\n")
        return folder, config
    source = open_run_folder(args.resume)
    config = RunConfig.load(source.config_path, args.set)
    _check_rank(args.machine_rank, config)
    if args.more_steps is not None:
        return _more_steps(source, args.more_steps, args.set, args.start_anyway)
    if source.status() == "finished":
        raise ConfigError(f"{source.path} has finished; resuming would train it again and rewrite its results. "
                          f"Train it for more steps as a new run: --resume {source.path} --more-steps N")
    checkpoint = source.latest_checkpoint()
    if checkpoint is None:
        raise ConfigError(f"{source.path}: no complete checkpoint to resume from; start a new run with "
                          f"`finetune-studio train {source.config_path}`")
    from backend.core.runs.run_continuation import resume_mismatch

    mismatch = resume_mismatch(checkpoint, config)
    if mismatch:
        raise ConfigError(f"--resume {source.path}: {mismatch}")
    overridden = refuse_what_cannot_run(config, start_anyway=args.start_anyway)
    if overridden:
        source.record_started_anyway(overridden)
    return source, config


def _check_rank(rank: int, config: RunConfig) -> None:
    machines = config.hardware.num_machines
    if rank >= machines:
        raise ConfigError(f"--machine-rank {rank}: this run has hardware.num_machines {machines}, "
                          f"so its ranks are 0 to {machines - 1}")


def _more_steps(source: RunFolder, steps: int, overrides: list[str],
                start_anyway: bool) -> tuple[RunFolder, RunConfig]:
    """A new run that trains `steps` past `source`'s newest checkpoint (run_continuation); source is kept."""
    from backend.core.runs.run_continuation import continue_run

    # before the new run's folder is made
    overridden = refuse_what_cannot_run(RunConfig.load(source.config_path, overrides), start_anyway=start_anyway)
    try:
        folder = continue_run(source, steps)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"--resume {source.path}: {exc}") from None
    if overridden:
        folder.record_started_anyway(overridden)
    config = RunConfig.load(folder.config_path, overrides)
    if overrides:
        config.save(folder.config_path)  # the new run's folder records what it trains with
    checkpoint = folder.latest_checkpoint()
    sys.stderr.write(f"training {source.run_id} for {steps} more steps as a new run from its "
                     f"{checkpoint.name if checkpoint else 'checkpoint'}; the finished run is kept as it is\n")
    return folder, config


def _index_run(folder: RunFolder) -> None:
    """Record the run in the index; the index is a cache, so a failure there is a note, never an error."""
    try:
        index = RunIndex()
        try:
            index.update(folder)
            if index.rebuilt:
                print(f"note: {index.rebuilt}", file=sys.stderr)
                index.sync()
        finally:
            index.close()
    except (OSError, sqlite3.Error, JobError) as exc:
        reason = getattr(exc, "message", None) or str(exc)
        print(f"note: the run list was not updated ({reason}); the run itself is saved in {folder.path}",
              file=sys.stderr)


def _summary(event: dict) -> None:
    def fmt(value, spec):
        return format(value, spec) if isinstance(value, (int, float)) else "n/a"

    lines = [
        "stopped early, checkpoint saved" if event.get("stopped") else "finished",
        f"run folder:  {event['run_dir']}",
        f"steps:       {event.get('steps')}",
        f"loss:        {fmt(event.get('first_loss'), '.4f')} -> {fmt(event.get('final_loss'), '.4f')}",
        f"tokens/s:    {fmt(event.get('tokens_per_s'), ',.0f')} (non-padding tokens the loss sees)",
        (f"MFU:         {100 * event['mfu']:.1f}% of this machine's measured peak" if event.get("mfu")
         else "MFU:         n/a (not measured for this run)"),
        f"time:        {fmt(event.get('seconds'), '.1f')} s"
        + (f" (torch.compile {event['compile_seconds']:.1f} s of it)" if event.get("compile_seconds") else ""),
        f"adapter:     {event.get('adapter_path')}",
    ]
    print("\n".join(lines))


def cmd_runs_list(args: argparse.Namespace) -> int:
    index = RunIndex()
    try:
        runs = index.sync()
    finally:
        index.close()
    for note in ([index.rebuilt] if index.rebuilt else []) + [f"skipped {u}" for u in index.unreadable]:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps([r.__dict__ for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs yet")
        return 0
    print(f"{'run':44} {'status':10} {'steps':>6} {'loss':>8} {'useful tok/s':>12}")
    for r in runs:
        loss = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        tps = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-"
        print(f"{r.run_id:44} {r.status:10} {r.steps:>6} {loss:>8} {tps:>12}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="finetune-studio", description="Fine-tune a language model.")
    sub = parser.add_subparsers(dest="command", required=True)
    fields = {"epilog": fields_epilog(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    train = sub.add_parser("train", help="run a fine-tune headless, with a progress bar", **fields)
    train.add_argument("config", nargs="?", help="RunConfig YAML (the studio saves the same file)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a field, e.g. --set train.max_steps=10 (repeatable)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a stopped run from its newest complete checkpoint (a path or a run id)")
    train.add_argument("--more-steps", type=positive_int, metavar="N",
                       help="with --resume of a finished run: train N more steps as a new run "
                            "(the finished one is kept)")
    train.add_argument("--start-anyway", action="store_true",
                       help="start although the estimate is over this machine's memory (recorded in the run "
                            "folder's started_anyway.json); every other problem still refuses")
    train.add_argument("--machine-rank", type=non_negative_int, default=0,
                       help="this machine's rank in a multi-node run (hardware.num_machines > 1)")
    train.set_defaults(func=cmd_train)
    est = sub.add_parser("estimate", help="predict the memory a run will take, part by part", **fields)
    add_estimate_arguments(est)
    est.set_defaults(func=cmd_estimate)
    from backend.cli.eval import add_chat_parser, add_eval_parser

    add_eval_parser(sub)
    add_chat_parser(sub)
    runs = sub.add_parser("runs", help="past runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    listing = runs_sub.add_parser("list", help="list runs, newest first")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_runs_list)
    from backend.cli.export import add_export_parser

    add_export_parser(sub)
    from backend.cli.serve import add_serve_estimate_parser

    add_serve_estimate_parser(sub)
    from backend.cli.prune import add_prune_parser

    add_prune_parser(sub)
    from backend.cli.serve_run import add_serve_run_parser

    add_serve_run_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every subcommand runs through run_guarded: whatever it raises becomes one line and an exit code."""
    return run_guarded(list(sys.argv[1:] if argv is None else argv), build_parser)


if __name__ == "__main__":
    sys.exit(main())
