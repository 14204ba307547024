"""`finetune-studio estimate CONFIG`: the memory a run will take, part by part, and what would make it fit.

Torch-free, as the estimate is: the verdicts `train` refuses with, the longest row (--max-seq-len), the
changes that fit a card (--fit) and a hub model's config.json fetched alone (--fetch-config).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from backend.cli.checks import positive_int
from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.paths import not_downloaded


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """The estimate command's arguments (cli/app.py makes the subcommand)."""
    parser.add_argument("config", help="RunConfig YAML; model.path may be a folder holding only config.json")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="where the run would train (default: this machine's: cuda where NVML finds a GPU, else cpu)")
    parser.add_argument("--gpus", type=positive_int, default=None,
                        help="number of GPUs (data-parallel processes; default: the config's hardware.num_processes)")
    parser.add_argument("--zero-stage", type=int, default=None, choices=[0, 1, 2, 3],
                        help="DeepSpeed ZeRO stage (default: the config's hardware.strategy)")
    parser.add_argument("--json", action="store_true",
                        help='print {"total_bytes": N, "breakdown": {...}, "device": ..., "verdicts": [...]}')
    parser.add_argument("--fetch-config", action="store_true",
                        help="for a hub:ORG/NAME model not downloaded: fetch its config.json alone (into the folder "
                             "the download fills) and estimate from it")
    parser.add_argument("--worst-case", action="store_true",
                        help="count logits at every position instead of reading the data for its longest answer")
    parser.add_argument("--max-seq-len", action="store_true",
                        help="print the longest train.seq_len that fits (one line; with --json the key max_seq_len): "
                             "on --card-gb's card, else this machine's smallest GPU, else its RAM for a CPU run")
    parser.add_argument("--card-gb", type=positive_int, default=None, metavar="N",
                        help="estimate for a CUDA card of N GB (e.g. 24), its usable memory by backend/estimate/cards.py, "
                             "and say whether the run fits it; the memory --max-seq-len and --fit aim at")
    parser.add_argument("--fit", action="store_true",
                        help="print the changes that bring the estimate under the memory (--card-gb's card, else this "
                             "machine's), least speed lost first, as --set lines with their speed cost (with --json the "
                             "key fit); exit 0 when they fit, else one line saying what still does not fit and exit 1")


