"""verdicts(): which of a run's choices can run on this machine, as one torch-free list of rules.

The worker's plan (backend/training/model/techniques.py) refuses a choice that cannot run before it loads
anything, and the studio must say the same before Start is pressed; both call `verdicts` so the two
can never drift apart. Each Verdict names the field, whether it runs as asked, the one-sentence
reason, and where a faithful fallback exists the value that runs instead. What the studio cannot
know without torch comes in as arguments: `probe` (the worker quantizes a tensor with bitsandbytes;
the studio only finds the package) and `facts` (the model class's attention support, read by the
worker through transformers; None in the studio, where those two rules are left to the worker).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from backend.core.config.run_config import RunConfig
from backend.core.paths import HUB_PREFIX, has_weight_files, resolve_resource
from backend.core.protocol import Capabilities

Probe = Callable[[str, str], "str | None"]
"""(feature: nf4 | int8 | adam8, device) -> None when bitsandbytes does it there, else the reason."""

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
"""config.json keys that hold the longest sequence a model was built for, in the order read."""


class AttentionFacts(Protocol):
    """What the worker knows of the model's class (backend.training.model.model_facts.ModelFacts)."""

    known: bool
    supports_sdpa: bool
    supports_flash_attn: bool
    attention_softcapping: bool
    name: str


class Verdict(BaseModel):
    """One choice on this machine: runs as asked (allowed), runs as `downgrade_to`, or cannot run."""

    model_config = ConfigDict(frozen=True)
    field: str
    """The dotted config key, e.g. technique.liger_kernel."""
    allowed: bool
    reason: str
    """One sentence: why it cannot run as asked (for a downgrade, what runs instead and why)."""
    downgrade_to: str | None = None
    """The value that runs instead, where the worker falls back faithfully (then Start may go)."""
    fix: str = ""
    """What to pick instead, for a refusal."""
    kind: Literal["bad_input", "missing_dependency"] = "bad_input"
    estimate_as: Any = None
    """The value the memory estimate counts in its place: the downgrade, or the nearest that runs."""
    overridable: bool = False
    """A person who knows better may start anyway (the estimate over the device's memory only)."""

    @property
    def blocks(self) -> bool:
        """Cannot run and has no fallback: Start must not go."""
        return not self.allowed and self.downgrade_to is None

    def message(self) -> str:
        return f"{self.field}: {self.reason}"


def installed_probe(feature: str, device: str) -> str | None:
    """The torch-free stand-in for the worker's bitsandbytes probe: only whether it is installed."""
    return None if _installed("bitsandbytes") else "bitsandbytes is not installed"


def context_length(model_config: dict[str, Any] | None) -> tuple[int, str] | None:
    """(tokens, key) of the model's context from config.json (a multimodal one's text_config), or None."""
    if not model_config:
        return None
    text = model_config.get("text_config")
    for source in ((text,) if isinstance(text, dict) else ()) + (model_config,):
        for key in CONTEXT_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def resolved_precision(config: RunConfig, caps: Capabilities) -> str:
    """precision auto as the worker resolves it: bf16 (fp16 without it) on CUDA, fp32 on the CPU."""
    asked = config.technique.precision
    if asked != "auto":
        return asked
    return ("bf16" if caps.bf16 else "fp16") if caps.cuda else "fp32"


