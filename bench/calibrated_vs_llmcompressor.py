"""Our calibrated exports beside llmcompressor's, on the same merged model and calibration rows: perplexity, time, RSS.

llmcompressor runs in its own venv (created on first use: torch, the CPU build, first, so nothing pulls a CUDA
torch, then llmcompressor at LLMCOMPRESSOR, which takes the transformers and compressed-tensors it pins); the
project never imports it. Each side writes each format in its own process, timed with its peak RSS (os.wait4's
rusage of that child): ours through the real export job (its check included, as a person's export runs it),
llmcompressor's through bench/llmcompressor_side.py's oneshot recipes, on the merged model folder, the token ids
of the calibration rows our export picks (samples.calibration_rows) and our writer's group size. Then ONE script
(bench/folder_perplexity.py), in our environment and in fp32, scores the merged model and every output folder on
the same held-out rows; a folder ours cannot load is said so in its row, and scored again in llmcompressor's venv
(labelled so).

    python bench/calibrated_vs_llmcompressor.py                       # train the bundled model, all 3 formats
    python bench/calibrated_vs_llmcompressor.py --quick --formats w8a8
    python bench/calibrated_vs_llmcompressor.py --run RUN_DIR         # a finished run of ours
    python bench/calibrated_vs_llmcompressor.py --model MERGED_DIR    # any merged folder (exported as a full run)
    python bench/calibrated_vs_llmcompressor.py --work DIR            # keep everything; --table DIR prints it again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import llmcompressor_table  # noqa: E402

FORMATS = ["gptq-int4", "awq-int4", "w8a8"]
LLMCOMPRESSOR = "0.14.0.1"
"""The version tested (it pins transformers<=5.17 and compressed-tensors 0.19.0, which its venv gets)."""
TORCH = "2.13.0"
"""Ours; on this machine's disk as the CPU build (pip's find-links), installed first into the venv."""
VENV = Path("/tmp/llmcompressor-venv")
PRESET = ROOT / "resources" / "presets" / "tiny_lora.yaml"
HELD_OUT = ROOT / "resources" / "datasets" / "demo_eval.jsonl"
SAMPLES, QUICK_SAMPLES = 128, 16
"""Calibration rows: the export's default (export_formats.CALIBRATION_SAMPLES_DEFAULT), and --quick's."""
EVAL_ROWS, QUICK_EVAL_ROWS = 100, 20
"""Held-out rows scored: all of demo_eval.jsonl, and --quick's."""


@dataclass
class Measured:
    """One child process: exit code, wall seconds, peak RSS bytes (its rusage), stdout, and where stderr went."""

    rc: int
    wall: float
    peak_rss: int
    stdout: str
    log: Path

    def result(self) -> dict:
        """The JSON after the child's `RESULT ` line ({} when it printed none)."""
        found = re.search(r"^RESULT (.*)$", self.stdout, re.M)
        return json.loads(found.group(1)) if found else {}

    def failure(self) -> str:
        """The last line of the child's stderr: why it failed, in its own words."""
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
        last = (errors or lines or ["no output"])[-1]
        return f"exit {self.rc}: {last[:300]} (log: {self.log})"


