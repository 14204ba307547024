"""EstimateState: the memory estimate of the draft config on the detected device (or on the card the
Techniques page picks), kept current, and whether Start may go (always judged for this machine).

Any change to the draft schedules one recomputation on the next turn of the event loop (several
changes in a row cost one estimate). The estimate is backend.estimate.run_estimate's, the one the CLI and
the worker use: the feasibility verdicts for this machine first (a choice that cannot run here is
estimated as what will run), then the estimator with this machine's CPU calibration. It is pure
Python and reads only config.json, so this stays in the GUI thread: a few milliseconds.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from backend.core.config.run_config import ConfigError
from backend.core.protocol import Capabilities
from studio.state.config_state import ConfigState

FEASIBILITY_KEYS = ("technique.method", "technique.precision", "technique.attention", "technique.optimizer",
                    "technique.offload", "technique.liger_kernel", "technique.torch_compile")
"""The choices whose other values the Techniques page marks when they cannot run here."""


ANSWERS_DELAY_MS = 300
"""The longest seq_len and the cards are worked out this long after the last change (tenths of a second each)."""


def predicted_peak(breakdown: Any) -> int:
    """The one predicted total of a Breakdown: its step peak plus the fixed runtime (`total_bytes`)."""
    return int(breakdown.total_bytes)


class EstimateState(QObject):
    """Breakdown of the draft (or the reason there is none), the verdicts, the device limit."""

    changed = Signal()
    """Emitted after the estimate, the verdicts or the device limit changed."""
    answers_changed = Signal()
    """Emitted after the longest seq_len and the card sizes were worked out again (a moment after `changed`)."""

    def __init__(self, config: ConfigState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._config = config
        self.breakdown: Any = None
        """The last Breakdown (backend.estimate), None when it could not be computed."""
        self.problem = ""
        """Why there is no estimate, in one line."""
        self.config_problem = ""
        """Why the draft is not a valid config ("" when it is)."""
        self.verdicts: tuple[Any, ...] = ()
        """backend.estimate.feasibility Verdicts of the draft on this machine: what does not run as asked."""
        self.start_verdicts: tuple[Any, ...] = ()
        """feasibility.before_start's: the verdicts plus the files (a model not downloaded) and the GPUs."""
        self.device = "cpu"
        self.limit_bytes: int | None = None
        self.limit_label = ""
        """What the limit is, e.g. "GPU 0 (NVIDIA H200): 139.8 GiB" or "System RAM: 15.6 GiB"."""
        self.machine: tuple[str, int | None, str] = ("cpu", None, "")
        """(device, memory, label) of this machine as detected; the Start verdicts are always its."""
        self.card_gb: int | None = None
        """The card the run is for (the Techniques page's picker, the CLI's --card-gb); None: this machine."""
        self.calibration: Any = None
        """backend.estimate.calibration.Calibration of this machine's runs (read once, again after each run)."""
        self._confirmed: Capabilities | None = None
        self._caps: dict[str, Capabilities] = {}
        self._answers: tuple[str, int | None] = ("", None)
        self._images: tuple[str, int | None] = ("", None)
        """(data path, its longest answer in tokens) from the Data page's measurement."""
        self._data_problem: tuple[str, str] = ("", "")
        """(data path, why the Data page could not read it)."""
        self._result: Any = None
        self._model_config: tuple[str, dict[str, Any] | None] | None = None
        """(model path, its config.json) for this round of verdicts; read again at each recompute."""
        self.seq_len_answer: Any = None
        """backend.estimate.seq_len.SeqLenAnswer: the longest seq_len that fits the device's memory."""
        self.cards: dict[str, Any] = {}
        """Which common card sizes the run fits on CUDA (backend.estimate.cards.cuda_cards)."""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.recompute)
        self._answers_timer = QTimer(self)
        self._answers_timer.setSingleShot(True)
        self._answers_timer.setInterval(ANSWERS_DELAY_MS)  # a bisection is ~20 estimates: once typing stops
        self._answers_timer.timeout.connect(self.recompute_answers)
        config.changed.connect(self._on_config_changed)

    # --- inputs -------------------------------------------------------------------------------
    def set_device(self, device: str, limit_bytes: int | None, label: str) -> None:
        """This machine's device and memory (the monitor's); the estimate's unless a card is chosen."""
        self.machine = (device, limit_bytes, label)
        self._aim()

    def set_card(self, card_gb: int | None) -> None:
        """Estimate for a CUDA card of `card_gb` GB (its usable memory by backend.estimate.cards), or None:
        for this machine again."""
        self.card_gb = card_gb
        self._aim()

    def _aim(self) -> None:
        """Recompute for the chosen memory; recomputes only when the device kind changed."""
        from backend.api.estimates import card_words, usable_bytes

        device, limit_bytes, label = self.machine if self.card_gb is None else (
            "cuda", usable_bytes(self.card_gb), card_words(self.card_gb))
        if (device, limit_bytes, label) == (self.device, self.limit_bytes, self.limit_label):
            return
        kind_changed = device != self.device
        self.device, self.limit_bytes, self.limit_label = device, limit_bytes, label
        if kind_changed:
            self.recompute()
        else:
            self.changed.emit()
            self._answers_timer.start()

    def set_capabilities(self, caps: Capabilities) -> None:
        """What a worker probed (bf16, bitsandbytes, flash-attn, ...): it replaces the studio's guess."""
        if caps != self._confirmed:
            self._confirmed = caps
            self._timer.start()

    def set_longest_answer(self, data_path: str, tokens: int | None, images: int | None = None) -> None:
        """The Data page measured the data: logits are counted for its longest answer, not every position;
        a vision-language model's image side for its most images in a row (None: not known, one assumed)."""
        if (data_path, tokens) != self._answers or (data_path, images) != self._images:
            self._answers = (data_path, tokens)
            self._images = (data_path, images)
            self._timer.start()

    def set_data_problem(self, data_path: str, problem: str) -> None:
        """The Data page could not read `data_path` (or "" once it could): Start waits for a fix."""
        if (data_path, problem) != self._data_problem:
            self._data_problem = (data_path, problem)
            self._timer.start()

    def recalibrate(self) -> None:
        """Read this machine's runs again (a run just wrote its memory.json)."""
        from backend.api.estimates import Calibration

        self.calibration = Calibration.read()
        self._timer.start()

    @property
    def longest_answer(self) -> int | None:
        """The measured longest answer, when it belongs to the draft's data path."""
        path, tokens = self._answers
        return tokens if path and path == self._config.get("data.path") else None

    @property
    def images_per_row(self) -> int | None:
        """The data's most images in a row, when it belongs to the draft's data path."""
        path, images = self._images
        return images if path and path == self._config.get("data.path") else None

    @property
    def data_problem(self) -> str:
        """The Data page's problem with the draft's data path ("" when none)."""
        path, problem = self._data_problem
        return problem if path == self._config.get("data.path") else ""

    def caps(self, device: str | None = None) -> Capabilities:
        """The machine as the verdicts see it for `device` (default: the estimate's): the worker's probe
        once one ran, else found torch-free."""
        from backend.core.device_caps import device_caps

        device = device or self.device
        if self._confirmed is not None:
            return self._confirmed.model_copy(update={"cuda": device == "cuda"})
        if device not in self._caps:
            self._caps[device] = device_caps(device)
        return self._caps[device]

    def _on_config_changed(self, key: str) -> None:
        if key != "name" and not key.startswith("export."):
            self._timer.start()

    def recompute(self) -> None:
        from backend.api.estimates import estimate_run  # pure Python; imported when first needed

        self._timer.stop()
        if self.calibration is None:
            self.recalibrate()
            self._timer.stop()
        from backend.api.verdicts import before_start, runs_folder_verdicts, verdicts

        self._model_config = None
        try:
            config = self._config.config()
        except (ConfigError, ValueError) as exc:
            self.breakdown = None
            self.problem = self.config_problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            draft = self._draft()  # its choices are still judged: every problem is shown at once
            self.start_verdicts = () if draft is None else tuple(before_start(
                draft, self.caps(self.machine[0]), self.model_config(draft.model.path), data_problem=self.data_problem)
                + runs_folder_verdicts())
            self.verdicts = () if draft is None else tuple(verdicts(
                draft, self.model_config(draft.model.path), self.caps(), data_problem=self.data_problem))
            self.changed.emit()
            return
        self.config_problem = ""
        result = estimate_run(config, self.device, caps=self.caps(), target_tokens=self.longest_answer,
                              calibration=self.calibration, data_problem=self.data_problem,
                              model_config=self.model_config(config.model.path), images_per_row=self.images_per_row)
        self.breakdown, self.verdicts, self.problem = result.breakdown, result.verdicts, result.problem
        self._result = result
        self.start_verdicts = tuple(before_start(config, self.caps(self.machine[0]), self.model_config(config.model.path),
                                                 data_problem=self.data_problem) + runs_folder_verdicts())
        self.changed.emit()
        self._answers_timer.start()

    def recompute_answers(self) -> None:
        """The inverse questions of the estimate: the longest seq_len that fits this device's memory
        and the card sizes the run fits on CUDA (the same estimate_run, torch-free)."""
        from backend.api.estimates import cuda_cards
        from backend.api.estimates import longest_seq_len, run_total

        self._answers_timer.stop()
        self.seq_len_answer, self.cards = None, {}
        try:
            config = self._config.config()
        except (ConfigError, ValueError):
            config = None
        raw = self.model_config(config.model.path) if config is not None else None
        if config is not None and raw is not None and self.breakdown is not None:
            self.cards = cuda_cards(config, self._result, self.longest_answer, None, None, model_config=raw)
            if self.limit_bytes:
                total = run_total(self.device, caps=self.caps(), target_tokens=self.longest_answer,
                                  calibration=self.calibration, data_problem=self.data_problem, model_config=raw,
                                  images_per_row=self.images_per_row)
                self.seq_len_answer = longest_seq_len(config, self.limit_bytes, total, raw,
                                                      images_per_row=self.images_per_row)
        self.answers_changed.emit()

    def fit_plan(self) -> Any:
        """backend.estimate.fit's FitPlan for the draft against the chosen memory (None: no valid draft or
        no memory known), with the estimate this page shows."""
        from backend.api.estimates import fit_estimator, make_fit

        try:
            config = self._config.config()
        except (ConfigError, ValueError):
            return None
        if not self.limit_bytes:
            return None
        estimate_at = fit_estimator(self.device, caps=self.caps(), target_tokens=self.longest_answer,
                                    calibration=self.calibration, data_problem=self.data_problem,
                                    model_config=self.model_config(config.model.path),
                                    images_per_row=self.images_per_row)
        return make_fit(config, self.limit_bytes, estimate_at, where=self.limit_label)

    def _draft(self) -> Any:
        """The form as a RunConfig, or (when it breaks a rule across sections) its sections alone."""
        from backend.api.verdicts import lenient_config

        try:
            return self._config.config()
        except (ConfigError, ValueError):
            return lenient_config(self._config.raw())

    # --- outputs ------------------------------------------------------------------------------
    @property
    def total_bytes(self) -> int | None:
        """The one predicted total (the step's peak plus the fixed runtime), as the CLI and the Train page show it."""
        return None if self.breakdown is None else predicted_peak(self.breakdown)

    @property
    def peak_bytes(self) -> int | None:
        """The same total (the Train page's name for it) where it is this machine's device's: a run
        trains here, so a card's estimate on a CPU machine predicts nothing for it (None)."""
        return self.total_bytes if self.device == self.machine[0] else None

    @property
    def sum_bytes(self) -> int | None:
        """The sum of the parts: an upper bound that holds every part at its own peak at once."""
        return None if self.breakdown is None else int(self.breakdown.sum_bytes)

    def verdict(self) -> str:
        """fits | tight (the total fits, the sum of parts does not) | too_big | unknown."""
        if self.breakdown is None or not self.limit_bytes:
            return "unknown"
        if self.sum_bytes is not None and self.sum_bytes <= self.limit_bytes:
            return "fits"
        if self.total_bytes is not None and self.total_bytes <= self.limit_bytes:
            return "tight"
        return "too_big"

    def start_blocker(self, anyway: bool = False) -> str:
        """Why Start may not go, every reason at once, one line each ("" when it may): an invalid form,
        a model not downloaded or a file not there, what this machine cannot run (the Data page's
        problem included) and the estimate over the device's memory: backend.estimate.start_verdicts,
        the verdicts `train` refuses with. `anyway`: the person pressed Start anyway, which overrides
        the memory verdict only."""
        lines = [self.config_problem] if self.config_problem else []
        lines += [line for line in self.blocking_lines(anyway) if line not in lines]
        return "\n".join(lines)

    def blocking_lines(self, anyway: bool = False) -> list[str]:
        """Each blocking verdict as `field: reason` (the memory one with its fix, which says how to start anyway)."""
        found = [v for v in self.all_start_verdicts() if v.blocks and not (anyway and v.overridable)]
        return [v.message() + (f"; {v.fix}" if v.overridable else "") for v in found]

    def all_start_verdicts(self) -> list[Any]:
        """before_start's verdicts and the runs folder's (at the last recompute), and the memory verdict
        of the current estimate against THIS machine's memory (which may change without a recompute). A card
        picked for planning ("For:") does not move Start's verdict; while it is of another device kind than
        this machine's, the estimate shown is not this machine's, so no memory verdict is drawn from it."""
        from backend.api.verdicts import memory_verdict

        device, limit, label = self.machine
        if device != self.device:
            return list(self.start_verdicts)
        where = (label.split(":")[0] or "this GPU") if device == "cuda" else "this machine's RAM"
        memory = memory_verdict(self.breakdown, limit, where, "press Start anyway")
        return list(self.start_verdicts) + ([memory] if memory is not None else [])

    def may_start_anyway(self) -> bool:
        """Whether "Start anyway" is offered: the form is valid and every blocking verdict may be overridden."""
        from backend.api.verdicts import overridden

        return not self.config_problem and overridden(self.all_start_verdicts())

    def model_config(self, path: str) -> dict[str, Any] | None:
        """config.json of `path` (None when unreadable: the estimate says why), read once per recompute."""
        from backend.api.estimates import load_model_config

        if self._model_config is None or self._model_config[0] != path:
            try:
                self._model_config = (path, load_model_config(path))
            except ValueError:
                self._model_config = (path, None)
        return self._model_config[1]

    def would_refuse(self, key: str, value: Any) -> str:
        """Why `key` set to `value` could not run here ("" if it could): the Techniques page marks it."""
        from backend.api.verdicts import verdicts

        config = self._draft()  # an invalid form still marks what could not run: no choice is clickable unsaid
        if config is None:
            return ""
        section, name = key.split(".", 1)
        changed = config.model_copy(update={section: getattr(config, section).model_copy(update={name: value})})
        found = verdicts(changed, self.model_config(config.model.path), self.caps())
        return next((v.reason for v in found if v.field == key and v.blocks), "")
