"""Make it fit: the config changes that bring a run's estimate under a memory, cheapest in speed first.

The estimate says a run does not fit a card; the person then wants to know what to change and what
each change costs. The candidates are tried greedily in `SPEED_COSTS`'s order (what costs least speed
first), each re-estimated with the same function every caller uses (run_estimate.estimate_run), kept
only where it lowers the total, and the search stops as soon as the total fits. A change whose setting
the run would not use (a CUDA-only shortcut on a CPU run, a shortcut of the SFT step under DPO) lowers
nothing and is skipped with why. Torch-free: the studio's Techniques page and `finetune-studio estimate
--fit` both ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.core.config.run_config import RunConfig
from backend.estimate import human_bytes
from backend.estimate.seq_len import longest_seq_len

MIN_SEQ_LEN = 8
"""train.seq_len's lower bound in RunConfig."""


@dataclass(frozen=True)
class SpeedCost:
    """What one change costs in speed: the mechanism, and the bench's figure where one was measured."""

    title: str
    cost: str
    measured: str = ""
    """The measured figure with where it was measured; "" where docs/benchmarks.md has none."""
    in_speed: bool = True
    """False for a change whose cost is not speed (shorter rows): there is no figure to ask for."""

    def sentence(self) -> str:
        """'one extra forward pass per step; not measured on a GPU yet' (or the measured figure)."""
        if not self.in_speed:
            return self.cost
        return f"{self.cost}; {self.measured or 'not measured on a GPU yet'}"


SPEED_COSTS: dict[str, SpeedCost] = {
    # Every `measured` below is empty because docs/benchmarks.md holds no speed figure for it yet; a figure
    # goes here only with the section it comes from. Sections that say so:
    # accumulation: "Throughput: the studio's worker against a bare transformers + peft Trainer" (CPU only,
    #   micro-batch 8 throughout, no micro-batch sweep).
    "accumulation": SpeedCost("Smaller micro-batches, more accumulation steps",
                              "the same examples per optimizer step in more, smaller passes (a GPU is less "
                              "busy on each)"),
    # checkpointing: "Session 12: the GPU proof in one run" ("GPU figures: not yet measured").
    "gradient_checkpointing": SpeedCost("Gradient checkpointing",
                                        "recomputes each layer's forward in the backward pass (one extra "
                                        "forward per step)"),
    # 8-bit optimizer: no section measures it (the bench's runs use adamw).
    "optimizer": SpeedCost("8-bit Adam", "quantizes the optimizer state at every step (bitsandbytes)"),
    # QLoRA: "Throughput: ..." ("No device was lent ... so there is no GPU figure yet" for --method qlora).
    "qlora": SpeedCost("QLoRA (4-bit base)", "dequantizes each frozen weight in every forward and backward"),
    # chunked loss: "Session 12: the chunked loss's memory on the CPU" ("no speed is claimed: that is for
    #   the GPU bench"); the shortcuts it is switched on with: "Session 7: shortcuts at hidden >= 1024".
    "chunked_loss": SpeedCost("Chunked loss (speed shortcuts on)",
                              "runs lm_head and the loss a chunk of rows at a time",
                              "the other shortcuts it comes with made a CPU step 1.15-1.21x faster (2 cores of an "
                              "AMD EPYC, hidden 1024, fp32 LoRA: docs/benchmarks.md, \"Session 7: shortcuts at "
                              "hidden >= 1024\"); the chunked loss itself runs on CUDA only and is not measured on a "
                              "GPU yet"),
    # activation offload: "Session 12: the GPU proof in one run" ("GPU figures: not yet measured").
    "activation_offload": SpeedCost("Activation offload", "copies each layer's checkpointed input to pinned CPU "
                                                          "memory and back every step"),
    # seq_len: a cost in what is learned rather than in speed; nothing to measure.
    "seq_len": SpeedCost("Shorter rows", "rows longer than the new train.seq_len are cut (data.truncate) or "
                                         "skipped: the cost is in what the model sees, not in speed", in_speed=False),
}
"""The candidates in the order they are tried: least speed lost first, a shorter seq_len last."""


@dataclass(frozen=True)
class FitStep:
    """One change the plan keeps: its dotted keys and values, and the estimate's parts around it."""

    name: str
    """A key of SPEED_COSTS."""
    changes: tuple[tuple[str, Any], ...]
    before: dict[str, int]
    after: dict[str, int]
    total_before: int
    total_after: int

    @property
    def speed(self) -> SpeedCost:
        return SPEED_COSTS[self.name]

    def set_args(self) -> list[str]:
        """['--set', 'train.micro_batch_size=2', ...]: the CLI's overrides for this change."""
        return [arg for key, value in self.changes for arg in ("--set", f"{key}={_word(value)}")]


