"""Useful tokens/s of the studio's worker against a bare transformers + peft Trainer script.

Same model, data, LoRA settings, batch and step count; runs alternate in one invocation so that
machine noise hits both. "Useful" means tokens the loss sees: padding and masked prompt tokens are
not counted, for either side. Prints each run, the medians and the ratio (studio / baseline).

    python bench/throughput.py                       # the preset on the bundled model
    python bench/throughput.py --rounds 3 --steps 40
    python bench/throughput.py --data tests/fixtures/peer-data/alpaca_en_demo.json   # uneven lengths
    # on a GPU: a 0.6B model built from a config, bf16 (both sides), LoRA and QLoRA, peak memory too
    python bench/throughput.py --model-size 0.6b --data tests/fixtures/peer-data/alpaca_en_demo.json \
        --seq-len 1024 --method qlora --rounds 2
    # steady state (GPU): the first 3 steps left out, 20 measured, useful tokens/s and peaks side by side
    python bench/throughput.py --preset resources/presets/llama-3.2-1b_lora_12gb.yaml --model MODEL_DIR \
        --data LONG_ROWS.jsonl --warmup 3 --steps 23 --rounds 1 --set train.gradient_accumulation_steps=1
    # the speed shortcuts (backend/core/registries/shortcuts.py): studio with them (auto) against without
    # (off), and each shortcut's own worth: auto against auto with that one shortcut left out
    python bench/throughput.py --shortcuts --model-size 1024 --vocab 32000 --rounds 3 --steps 4 \
        --data tests/fixtures/peer-data/alpaca_en_demo.json --batch 2
    # the same, switched per training step in one process (bench/shortcut_worth.py): finer than runs
    python bench/throughput.py --toggle --model-size 1024 --vocab 32000 --steps 30 \
        --data tests/fixtures/peer-data/alpaca_en_demo.json --batch 2

The studio side runs with its default threads (at most all cores but one, so the desktop keeps a
core, fewer where a measured training pass is faster on fewer; OMP_WAIT_POLICY=PASSIVE) and pinned
to as many threads as the baseline uses; the baseline runs with its
defaults (every core, OpenMP's spinning wait) and with the studio's default thread count. The
headline ratio is defaults against defaults; the equal-threads ratio shows what the training path
itself gains, apart from the core the studio leaves to the desktop. On a GPU both sides run their
defaults (bf16), and the peak of torch's allocated memory is compared too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # before transformers; the worker and the baseline inherit it

if "--toggle" in sys.argv:  # in this process, as in the worker: set before torch loads OpenMP
    from backend.core.cpu_features import RUNTIME_ENV

    for _name, _value in RUNTIME_ENV.items():
        os.environ.setdefault(_name, _value)

def run_baseline(params: dict, threads: int | None = None) -> dict:
    """The bare Trainer (bench/throughput_baseline.py) in its own process."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run([sys.executable, str(ROOT / "bench/throughput_baseline.py"), json.dumps(params)],
                          capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(done.stderr[-2000:])


def run_studio(preset: Path, overrides: list[str]) -> dict:
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder
    from backend.cli.worker_process import WorkerProcess

    config = RunConfig.load(preset, overrides)
    folder = RunFolder.create(config)
    terminal = WorkerProcess().run(folder, config)
    if terminal["type"] != "JobFinished":
        raise RuntimeError(terminal["message"])
    # Timed like the baseline: wall clock from train begin to the last step, reporting included (the
    # studio's own tokens/s leaves its reporting out, so it reads a little higher than this).
    events = [json.loads(line) for line in (folder.path / "events.jsonl").read_text().splitlines()]
    last = [e for e in events if e["type"] == "MetricsLogged"][-1]
    losses = [e["loss"] for e in events if e["type"] == "MetricsLogged"]
    peaks = [(e.get("memory") or {}).get("peak_bytes") for e in events if e["type"] == "MetricsLogged"]
    chosen = [e["detail"] for e in events if e["type"] == "PhaseChanged" and e["phase"] == "threads"]
    threads = int(chosen[-1].split()[0]) if chosen and chosen[-1][:1].isdigit() else None  # measured count
    return {**terminal, "reported_tokens_per_s": terminal["tokens_per_s"], "events": events, "run_dir": folder.path,
            "tokens_per_s": last["tokens_seen"] / last["elapsed_s"], "losses": losses,
            "peak_bytes": max((p for p in peaks if p), default=None), "threads": threads}


