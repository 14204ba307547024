"""The typed JSON-lines protocol between a client (studio or CLI) and a worker process.

One message is one JSON object on one line. Commands go to the worker's stdin, events come back on
its stdout. Every message carries ``type`` (the discriminator) and ``v`` (the protocol version) so
that a studio never silently misreads a worker from another release: a mismatch is refused at the
first line, with a sentence naming both versions.

Version 2 added the chat session: a chat StartJob with ``params.session`` keeps its worker (and the
loaded model) for ChatMessage commands, each answered with the same streamed events and closed by
AnswerFinished; StopAnswer cuts one answer, StopJob (or stdin closing) ends the session.

Standard library and pydantic only: the studio imports this module and must stay torch-free.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

PROTOCOL_VERSION = 2

JobKind = Literal["finetune", "export", "evaluate", "chat", "prune"]
FailureKind = Literal["bad_input", "out_of_memory", "disk_full", "missing_dependency", "crashed", "cancelled"]


class ProtocolError(ValueError):
    """A line that is not a message this version of the protocol understands."""


class Message(BaseModel):
    """Every command and event: frozen, no unknown field, and the protocol version it was written in."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    v: int = PROTOCOL_VERSION


# --- commands (imperative) -------------------------------------------------------------------


class StartJob(Message):
    """Start one job; a worker runs exactly one job and then exits (a chat session once it is ended)."""

    type: Literal["StartJob"] = "StartJob"
    job: JobKind = "finetune"
    run_dir: str = Field(description="Run folder already created by the client, holding config.yaml.")
    config: dict[str, Any] = Field(description="The resolved RunConfig as a plain dict.")
    resume: bool = False
    params: dict[str, Any] = Field(default_factory=dict, description="Job-specific options (export format, ...).")


class StopJob(Message):
    """Stop at the next step boundary; with ``save`` a complete checkpoint is written first."""

    type: Literal["StopJob"] = "StopJob"
    save: bool = True


class ChatMessage(Message):
    """The next message of a chat session: the whole conversation and how to sample its answer.

    Ranges are checked by the worker, which refuses a bad message with MessageRefused and goes on."""

    type: Literal["ChatMessage"] = "ChatMessage"
    messages: list[dict[str, Any]] = Field(description="{role, content} turns, ending with the user's message.")
    images: list[str] = Field(default_factory=list, description=(
        "Image files of the conversation, in the order of its <image> markers (none: they lead the last "
        "user message); a vision-language run's models see them, a text model refuses them."))
    model: str = Field(default="tuned", description="base, tuned, or both (base then tuned).")
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 256
    seed: int | None = None

    def params(self) -> dict[str, Any]:
        """The same options as a chat StartJob's params, so one parser checks both."""
        skip = {"type", "v"} | ({"seed"} if self.seed is None else set()) | (set() if self.images else {"images"})
        return self.model_dump(exclude=skip)


class StopAnswer(Message):
    """Cut the chat answer being generated at the next token; the session and its model stay."""

    type: Literal["StopAnswer"] = "StopAnswer"


Command = Annotated[Union[StartJob, StopJob, ChatMessage, StopAnswer], Field(discriminator="type")]


# --- events (past tense) ---------------------------------------------------------------------


class DeviceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int
    name: str
    total_bytes: int