@dataclass(frozen=True)
class FitPlan:
    """The changes that bring the estimate under `limit_bytes` (or as far as they go), before and after."""

    limit_bytes: int
    where: str
    total_before: int
    before: dict[str, int]
    steps: tuple[FitStep, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    """(SPEED_COSTS key, why it is not proposed) for the candidates tried and not kept."""
    problem: str = ""
    """Why there is no estimate to plan from (one line)."""

    @property
    def total_after(self) -> int:
        return self.steps[-1].total_after if self.steps else self.total_before

    @property
    def after(self) -> dict[str, int]:
        return self.steps[-1].after if self.steps else self.before

    @property
    def fits(self) -> bool:
        return not self.problem and self.total_after <= self.limit_bytes

    @property
    def already_fits(self) -> bool:
        return not self.problem and self.total_before <= self.limit_bytes

    def changes(self) -> dict[str, Any]:
        """Every dotted key the plan sets, with its final value (what the studio applies)."""
        return {key: value for step in self.steps for key, value in step.changes}

    def set_args(self) -> list[str]:
        """The CLI's --set overrides of every step, in order."""
        return [arg for step in self.steps for arg in step.set_args()]

    def skipped_lines(self) -> list[str]:
        """'QLoRA (4-bit base): the base is 4-bit already' for each candidate not proposed."""
        return [f"{SPEED_COSTS[name].title}: {why}" for name, why in self.skipped]

    def sentence(self) -> str:
        """One line: what fits, or what still does not and by how much."""
        if self.problem:
            return f"no plan: {self.problem}"
        if self.already_fits:
            return f"already fits {self.where}: {human_bytes(self.total_before)}"
        if self.fits:
            return (f"fits {self.where} with {len(self.steps)} change(s): {human_bytes(self.total_before)} -> "
                    f"{human_bytes(self.total_after)}")
        largest = max(self.after, key=self.after.get)  # type: ignore[arg-type]
        return (f"does not fit {self.where} even with every change: {human_bytes(self.total_after)} of "
                f"{human_bytes(self.limit_bytes)}, the largest part {largest} ({human_bytes(self.after[largest])})")

    def to_json(self) -> dict[str, Any]:
        return {"fits": self.fits, "already_fits": self.already_fits, "limit_bytes": self.limit_bytes,
                "for": self.where, "total_before": self.total_before, "total_after": self.total_after,
                "before": self.before, "after": self.after, "sentence": self.sentence(), "problem": self.problem,
                "set": self.set_args(), "changes": self.changes(),
                "steps": [{"name": s.name, "title": s.speed.title, "speed_cost": s.speed.sentence(),
                           "changes": dict(s.changes), "total_before": s.total_before, "total_after": s.total_after,
                           "before": s.before, "after": s.after} for s in self.steps],
                "skipped": [{"name": name, "why": why} for name, why in self.skipped]}


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def with_changes(config: RunConfig, changes: tuple[tuple[str, Any], ...]) -> RunConfig:
    """`config` with dotted keys set, validated as a whole (ValueError when the result breaks a rule)."""
    raw = config.model_dump(mode="json")
    for key, value in changes:
        section, name = key.split(".", 1)
        raw[section][name] = value
    return RunConfig.model_validate(raw)


Estimator = Callable[[RunConfig], Any]
"""config -> an estimate with `total_bytes` and `breakdown` (run_estimate.RunEstimate)."""


def _accumulation(config: RunConfig, fits: Callable[[RunConfig], bool]) -> tuple[tuple[str, Any], ...] | str:
    """The smallest split of the micro-batch that fits (else the smallest micro-batch), the effective
    batch kept exactly: micro-batch / d and accumulation x d for a divisor d of the micro-batch."""
    micro, accumulation = config.train.micro_batch_size, config.train.gradient_accumulation_steps
    least = 2 if config.technique.objective == "kto" else 1  # KTO's KL estimate needs two rows a micro-batch
    splits = [d for d in range(2, micro + 1) if micro % d == 0 and micro // d >= least]
    if not splits:
        return f"train.micro_batch_size is {micro} already" + (" (KTO needs 2)" if least == 2 else "")
    for d in splits:
        changes = (("train.micro_batch_size", micro // d), ("train.gradient_accumulation_steps", accumulation * d))
        if fits(with_changes(config, changes)):
            return changes
    d = splits[-1]
    return ("train.micro_batch_size", micro // d), ("train.gradient_accumulation_steps", accumulation * d)


def _candidate(name: str, config: RunConfig) -> tuple[tuple[str, Any], ...] | str:
    """The changes of one fixed candidate, or why it does not apply to `config`."""
    t = config.technique
    if name == "gradient_checkpointing":
        return "on already" if t.gradient_checkpointing else (("technique.gradient_checkpointing", True),)
    if name == "optimizer":
        if t.optimizer != "adamw":
            return f"technique.optimizer is {t.optimizer} already"
        if t.offload != "none":
            return "DeepSpeed's offload runs its own CPU Adam"
        return (("technique.optimizer", "adamw_8bit"),)
    if name == "qlora":
        if t.method in ("qlora", "full", "dora"):
            return {"qlora": "the base is 4-bit already", "full": "full tuning would become adapters: a change "
                    "of method, not of storage", "dora": "QLoRA would drop DoRA's magnitude vectors"}[t.method]
        return (("technique.method", "qlora"),)
    if name == "chunked_loss":
        return "the speed shortcuts are on already" if t.shortcuts == "auto" else (("technique.shortcuts", "auto"),)
    if name == "activation_offload":
        if t.activation_offload:
            return "on already"
        if not t.gradient_checkpointing:
            return "needs gradient checkpointing"
        return (("technique.activation_offload", True),)
    raise KeyError(name)


def make_fit(config: RunConfig, limit_bytes: int, estimate_at: Estimator, *, where: str = "the memory") -> FitPlan:
    """The greedy plan: SPEED_COSTS's candidates in order, each kept where it lowers the total, until
    the total fits `limit_bytes`. `estimate_at` is the caller's estimate (the same one it shows)."""
    def measure(run: RunConfig, changed: tuple[tuple[str, Any], ...] = ()) -> tuple[int, dict[str, int]]:
        result = estimate_at(run)
        if result.breakdown is None:
            raise ValueError(result.problem or "no estimate")
        refused = next((v for v in result.verdicts if v.blocks and v.field in dict(changed)), None)
        if refused is not None:  # the feasibility verdicts: a change that could not run there is no fix
            raise ValueError(refused.message())
        return int(result.total_bytes), result.breakdown.breakdown()

    try:
        total, parts = measure(config)
    except ValueError as exc:
        return FitPlan(limit_bytes, where, 0, {}, problem=str(exc).splitlines()[0])
    steps: list[FitStep] = []
    skipped: list[tuple[str, str]] = []
    for name in SPEED_COSTS:
        if total <= limit_bytes:
            break
        try:
            if name == "accumulation":
                changes = _accumulation(config, lambda run: measure(run)[0] <= limit_bytes)
            elif name == "seq_len":
                changes = _shorter_rows(config, limit_bytes, lambda run: measure(run)[0])
            else:
                changes = _candidate(name, config)
            if isinstance(changes, str):
                skipped.append((name, changes))
                continue
            changed = with_changes(config, changes)
            new_total, new_parts = measure(changed, changes)
        except ValueError as exc:
            skipped.append((name, str(exc).splitlines()[0]))
            continue
        if new_total >= total:
            skipped.append((name, f"does not lower the estimate on this run ({human_bytes(total)} -> "
                                  f"{human_bytes(new_total)}; a setting it would not use here, or one that costs more)"))
            continue
        steps.append(FitStep(name, changes, parts, new_parts, total, new_total))
        config, total, parts = changed, new_total, new_parts
    return FitPlan(limit_bytes, where, steps[0].total_before if steps else total,
                   steps[0].before if steps else parts, tuple(steps), tuple(skipped))


def _shorter_rows(config: RunConfig, limit_bytes: int,
                  total_at: Callable[[RunConfig], int]) -> tuple[tuple[str, Any], ...] | str:
    """train.seq_len at the longest that fits (longest_seq_len's bisection, capped at today's length)."""
    answer = longest_seq_len(config, limit_bytes, total_at, None, ceiling=config.train.seq_len)
    if answer.problem:
        return answer.problem
    if answer.seq_len is None or answer.seq_len < MIN_SEQ_LEN:
        return f"not even {MIN_SEQ_LEN}-token rows fit"
    if answer.seq_len >= config.train.seq_len:
        return "the rows fit at their length"
    return (("train.seq_len", answer.seq_len),)


def fit_estimator(device: str, **estimate_kwargs: Any) -> Estimator:
    """estimate_at for make_fit: estimate_run on `device` with the caller's kwargs (caps, calibration, ...)."""
    from backend.estimate.run_estimate import estimate_run

    return lambda config: estimate_run(config, device, **estimate_kwargs)



def cli_fit(args: Any, config: RunConfig, found: Any, answer: int | None) -> FitPlan:
    """The plan for `finetune-studio estimate --fit`: on --card-gb's card, else this machine's memory."""
    from backend.estimate.seq_len import cli_estimate_kwargs, cli_target

    device, limit, where = cli_target(args, found)
    return make_fit(config, limit, fit_estimator(device, **cli_estimate_kwargs(args, config, found, device, answer)),
                    where=where)
