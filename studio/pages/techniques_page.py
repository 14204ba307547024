"""TechniquesPage: step 3, choose how to train, and see the memory it will take before starting.

Every technique option and the batch / length / schedule knobs, each with its description as a
tooltip (what it saves, what it costs). Beside them the memory estimate follows every change, against
the detected device's memory, with a plain "fits / does not fit"; an option this machine cannot run
is marked with why (studio/widgets/feasibility_marks.py). Below, the command line that runs the
same setup headless.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from backend.api.vision import cap_cost_line
from backend.core.config.run_config import ConfigError, TechniqueSection
from backend.core.paths import resolve_resource
from backend.core.config.schedule import Schedule, held_out
from studio.state.config_state import ConfigState
from studio.state.estimate_state import EstimateState
from studio.widgets.column_flow_widget import ColumnFlowWidget
from studio.widgets.command_line_widget import CommandLineWidget
from studio.widgets.feasibility_marks import AMBER, FeasibilityMarks
from studio.widgets.field_editors import FieldEditors, description
from studio.widgets.form_rows import beside_row, dense, pair_row
from studio.widgets.hardware_widget import HardwareWidget
from studio.widgets.memory_breakdown_widget import MemoryBreakdownWidget
from studio.widgets.memory_target_widget import MemoryTargetWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.reward_summary_widget import RewardSummaryWidget
from studio.widgets.vertical_scroll_area import VerticalScrollArea

GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Objective", (("technique.objective", "Objective"), ("technique.dpo_beta", "DPO beta"),
                   ("technique.dpo_loss", "DPO loss"), ("kto.beta", "KTO beta"),
                   ("kto.desirable_weight", "Desirable weight"), ("kto.undesirable_weight", "Undesirable weight"),
                   ("grpo.num_generations", "Generations per prompt"),
                   ("grpo.max_completion_length", "Max completion length"), ("grpo.temperature", "Temperature"),
                   ("grpo.loss", "GRPO loss"), ("grpo.beta", "KL beta"))),
    ("Method", (("technique.method", "Method"), ("technique.lora_rank", "LoRA rank"),
                ("technique.lora_alpha", "LoRA alpha"), ("technique.lora_dropout", "LoRA dropout"),
                ("technique.lora_targets", "LoRA targets"))),
    ("Memory and speed", (("technique.precision", "Precision"), ("technique.attention", "Attention"),
                          ("technique.gradient_checkpointing", "Gradient checkpointing"),
                          ("technique.activation_offload", "Offload activations"),
                          ("technique.optimizer", "Optimizer"), ("technique.offload", "Offload"),
                          ("technique.shortcuts", "Speed shortcuts"), ("technique.liger_kernel", "Liger kernel"),
                          ("technique.torch_compile", "Torch compile"))),
    ("Data shaping", (("technique.packing", "Packing"), ("technique.neftune_alpha", "NEFTune alpha"))),
    ("Images", (("vision.tower", "Tune the vision tower"), ("vision.projector", "Tune the projector"),
                ("vision.max_pixels", "Image resolution cap"))),
    ("Batch, length and schedule", (("train.micro_batch_size", "Micro batch size"),
                                    ("train.gradient_accumulation_steps", "Gradient accumulation"),
                                    ("train.seq_len", "Sequence length"), ("train.max_steps", "Steps or epochs"),
                                    ("train.learning_rate", "Learning rate"), ("train.lr_scheduler", "LR schedule"),
                                    ("train.warmup_steps", "Warmup steps or ratio"),
                                    ("train.max_grad_norm", "Clip gradient norm"),
                                    ("train.save_steps", "Save / evaluate every"))),
)
"""The page's groups: (title, ((dotted key, label), ...)). Every TechniqueSection field is here (the
form stays in two columns at 1280x800 with GRPO's settings, so liger and compile join Memory and speed)."""
PAIRS = {"train.max_steps": ("train.num_epochs", "or"), "train.warmup_steps": ("train.warmup_ratio", "or"),
         "train.save_steps": ("train.eval_steps", "/")}
