"""RunConfig: the one file that the studio saves and the CLI reads.

Every field's docstring is its description: the studio shows it as a tooltip and the CLI as help,
so it says what the option saves and what it costs. ``extra="forbid"`` makes a typo an error that
names the field, where it was written and the closest real one (config_errors.py). Torch-free: the
studio imports this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from backend.core.config.base import Section as _Section
from backend.core.config.errors import ConfigError, describe_error, is_cross_field, override_for, short_item, yaml_line
from backend.core.config.file import parse_config_yaml, read_config_text
from backend.core.config.objectives import GrpoSection, KtoSection, Objective
from backend.core.config.vision import VisionSection
from backend.core.config.schedule import Schedule, TrainSection, clear_alternatives, plan_schedule
from backend.core.paths import resolve_resource

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = range(1, SCHEMA_VERSION + 1)
"""The schema versions this studio reads (older ones are migrated on load)."""

class ModelSection(_Section):
    path: str = "bundled:tiny"
    """A local Hugging Face model folder, or `bundled:tiny` for the small model shipped with the studio."""
    trust_remote_code: bool = False
    """Run Python code shipped inside the model folder. Off unless you trust its author."""
    allow_pickle: bool = False
    """Allow loading .bin/.pt pickle weights, which can run arbitrary code. Off: safetensors only."""
    adapter: str = ""
    """Start from this LoRA/DoRA adapter (a run folder or its adapter folder) and keep training it, e.g. DPO or GRPO after an SFT run; empty starts a new adapter. Its rank and method must match technique's; the result is still one adapter on model.path."""


class DataSection(_Section):
    path: str = "bundled:datasets/demo_train.jsonl"
    """A JSONL, JSON, CSV, Parquet, Arrow or .txt file of examples, a `datasets` save_to_disk folder, or
    a folder of such files (each read in its own format); a LLaMA-Factory dataset_info.json beside it
    maps its fields. `bundled:datasets/demo_train.jsonl` is the demo set."""
    format: Literal["auto", "alpaca", "sharegpt", "messages", "text"] = "auto"
    """auto follows the file's entry in a LLaMA-Factory dataset_info.json beside it, else detects:
    alpaca {instruction,input,output}; sharegpt {conversations}; messages {role,content}; text. Any
    other value reads every file in that format and ignores dataset_info.json's mapping."""
    validation_split: float = Field(default=0.05, ge=0.0, lt=0.5)
    """Share of examples held out to measure eval loss (0 to skip evaluation)."""
    max_examples: int | None = Field(default=None, ge=1)
    """Use only the first N examples (handy for a quick try)."""
    truncate: bool = True
    """Cut examples longer than train.seq_len (and count them); off refuses such examples instead."""
    skip_invalid: bool = False
    """Leave out examples with a null or empty prompt, answer or turn, or a bad image (missing, corrupt,
    too large, more or fewer than its <image> markers, more than the model takes), and say how many and
    the first line; off refuses such a dataset (never trains on the text "None")."""