def verdicts(config: RunConfig, model_config: dict[str, Any] | None, caps: Capabilities, *,
             probe: Probe | None = None, facts: AttentionFacts | None = None, data_problem: str = "") -> list[Verdict]:
    """Every choice of `config` that does not run as asked on a machine with `caps`, in the order
    the worker's plan checks them (the first blocking one is what it refuses with)."""
    t = config.technique
    probe = probe or installed_probe
    device = "cuda" if caps.cuda else "cpu"
    out: list[Verdict] = []

    def no(field: str, reason: str, fix: str, estimate_as: Any, kind: str = "bad_input") -> None:
        out.append(Verdict(field=field, allowed=False, reason=reason, fix=fix, kind=kind, estimate_as=estimate_as))

    if t.precision == "fp16" and device == "cpu":
        no("technique.precision", "fp16 with loss scaling needs a CUDA GPU", "pick bf16 or fp32 on the CPU", "auto")
    if t.precision == "bf16" and device == "cuda" and not caps.bf16:
        no("technique.precision", "this GPU has no bf16 support", "pick fp16 (with loss scaling) or fp32", "fp16")
    precision = resolved_precision(config, caps)

    if t.attention == "flash_attention_2":
        if device != "cuda":
            no("technique.attention", "flash_attention_2 needs a CUDA GPU", "pick sdpa (or auto) on this machine",
               "sdpa")
        elif not caps.flash_attn:
            no("technique.attention", "flash_attention_2 needs the flash-attn package, which is not installed",
               "install the gpu extra, or pick sdpa", "sdpa")
        elif precision == "fp32":
            no("technique.attention", "flash_attention_2 runs only in bf16 or fp16",
               "set precision bf16, or attention sdpa", "sdpa")
        elif facts is not None and facts.known and not facts.supports_flash_attn:
            no("technique.attention", f"{facts.name} does not support flash_attention_2 (transformers refuses it)",
               "pick auto, or " + ("sdpa" if facts.supports_sdpa else "eager"), "auto")
    if t.attention == "sdpa" and facts is not None and facts.known and not facts.supports_sdpa:
        no("technique.attention", f"{facts.name} does not support sdpa (transformers refuses it"
           + (", as its attention logits are soft-capped)" if facts.attention_softcapping else ")"),
           "pick eager, or auto (which picks eager for it)", "eager")

    if t.method == "qlora":
        reason = probe("nf4", device)
        if reason:
            no("technique.method", f"qlora needs bitsandbytes 4-bit on {device}, and here {reason}",
               "pick lora (16-bit base) instead", "lora")
    elif t.method == "lora8":
        reason = probe("int8", device)
        if reason:
            no("technique.method", f"lora8 needs bitsandbytes LLM.int8 on {device}, and here {reason}",
               "pick qlora or lora instead", "lora")

    if t.optimizer != "adamw":
        reason = probe("adam8", device)
        if reason:
            no("technique.optimizer", f"{t.optimizer} needs bitsandbytes' 8-bit Adam, and here {reason}", "pick adamw",
               "adamw")
        elif t.optimizer == "paged_adamw_8bit" and device != "cuda":
            out.append(Verdict(field="technique.optimizer", allowed=False, downgrade_to="adamw_8bit",
                               estimate_as="adamw_8bit",
                               reason="paged_adamw_8bit -> adamw_8bit (paging needs CUDA unified memory; same maths)"))

    if t.offload != "none":
        if device != "cuda":
            no("technique.offload", "DeepSpeed offload needs a CUDA GPU", "set offload: none on this machine", "none")
        elif not caps.deepspeed:
            no("technique.offload", "DeepSpeed is not installed", "pip install -e '.[gpu]', or set offload: none",
               "none", "missing_dependency")

    if t.liger_kernel:
        if device != "cuda":
            no("technique.liger_kernel", "Liger's fused kernels are Triton kernels and need a CUDA GPU",
               "turn liger_kernel off on this machine", False)
        elif not caps.liger_kernel:
            no("technique.liger_kernel", "the liger-kernel package is not installed",
               "pip install liger-kernel, or turn liger_kernel off", False, "missing_dependency")

    if t.torch_compile and device != "cuda":
        # Measured here: 140 s to compile the bundled model on the CPU, then ~2 tokens/s as every
        # new packed-batch length recompiles. Not an option worth offering on the CPU.
        no("technique.torch_compile", "torch.compile on the CPU compiles for minutes and recompiles for each new "
           "batch shape, so it runs slower than without", "turn torch_compile off on this machine", False)

    if t.method == "full" and precision == "fp16":
        no("technique.precision", "full fine-tuning with fp16 weights cannot take optimizer steps in fp16",
           "pick bf16 or fp32 for method full", "bf16" if caps.bf16 else "fp32")

    context = context_length(model_config)
    if context is not None and config.train.seq_len > context[0]:
        tokens, key = context
        no("train.seq_len", f"{config.train.seq_len} is longer than the model's context of {tokens:,} tokens "
           f"({key} in its config.json)", f"set train.seq_len to {tokens} or less", tokens)

    _strategy(config, caps, no)

    if data_problem:
        no("data.path", data_problem, "pick a readable dataset on the Data page", None)
    return out


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (no torch, no CUDA init)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _strategy(config: RunConfig, caps: Capabilities, no: Callable[..., None]) -> None:
    """hardware.*: what `accelerate launch` would die on before the worker writes a line (a launcher
    that cannot start leaves no worker.log, so these must be said before Start)."""
    hw = config.hardware
    if not hw.distributed:
        return
    fallback = "ddp" if hw.world_size > 1 else "single"
    other = "ddp (CPU processes over gloo)" if hw.world_size > 1 else "single"
    if hw.strategy.startswith("deepspeed"):
        if not caps.cuda:
            no("hardware.strategy", f"{hw.strategy} runs through DeepSpeed, which needs a CUDA GPU",
               f"set hardware.strategy: {other} on this machine", fallback)
        elif not caps.deepspeed:
            no("hardware.strategy", f"{hw.strategy} needs the DeepSpeed package, which is not installed",
               f"pip install -e '.[gpu]' (it brings DeepSpeed), or set hardware.strategy: {fallback}", fallback,
               "missing_dependency")
    elif hw.strategy == "fsdp" and not caps.cuda:
        no("hardware.strategy", "fsdp shards the model across GPUs and needs CUDA (accelerate's FSDP does not "
           "run on the CPU)", f"set hardware.strategy: {other} on this machine", fallback)
    if not _installed("accelerate"):
        no("hardware.strategy", f"{hw.strategy} starts its processes with accelerate, which is not installed",
           "pip install accelerate, or set hardware.strategy: single with one process", "single",
           "missing_dependency")