def measured(cmd: list[str], env: dict, log: Path) -> Measured:
    """Run `cmd`, stderr into `log`; wall time and the peak RSS of that child alone (os.wait4's rusage)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as err, tempfile.TemporaryFile("w+") as out:
        began = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return Measured(proc.returncode, wall, usage.ru_maxrss * 1024, out.read(), log)


def venv_commands(venv: Path, version: str, have: str | None) -> list[list[str]]:
    """What makes `venv` hold llmcompressor `version` (`have`: the version it holds now, None: none)."""
    if have == version:
        return []
    python = str(venv / "bin" / "python")
    base = getattr(sys, "_base_executable", sys.executable)
    make = [] if (venv / "bin" / "python").exists() else [[base, "-m", "venv", str(venv)]]
    return make + [[python, "-m", "pip", "install", f"torch=={TORCH}"],
                   [python, "-m", "pip", "install", f"llmcompressor=={version}"]]


def ensure_venv(venv: Path, version: str) -> dict:
    """Create or reuse the llmcompressor venv, printing each command it runs; its packages' versions."""
    probe = [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m, json; print(json.dumps({p: "
             "m.version(p) for p in ('llmcompressor', 'compressed-tensors', 'transformers', 'torch')}))"]

    def versions() -> dict:
        if not (venv / "bin" / "python").exists():
            return {}
        done = subprocess.run(probe, capture_output=True, text=True)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    for cmd in venv_commands(venv, version, versions().get("llmcompressor")):
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    found = versions()
    print(f"llmcompressor venv {venv}: " + ", ".join(f"{k} {v}" for k, v in found.items()), flush=True)
    return found


# --- the children in our environment ---------------------------------------------------------------

def child_inputs(run_dir: Path, out: Path, samples: int, eval_rows: int) -> None:
    """Child: the calibration token ids our export uses, the held-out rows, and our writer's group size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from backend.core.data.records import detect_format, read_records, to_conversation
    from backend.core.runs.run_folder import RunFolder
    from backend.export.calibrated import layers
    from backend.export.calibrated.samples import calibration_rows
    from backend.export.merge import TrainedRun, load_tokenizer
    from backend.training.tokenized import encode_conversation

    config = RunFolder(run_dir).load_config()
    run = TrainedRun.check(run_dir, config, "merged")
    tokenizer = load_tokenizer(run)
    rows, described = calibration_rows(config, tokenizer, samples)
    records = read_records(HELD_OUT)
    fmt = detect_format(records, HELD_OUT)
    held_out = []
    for index, record in enumerate(records[:eval_rows]):
        ids, labels = encode_conversation(tokenizer, to_conversation(record, fmt, f"{HELD_OUT} record {index + 1}"))
        held_out.append({"input_ids": ids, "labels": labels})
    source = run.weights_dir if run.full else run.base_path
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    out.write_text(json.dumps({"calibration": rows, "calibration_source": described, "held_out": held_out,
                               "group": layers.group_size(layers.quantized_linears(model))}))


def child_ours(fmt: str, run_dir: Path, out: Path, samples: int) -> None:
    """Child: one export through the export job (as bench/export_memory.py's child, with calibration_samples)."""
    import io

    import torch

    from backend.core.errors import JobError
    from backend.core.runs.run_folder import RunFolder
    from backend.jobs.export import run_export
    from backend.runtime.reporter import Reporter
    from backend.runtime.stop_listener import StopListener

    torch.set_num_threads(os.cpu_count() or 1)
    folder = RunFolder(run_dir)
    params = {"format": fmt, "out": str(out), "overwrite": True, "calibration_samples": samples}
    began = time.monotonic()
    error = None
    try:
        run_export(folder.load_config(), folder.path, Reporter(io.StringIO()), StopListener(io.StringIO()),
                   params=params)
    except JobError as exc:
        error = f"{exc.kind}: {exc.message}"
    print("RESULT " + json.dumps({"job_s": time.monotonic() - began, "error": error}))


# --- the bench ------------------------------------------------------------------------------------

def trained_run(work: Path, env: dict, steps: int) -> Path:
    """The bundled model trained with tiny_lora.yaml through the real `train` command (bench/export_calibrated.py's)."""
    sets = [f"train.max_steps={steps}", "train.save_steps=1000", "name=bench-llmcompressor"]
    train = subprocess.run([sys.executable, "-m", "backend.cli", "train", str(PRESET),
                            *[a for s in sets for a in ("--set", s)]], cwd=ROOT, env=env, capture_output=True,
                           text=True)
    found = re.search(r"adapter:\s+(\S+)/adapter", train.stdout)
    if train.returncode != 0 or not found:
        raise SystemExit(f"training failed:\n{train.stdout[-2000:]}\n{train.stderr[-2000:]}")
    return Path(found.group(1))


def run_of_model(model: Path, work: Path) -> Path:
    """A run folder holding `model` as a full fine-tune's model/, so our export job exports exactly its weights."""
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder

    config = RunConfig.load(PRESET, [f"model.path={model.resolve()}", "technique.method=full",
                                     "name=bench-llmcompressor-model"])
    folder = RunFolder.create(config, work / "runs")
    (folder.path / "model").symlink_to(model.resolve(), target_is_directory=True)
    return folder.path


def render(work: Path) -> str:
    """The table of a finished bench from its work folder (results.json and the perplexity files)."""
    results = json.loads((work / "results.json").read_text())
    sides = {(s["format"], s["tool"]): s for s in results["sides"]}
    elsewhere = work / "perplexity_theirs.json"
    return (llmcompressor_table.table(results["formats"], sides, json.loads((work / "perplexity.json").read_text()),
                                      results["merged"], json.loads(elsewhere.read_text()) if elsewhere.is_file()
                                      else {}) + "\n\n" + results["note"] + f"; work folder {work}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_SAMPLES} calibration rows and {QUICK_EVAL_ROWS} held-out rows "
                             f"(instead of {SAMPLES} and {EVAL_ROWS})")
    parser.add_argument("--samples", type=int, help="calibration rows (overrides --quick's and the default)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=Path, help="a merged model folder (default: train the bundled model)")
    source.add_argument("--run", type=Path, help="a finished run of ours (its merged export is the model)")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the bundled model (preset's 60)")
    parser.add_argument("--venv", type=Path, default=VENV, help=f"llmcompressor's venv (default {VENV})")
    parser.add_argument("--llmcompressor", default=LLMCOMPRESSOR, help=f"its version (default {LLMCOMPRESSOR})")
    parser.add_argument("--work", type=Path, help="folder for everything written (default: a temporary one, removed)")
    parser.add_argument("--table", type=Path, metavar="WORK", help="print the table of a finished bench's --work folder")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.samples is None:
        args.samples = QUICK_SAMPLES if args.quick else SAMPLES
    args.eval_rows = QUICK_EVAL_ROWS if args.quick else EVAL_ROWS
    return args


def main(argv: list[str] | None = None) -> int:
    import export_memory  # switches Hub kernels off for every child (bench/hub_kernels.py)

    args = parse(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "inputs":
            child_inputs(Path(rest[0]), Path(rest[1]), int(rest[2]), int(rest[3]))
        else:
            child_ours(rest[0], Path(rest[1]), Path(rest[2]), int(rest[3]))
        return 0
    if args.table:
        print(render(args.table))
        return 0
    began = time.monotonic()
    work = args.work or Path(tempfile.mkdtemp(prefix="calibrated-vs-llmcompressor-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    theirs_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "FINETUNE_STUDIO_HOME")}
    versions = ensure_venv(args.venv, args.llmcompressor)
    venv_python = str(args.venv / "bin" / "python")
    me = [sys.executable, str(Path(__file__).resolve())]

    if args.model:
        run_dir, merged = run_of_model(args.model, work), args.model.resolve()
    else:
        run_dir = args.run.resolve() if args.run else trained_run(work, env, args.steps)
        merged = work / "merged"
        if not (merged / "config.json").is_file():
            export_memory.run_child("--one", "merged", str(run_dir), str(merged), env=env)
    print(f"run: {run_dir}\nmerged model: {merged}", flush=True)
    inputs = work / "inputs.json"
    done = measured([*me, "--child", "inputs", str(run_dir), str(inputs), str(args.samples), str(args.eval_rows)],
                    env, work / "logs" / "inputs.log")
    if done.rc:
        raise SystemExit(f"reading the calibration rows failed: {done.failure()}")
    data = json.loads(inputs.read_text())
    (work / "calibration.json").write_text(json.dumps({"rows": data["calibration"]}))
    (work / "held_out.json").write_text(json.dumps({"rows": data["held_out"]}))
    print(f"calibration: {data['calibration_source']}; group size {data['group']}; "
          f"{len(data['held_out'])} held-out rows of {HELD_OUT.relative_to(ROOT)}", flush=True)

    sides: dict[tuple[str, str], dict] = {}
    theirs_dtype, theirs_unpinned = None, False
    for fmt in args.formats:
        out = work / "ours" / fmt
        got = measured([*me, "--child", "ours", fmt, str(run_dir), str(out), str(args.samples)], env,
                       work / "logs" / f"ours-{fmt}.log")
        report_path = out / "export_report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        error = got.result().get("error") or (None if got.rc == 0 else got.failure())
        sides[fmt, "ours"] = {"folder": out, "wall": got.wall, "rss": got.peak_rss, "error": error,
                              "quantize": report.get("timings", {}).get("write")}
        out = work / "llmcompressor" / fmt
        shutil.rmtree(out, ignore_errors=True)
        got = measured([venv_python, str(ROOT / "bench" / "llmcompressor_side.py"), fmt, str(merged),
                        str(work / "calibration.json"), str(out), "--group", str(data["group"])], theirs_env,
                       work / "logs" / f"llmcompressor-{fmt}.log")
        result = got.result()
        theirs_dtype = result.get("dtype", theirs_dtype)
        theirs_unpinned = theirs_unpinned or bool(result.get("unpinned"))
        sides[fmt, "llmcompressor"] = {
            "folder": out, "wall": got.wall, "rss": got.peak_rss, "error": None if got.rc == 0 else got.failure(),
            "quantize": sum(result[k] for k in ("load_s", "calibrate_s", "save_s")) if result else None}
        for tool in ("ours", "llmcompressor"):
            side = sides[fmt, tool]
            print(f"  {fmt} {tool}: {side['wall']:.0f} s, peak RSS {side['rss'] / 1e9:.2f} GB"
                  + (f", FAILED {side['error']}" if side["error"] else ""), flush=True)

    folders = [str(merged)] + [str(s["folder"]) for s in sides.values() if not s["error"]]
    done = measured([sys.executable, str(ROOT / "bench" / "folder_perplexity.py"), str(work / "held_out.json"),
                     str(work / "perplexity.json"), *folders, "--packed-zero-points"], env,
                    work / "logs" / "perplexity.log")
    if done.rc:
        raise SystemExit(f"scoring failed: {done.failure()}")
    scores = json.loads((work / "perplexity.json").read_text())
    unloaded = [f for f in folders[1:] if "error" in scores[f]]
    if unloaded:  # scored where they were written, labelled so, with the merged model beside them there
        done = measured([venv_python, str(ROOT / "bench" / "folder_perplexity.py"), str(work / "held_out.json"),
                         str(work / "perplexity_theirs.json"), str(merged), *unloaded], theirs_env,
                        work / "logs" / "perplexity-theirs.log")
        if done.rc:
            print(f"scoring in llmcompressor's venv failed: {done.failure()}", flush=True)
    sides_out = [{"format": f, "tool": t, **{k: str(v) if k == "folder" else v for k, v in s.items()}}
                 for (f, t), s in sides.items()]
    note = (f"ours: the export job (its check included in wall s), Python {sys.version.split()[0]}; llmcompressor side: "
            + ", ".join(f"{k} {v}" for k, v in versions.items())
            + f", the merged model loaded in {theirs_dtype or '?'}"
            + ("" if not theirs_unpinned else ", AWQ's memory pinning switched off (no accelerator)")
            + f"; {len(data['calibration'])} calibration rows, group size {data['group']}, "
            f"{len(data['held_out'])} held-out rows; whole bench {time.monotonic() - began:.0f} s")
    (work / "results.json").write_text(json.dumps({"formats": args.formats, "merged": str(merged),
                                                   "sides": sides_out, "note": note}, indent=2))
    print("\n" + render(work))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
