"""TechniquesPage: step 3, choose how to train, and see the memory it will take before starting.

Every technique option and the batch / length / schedule knobs, each with its description as a
tooltip (what it saves, what it costs). Beside them the memory estimate follows every change, against
the detected device's memory, with a plain "fits / does not fit"; an option this machine cannot run
is marked with why (studio/widgets/feasibility_marks.py). Below, the command line that runs the
same setup headless.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QLabel,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from backend.config import TechniqueSection
from studio.state.config_state import ConfigState
from studio.state.estimate_state import EstimateState
from studio.widgets.column_flow_widget import ColumnFlowWidget
from studio.widgets.command_line_widget import CommandLineWidget
from studio.widgets.feasibility_marks import FeasibilityMarks
from studio.widgets.field_editors import FieldEditors
from studio.widgets.hardware_widget import HardwareWidget
from studio.widgets.memory_breakdown_widget import MemoryBreakdownWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.vertical_scroll_area import VerticalScrollArea

GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Method", (("technique.method", "Method"), ("technique.lora_rank", "LoRA rank"),
                ("technique.lora_alpha", "LoRA alpha"), ("technique.lora_dropout", "LoRA dropout"),
                ("technique.lora_targets", "LoRA targets"))),
    ("Memory and speed", (("technique.precision", "Precision"), ("technique.attention", "Attention"),
                          ("technique.gradient_checkpointing", "Gradient checkpointing"),
                          ("technique.optimizer", "Optimizer"), ("technique.offload", "Offload"),
                          ("technique.shortcuts", "Speed shortcuts"))),
    ("Data shaping", (("technique.packing", "Packing"), ("technique.neftune_alpha", "NEFTune alpha"))),
    ("Batch, length and schedule", (("train.micro_batch_size", "Micro batch size"),
                                    ("train.gradient_accumulation_steps", "Gradient accumulation"),
                                    ("train.seq_len", "Sequence length"), ("train.max_steps", "Max steps"),
                                    ("train.learning_rate", "Learning rate"), ("train.warmup_steps", "Warmup steps"),
                                    ("train.save_steps", "Save every (steps)"), ("train.eval_steps", "Evaluate every (steps)"))),
)
"""The page's groups: (title, ((dotted key, label), ...)). Every TechniqueSection field is here."""
LORA_ONLY = ("technique.lora_rank", "technique.lora_alpha", "technique.lora_dropout", "technique.lora_targets")
DECIMALS = {"train.learning_rate": 6, "technique.lora_dropout": 2, "technique.lora_alpha": 1,
            "technique.neftune_alpha": 1}


class TechniquesPage(QWidget):
    """The technique and training form, the live memory breakdown, and the command line."""

    def __init__(self, state: ConfigState, editors: FieldEditors, estimate: EstimateState,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self._editors = editors
        header = PageHeaderWidget("Techniques", "Choose how to train. Hover over an option to see what it "
                                                "saves and what it costs; the estimate on the right follows "
                                                "every change.")
        form_widget = ColumnFlowWidget()  # two columns on a wide window, one on a narrow one
        self.labels: dict[str, QLabel] = {}
        listed = {key for _, fields in GROUPS for key, _ in fields}
        more = tuple((f"technique.{name}", name.replace("_", " ").capitalize())
                     for name in TechniqueSection.model_fields if f"technique.{name}" not in listed)
        groups = GROUPS + ((("More techniques", more),) if more else ())  # a new technique field shows up by itself
        for index, (title, fields) in enumerate(groups):
            box = QGroupBox(title)
            form = QFormLayout(box)
            form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
            for key, label in fields:
                widget = editors.editor(key, decimals=DECIMALS.get(key, 3))
                widget.setMinimumWidth(150)
                text = QLabel(label)
                text.setToolTip(widget.toolTip())
                self.labels[key] = text
                form.addRow(text, widget)
            form_widget.add(box, 0 if index in (0, 2, 4) else 1)
        self.hardware = HardwareWidget(state, editors)
        form_widget.add(self.hardware, 0)
        self.form = form_widget
        scroll = VerticalScrollArea(form_widget)  # the form reflows to the width instead of scrolling sideways

        self.breakdown = MemoryBreakdownWidget(estimate)
        self.feasibility_label = QLabel()
        self.marks = FeasibilityMarks(estimate, self.labels, self.editor, self.feasibility_label)
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet("color: #dc2626;")
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(scroll)
        split.addWidget(self.breakdown)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        self.command_line = CommandLineWidget(state)
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(split, 1)
        layout.addWidget(self.feasibility_label)
        layout.addWidget(self.problem_label)
        layout.addWidget(self.command_line)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")
        self.marks.refresh()

    def editor(self, key: str) -> QWidget:
        """The editor this page made for `key`."""
        return next(w for w in self._editors.editors[key] if self.isAncestorOf(w))

    def _on_state_changed(self, key: str) -> None:
        if key in ("", "technique.method"):
            lora = self._state.get("technique.method") != "full"
            for name in LORA_ONLY:
                self.editor(name).setVisible(lora)
                self.labels[name].setVisible(lora)
        problem = self._state.problem()
        self.problem_label.setText(f"Cannot start: {problem}" if problem else "")
        self.problem_label.setVisible(bool(problem))
