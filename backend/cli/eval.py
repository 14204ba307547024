"""`finetune-studio eval|chat RUN_DIR ...`: the headless face of the evaluate and chat jobs. Torch-free.

Both start the same worker the studio starts (`WorkerProcess(job=...)`) with the run's own
config.yaml; `eval` prints the base and tuned figures side by side from eval_report.json, `chat`
prints the answer(s) as the tokens stream in (`--image PATH` shows a vision-language run's models an image;
a text model's run is refused before a worker starts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import IO, Any

from backend.api.evaluation_rows import report_note, report_rows
from backend.api.vision import read_vision
from backend.cli.checks import existing_file, non_negative_float, open_run_folder, positive_int, probability
from backend.core.config.run_config import ConfigError
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess

REPORT = "eval_report.json"  # the name backend.jobs.evaluate writes (kept here: the CLI never imports torch)


def _run_folder(args: argparse.Namespace) -> RunFolder:
    folder = open_run_folder(args.run_dir)
    args.run_folder = folder.path  # an internal error's traceback goes to its worker.log
    return folder


def _failed(terminal: dict[str, Any]) -> int:
    print(f"error: {terminal.get('message')}", file=sys.stderr)
    if terminal.get("hint"):
        print(f"hint: {terminal['hint']}", file=sys.stderr)
    return 2 if terminal.get("kind") == "bad_input" else 1


# --- eval ------------------------------------------------------------------------------------

def _eval_progress(event: dict[str, Any], out: IO[str]) -> None:
    if event["type"] != "PhaseChanged":
        return
    detail = event.get("detail", "")
    text = f"[{event['phase']}] {detail}"
    batches = event["phase"] in ("perplexity", "exact_match", "mean_reward", "preference")
    if out.isatty():
        out.write("\r\033[K" + text + ("" if batches else "\n"))
    elif not batches or _stage_done(detail):
        out.write(text + "\n")  # batch progress only once a stage completes
    out.flush()


def _stage_done(detail: str) -> bool:
    """The detail's count ("base 20/20 examples") is complete."""
    count = re.search(r"(\d+)/(\d+)", detail)
    return count is not None and count.group(1) == count.group(2)


def format_report(report: dict[str, Any]) -> str:
    """The side-by-side table: perplexity and exact match, base and tuned."""
    def cell(section: dict[str, Any] | None, which: str, key: str, spec: str) -> str:
        if not section:
            return "-"
        value = section[which].get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    if report.get("mean_reward") or report.get("preference"):  # GRPO, DPO, KTO: their own rows
        table = [f"{'':22} {'base':>12} {'tuned':>12}"]
        table += [f"{row.label.rstrip(' ↑↓').lower() if not row.label.startswith(' ') else row.label:22} "
                  f"{row.base:>12} {row.tuned:>12}" for row in report_rows(report)]
        return "\n".join(table + ["", report_note(report)])
    ppl, em = report.get("perplexity"), report.get("exact_match")
    rows = [
        f"{'':22} {'base':>12} {'tuned':>12}",
        f"{'perplexity':22} {cell(ppl, 'base', 'perplexity', '.2f'):>12} {cell(ppl, 'tuned', 'perplexity', '.2f'):>12}",
        f"{'exact match':22} {cell(em, 'base', 'accuracy', '.1%'):>12} {cell(em, 'tuned', 'accuracy', '.1%'):>12}",
    ]
    notes = []
    if ppl:
        notes.append(f"perplexity: validation split, {ppl['examples']} examples, {ppl['tokens']} answer tokens")
    if em:
        notes.append(f"exact match: {em['n']} prompts from {em['prompts_file']}, greedy, "
                     f"{em['max_new_tokens']} new tokens at most")
        if em.get("in_training"):  # the prompts are (partly) the training data: say it, whatever the score
            itself = " (the prompts file is the training data itself)" if em.get("same_file") else ""
            notes.append(f"warning: {em['in_training']} of {em['n']} prompts are also in the training data{itself}, "
                         "so exact match is not held out")
    notes += report.get("skipped", [])
    return "\n".join(rows + [""] + notes)


