"""Which server runs an export, and its exact command line and environment. Torch-free.

Three engines serve the OpenAI API on 127.0.0.1: the embedded default, `transformers serve` with
continuous batching (installs with the project's `serve` extra; CPU or GPU), vLLM where it is
installed (its line from the serving estimate, sizing.py), and llama.cpp's server for a GGUF export
where llama-cpp-python is installed. A calibrated export (gptq-int4, awq-int4, w8a8: compressed-tensors)
goes to transformers, which loads it through compressed-tensors on the CPU too, or to vLLM. Every engine
gets a token it requires and an offline environment (no Hub downloads, no Hub kernels), and loads the
local folder.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from backend.core.registries.export_formats import MMPROJ_FILE, export_format
from backend.runtime.processes import module_command, worker_env
from backend.serving import Card, estimate_serving
from backend.serving.source import ServeSource, max_positions
from backend.serving.tf_server import TOKEN_ENV

HOST = "127.0.0.1"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"
"""A warnings filter for the server's multiprocessing resource tracker. The model's process (spawned by
transformers serve, or vLLM's engine) holds named semaphores that a stop by SIGTERM never unregisters; the
tracker, which outlives them, unlinks each one and warns "There appear to be N leaked semaphore objects to
clean up at shutdown" at every Stop. Nothing is left behind (it is that clean-up that speaks), so the
warning only alarms: the filter rides in PYTHONWARNINGS, which the tracker inherits."""
HIDDEN = "<token>"


@dataclass
class ServeLaunch:
    """One server to start: argv and env (the token inside), what to show, what clients ask for."""

    engine: str
    argv: list[str]
    env: dict[str, str]
    model: str
    """The `model` a client sends (the server's name for what it serves)."""
    port: int
    shown: str
    """The command line with the token replaced by HIDDEN."""
    notes: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"


def installed(module: str) -> bool:
    """Whether `module` imports here, without importing it (vllm and llama_cpp are heavy)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


LLAMA_CPP_SERVER = ("llama_cpp.server", "sse_starlette", "starlette_context", "pydantic_settings", "fastapi", "uvicorn")
"""llama_cpp.server and the modules its app imports (the `server` extra): llama-cpp-python built
without the extra has the first and fails on the second at start."""


def video_processor_problem(folder: str) -> str | None:
    """Why `transformers serve` cannot load this vision-language folder here, or None: it builds the processor
    with AutoProcessor, which for Qwen2.5-VL, Qwen3-VL, Qwen3.5 and Gemma 4 also builds a video processor that
    needs torchvision (our own jobs leave it out: training/model/vision_processor.py; the server cannot)."""
    from backend.core.vision_folder import VisionFolder
    from backend.training.model.vision_processor import WITH_VIDEO

    family = VisionFolder.read(Path(folder)).family if Path(folder).is_dir() else None
    if family is None or family.key not in WITH_VIDEO or installed("torchvision"):
        return None
    return (f"transformers serve builds {family.label}'s processor with its video processor, which needs torchvision, "
            f"not installed here: `pip install torchvision` (the build matching torch), or serve with vLLM on a GPU")


def choose_engine(source: ServeSource, engine: str, device: str) -> str:
    """The engine `auto` means, or a one-line ValueError for one that cannot serve this export here."""
    spec = export_format(source.fmt)
    if engine == "auto":  # the first engine that loads the format and runs here (vLLM: on a GPU, where installed)
        engine = next(e for e in spec.served_by if e != "vllm" or (device != "cpu" and installed("vllm")))
    if engine not in spec.served_by and "llama-cpp" in spec.served_by:
        raise ValueError(f"--engine {engine}: a {source.fmt} export is served by llama.cpp (--engine llama-cpp); "
                         "serve the run's merged export with the other engines")
    if engine not in spec.served_by:
        raise ValueError(f"--engine llama-cpp serves a GGUF export; {source.serve_path} is {source.fmt} "
                         "(`--format gguf-q8_0` names the run's GGUF export)")
    if engine == "llama-cpp" and not all(map(installed, LLAMA_CPP_SERVER)):
        raise ValueError("llama-cpp-python's server is not installed, so the GGUF export cannot be served here: "
                         "`pip install 'llama-cpp-python[server]'`, or serve the merged export (--format merged)")
    if engine == "transformers" and spec.calibrated and not installed("compressed_tensors"):
        raise ValueError(f"the compressed-tensors package is not installed, so transformers cannot load the "
                         f"{source.fmt} export: `pip install 'compressed-tensors>=0.20,<0.21'`, or serve the merged "
                         "export (--format merged)")
    if engine == "transformers" and (problem := video_processor_problem(source.serve_path)):
        raise ValueError(problem)
    if engine == "vllm" and not installed("vllm"):
        raise ValueError("vLLM is not installed: `pip install vllm` on a CUDA machine, or leave --engine out "
                         "to serve with transformers")
    if engine == "vllm" and device == "cpu":
        raise ValueError("--engine vllm --device cpu: this project runs vLLM on a CUDA GPU only; leave --engine "
                         "out to serve on the CPU with transformers")
    return engine


def _env(secret: dict[str, str]) -> dict[str, str]:
    env = worker_env()
    env.update(OFFLINE_ENV)
    env["PYTHONWARNINGS"] = ",".join(part for part in (env.get("PYTHONWARNINGS", ""), TRACKER_WARNING) if part)
    env.update(secret)
    return env


def _shown(argv: list[str], token: str) -> str:
    return " ".join(HIDDEN if part == token else shlex.quote(part) for part in argv)


def _needs_merged(source: ServeSource) -> None:
    """A run without the export asked for: say which export to make (these engines load whole weights)."""
    lora = "--enable-lora" in source.flags
    if lora or not Path(source.serve_path).exists():
        run = next((n.split("`")[1] for n in source.notes if "`finetune-studio export" in n), None)
        make = run or f"finetune-studio export RUN_DIR --format {source.fmt}"
        gone = next((n.removesuffix("; skipped") for n in source.notes if "(moved or deleted)" in n), "")
        why = gone or ("the run has its adapter only" if lora else f"{source.serve_path} does not exist")
        raise ValueError(f"no {source.fmt} export to serve ({why}); make it first with `{make}`")


CPU_SEQS = 8
"""Sequences the CPU cache holds at once by default (--max-num-seqs)."""
CPU_CONTEXT = 2048
"""Longest request on the CPU by default (or the model's positions if fewer)."""
CPU_BATCH_TOKENS = 1024
"""Tokens one forward pass takes on the CPU: a longer prompt is prefilled in chunks of this size."""
PAGE_SIZE = 256
"""transformers' ContinuousBatchingConfig.page_size default: tokens of one cache block."""


def cpu_cache_flags(positions: int, context: int | None, seqs: int | None) -> list[str]:
    """--cb-num-blocks and --cb-max-batch-tokens for the CPU. Left alone, transformers sizes its paged cache
    to 90% of free RAM and fills masks that large before it answers; we size it for `seqs` sequences of
    `context` tokens instead."""
    context = min(context or CPU_CONTEXT, positions)
    blocks = -(-(seqs or CPU_SEQS) * context // PAGE_SIZE)
    return ["--max-model-len", str(context), "--cb-num-blocks", str(blocks),
            "--cb-max-batch-tokens", str(min(CPU_BATCH_TOKENS, context))]


def transformers_launch(source: ServeSource, port: int, token: str, device: str, context: int | None = None,
                        seqs: int | None = None) -> ServeLaunch:
    """`transformers serve` (through tf_server, which adds the token) with continuous batching. On the CPU the
    paged cache is sized by cpu_cache_flags; on a GPU transformers sizes it from free memory (--context and
    --max-num-seqs still bound it)."""
    _needs_merged(source)
    command = module_command("backend.serving.tf_server")
    argv = [*command, source.serve_path, "--continuous-batching",
            "--host", HOST, "--port", str(port), "--device", device, "--log-level", "warning"]
    if device == "cpu":
        argv += cpu_cache_flags(max_positions(source.config), context, seqs)
    else:
        if context:
            argv += ["--max-model-len", str(context)]
        if context and seqs:
            argv += ["--cb-num-blocks", str(-(-seqs * context // PAGE_SIZE))]
    shown = "transformers serve " + " ".join(shlex.quote(a) for a in argv[len(command):])
    return ServeLaunch("transformers", argv, _env({TOKEN_ENV: token}), source.serve_path, port,
                       shown + f"  (token required: {TOKEN_ENV}={HIDDEN})", list(source.notes) + unpacked_note(source))


def unpacked_note(source: ServeSource) -> list[str]:
    """What transformers does with a calibrated export (measured on the CPU: the log's "Decompressing model"),
    so nobody takes its speed or memory for the format's."""
    spec = export_format(source.fmt)
    if not spec.calibrated:
        return []
    inputs = f" and rounds every linear layer's input to int{spec.activation_bits} per token" if spec.activation_bits else ""
    return [f"transformers unpacks the {source.fmt} integers to 16-bit weights as it loads them (compressed-tensors)"
            f"{inputs}: it answers as the export does, with 16-bit memory and speed; vLLM on a GPU runs the "
            "integers themselves"]


def vllm_launch(source: ServeSource, port: int, token: str, card: Card, context: int | None = None,
                concurrency: int | None = None) -> ServeLaunch:
    """The serving estimate's `vllm serve` line for `card`, bound to 127.0.0.1, the token in VLLM_API_KEY:
    the most sequences at `context`, the longest context for `concurrency`, or, both given, those two
    when they fit (a one-line refusal saying how many fit when they do not). A calibrated export's line
    carries no --quantization: vLLM takes compressed-tensors from its config.json (source.py's _export)."""
    if "--enable-lora" not in source.flags and not Path(source.serve_path).exists():
        _needs_merged(source)
    both = context is not None and concurrency is not None
    result = estimate_serving(source, card, context, None if both else concurrency)
    if result.get("does_not_fit"):
        raise ValueError(f"does not fit the card: {result['does_not_fit']}")
    plan = result["plans"][-1]  # the concurrency's plan when one was asked, else the context's
    line = shlex.split(plan["vllm"])
    if both:
        if plan["max_num_seqs"] < concurrency:
            raise ValueError(f"--max-num-seqs {concurrency}: only {plan['max_num_seqs']} sequences of {context:,} "
                             f"tokens fit in {card.utilization:g} x {card.gb:g} GiB; lower one of them")
        line[line.index("--max-num-seqs") + 1] = str(concurrency)
    binary = Path(sys.executable).with_name("vllm")
    argv = line + ["--host", HOST, "--port", str(port)]
    argv[0] = str(binary) if binary.exists() else "vllm"
    model = source.serve_path
    if "--lora-modules" in argv:
        model = argv[argv.index("--lora-modules") + 1].split("=", 1)[0]
    notes = list(result["notes"]) + list(plan["notes"])
    shown = " ".join(shlex.quote(part) for part in ["vllm", *line[1:], "--host", HOST, "--port", str(port)])
    return ServeLaunch("vllm", argv, _env({"VLLM_API_KEY": token}), model, port,
                       shown + f"  (token required: VLLM_API_KEY={HIDDEN})", notes)


def llama_cpp_launch(source: ServeSource, port: int, token: str, context: int | None = None) -> ServeLaunch:
    """`python -m llama_cpp.server` on the GGUF file. The token goes in API_KEY, which its pydantic-settings
    ServerSettings reads into api_key (kept out of argv, where `ps` shows it); interrupt_requests is off,
    or each new request would cut off the one being answered."""
    _needs_merged(source)
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", source.serve_path, "--host", HOST,
            "--port", str(port), "--interrupt_requests", "false"]
    if context:
        argv += ["--n_ctx", str(context)]
    notes = list(source.notes)
    mmproj = Path(source.serve_path).with_name(MMPROJ_FILE)
    if mmproj.is_file():  # a vision-language export: mtmd reads the pair and the GGUF's own chat template
        argv += ["--chat_format", "mtmd", "--clip_model_path", str(mmproj)]
        notes.append(f"images through llama.cpp's mtmd with {MMPROJ_FILE} (OpenAI image_url parts: a URL or a "
                     "data: URI)")
    return ServeLaunch("llama-cpp", argv, _env({"API_KEY": token}), source.serve_path, port,
                       _shown(argv, token) + f"  (token required: API_KEY={HIDDEN})", notes)
