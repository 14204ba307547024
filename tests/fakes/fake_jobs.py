"""The fake worker's export, evaluate and chat jobs: the events and report files of backend/jobs, no model.

export: stages as PhaseChanged with MetricsLogged(step, max_steps) progress, a folder with a dummy weight
file and export_report.json (scenario `export_fail`: the perplexity check fails, JobFailed bad_input);
an existing folder without `overwrite` is refused like the real job. evaluate: eval_report.json with
base vs tuned perplexity and exact match. chat: the answer streams as TokensGenerated pieces (base
then tuned for "both", each after PhaseChanged generate) and ends with AnswerFinished; a StopAnswer
or StopJob cuts it. With `session` the fake "loads" once (PhaseChanged load_model) and answers
ChatMessage after ChatMessage until StopJob or stdin closing; a message whose text is "refuse me"
is refused with MessageRefused and the session goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from backend.core.protocol import (
    AnswerFinished,
    JobFailed,
    JobFinished,
    JobStarted,
    MessageRefused,
    MetricsLogged,
    PhaseChanged,
    TokensGenerated,
)

STAGES = ("check", "load_model", "measure", "write", "verify", "report")


def run_job(worker: Any, start: Any) -> int:
    job = {"export": export, "evaluate": evaluate, "chat": chat}[start.job]
    return job(worker, Path(start.run_dir), start.params)


def export(worker: Any, run_dir: Path, params: dict[str, Any]) -> int:
    fmt = params.get("format", "adapter")
    out = Path(params.get("out") or run_dir / "exports" / fmt)
    worker.emit(JobStarted(job="export", run_dir=str(run_dir), max_steps=len(STAGES)))
    if out.exists() and not params.get("overwrite"):
        worker.emit(JobFailed(kind="bad_input", message=f"{out} already holds an export; pass --overwrite",
                              hint="tick Overwrite or pick another folder"))
        return 0
    for number, stage in enumerate(STAGES, start=1):
        worker.emit(PhaseChanged(phase=stage, detail=f"fake {stage}"))
        worker.emit(MetricsLogged(step=number, max_steps=len(STAGES)))
        time.sleep(worker.delay)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.safetensors").write_bytes(b"fake" * 256)
    failing = worker.scenario == "export_fail"
    checks = [
        {"name": "perplexity", "what": "relative perplexity increase over the trained model's",
         "measured": 0.31, "tolerance": 0.25, "passed": False} if failing else
        {"name": "logits", "what": "largest |logit difference| against the trained model",
         "measured": 0.0031, "tolerance": 0.01, "passed": True},
        {"name": "tokenizer", "what": "tokenizer matches", "measured": "identical", "tolerance": "identical",
         "passed": True},
    ]
    report = {"format": fmt, "passed": not failing, "path": str(out), "dtype": params.get("dtype"),
              "files": [{"name": "model.safetensors", "bytes": 1024}], "total_bytes": 1024,
              "loaded_as": "fake loader", "checks": checks}
    (out / "export_report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if failing:
        worker.emit(JobFailed(kind="bad_input", message=f"{fmt} export failed its perplexity check: +31.00% "
                              "(tolerance +25%)", hint="try a higher-precision format"))
        return 0
    worker.emit(PhaseChanged(phase="verified", detail=f"{out}: logits 0.0031 (tolerance 0.01)"))
    worker.emit(JobFinished(run_dir=str(run_dir), seconds=0.1))
    return 0


def evaluate(worker: Any, run_dir: Path, params: dict[str, Any]) -> int:
    worker.emit(JobStarted(job="evaluate", run_dir=str(run_dir)))
    for which in ("base", "tuned"):
        worker.emit(PhaseChanged(phase="load_model", detail=which))
        for done in (0, 4, 8):  # as the real job counts: before the first batch, then after each
            worker.emit(PhaseChanged(phase="perplexity", detail=f"{which} {done}/8 examples"))
            time.sleep(worker.delay)
    report = {
        "perplexity": {"split": "validation", "examples": 8, "tokens": 512,
                       "base": {"perplexity": 12.5, "loss": 2.526, "tokens": 512, "examples": 8},
                       "tuned": {"perplexity": 4.25, "loss": 1.447, "tokens": 512, "examples": 8}},
        "exact_match": {"n": 4, "max_new_tokens": 32, "prompts_file": "held_out.jsonl",
                        "base": {"accuracy": 0.25, "hits": 1, "n": 4}, "tuned": {"accuracy": 0.75, "hits": 3, "n": 4}},
        "skipped": [],
        "examples": [{"prompt": "What is 2 + 2?", "expected": "4", "base": "four", "base_match": False,
                      "tuned": "4", "tuned_match": True}],
    }
    (run_dir / "eval_report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    worker.emit(PhaseChanged(phase="report", detail="perplexity base 12.50 -> tuned 4.25"))
    worker.emit(JobFinished(run_dir=str(run_dir), seconds=0.1))
    return 0


def chat(worker: Any, run_dir: Path, params: dict[str, Any]) -> int:
    worker.emit(JobStarted(job="chat", run_dir=str(run_dir)))
    params = dict(params)
    session = params.pop("session", False)
    answered = 0
    if params.get("messages") is not None or not session:
        answer(worker, params, load=True)
        answered += 1
    while session and not worker.stop.is_set():
        message = worker.inbox.get()
        if message is None:
            break
        worker.cut.clear()
        if message.messages and message.messages[-1].get("content") == "refuse me":
            worker.emit(MessageRefused(message="the fake refuses this message", hint="send another"))
            continue
        answer(worker, message.params(), load=answered == 0)
        answered += 1
    worker.emit(JobFinished(run_dir=str(run_dir), stopped=worker.stop.is_set(), steps=answered, seconds=0.1))
    return 0


def answer(worker: Any, params: dict[str, Any], load: bool) -> None:
    """One answer: pieces per model, "[model on 'last message'] model1 model2 ..." ("... seeing N images]"
    when the conversation carries images), cut by a stop."""
    model = params.get("model", "tuned")
    which = ["base", "tuned"] if model == "both" else [model]
    last = next((m["content"] for m in reversed(params.get("messages", [])) if m.get("role") == "user"), "")
    images = params.get("images") or []
    seen = f" seeing {len(images)} image{'s' if len(images) != 1 else ''}" if images else ""
    pieces = int(params.get("max_new_tokens", 8))
    if load:
        worker.emit(PhaseChanged(phase="load_model", detail=" and ".join(which)))
        time.sleep(worker.delay)
    stopped, tokens = False, 0
    for name in which:
        if worker.stop.is_set() or worker.cut.is_set():
            stopped = True
            break
        worker.emit(PhaseChanged(phase="generate", detail=name))
        for index in range(pieces):
            if worker.stop.is_set() or worker.cut.is_set():
                stopped = True
                break
            worker.emit(TokensGenerated(text=f"{name}{index} " if index else f"[{name} on {last!r}{seen}] "))
            tokens += 1
            time.sleep(worker.delay)
        worker.emit(TokensGenerated(text="", done=True))
    worker.emit(AnswerFinished(stopped=stopped, tokens=tokens, seconds=0.1))