"""Fields side by side in one row: two ways to set one thing (schedule.ALTERNATIVES: setting one turns the
other off), and the two step intervals."""
BESIDE = {"technique.liger_kernel": "technique.torch_compile"}
"""Two check boxes in one row, each with its own label (marked apart): a row less in Memory and speed."""
PAIRED = {key for first, (second, _) in PAIRS.items() for key in (first, second)}
PAIRED_WIDTH = (84, 108)
"""Each editor of a pair, narrowest and widest, in pixels: seven digits show whole (the units are in the
row's label), and the form keeps its two columns at 1280x800 with GRPO's settings."""
COLUMNS = {"Objective": 0, "Method": 0, "Memory and speed": 1, "Batch, length and schedule": 1}
VISION_GROUP = "Images"
"""The group shown only while the model is a proven vision-language model (backend/training/vision)."""
"""Each group's column when the form has two; any other group (Data shaping, Hardware, More techniques)
goes to the shorter column, so a DPO, KTO or GRPO section does not make the left column scroll alone."""
OBJECTIVE_ONLY = {"technique.dpo_beta": "dpo", "technique.dpo_loss": "dpo", "kto.beta": "kto",
                  "kto.desirable_weight": "kto", "kto.undesirable_weight": "kto", "grpo.num_generations": "grpo",
                  "grpo.max_completion_length": "grpo", "grpo.temperature": "grpo", "grpo.loss": "grpo",
                  "grpo.beta": "grpo", "technique.activation_offload": "sft"}
"""The settings shown only while their objective is chosen (activation offload is a shortcut of the SFT step)."""
OBJECTIVE_TIPS = {
    "sft": "Supervised fine-tuning. Data: instructions with their answers (alpaca, sharegpt, messages or text). "
           "Teaches the model to answer like the examples.",
    "dpo": "Direct Preference Optimization. Data: prompt, chosen and rejected answers. Teaches the model to "
           "prefer the chosen answer over the rejected one. Costs a reference pass (with full tuning, a frozen "
           "copy of the base).",
    "kto": "Kahneman-Tversky Optimization. Data: prompt, completion and a true/false label. Teaches more of "
           "the answers labelled good and less of the bad ones, no pairs needed.",
    "grpo": "Group Relative Policy Optimization. Data: prompts (and the columns the rewards read). Samples "
            "several answers per prompt and reinforces those your reward functions score above the group's "
            "mean.",
}
"""The objective combo's item tooltips: what each needs as data and what it teaches."""
SFT_ONLY = {"technique.packing": "DPO, KTO and GRPO build their own batches (a prompt and its answers kept apart), "
                                 "so nothing is packed",
            "technique.shortcuts": "a DPO, KTO or GRPO run trains the plain transformers + peft way (the "
                                   "shortcuts' exactness tests cover the SFT step only)"}
"""Settings a TRL objective ignores (backend.training.model.techniques: no packing, shortcuts off), with why."""
OFFLOAD_NEEDS = (("technique.gradient_checkpointing", False, "needs gradient checkpointing (it keeps the inputs of "
                                                              "the checkpointed layers in host memory)"),
                 ("technique.torch_compile", True, "torch.compile would trace the copies"))
"""When technique.activation_offload does nothing (backend/core/registries/shortcuts.py _activation_offload):
(key, value that stops it, why); it also needs CUDA and a single or DDP run."""
NONE_TEXT = {"vision.max_pixels": "the model's"}
"""What an unset optional number reads where "off" would mislead: no cap of ours is the folder's own cap."""
LORA_ONLY = ("technique.lora_rank", "technique.lora_alpha", "technique.lora_dropout", "technique.lora_targets")
DECIMALS = {"train.learning_rate": 6, "train.warmup_ratio": 2, "train.max_grad_norm": 2, "technique.lora_dropout": 2,
            "technique.lora_alpha": 1,
            "technique.neftune_alpha": 1, "grpo.temperature": 2, "grpo.beta": 4, "kto.desirable_weight": 2,
            "kto.undesirable_weight": 2}


def epochs_text(epochs: float) -> str:
    """An epoch count as a person reads it: 0.84, 1.6, 12."""
    return f"{epochs:.2f}" if epochs < 1 else f"{epochs:.1f}" if epochs < 10 else f"{epochs:,.0f}"