MODEL_SIZES = {
    # Llama shapes at the bundled tokenizer's 4096-token vocabulary; weights random (seeded): speed
    # and memory depend on the shapes, not on what the weights know.
    "0.6b": dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=12,
                 num_key_value_heads=4, head_dim=128),
    # Qwen3-0.6B's widths (hidden 1024, MLP 3072, 16 heads, 8 KV heads) at 8 of its 28 layers, so
    # that a CPU runs a few steps per minute; with a 32k vocabulary the output projection's share of
    # the weights (0.26) is near the real model's at 28 layers and 152k (0.35).
    "1024": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=64),
    # TinyLlama-1.1B's widths (hidden 2048, MLP 5632, 32 heads, 4 KV heads) at 4 of its 22 layers.
    "2048": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=64),
}


def build_model(size: str, tokenizer_dir: Path, out: Path, vocab: int | None = None) -> Path:
    """A model of the named size from a config, with the bundled tokenizer, saved in bf16; a larger
    `vocab` than the tokenizer's gives the output projection a real model's size (ids past the
    tokenizer's are never seen, which changes no cost)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    bundled = json.loads((tokenizer_dir / "config.json").read_text())
    config = LlamaConfig(vocab_size=max(vocab or 0, bundled["vocab_size"]), max_position_embeddings=2048,
                         tie_word_embeddings=True,
                         bos_token_id=bundled["bos_token_id"], eos_token_id=bundled["eos_token_id"],
                         pad_token_id=bundled["pad_token_id"], **MODEL_SIZES[size])
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    print(f"built a {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B-parameter model in {out}", flush=True)
    return out


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def quarters(losses: list[float]) -> list[float]:
    """Mean loss over each quarter of the run: the curve's shape without single-batch noise."""
    n = max(1, len(losses) // 4)
    return [statistics.fmean(losses[i:i + n]) for i in range(0, n * 4, n) if losses[i:i + n]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=str(ROOT / "resources/presets/tiny_lora.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), help="build a model of this size from a config")
    parser.add_argument("--data", help="instruction data (JSON lines or an alpaca JSON list); default: the preset's")
    parser.add_argument("--method", choices=["lora", "qlora"], help="default: the preset's")
    parser.add_argument("--batch", type=int, help="micro-batch size; default: the preset's")
    parser.add_argument("--seq-len", type=int, help="default: the preset's")
    parser.add_argument("--vocab", type=int, help="with --model-size: the vocabulary of the built model")
    parser.add_argument("--shortcuts", action="store_true",
                        help="compare the studio with its speed shortcuts (auto), without (off) and without each one")
    parser.add_argument("--toggle", action="store_true",
                        help="the same per training step, in one process (bench/shortcut_worth.py)")
    parser.add_argument("--leave-out", help="with --toggle: only these shortcuts (comma-separated) left out one at a time")
    parser.add_argument("--model", help="a model folder to train (instead of the preset's or --model-size)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another override, both sides")
    parser.add_argument("--warmup", type=int,
                        help="steady state: leave out the first N steps of each side (then at least 20 more are wise)")
    parser.add_argument("--studio-run", help="with --warmup: the studio side is this finished run (made with the same "
                                             "settings, e.g. by bench/gpu_preset_run.py), not a new one")
    parser.add_argument("--json-out", help="with --warmup: write the side-by-side figures here")
    args = parser.parse_args()

    import torch

    from backend.core.config.run_config import RunConfig
    from backend.training.model.capabilities import default_threads

    os.environ["FINETUNE_STUDIO_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    common = [f"train.max_steps={args.steps}", f"train.save_steps={args.steps}"]
    for flag, key in ((args.data, "data.path"), (args.method, "technique.method"), (args.batch, "train.micro_batch_size"),
                      (args.seq_len, "train.seq_len")):
        if flag is not None:
            common.append(f"{key}={Path(flag).resolve() if key == 'data.path' else flag}")
    if args.model:
        common.append(f"model.path={Path(args.model).resolve()}")
    common += args.set
    config = RunConfig.load(args.preset, common)
    if args.model_size:
        model = build_model(args.model_size, config.resolved_model_path(), Path(tempfile.mkdtemp(prefix="bench-model-")),
                            args.vocab)
        common.append(f"model.path={model}")
        config = RunConfig.load(args.preset, common)
    if args.shortcuts:
        return compare_shortcuts(Path(args.preset), common, args.rounds)
    if args.toggle:
        from bench.shortcut_worth import toggle_worth

        return toggle_worth(Path(args.preset), common, args.steps, args.leave_out.split(",") if args.leave_out else None)
    base_threads = os.cpu_count() or 1
    params = {
        "model": str(config.resolved_model_path()), "data": str(config.resolved_data_path()),
        "seq_len": config.train.seq_len, "rank": config.technique.lora_rank, "alpha": config.technique.lora_alpha,
        "batch": config.train.micro_batch_size, "lr": config.train.learning_rate, "steps": args.steps,
        "seed": config.train.seed, "validation_split": config.data.validation_split, "method": config.technique.method,
        "out": tempfile.mkdtemp(prefix="bench-baseline-"), "checkpointing": config.technique.gradient_checkpointing,
    }
    if args.warmup is not None:
        from bench.throughput_steady import steady_compare  # noqa: PLC0415

        return steady_compare(Path(args.preset), common, params, args.warmup, args.steps, args.rounds, args.studio_run,
                              args.json_out)
    cuda = torch.cuda.is_available()
    studio_threads = default_threads()
    results: dict[str, list[float]] = {"studio (default threads)": [], "baseline": []}
    if not cuda:  # threads only matter on the CPU
        results.update({"studio (same threads)": [], "baseline (studio's threads)": []})
    curves: dict[str, list[list[float]]] = {"studio": [], "baseline": []}
    peaks: dict[str, list[int]] = {"studio": [], "baseline": []}
    print(f"{config.technique.method} on {params['model']}, data {params['data']}, micro-batch {params['batch']}, "
          f"seq_len {params['seq_len']}, {args.steps} steps, {'CUDA' if cuda else 'CPU'}", flush=True)
    for round_ in range(args.rounds):
        t0 = time.monotonic()
        a = run_studio(Path(args.preset), common)
        c = run_baseline(params)
        results["studio (default threads)"].append(a["tokens_per_s"])
        results["baseline"].append(c["tokens_per_s"])
        line = (f"round {round_ + 1}: studio {a['tokens_per_s']:,.0f} tok/s (loss {a['first_loss']:.3f}->"
                f"{a['final_loss']:.3f}), baseline {c['tokens_per_s']:,.0f} (loss {c['first_loss']:.3f}->"
                f"{c['final_loss']:.3f})")
        if cuda:
            peaks["studio"].append(a["peak_bytes"])
            peaks["baseline"].append(c["peak_bytes"])
            line += f", peak memory studio {gib(a['peak_bytes'])}, baseline {gib(c['peak_bytes'])}"
        else:
            studio_threads = a["threads"] or default_threads()  # the count its thread choice kept
            b = run_studio(Path(args.preset), common + [f"train.cpu_threads={base_threads}"])
            d = run_baseline(params, threads=studio_threads)
            results["studio (same threads)"].append(b["tokens_per_s"])
            results["baseline (studio's threads)"].append(d["tokens_per_s"])
            line += (f"; threads: studio {studio_threads}, baseline {c['threads']}; studio@{base_threads}t "
                     f"{b['tokens_per_s']:,.0f}, baseline@{d['threads']}t {d['tokens_per_s']:,.0f}")
        print(line + f"  [{time.monotonic() - t0:.0f}s]", flush=True)
        curves["studio"].append(quarters(a["losses"]))
        curves["baseline"].append(quarters(c["losses"]))
    for name, runs in curves.items():  # speed must not be bought with different training
        mean = [statistics.fmean(q[i] for q in runs) for i in range(len(runs[0]))]
        print(f"loss by quarter of the run, {name:8}: " + "  ".join(f"{v:.3f}" for v in mean))
    medians = {k: statistics.median(v) for k, v in results.items()}
    for name, value in medians.items():
        print(f"median {name:26} {value:10,.0f} useful tokens/s")
    print(f"ratio studio/baseline (default threads): {medians['studio (default threads)'] / medians['baseline']:.2f}x")
    # Each round's two runs are adjacent in time, so their ratio cancels the drift of a shared host
    # that moves both medians (same-code runs here differ by up to 35% minutes apart).
    paired = [a / c for a, c in zip(results["studio (default threads)"], results["baseline"])]
    print(f"ratio per round (default threads):       median {statistics.median(paired):.2f}x, "
          f"range {min(paired):.2f}-{max(paired):.2f}x")
    if cuda:
        studio_peak, baseline_peak = max(peaks["studio"] or [0]), max(peaks["baseline"] or [0])
        print(f"peak memory: studio {gib(studio_peak)}, baseline {gib(baseline_peak)}"
              + (f" ({studio_peak / baseline_peak:.2f}x)" if studio_peak and baseline_peak else ""))
    else:
        print(f"ratio studio/baseline (same threads):    {medians['studio (same threads)'] / medians['baseline']:.2f}x")
        equal = medians["studio (default threads)"] / medians["baseline (studio's threads)"]
        print(f"ratio studio/baseline (both {studio_threads} thread(s), each side's default otherwise): {equal:.2f}x")
    return 0


def plan_line(run: dict) -> str:
    return next(e["detail"] for e in run["events"] if e["type"] == "PhaseChanged" and e["phase"] == "plan")


def compare_shortcuts(preset: Path, common: list[str], rounds: int) -> int:
    """auto vs off, and auto vs auto-without-X for each shortcut X that auto uses, alternated in rounds
    (the order rotates each round); prints each round's ratios, whose pairs are close in time."""
    from backend.core.registries.shortcuts import DISABLE_ENV, SHORTCUTS

    def run(variant: str) -> dict:
        os.environ.pop(DISABLE_ENV, None)
        overrides = [*common, "data.validation_split=0"]
        if variant == "off":
            overrides.append("technique.shortcuts=off")
        elif variant != "auto":
            os.environ[DISABLE_ENV] = variant[len("auto-"):]
        try:
            return run_studio(preset, overrides)
        finally:
            os.environ.pop(DISABLE_ENV, None)

    first = run("auto")
    plan = plan_line(first)
    print(f"plan: {plan}", flush=True)
    used = [s.name for s in SHORTCUTS if re_used(plan, s.name) and s.name != "thread_choice"]
    variants = ["auto", "off", *(f"auto-{name}" for name in used)]
    speeds: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, list[float]] = {}
    for round_ in range(rounds):
        t0 = time.monotonic()
        order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
        for variant in order:
            result = run(variant)
            speeds[variant].append(result["tokens_per_s"])
            losses.setdefault(variant, result["losses"])
        print(f"round {round_ + 1}: " + ", ".join(f"{v} {speeds[v][-1]:,.1f}" for v in variants)
              + f" useful tokens/s  [{time.monotonic() - t0:.0f}s]", flush=True)
    for variant in variants[1:]:
        ratios = [a / b for a, b in zip(speeds["auto"], speeds[variant])]
        what = "all shortcuts (auto/off)" if variant == "off" else f"{variant[len('auto-'):]} (auto/without it)"
        print(f"worth of {what:42}: per round {' '.join(f'{r:.3f}' for r in ratios)}; median "
              f"{statistics.median(ratios):.3f}x")
    drift = max(abs(a - b) for a, b in zip(losses["auto"], losses["off"]))
    print(f"largest loss difference, auto vs off, over {len(losses['auto'])} steps: {drift:.2e}")
    return 0


def re_used(plan: str, name: str) -> bool:
    """Whether the plan line's "shortcuts a, b, c (not used: ...)" lists `name` as used."""
    head = plan.split("shortcuts ", 1)[-1].split(" (not used", 1)[0].split(";", 1)[0]
    return name in [part.strip() for part in head.split(",")]


if __name__ == "__main__":
    sys.exit(main())