def cmd_estimate(args: argparse.Namespace) -> int:
    from backend.estimate.calibration import Calibration
    from backend.core.device_caps import detected_device, device_caps
    from backend.estimate.cards import cuda_cards, usable_bytes
    from backend.estimate.fit import cli_fit
    from backend.estimate.seq_len import card_words, cli_longest_seq_len, cli_target
    from backend.estimate.run_estimate import data_facts, estimate_run

    config = RunConfig.load(args.config, args.set)
    if args.fetch_config:
        from backend.api.hub_config import fetch_model_config

        try:
            print(f"config.json: {fetch_model_config(config.model.path)}", file=sys.stderr)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    _check_estimate_paths(config, args.worst_case)
    found = detected_device()  # torch-free: NVML, as the studio's monitor sees the machine
    device = cli_target(args, found)[0] if args.card_gb else (args.device or found.kind)  # refuses --device cpu
    why = (f"from --card-gb: {card_words(args.card_gb)}" if args.card_gb else
           f"assumed, this machine's: {found.why}; --device chooses" if args.device is None
           else f"from --device; this machine's would be {found.kind}: {found.why}")
    # As the studio does once its Data page has read the data (the same reading, the same answer).
    answer, images = (None, None) if args.worst_case else data_facts(config)
    caps = device_caps(device, found.bf16 if found.kind == device else None,
                       found.devices if found.kind == device else ())
    result = estimate_run(config, device, caps=caps,
                          target_tokens=answer, calibration=Calibration.read(), num_gpus=args.gpus,
                          zero_stage=args.zero_stage, data_rows=not args.worst_case, images_per_row=images)
    breakdown = result.breakdown
    if breakdown is None:  # an unusable config.json: one line naming the file, the key and the fix
        raise ConfigError(result.problem)
    blockers = _start_blockers(config, result, found, caps)
    calibration = result.calibration.note() if device == "cpu" else ""
    cards = cuda_cards(config, result, answer, args.gpus, args.zero_stage)
    seq = cli_longest_seq_len(args, config, found, answer, images) if args.max_seq_len else None
    plan = cli_fit(args, config, found, answer) if args.fit else None
    card_fits = None if not args.card_gb else int(breakdown.total_bytes) <= usable_bytes(args.card_gb)
    if args.json:
        extra = {} if seq is None else {"max_seq_len": seq[0].seq_len, "max_seq_len_limit_bytes": seq[0].limit_bytes,
                                        "max_seq_len_capped": seq[0].capped_at is not None, "max_seq_len_for": seq[1]}
        extra.update({} if plan is None else {"fit": plan.to_json()})
        extra.update({} if card_fits is None else {"card_gb": args.card_gb, "card_fits": card_fits})
        print(json.dumps({**breakdown.to_json(), "device": device, "device_source": why, "calibration": calibration,
                          "start_blocker": result.start_blocker(), "start_blockers": blockers, "cards": cards,
                          **extra,
                          "verdicts": [v.model_dump(mode="json") for v in result.verdicts]}))
        return 1 if plan is not None and not plan.fits else 0
    if seq is not None:
        print(seq[0].sentence(seq[1]))
        return 0
    if plan is not None:
        return _print_fit(plan)
    print(f"device: {device} ({why})")
    print(breakdown.format_table())
    print(f"on CUDA: {cards['sentence']} (per GPU; usable memory per card: backend/estimate/cards.py)")
    if card_fits is not None:
        print(f"{'fits' if card_fits else 'does not fit'} {card_words(args.card_gb)}"
              + ("" if card_fits else "; --fit proposes the changes that would"))
    print(f"logits counted for the data's longest answer, {answer:,} tokens" if answer is not None else
          "logits counted at every position (the worst case: data not read, sampled, or --worst-case)")
    if calibration:
        print(f"runtime: {calibration}")
    for verdict in result.verdicts:
        print(f"runs as {verdict.downgrade_to}: {verdict.message()}" if verdict.downgrade_to else
              f"cannot run here: {verdict.message()} ({verdict.fix}); estimated as {verdict.field} = "
              f"{verdict.estimate_as}")
    for line in blockers:
        print(f"cannot start: {line}")
    return 0


def _print_fit(plan) -> int:
    """--fit: each change as its --set line with its speed cost, or the one line of what still does not fit."""
    if plan.problem or not plan.fits:
        print(plan.sentence(), file=sys.stderr)
        return 1
    print(f"# {plan.sentence()}")
    for step in plan.steps:
        print(f"{' '.join(step.set_args())}  # {step.speed.title}: {step.speed.sentence()}")
    return 0


def _start_blockers(config: RunConfig, result: Any, found: Any, caps: Any) -> list[str]:
    """What `train` would refuse with here (start_verdicts), besides the choices printed above: files,
    the runs folder, GPUs and, on this machine's own device, the estimate against its memory."""
    from backend.estimate.feasibility import blocking_lines
    from backend.estimate.start_verdicts import machine_limit, start_verdicts

    limit = machine_limit(found) if result.device == found.kind else (None, "")
    shown = {v.message() for v in result.verdicts}
    verdicts = start_verdicts(config, caps, result, limit, override="train with --start-anyway")
    return blocking_lines([v for v in verdicts if v.message() not in shown])


def _check_estimate_paths(config: RunConfig, worst_case: bool) -> None:
    """A model folder or data file that is not there is said, not estimated as something else."""
    missing = not_downloaded(config.model.path)
    if missing:
        raise ConfigError(missing)
    model = config.resolved_model_path()
    if not model.exists():
        raise ConfigError(f"model.path {config.model.path}: {model} does not exist; point it at a Hugging Face "
                          "model folder (config.json alone is enough to estimate) or bundled:tiny")
    if model.is_dir() and not (model / "config.json").exists():
        raise ConfigError(f"model.path {config.model.path}: the folder {model} has no config.json; point it at a "
                          "Hugging Face model folder, or copy the model's config.json into it")
    data = config.resolved_data_path()
    if not worst_case and not data.exists():
        raise ConfigError(f"data.path {config.data.path}: {data} does not exist; fix the path, or add "
                          "--worst-case to estimate without reading the data")