class TechniquesPage(QWidget):
    """The technique and training form, the live memory breakdown, and the command line."""

    def __init__(self, state: ConfigState, editors: FieldEditors, estimate: EstimateState,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self._editors = editors
        self._examples: int | None = None
        """How many examples the Data page counted (None until it has)."""
        header = PageHeaderWidget("Techniques", "Choose how to train. Hover over an option to see what it "
                                                "saves and what it costs; the estimate on the right follows "
                                                "every change.")
        form_widget = ColumnFlowWidget()  # two columns on a wide window, one on a narrow one
        self.labels: dict[str, QLabel] = {}
        listed = {key for _, fields in GROUPS for key, _ in fields}
        more = tuple((f"technique.{name}", name.replace("_", " ").capitalize())
                     for name in TechniqueSection.model_fields if f"technique.{name}" not in listed)
        groups = GROUPS + ((("More techniques", more),) if more else ())  # a new technique field shows up by itself
        for title, fields in groups:
            box = QGroupBox(title)
            form = QFormLayout(box)
            form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
            dense(form)
            names = dict(fields)
            for key, label in fields:
                if key in BESIDE.values():
                    continue  # in the row of the one it sits beside
                widget = self._field(key)
                text = QLabel(label)
                text.setToolTip(widget.toolTip())
                self.labels[key] = text
                if key in PAIRS:  # one row, two editors: "Steps or epochs [60] or [2]"
                    other, joiner = PAIRS[key]
                    text.setToolTip(f"{description(key)}\n\n{description(other)}")
                    self.labels[other] = text
                    widget = pair_row(widget, joiner, self._field(other))
                if key in BESIDE:  # "Liger kernel [ ]   Torch compile [ ]"
                    other = BESIDE[key]
                    self.labels[other] = QLabel(names[other])
                    self.labels[other].setToolTip(description(other))
                    widget = beside_row(widget, self.labels[other], self._field(other))
                form.addRow(text, widget)
                if key == "train.seq_len":  # the inverse question, right under the field it answers
                    self.max_seq_len_label = QLabel("Longest that fits: …")  # one short line; the sentence in its tooltip
                    self.max_seq_len_label.setStyleSheet("color: palette(placeholder-text);")
                    self.max_seq_len_label.setWordWrap(True)  # "(model's limit)" wraps rather than widen the column
                    form.addRow(self.max_seq_len_label)  # both columns: one line at 1280x800
                if key == "vision.max_pixels":  # its token cost, right under it (api/vision.cap_cost_line)
                    self.image_cost_label = QLabel()
                    self.image_cost_label.setStyleSheet("color: palette(placeholder-text);")
                    self.image_cost_label.setWordWrap(True)
                    form.addRow(self.image_cost_label)
            if title == "Objective":
                self.rewards = RewardSummaryWidget(state)
                self.rewards_label = self.rewards.label
                self.rewards_label.setToolTip(description("grpo.rewards"))
                form.addRow(self.rewards_label, self.rewards)
                self.objective_form = form
            form_widget.add(box, COLUMNS.get(title))
            if title == VISION_GROUP:
                self.vision_box = box
        self.hardware = HardwareWidget(state, editors)
        dense(self.hardware.layout())
        form_widget.add(self.hardware, None)
        self.form = form_widget
        scroll = VerticalScrollArea(form_widget)  # the form reflows to the width instead of scrolling sideways

        self.breakdown = MemoryBreakdownWidget(estimate)
        self.target = MemoryTargetWidget(estimate, state)  # the card the run is for, and Make it fit
        self.breakdown.layout().insertWidget(1, self.target)
        self.feasibility_label = QLabel()
        self.marks = FeasibilityMarks(estimate, self.labels, self.editor, self.feasibility_label)
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet("color: #dc2626;")
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(scroll)
        split.addWidget(VerticalScrollArea(self.breakdown))  # a short window scrolls the notes, never draws them over the table
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        self.command_line = CommandLineWidget(state)
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(split, 1)
        layout.addWidget(self.feasibility_label)
        layout.addWidget(self.problem_label)
        layout.addWidget(self.command_line)
        objective = self.editor("technique.objective")
        for index in range(objective.count()):
            objective.setItemData(index, OBJECTIVE_TIPS.get(objective.itemText(index), ""),
                                  Qt.ItemDataRole.ToolTipRole)
        self._estimate = estimate
        estimate.answers_changed.connect(self._show_max_seq_len)
        estimate.changed.connect(self._show_offload)
        self._show_max_seq_len()
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")
        self.marks.refresh()

    def _field(self, key: str) -> QWidget:
        """The editor of `key` as this page shows it: paired fields narrower and with their unit."""
        if key not in PAIRED:
            widget = self._editors.editor(key, decimals=DECIMALS.get(key, 3), none_text=NONE_TEXT.get(key, "off"))
            widget.setMinimumWidth(150)
            return widget
        widget = self._editors.editor(key, decimals=DECIMALS.get(key, 3), none_text="—")
        if isinstance(widget, QAbstractSpinBox) and key == "train.eval_steps":
            widget.setSpecialValueText("at end")  # 0: only once, when training ends
        # Two in the row of one: sized for the values people set, not for the ten digits an int may hold.
        widget.setSizePolicy(QSizePolicy.Policy.Ignored, widget.sizePolicy().verticalPolicy())
        widget.setMinimumWidth(PAIRED_WIDTH[0])
        widget.setMaximumWidth(PAIRED_WIDTH[1])
        return widget

    def set_examples(self, count: int | None) -> None:
        """The Data page read the data (`count` examples; None when it could not): the length row says
        what the ruling field comes to in the other unit."""
        self._examples = count
        self._show_length()

    def _show_length(self) -> None:
        """The inactive one of steps and epochs shows what the active one comes to (approximate: the
        worker counts after tokenizing, and says the exact steps in its schedule line)."""
        steps, epochs = self.editor("train.max_steps"), self.editor("train.num_epochs")
        plan = self._length_plan()
        steps.setSpecialValueText(f"≈ {plan.steps:,}" if plan and plan.epochs else "—")
        epochs.setSpecialValueText(f"≈ {epochs_text(plan.steps / plan.steps_per_epoch)}" if plan and not plan.epochs
                                   else "—")
        for key, box in (("train.max_steps", steps), ("train.num_epochs", epochs)):  # the derived one in grey
            text = box.findChild(QLineEdit)  # the style sheet keeps a spin box's palette off its line edit
            palette = QPalette()  # no role of its own: the theme's, and it follows a change of theme
            if self._state.get(key) is None:
                palette.setColor(QPalette.ColorRole.Text, self.palette().color(QPalette.ColorRole.PlaceholderText))
            text.setPalette(palette)
        tip = f"{description('train.max_steps')}\n\n{description('train.num_epochs')}"
        if plan is not None:
            tip += (f"\n\nWith the Data page's {self._examples:,} examples: {plan.describe()}. Approximate: the "
                    "worker counts the rows after tokenizing (examples whose prompt fills seq_len are left out) "
                    "and says the exact steps when the run starts.")
        self.labels["train.max_steps"].setToolTip(tip)

    def _length_plan(self) -> Schedule | None:
        """The schedule over the examples the Data page counted, less the validation split; None when unknown."""
        if not self._examples:
            return None
        try:
            config = self._state.config()
            used = min(self._examples, config.data.max_examples or self._examples)
            return config.schedule(used - held_out(used, config.data.validation_split), config.hardware.world_size)
        except ConfigError:
            return None

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        """A new theme re-polishes every widget, the derived length's grey included: grey it again after."""
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            QTimer.singleShot(0, self, self._show_length)  # (dropped if the page is gone by then)

    def editor(self, key: str) -> QWidget:
        """The editor this page made for `key`."""
        return next(w for w in self._editors.editors[key] if self.isAncestorOf(w))

    def _on_state_changed(self, key: str) -> None:
        if key in ("", "technique.method"):
            lora = self._state.get("technique.method") != "full"
            for name in LORA_ONLY:
                self.editor(name).setVisible(lora)
                self.labels[name].setVisible(lora)
        if key in ("", "technique.objective", "technique.method"):
            self._show_objective()
        if key in ("", "technique.objective", "technique.packing"):
            self._show_packing()
        if key in ("", "technique.activation_offload", "hardware.strategy", *(k for k, _, _ in OFFLOAD_NEEDS)):
            self._show_offload()
        if key in ("", "model.path", "vision.max_pixels"):
            self._show_vision()
        problem = self._state.problem()
        self.problem_label.setText(f"Cannot start: {problem}" if problem else "")
        self.problem_label.setVisible(bool(problem))
        self._show_length()

    def _show_vision(self) -> None:
        """The Images group only for a proven VLM, with what a photo costs at the cap (config.json only)."""
        model = self._state.get("model.path")
        try:
            line = cap_cost_line(resolve_resource(model) if model else None, self._state.get("vision.max_pixels"))
        except (OSError, ValueError):  # a path that is not a folder yet, an image the family's rule refuses
            line = ""
        self.image_cost_label.setText(line)
        if getattr(self, "_vision_shown", None) != bool(line):
            self._vision_shown = bool(line)
            self.vision_box.setVisible(self._vision_shown)
            if hasattr(self, "form"):
                self.form.reflow()

    def _show_max_seq_len(self) -> None:
        """The longest seq_len that fits this device's memory (EstimateState.seq_len_answer)."""
        answer = self._estimate.seq_len_answer
        if answer is None:
            self.max_seq_len_label.setText("Longest that fits: …")
            return
        card = self._estimate.card_gb
        where = (f"a {card} GB card" if card else "this GPU" if self._estimate.device == "cuda"
                 else "this machine's RAM")
        fits = f"Longest that fits {f'{card} GB' if card else 'this GPU' if self._estimate.device == 'cuda' else 'RAM'}"
        if answer.seq_len is None:
            short = f"{fits}: none" if not answer.problem else ""
        else:
            short = f"{fits}: {answer.seq_len:,}" + (" (model's limit)" if answer.capped_at else "")
        self.max_seq_len_label.setText(short)
        self.max_seq_len_label.setToolTip(f"{answer.sentence(where)}. The longest train.seq_len whose estimated "
                                          f"total fits {self._estimate.limit_label or where}, every other setting "
                                          "as it is.")

    def _show_objective(self) -> None:
        """Only the chosen objective's settings; the rewards only for GRPO."""
        objective = self._state.get("technique.objective")
        for key, owner in OBJECTIVE_ONLY.items():  # each in its own group's form
            self.labels[key].parentWidget().layout().setRowVisible(self.labels[key], owner == objective)
        self.objective_form.setRowVisible(self.rewards_label, objective == "grpo")
        if hasattr(self, "form"):
            self.form.reflow()
        for key, why in SFT_ONLY.items():  # shown, so the SFT value stays in view, but off with the reason
            editor, label = self.editor(key), self.labels[key]
            editor.setEnabled(objective == "sft")
            tip = description(key) if objective == "sft" else \
                f"{description(key)}\n\nNot used by {objective.upper()}: {why}."
            editor.setToolTip(tip)
            label.setToolTip(tip)

    def _show_packing(self) -> None:
        """Off for a TRL objective, the box shows unticked (the draft keeps its value for SFT), as an option
        that cannot run here shows; its tooltip says why (SFT_ONLY)."""
        box = self.editor("technique.packing")
        box.blockSignals(True)  # what is shown, not what the draft holds
        box.setChecked(bool(self._state.get("technique.packing")) and self._state.get("technique.objective") == "sft")
        box.blockSignals(False)

    def offload_reason(self) -> str:
        """Why technique.activation_offload would do nothing with this draft here ("" when it would act)."""
        if self._estimate.device != "cuda":
            return "needs a CUDA GPU (it copies layer inputs to pinned host memory)"
        for key, value, why in OFFLOAD_NEEDS:
            if bool(self._state.get(key)) == value:
                return why
        strategy = self._state.get("hardware.strategy")
        return "" if strategy in ("single", "ddp") else f"{strategy} checkpoints its own way"

    def _show_offload(self) -> None:
        """Marked as the CUDA-only options are (feasibility_marks.py): disabled where it cannot act, why in
        the label's tooltip; ticked, it stays enabled to untick, its label amber."""
        key = "technique.activation_offload"
        box, label, reason = self.editor(key), self.labels[key], self.offload_reason()
        ticked = bool(self._state.get(key))
        box.setEnabled(ticked or not reason)
        label.setStyleSheet(f"color: {AMBER};" if reason and ticked else "")
        label.setToolTip(f"{description(key)}\n\nDoes nothing here: {reason}." if reason else description(key))