def _gpu_count(config: RunConfig, caps: Capabilities) -> list[Verdict]:
    """The GPUs hardware.gpu_ids names, and one process per GPU, on this machine as NVML lists it.
    Before Start only: inside a launched rank CUDA_VISIBLE_DEVICES renumbers the GPUs."""
    hw = config.hardware
    out: list[Verdict] = []
    if not hw.distributed or not caps.cuda or not caps.devices:
        return out  # the CPU runs as many gloo processes as asked; an unknown GPU count is the launcher's to check
    present = {d.index for d in caps.devices}
    if hw.gpu_ids.strip().lower() == "all":
        chosen = sorted(present)
    else:
        try:
            chosen = [int(part) for part in hw.gpu_ids.split(",") if part.strip()]
        except ValueError:
            chosen = sorted(present)
        absent = [i for i in chosen if i not in present]
        if absent:
            out.append(Verdict(field="hardware.gpu_ids", allowed=False, estimate_as="all",
                               reason=f"GPU {', '.join(map(str, absent))} is not on this machine (it has "
                                      f"{', '.join(map(str, sorted(present)))})",
                               fix="list GPUs this machine has, or set hardware.gpu_ids: all"))
            return out
    if hw.num_processes > len(chosen):
        out.append(Verdict(field="hardware.num_processes", allowed=False, estimate_as=len(chosen),
                           reason=f"{hw.num_processes} processes, one per GPU, but hardware.gpu_ids {hw.gpu_ids} "
                                  f"gives {len(chosen)} GPU(s) here",
                           fix=f"set hardware.num_processes to {len(chosen)} or less"))
    return out


