"""`finetune-studio serve RUN_DIR [--format ...] [--port N]`: an OpenAI-compatible server on 127.0.0.1.

Picks the engine (engines.py), prints the command it runs and the token once, starts it offline on the
local folder, says when it answers, and on Ctrl-C (or SIGTERM, the studio's Stop) stops it with every
process it started and frees the port. Torch-free: the server imports what it needs in its own process.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from typing import Any

from backend.cli.checks import positive_int, probability
from backend.cli.serve import CARD_GB_HELP, card_gb
from backend.core.config.run_config import ConfigError
from backend.core.registries.export_formats import CALIBRATED
from backend.serving import Card, resolve
from backend.core.registries.serving_options import DEVICES, ENGINES, SERVED_FORMATS, TOKEN_ENV
from backend.serving.engines import (ServeLaunch, choose_engine, llama_cpp_launch,
                                     transformers_launch, vllm_launch)
from backend.serving.server_process import ServerFailed, ServerProcess, free_port
from backend.serving.sizing import BATCHED_TOKENS, BLOCK_SIZE, UTILIZATION


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535 (got {text}); 0 picks a free one")
    return value


def add_serve_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve", help="serve a run's export on 127.0.0.1 with an OpenAI-compatible API (continuous batching)",
        description="Start an OpenAI-compatible server for a run's export (or a model folder) on 127.0.0.1:\n"
                    "transformers serve with continuous batching by default (CPU or GPU), vLLM where it is\n"
                    "installed and a GPU is used, llama.cpp's server for a GGUF export. The calibrated exports\n"
                    f"({', '.join(CALIBRATED)}) load through compressed-tensors in transformers and vLLM.\n"
                    "The server requires a token (printed once). Ctrl-C stops it and every process it started.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="RUN_DIR", help="a run folder, an export folder, or a model folder")
    parser.add_argument("--format", choices=list(SERVED_FORMATS), default=None,
                        help="which export to serve (default: the run's first export in this order, else merged)")
    parser.add_argument("--port", type=_port, default=8000, help="port on 127.0.0.1 (default 8000; 0 picks a free one)")
    parser.add_argument("--engine", choices=ENGINES, default="auto",
                        help="auto: llama-cpp for GGUF, vllm when installed and not --device cpu, else transformers")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where the model runs (transformers)")
    parser.add_argument("--context", type=positive_int, default=None,
                        help="longest request in tokens, prompt + answer (vLLM's --max-model-len; llama.cpp's n_ctx)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=None,
                        help="sequences batched at once: sizes the paged KV cache (transformers on the CPU: default "
                             "8) or vLLM's context for that many (vLLM: default, the most that fit at --context)")
    parser.add_argument("--card-gb", type=card_gb, default=None,
                        help=f"vLLM: {CARD_GB_HELP} (default: the first CUDA GPU's)")
    parser.add_argument("--gpu-memory-utilization", type=probability, default=UTILIZATION, help="vLLM's share of the card")
    parser.add_argument("--tensor-parallel", type=positive_int, default=1, help="vLLM: GPUs the model is split over")
    parser.add_argument("--ready-timeout", type=positive_int, default=600, help="seconds to wait for the model to load")
    parser.set_defaults(func=cmd_serve)
    return parser


def plan(args: argparse.Namespace, token: str) -> ServeLaunch:
    """The launch for these arguments, or a one-line ValueError. `--device auto` is cuda when NVML sees a
    GPU, else cpu (found without torch: device_caps.detected_device)."""
    from backend.core.device_caps import detected_device

    source = resolve(args.model, args.format)
    detected = detected_device() if args.device == "auto" or (args.engine == "vllm" and not args.card_gb) else None
    device = detected.kind if args.device == "auto" and detected else args.device
    engine = choose_engine(source, args.engine, device)
    port = args.port or free_port()
    if engine == "vllm":
        if not args.card_gb and not (detected and detected.devices):
            raise ValueError("--engine vllm: no CUDA GPU found to size the server for; give --card-gb")
        card_gb = args.card_gb or detected.devices[0].total_bytes / 2**30  # GiB, as --card-gb
        card = Card(card_gb, args.gpu_memory_utilization, args.tensor_parallel, BLOCK_SIZE, BATCHED_TOKENS)
        return vllm_launch(source, port, token, card, args.context, args.max_num_seqs)
    if engine == "llama-cpp":
        return llama_cpp_launch(source, port, token, args.context)
    return transformers_launch(source, port, token, device, args.context, args.max_num_seqs)


_PRINT = threading.Lock()


def say(line: str) -> None:
    """One whole line to stdout: the server's output is relayed from another thread, and print() writes
    the text and its newline apart, so two threads could glue their lines together."""
    with _PRINT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def cmd_serve(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV) or f"fs-{secrets.token_urlsafe(24)}"
    try:
        launch = plan(args, token)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    say(f"engine:  {launch.engine}")
    say(f"command: {launch.shown}")
    for note in launch.notes:
        say(f"note:    {note}")
    server = ServerProcess(launch, token, on_line=lambda line: say(f"  | {line}"))
    signal.signal(signal.SIGTERM, _raise_interrupt)  # the studio's Stop: the same clean stop as Ctrl-C
    try:
        try:
            server.start()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        say(f"token:   {token}  (printed once; clients send it as the API key)")
        say(f"pid:     {server.pid}")
        server.wait_ready(args.ready_timeout)
        say(f"ready:   {launch.base_url}  model {launch.model}")
        say(f"try:     curl {launch.base_url}/chat/completions -H 'Authorization: Bearer <token>' "
            "-H 'Content-Type: application/json' -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'")
        say("Ctrl-C stops the server")
        assert server.child is not None
        server.child.wait()
        print(f"error: {server.failure()}", file=sys.stderr, flush=True)
        return 1
    except ServerFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        say("stopping the server")
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second Stop while we clean up must not cut it short
        server.stop()
        if server.child is not None:
            say(f"stopped: port {launch.port} is free")