def cmd_eval(args: argparse.Namespace) -> int:
    folder = _run_folder(args)
    config = folder.load_config()
    params: dict[str, Any] = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
    if args.prompts:
        params["prompts"] = str(existing_file(args.prompts, "--prompts"))
    if args.limit is not None:
        params["limit"] = args.limit
    err = sys.stderr
    worker = WorkerProcess(job="evaluate", params=params)
    terminal = worker.run(folder, config, on_event=lambda e: _eval_progress(e, err))
    if terminal["type"] != "JobFinished":
        return _failed(terminal)
    report = json.loads((folder.path / REPORT).read_text(encoding="utf-8"))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    if not args.json:
        print(f"report: {folder.path / REPORT}")
    return 0


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("eval", help="compare the base and tuned model: perplexity and exact match "
                                                "(a GRPO run: the mean reward of its reward functions)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run folder (it holds config.yaml and adapter/)")
    parser.add_argument("--prompts", metavar="FILE",
                        help='held-out JSONL of {"prompt", "expected"} or alpaca records '
                             "(default: the eval file beside the training data, e.g. demo_eval.jsonl)")
    parser.add_argument("--limit", type=positive_int, metavar="N", help="score only the first N prompts (at least 1)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None, metavar="N",
                        help="longest answer generated (32; a GRPO run: its grpo.max_completion_length)")
    parser.add_argument("--json", action="store_true", help="print eval_report.json instead of the table")
    parser.set_defaults(func=cmd_eval)
    return parser


# --- chat ------------------------------------------------------------------------------------

class _ChatPrinter:
    """Prints streamed pieces to stdout; a label line before each answer when there are two."""

    def __init__(self, out: IO[str], labelled: bool):
        self.out = out
        self.labelled = labelled

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "PhaseChanged" and event["phase"] == "generate" and self.labelled:
            self.out.write(f"[{event.get('detail')}]\n")
        elif kind == "TokensGenerated":
            self.out.write(event["text"])
            if event.get("done"):
                self.out.write("\n")
        self.out.flush()


def cmd_chat(args: argparse.Namespace) -> int:
    if not args.message.strip():
        raise ConfigError("the message is empty; give the text to ask, e.g. chat RUN_DIR \"What is LoRA?\"")
    folder = _run_folder(args)
    config = folder.load_config()
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.message}]
    params: dict[str, Any] = {"model": args.model, "temperature": args.temperature, "top_p": args.top_p,
                              "max_new_tokens": args.max_new_tokens, "messages": messages}
    if args.seed is not None:
        params["seed"] = args.seed
    if args.image:
        model = config.resolved_model_path()
        if (model / "config.json").is_file() and read_vision(model).family is None:  # else the worker decides
            raise ConfigError(f"--image: this model reads no images ({config.model.path} is a text model); "
                              "ask without --image, or chat with a run of a vision-language model")
        params["images"] = [str(existing_file(path, "--image")) for path in args.image]
    printer = _ChatPrinter(sys.stdout, labelled=args.model == "both")
    terminal = WorkerProcess(job="chat", params=params).run(folder, config, on_event=printer)
    return 0 if terminal["type"] == "JobFinished" else _failed(terminal)


def add_chat_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("chat", help="ask a run's model one message; the answer streams in")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder")
    parser.add_argument("message", help="what to ask")
    parser.add_argument("--model", choices=["base", "tuned", "both"], default="tuned",
                        help="answer with the base model, the tuned one, or both in turn (tuned)")
    parser.add_argument("--temperature", type=non_negative_float, default=0.7, metavar="T",
                        help="0 for greedy answers (0.7)")
    parser.add_argument("--top-p", type=probability, default=0.9, metavar="P", help="nucleus sampling mass (0.9)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N", help="longest answer (256)")
    parser.add_argument("--system", metavar="TEXT", help="a system message before yours")
    parser.add_argument("--seed", type=int, help="seed for sampling (same seed, same answer)")
    parser.add_argument("--image", action="append", metavar="PATH",
                        help="an image the message shows (repeatable; a vision-language run only); "
                             "it goes where the message writes <image>, else before the text")
    parser.set_defaults(func=cmd_chat)
    return parser