def input_verdicts(config: RunConfig) -> list[Verdict]:
    """The model and data the run reads, as files: a model not downloaded (or not there) and a data
    path that does not exist are verdicts like any other, so Start waits and the CLI makes no run folder."""
    out: list[Verdict] = []

    def no(field: str, reason: str, fix: str) -> None:
        out.append(Verdict(field=field, allowed=False, reason=reason, fix=fix))

    path = config.model.path
    folder = resolve_resource(path)
    if path.startswith(HUB_PREFIX) and not folder.exists():
        repo = path[len(HUB_PREFIX):]
        no("model.path", f"{path} is not downloaded yet ({folder})",
           f"download it on the Model page, or run `hf download {repo} --local-dir {folder}`")
    elif not folder.exists():
        no("model.path", f"{folder} does not exist",
           "pick a downloaded model on the Model page, or point model.path at a Hugging Face model folder")
    elif not folder.is_dir():
        no("model.path", f"{folder} is a file", "point model.path at the folder that holds config.json")
    elif not (folder / "config.json").is_file():
        no("model.path", f"the folder {folder} has no config.json, so it is not a Hugging Face model folder",
           "point model.path at a downloaded model's folder")
    elif not has_weight_files(folder):
        how = (f"download the model first (the Model page, or `hf download {path[len(HUB_PREFIX):]} --local-dir "
               f"{folder}`)" if path.startswith(HUB_PREFIX) else "download the model first, or point model.path at "
               "a folder with its *.safetensors")
        no("model.path", f"no weight files in {folder} (only config.json is enough to estimate, not to train)", how)
    data = config.resolved_data_path()
    if not data.exists():
        no("data.path", f"{data} does not exist", "pick a .jsonl, .json, .csv, .parquet or .txt file, or a dataset "
           "folder (e.g. bundled:datasets/demo_train.jsonl)")
    return out


def before_start(config: RunConfig, caps: Capabilities, model_config: dict[str, Any] | None = None, *,
                 probe: Probe | None = None, data_problem: str = "") -> list[Verdict]:
    """The one verdict before any process starts (the CLI's `train`, the window's Start): the files the
    run reads, every choice this machine cannot run, and the GPUs the launcher would be asked for.
    model_config None reads config.json (None again where unreadable: the worker's check says why)."""
    found = input_verdicts(config)
    if model_config is None and not any(v.field == "model.path" for v in found):
        from backend.estimate import load_model_config  # torch-free

        try:
            model_config = load_model_config(config.model.path)
        except ValueError:
            model_config = None
    data_problem = "" if any(v.field == "data.path" for v in found) else data_problem
    return found + verdicts(config, model_config, caps, probe=probe, data_problem=data_problem) + _gpu_count(config, caps)


def lenient_config(raw: dict[str, Any]) -> RunConfig | None:
    """`raw` with its sections checked one by one but not against each other: the choices of a draft
    that breaks a combination rule (KTO with micro-batch 1) can still be judged, so every problem is
    shown at once. None when a section itself is invalid."""
    from backend.core.config.run_config import migrate, section_models

    try:
        data = migrate(raw)
        sections = {name: model.model_validate(data.get(name, {})) for name, model in section_models().items()}
    except (ValueError, TypeError, AttributeError):
        return None
    rest = {key: value for key, value in data.items() if key not in sections}
    try:
        return RunConfig.model_construct(**rest, **sections)
    except (ValueError, TypeError):
        return None


def blocking_lines(found: list[Verdict]) -> list[str]:
    """Each verdict that keeps the run from starting as `field: reason; fix` (one line each)."""
    return [v.message() + (f"; {v.fix}" if v.fix else "") for v in found if v.blocks]


def blocker(found: list[Verdict]) -> Verdict | None:
    """The first verdict that keeps the run from starting, or None."""
    return next((v for v in found if v.blocks), None)


def runnable(config: RunConfig, found: list[Verdict]) -> RunConfig:
    """`config` as it will run: each choice that cannot run replaced by its `estimate_as` (the
    memory estimate is computed for this, not for options that would be refused or downgraded)."""
    changes = [(v.field, v.estimate_as) for v in found if not v.allowed and v.estimate_as is not None]
    if not changes:
        return config
    raw = config.model_dump(mode="json")
    for field, value in changes:
        section, name = field.split(".", 1)
        raw[section][name] = value
    try:
        return RunConfig.from_dict(raw, source="runnable")
    except ValueError:  # a replacement that breaks a combination rule: estimate what was asked
        return config
