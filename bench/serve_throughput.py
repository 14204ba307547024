"""Continuous batching, measured: N concurrent clients against the embedded server (`transformers serve
--continuous-batching`, started as `finetune-studio serve` starts it) versus the same requests one at a
time. Prints tokens/s (completion tokens over wall time) and request latency p50/p95 for both, as a
table and as one JSON line.

    python bench/serve_throughput.py                              # the bundled model (resources/tiny)
    python bench/serve_throughput.py --random-0.5b --requests 8   # random Qwen2.5-0.5B-shaped weights
    python bench/serve_throughput.py --model RUN_DIR/exports/merged --device cuda

Every request asks for exactly --max-tokens tokens (greedy; the bundled and random models rarely stop
early, and the count used is the server's usage.completion_tokens either way).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.serving import resolve  # noqa: E402
from backend.serving.engines import transformers_launch  # noqa: E402
from backend.serving.server_process import ServerProcess, free_port  # noqa: E402

QWEN_05B = ROOT / "tests" / "fixtures" / "model_configs" / "Qwen--Qwen2.5-0.5B-Instruct" / "config.json"
TINY = ROOT / "resources" / "tiny"
TOKEN = "fs-bench"


def build_random_05b(folder: Path) -> Path:
    """Qwen2.5-0.5B's config with random float32 weights and the bundled tokenizer (ids past its 4,096
    decode to nothing; the compute is the real model's shape, vocabulary included)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    raw = json.loads(QWEN_05B.read_text())
    raw.update({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**raw), dtype=torch.float32)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY / name, folder / name)
    return folder


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def run_phase(base_url: str, model: str, prompts: list[str], clients: int, max_tokens: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=TOKEN, timeout=3600, max_retries=0)

    def ask(prompt: str) -> tuple[float, int]:
        start = time.perf_counter()
        reply = client.chat.completions.create(model=model, max_tokens=max_tokens, temperature=0,
                                               messages=[{"role": "user", "content": prompt}])
        return time.perf_counter() - start, reply.usage.completion_tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(ask, prompts))
    wall = time.perf_counter() - start
    latencies = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    return {"clients": clients, "requests": len(prompts), "completion_tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1), "p50_s": round(percentile(latencies, 0.5), 2),
            "p95_s": round(percentile(latencies, 0.95), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(TINY), help="a model, export or run folder (default resources/tiny)")
    parser.add_argument("--random-0.5b", dest="random_05b", action="store_true",
                        help="serve random weights of Qwen2.5-0.5B's shape instead of --model")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (and the cache's sequences)")
    parser.add_argument("--requests", type=int, default=16, help="requests in each phase")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens each request asks for")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    try:
        path = build_random_05b(scratch / "qwen05b") if args.random_05b else Path(args.model)
        launch = transformers_launch(resolve(str(path), None), free_port(), TOKEN, args.device,
                                     context=512, seqs=args.clients)
        server = ServerProcess(launch, TOKEN)
        started = time.perf_counter()
        server.start()
        try:
            server.wait_ready(900)
            ready_s = time.perf_counter() - started
            prompts = [f"Request {i}: write a short note about the number {i}." for i in range(args.requests)]
            run_phase(launch.base_url, launch.model, prompts[:2], 2, 4)  # warm up both paths
            one = run_phase(launch.base_url, launch.model, prompts, 1, args.max_tokens)
            many = run_phase(launch.base_url, launch.model, prompts, args.clients, args.max_tokens)
        finally:
            server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"model {'random Qwen2.5-0.5B shape' if args.random_05b else path}, device {args.device}, "
          f"server ready in {ready_s:.1f} s, {args.requests} requests x {args.max_tokens} tokens")
    print(f"{'phase':<22}{'tokens/s':>10}{'wall s':>9}{'p50 s':>8}{'p95 s':>8}")
    for name, row in (("one at a time", one), (f"{args.clients} concurrent", many)):
        print(f"{name:<22}{row['tokens_per_s']:>10}{row['wall_s']:>9}{row['p50_s']:>8}{row['p95_s']:>8}")
    print(f"speed-up {many['tokens_per_s'] / one['tokens_per_s']:.2f}x")
    print(json.dumps({"model": "random-qwen2.5-0.5b" if args.random_05b else str(path), "device": args.device,
                      "ready_s": round(ready_s, 1), "sequential": one, "concurrent": many}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