class Capabilities(BaseModel):
    """What this machine can do, probed by the worker (never assumed by the studio)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    torch_version: str = ""
    cuda: bool = False
    devices: list[DeviceInfo] = Field(default_factory=list)
    bf16: bool = False
    bitsandbytes: str | None = Field(default=None, description="bitsandbytes version, None if absent.")
    flash_attn: bool = False
    deepspeed: bool = False
    liger_kernel: bool = False
    cpu_threads: int = 1


class WorkerReady(Message):
    type: Literal["WorkerReady"] = "WorkerReady"
    protocol_version: int = PROTOCOL_VERSION
    pid: int = 0
    capabilities: Capabilities = Field(default_factory=Capabilities)


class JobStarted(Message):
    type: Literal["JobStarted"] = "JobStarted"
    job: JobKind = "finetune"
    run_dir: str
    max_steps: int = 0
    resumed_from: str | None = None


class PhaseChanged(Message):
    type: Literal["PhaseChanged"] = "PhaseChanged"
    phase: str = Field(description="load_model, load_data, tokenize, train, save, ...")
    detail: str = ""


class MemorySample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    rss_bytes: int | None = None


class MetricsLogged(Message):
    type: Literal["MetricsLogged"] = "MetricsLogged"
    step: int
    max_steps: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = Field(default=None, description="Non-padding tokens per second.")
    tokens_seen: int | None = None
    image_rows_seen: int | None = Field(default=None, description="Rows holding images trained on so far (a "
                                        "vision-language run; None for a text model). This rank's count.")
    image_tokens_seen: int | None = Field(default=None, description="Image tokens in those rows' text "
                                          "sequences (Mllama: one per image; its tiles enter by cross-attention).")
    mfu: float | None = Field(default=None, description="Model FLOPs utilisation against the measured peak.")
    elapsed_s: float | None = None
    memory: MemorySample = Field(default_factory=MemorySample)
    extra: dict[str, float] = Field(
        default_factory=dict,
        description="Objective-specific metrics by their trainer name: DPO's rewards/chosen, rewards/rejected, "
                    "rewards/margins and rewards/accuracies; KTO's rewards/chosen, rewards/rejected, rewards/margins, "
                    "logps/chosen, logps/rejected, kl and entropy; GRPO's reward, reward_std, rewards/<function>/mean, "
                    "kl, completions/mean_length, clip_ratio/region_mean. Empty for supervised fine-tuning.")


class CompletionScored(Message):
    """GRPO: one sampled completion and what each reward function gave it, as training generates them."""

    type: Literal["CompletionScored"] = "CompletionScored"
    step: int
    prompt: str
    completion: str
    rewards: dict[str, float] = Field(default_factory=dict, description="Each reward function's score, by its label.")
    reward: float = Field(description="The weighted sum GRPO ranks the prompt's completions by.")


class TelemetrySampled(Message):
    type: Literal["TelemetrySampled"] = "TelemetrySampled"
    time: float
    memory: MemorySample = Field(default_factory=MemorySample)
    cpu_percent: float | None = None


class CheckpointSaved(Message):
    type: Literal["CheckpointSaved"] = "CheckpointSaved"
    step: int
    path: str


class EvalFinished(Message):
    type: Literal["EvalFinished"] = "EvalFinished"
    step: int
    eval_loss: float | None = None


class TokensGenerated(Message):
    type: Literal["TokensGenerated"] = "TokensGenerated"
    text: str
    done: bool = False


class AnswerFinished(Message):
    """One chat answer is complete (every model asked has answered); a session waits for the next message."""

    type: Literal["AnswerFinished"] = "AnswerFinished"
    stopped: bool = Field(default=False, description="True when StopAnswer or StopJob cut the answer.")
    tokens: int = Field(default=0, description="Tokens generated, summed over the models that answered.")
    seconds: float = Field(default=0.0, description="From the message to its last token, loading included.")


class MessageRefused(Message):
    """A chat message the session cannot answer (bad options, no tuned model); the session goes on."""

    type: Literal["MessageRefused"] = "MessageRefused"
    message: str = Field(description="One line a person can act on.")
    hint: str = ""


class JobFinished(Message):
    type: Literal["JobFinished"] = "JobFinished"
    run_dir: str
    stopped: bool = Field(default=False, description="True when a StopJob ended the run early.")
    steps: int = 0
    final_loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    compile_seconds: float | None = Field(default=None, description="torch.compile time, not in tokens/s.")
    seconds: float = 0.0
    adapter_path: str | None = None
    checkpoint_path: str | None = None


class JobFailed(Message):
    type: Literal["JobFailed"] = "JobFailed"
    kind: FailureKind
    message: str = Field(description="One line a person can act on.")
    hint: str = ""
    phase: str | None = Field(default=None, description="Where it failed: load, forward, backward, optimizer step, ...")
    peak_bytes: int | None = Field(default=None, description="Peak memory seen before an out-of-memory.")
    predicted_bytes: int | None = Field(default=None, description="The estimate's predicted peak for this run.")
    fix: dict[str, Any] = Field(default_factory=dict, description="Config overrides that apply the proposed fix.")


Event = Annotated[
    Union[
        WorkerReady,
        JobStarted,
        PhaseChanged,
        MetricsLogged,
        CompletionScored,
        TelemetrySampled,
        CheckpointSaved,
        EvalFinished,
        TokensGenerated,
        AnswerFinished,
        MessageRefused,
        JobFinished,
        JobFailed,
    ],
    Field(discriminator="type"),
]

TERMINAL_EVENTS = ("JobFinished", "JobFailed")

_command_adapter: TypeAdapter[Any] = TypeAdapter(Command)
_event_adapter: TypeAdapter[Any] = TypeAdapter(Event)
_COMMAND_TYPES = {"StartJob", "StopJob", "ChatMessage", "StopAnswer"}
_EVENT_TYPES = {
    "WorkerReady", "JobStarted", "PhaseChanged", "MetricsLogged", "CompletionScored", "TelemetrySampled",
    "CheckpointSaved", "EvalFinished", "TokensGenerated", "AnswerFinished", "MessageRefused", "JobFinished",
    "JobFailed",
}


def encode(message: Message) -> str:
    """One message as one line, newline included."""
    return message.model_dump_json() + "\n"


def _parse(line: str, adapter: TypeAdapter[Any], known: set[str], what: str) -> Any:
    text = line.strip()
    if not text:
        raise ProtocolError(f"empty {what} line")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{what} line is not JSON ({exc.msg} at column {exc.colno}): {text[:80]!r}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what} line is not a JSON object: {text[:80]!r}")
    kind = raw.get("type")
    if kind not in known:
        raise ProtocolError(f"unknown {what} type {kind!r}; this studio knows {sorted(known)}")
    version = raw.get("v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{what} {kind} speaks protocol v{version} but this side speaks v{PROTOCOL_VERSION}; "
            "install the studio and worker from the same release"
        )
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"][1:]) or "(message)"
        raise ProtocolError(f"{what} {kind}: field {field}: {err['msg']}") from None


def decode_event(line: str) -> Any:
    """Parse one event line, raising ProtocolError with a readable sentence on anything odd."""
    return _parse(line, _event_adapter, _EVENT_TYPES, "event")


def decode_command(line: str) -> Any:
    """Parse one command line, raising ProtocolError with a readable sentence on anything odd."""
    return _parse(line, _command_adapter, _COMMAND_TYPES, "command")