class TechniqueSection(_Section):
    objective: Objective = "sft"
    """sft teaches the answers of instruction data; dpo (Direct Preference Optimization) teaches to prefer each pair's chosen answer over its rejected one (prompt/chosen/rejected data); kto (Kahneman-Tversky Optimization) learns from answers each labelled good or bad (prompt/completion/label data); grpo (Group Relative Policy Optimization) samples several answers per prompt and reinforces those the reward functions score above their group's mean (prompts, with any columns the rewards read). With an adapter method (lora, dora, qlora, lora8) the reference is the base with the adapters off (no second copy); with full tuning it is a frozen copy of the base loaded beside the model (twice the weights). They cost a reference pass (grpo only when grpo.beta > 0), and grpo the generations."""
    method: Literal["lora", "dora", "qlora", "lora8", "full"] = "lora"
    """lora freezes the base and trains small adapters (saves ~12 of the 16 bytes/parameter of full
    tuning, costs a little quality); dora adds a magnitude vector (a little closer to full tuning, costs
    ~1.5x the adapter time and extra activations); qlora stores the base in 4-bit NF4
    (~0.52 byte/parameter instead of 2, costs dequantization time); lora8 stores it in 8-bit LLM.int8
    (1 byte/parameter, slower still); full trains every weight (best quality, costs 16 bytes/parameter)."""
    lora_rank: int = Field(default=8, ge=1, le=1024)
    """Rank r of each adapter. Higher learns more and costs r*(in+out) parameters per layer."""
    lora_alpha: float = Field(default=16.0, gt=0)
    """Adapter scale numerator: the update is multiplied by alpha/r."""
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input; regularises small datasets, slows convergence a little."""
    lora_targets: str = "all-linear"
    """Which linear layers get adapters: all-linear, or a comma-separated list like q_proj,v_proj."""
    gradient_checkpointing: bool = False
    """Keep only each layer's input and recompute the rest in the backward pass (non-reentrant): saves most activation memory, costs one extra forward pass (about 25-35% more time per step)."""
    attention: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    """Attention kernel: flash_attention_2 and sdpa never store the seq_len x seq_len score matrix (eager does), flash_attention_2 needs the flash-attn package and bf16/fp16; auto picks the best available."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """Number format for the forward and backward pass: bf16/fp16 halve weights and activations (an fp32 master copy keeps full tuning accurate), fp32 costs twice the memory; auto is bf16 on a GPU that has it, else fp32, except that LoRA on a CPU that multiplies bf16 natively (AVX512-BF16/AMX) holds the frozen base in bf16 and runs its products in bf16 (~1.2x a step; adapters, activations and loss stay fp32); fp32 keeps everything fp32."""
    packing: bool = True
    """Padding-free packing: a batch is one row of whole examples with position ids restarting per
    example, so no compute goes to padding and no example attends to another (image rows too, where the
    model's family is proven for it: Qwen2.5-VL, Qwen3-VL); off pads each batch to its longest example and
    groups examples of similar length instead."""
    neftune_alpha: float | None = Field(default=None, gt=0)
    """Add uniform noise of this scale to the input embeddings while training (NEFTune; 5 is typical): often better chat answers from small datasets at no memory or speed cost, can blur exact recall; None turns it off."""
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw"
    """adamw keeps two fp32 states (8 bytes per trained parameter); adamw_8bit keeps them in 8 bits (about 2 bytes) at a tiny quality cost; paged_adamw_8bit also lets them spill to CPU memory on a spike, costing speed when it does."""
    liger_kernel: bool = False
    """Liger's fused Triton kernels (linear+cross-entropy, RMSNorm, RoPE, SwiGLU): the logits buffer
    disappears and steps get faster; needs CUDA and the liger-kernel package."""
    torch_compile: bool = False
    """Compile the model with torch.compile: faster steady-state steps after a one-off compile time
    (reported separately, never counted in tokens/s)."""
    activation_offload: bool = False
    """With gradient checkpointing on a GPU: keep each layer's checkpointed input (batch x seq x hidden per layer) in pinned CPU memory until the backward pass needs it, so longer rows fit; costs a copy each way per layer and step, so turn it on only where memory is short (it runs as one of the speed shortcuts)."""
    shortcuts: Literal["auto", "off"] = "auto"
    """auto: the worker's speed shortcuts (logits only where the loss looks, the last layer on those rows, per-example attention for packed rows, image rows packed for Qwen2.5-VL and Qwen3-VL, on a GPU the loss a chunk of rows at a time (and activation offload where asked), and on the CPU rank-first LoRA products, bf16 base products and a measured thread count) where a test proved them exact for the model's family; off: the plain transformers + peft computation (slower, for comparison or a suspected shortcut bug)."""
    dpo_beta: float = Field(default=0.1, gt=0)
    """DPO only: how far the tuned model may move from the reference; smaller lets it drift further from the base for a larger preference margin (0.1 is typical)."""
    dpo_loss: Literal["sigmoid", "ipo", "hinge", "robust", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot",
                      "apo_zero", "apo_down", "discopop", "sigmoid_norm"] = "sigmoid"
    """DPO only (TRL's loss_type): sigmoid is the paper's loss; ipo a squared loss that keeps the margin from growing without bound on small or noisy sets; hinge a margin loss (SLiC) that stops pushing once a pair is separated; robust assumes 10% of the pairs are flipped (label smoothing 0.1, the Robust DPO paper's); exo_pair the EXO loss (smoothing 1e-3, its paper's); nca_pair, bco_pair, sppo_hard, aot, apo_zero (chosen answers better than the model's own), apo_down (chosen worse than the model's own), discopop and sigmoid_norm (sigmoid on per-token averages) as in TRL's DPO documentation."""
    offload: Literal["none", "zero2_optimizer", "zero3_optimizer_params"] = "none"
    """DeepSpeed offload: zero2_optimizer moves optimizer state and master weights to CPU memory (saves up to 12 bytes/parameter of GPU memory), zero3_optimizer_params moves the weights too; costs PCIe traffic and slower steps, and needs deepspeed."""

    @field_validator("shortcuts", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` (and `on`) as a boolean
        return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _technique_combinations(self) -> "TechniqueSection":
        if self.attention == "flash_attention_2" and self.precision == "fp32":
            raise ValueError(
                "technique.attention flash_attention_2 runs only in bf16 or fp16; "
                "set technique.precision to bf16 (or auto) or technique.attention to sdpa"
            )
        if self.optimizer != "adamw" and self.offload != "none":
            raise ValueError(
                f"technique.optimizer {self.optimizer} cannot be offloaded: DeepSpeed runs its own CPU Adam "
                "on offloaded state; set technique.optimizer to adamw or technique.offload to none"
            )
        if self.method == "lora8" and self.offload == "zero3_optimizer_params":
            raise ValueError(
                "technique.offload zero3_optimizer_params cannot shard 8-bit (LLM.int8) weights; "
                "use technique.method qlora or technique.offload zero2_optimizer"
            )
        return self


class ExportSection(_Section):
    formats: list[Literal["adapter"]] = Field(default_factory=lambda: ["adapter"])
    """What to write when training ends: adapter (the PEFT folder, loadable on top of the base)."""


class HardwareSection(_Section):
    strategy: Literal["single", "ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"] = "single"
    """single: one device. ddp: a full copy per GPU, gradients averaged (fastest when the model fits).
    fsdp: weights, gradients and optimizer state sharded across GPUs (fits bigger models, costs
    communication). deepspeed_zero2/3: ZeRO sharding of optimizer+gradients (2) or everything (3)."""
    num_processes: int = Field(default=1, ge=1, le=1024)
    """Processes per machine, one per GPU (with no GPU, ddp runs this many CPU processes over gloo)."""
    gpu_ids: str = "all"
    """Which GPUs to use: all, or a comma-separated list of indices like 0,1."""
    fsdp_cpu_offload: bool = False
    """FSDP only: keep sharded parameters in CPU memory between uses (fits more, much slower)."""
    num_machines: int = Field(default=1, ge=1)
    """Machines in a multi-node run; each runs num_processes processes."""
    main_process_ip: str = "127.0.0.1"
    """Address of machine 0 in a multi-node run (every machine must reach it)."""
    main_process_port: int = Field(default=29500, ge=1024, le=65535)
    """Port of the rendezvous on machine 0."""
    rendezvous_timeout_s: int = Field(default=600, ge=5, le=86400)
    """Multi-node: seconds machine 0 waits for the other machines to join before it gives up."""

    @model_validator(mode="after")
    def _processes(self) -> "HardwareSection":
        if self.strategy == "single" and (self.num_processes > 1 or self.num_machines > 1):
            raise ValueError("hardware.strategy single runs one process; pick ddp, fsdp or deepspeed_zero2/3 "
                             "for hardware.num_processes > 1")
        return self

    @property
    def distributed(self) -> bool:
        return self.strategy != "single"

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_machines


class RunConfig(_Section):
    schema_version: int = SCHEMA_VERSION
    """Version of this file's layout; older files are migrated on load."""
    name: str = "run"
    """A short label for the run folder and the run list."""
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    technique: TechniqueSection = Field(default_factory=TechniqueSection)
    train: TrainSection = Field(default_factory=TrainSection)
    export: ExportSection = Field(default_factory=ExportSection)
    hardware: HardwareSection = Field(default_factory=HardwareSection)
    kto: KtoSection = Field(default_factory=KtoSection)
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    vision: VisionSection = Field(default_factory=VisionSection)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(f"schema_version {value} is newer than this studio ({SCHEMA_VERSION}); upgrade it")
        if value not in SUPPORTED_VERSIONS:
            raise ValueError(f"schema_version {value} is not a version of this file; this studio reads "
                             f"{', '.join(map(str, SUPPORTED_VERSIONS))}: set schema_version: {SCHEMA_VERSION}")
        return value

    @model_validator(mode="after")
    def _combinations(self) -> "RunConfig":
        if self.technique.offload != "none" and not self.hardware.strategy.startswith("deepspeed"):
            raise ValueError("technique.offload runs through DeepSpeed: set hardware.strategy to deepspeed_zero2 "
                             "(optimizer offload) or deepspeed_zero3 (optimizer and parameter offload)")
        if self.technique.offload == "zero3_optimizer_params" and self.hardware.strategy != "deepspeed_zero3":
            raise ValueError("technique.offload zero3_optimizer_params needs hardware.strategy deepspeed_zero3")
        objective = self.technique.objective
        if objective != "sft" and self.data.format != "auto":
            reads = {"dpo": "preference pairs (prompt, chosen, rejected)", "kto": "labelled answers (prompt, "
                     "completion, label)", "grpo": "prompts (prompt, and the columns the rewards read)"}[objective]
            raise ValueError(f"data.format {self.data.format} is a supervised format; technique.objective {objective} "
                             f"reads {reads}: set data.format to auto")
        if self.model.adapter and self.technique.method == "full":
            raise ValueError("model.adapter continues an adapter, and technique.method full trains every weight "
                             "without one: set technique.method to lora or dora, or leave model.adapter empty")
        if objective == "grpo":
            batch = self.train.micro_batch_size * self.train.gradient_accumulation_steps * self.hardware.world_size
            if batch % self.grpo.num_generations:
                raise ValueError(
                    f"grpo.num_generations {self.grpo.num_generations} must divide the batch of completions, "
                    f"train.micro_batch_size x gradient_accumulation_steps x processes = {batch}: each prompt's "
                    "completions are scored together; make micro_batch_size a multiple of num_generations")
        if objective == "kto" and self.train.micro_batch_size < 2:
            raise ValueError("technique.objective kto needs train.micro_batch_size 2 or more: KTO estimates its KL "
                             "term from the other answers of the same batch (TRL refuses a batch of 1); set "
                             "train.micro_batch_size to 2 or more")
        return self

    def schedule(self, examples: int, processes: int) -> Schedule:
        """The steps and learning rate over `examples` training examples (after the split and what training
        drops); a GRPO step's rows are completions, num_generations for each prompt."""
        if self.technique.objective == "grpo":
            generations = self.grpo.num_generations
            return plan_schedule(self.train, examples * generations, processes,
                                 f"{examples:,} prompts x {generations} generations")
        return plan_schedule(self.train, examples, processes)

    # --- files ------------------------------------------------------------------------------

    def resolved_model_path(self) -> Path:
        return resolve_resource(self.model.path)

    def resolved_data_path(self) -> Path:
        return resolve_resource(self.data.path)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml(), encoding="utf-8")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "RunConfig":
        return cls._validate(raw, source)

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "RunConfig":
        path = Path(path)
        text = read_config_text(path)
        raw = parse_config_yaml(text, str(path))
        overrides = overrides or []
        apply_overrides(raw, overrides)
        return cls._validate(raw, str(path), text, overrides)

    @classmethod
    def _validate(cls, raw: dict[str, Any], source: str, text: str = "",
                  overrides: list[str] | None = None) -> "RunConfig":
        """Validate, or raise one ConfigError line that says where the first problem was written."""
        try:
            return cls.model_validate(migrate(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = source
            if not is_cross_field(err):
                item = override_for(err["loc"], overrides or [])
                line = yaml_line(text, err["loc"]) if text and item is None else None
                where = f"--set {short_item(item)}" if item else f"{source} line {line}" if line else source
            raise ConfigError(f"{where}: {describe_validation_error(exc)}") from None


def section_models() -> dict[str, type[BaseModel]]:
    """RunConfig's sections by name (`model`, `data`, ...), in file order."""
    return {name: info.annotation for name, info in RunConfig.model_fields.items()
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


def field_paths() -> list[str]:
    """Every settable key as YAML and --set spell it (`name`, `train.max_steps`, ...), in file order."""
    sections = section_models()
    paths: list[str] = []
    for name in RunConfig.model_fields:
        paths += [f"{name}.{field}" for field in sections[name].model_fields] if name in sections else [name]
    return paths


def describe_validation_error(exc: ValidationError) -> str:
    """The first error as `field.path: what is wrong` and the fix, the way a person fixes it."""
    return describe_error(exc.errors()[0], field_paths(), section_models())


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> None:
    """Apply `dotted.key=value` strings in place; values are parsed as YAML scalars. What they set wins
    over the file's alternative (train.num_epochs over its max_steps: schedule.ALTERNATIVES)."""
    keys: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        shown = short_item(item)
        if not sep or not key.strip():
            raise ConfigError(f"--set {shown!r}: expected dotted.key=value, for example train.max_steps=10")
        node = raw
        parts = key.strip().split(".")
        if not all(part.strip() for part in parts):
            raise ConfigError(f"--set {shown!r}: a part of the key is empty; write it as section.field, "
                              "for example train.max_steps=10")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {shown!r}: {part} is not a section")
            node = child
        node[parts[-1]] = parse_scalar(value)
        keys.append(".".join(parts))
    clear_alternatives(raw, keys)


def parse_scalar(value: str) -> Any:
    """A --set value: YAML scalar parsing, plus the floats YAML 1.1 misses (`1e-3` without a dot);
    a quoted value (`name='123'`) stays a string."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(parsed, str) and parsed == value.strip():
        try:
            return float(parsed)
        except ValueError:
            return parsed
    return parsed


FLOW_INDICATORS = frozenset(",[]{}:#&*!|>'\"%@`")
"""Characters that end or change a plain scalar inside a flow list or mapping: such strings are quoted there."""


def yaml_scalar(value: Any, flow: bool = False) -> str:
    """A value as the CLI's `--set key=value` parses it back (YAML scalars, flow lists and mappings,
    so grpo.rewards' list of dicts is one value); a string that would read back as something else
    (`123`, `off`, `a #b`, or `a,b` inside a list) is quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, BaseModel):  # a default RewardSpec: its fields as written, defaults left out
        value = value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, list):
        return "[" + ",".join(yaml_scalar(v, flow=True) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{yaml_scalar(str(k), flow=True)}: {yaml_scalar(v, flow=True)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, str) and (parse_scalar(value) != value or value != value.strip()
                                   or (flow and FLOW_INDICATORS.intersection(value))):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older file up to SCHEMA_VERSION. Version 1 is the first; nothing to do yet."""
    raw = dict(raw)
    raw.setdefault("schema_version", SCHEMA_VERSION)
    return raw
