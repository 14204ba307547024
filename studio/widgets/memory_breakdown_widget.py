"""MemoryBreakdownWidget: the estimate's parts as one stacked bar against the device's memory.

A person choosing techniques wants two answers at a glance: does it fit, and what is taking the
room. The bar answers the second (one coloured segment per part, scaled so the device's memory line
is always on screen), the verdict line the first, and the table gives the numbers.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPalette, QPen, QPixmap
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from backend.api.estimates import ALLOCATOR_RESERVE, CONTEXT_NOTE, CUDA_CONTEXT_BYTES, RESERVE_NOTE
from backend.api.estimates import PART_NOTES
from studio.state.estimate_state import EstimateState
from studio.widgets.units import human_bytes

PART_COLORS = {
    "weights": "#3b82f6",
    "adapters": "#06b6d4",
    "gradients": "#10b981",
    "optimizer": "#eab308",
    "master_weights": "#f97316",
    "activations": "#a855f7",
    "logits": "#ec4899",
    "runtime": "#94a3b8",
    "ref_model": "#155e75",
    "ref_adapter": "#0e7490",
    "reference": "#7c3aed",
    "generation": "#be185d",
    "vision_tower": "#0f766e",
    "projector": "#65a30d",
    "vision_activations": "#c026d3",
    "pixel_values": "#b45309",
    "allocator_reserve": "#64748b",
    "cuda_context": "#475569",
}
PART_WORDS = {
    "weights": "Weights", "adapters": "Adapters", "gradients": "Gradients", "optimizer": "Optimizer state",
    "master_weights": "Master weights", "activations": "Activations", "logits": "Logits / loss",
    "runtime": "Runtime (cuBLAS, transients)", "allocator_reserve": "CUDA allocator reserve",
    "cuda_context": "CUDA context",
    "ref_model": "Reference model (frozen copy)", "ref_adapter": "Reference adapter", "reference": "Reference / KL passes", "generation": "Generation (KV cache)",
    "vision_tower": "Vision tower", "projector": "Projector", "vision_activations": "Vision activations (per image)",
    "pixel_values": "Pixel values",
}
CPU_RUNTIME_WORDS = "Runtime (process baseline)"
CUDA_NOTES = {"allocator_reserve": RESERVE_NOTE.format(share=ALLOCATOR_RESERVE),
              "cuda_context": CONTEXT_NOTE.format(mib=CUDA_CONTEXT_BYTES >> 20)}
VERDICTS = {
    "fits": ("Fits", "#16a34a"),
    "tight": ("Tight: the peak fits, the sum of all parts does not", "#d97706"),
    "too_big": ("Does not fit", "#dc2626"),
    "unknown": ("Unknown", "#6b7280"),
}


def logits_note(details: dict) -> str:
    """What the logits part counts: the data's longest answer when the Data page measured it."""
    logits = details.get("logits") or {}
    positions, answer = logits.get("positions"), logits.get("target_tokens")
    if positions is None:
        return ""
    if logits.get("fused_head"):
        return (f"TRL's fused LM head over {positions:,} positions: a copy of the final hidden states and one "
                "4096-token tile of log-probabilities at a time, never the whole logits.")
    if answer is None:
        return (f"Counted at all {positions:,} positions of a micro-batch, the worst case: the data is not "
                "measured yet (or only a sample of it was), and raw text trains on every token.")
    return (f"Counted at {positions:,} positions per micro-batch: the longest answer in the data is "
            f"{answer:,} tokens (measured on every example), and logits are computed only where the loss is.")


def weights_note(details: dict) -> str:
    """Why the weights are smaller than 4 bytes per parameter on a CPU run, when they are."""
    weights = details.get("weights") or {}
    if not weights.get("bf16_base"):
        return ""
    return (f"The adapted layers' frozen weights are held in bf16 ({human_bytes(weights.get('bf16', 0))}), the rest "
            f"in fp32 ({human_bytes(weights.get('fp32', 0))}): this CPU multiplies bf16 natively, so with precision "
            "auto the base's products run in bf16. Precision fp32 keeps every weight in fp32.")


def runtime_note(details: dict) -> str:
    """What the runtime part holds: on the CPU the worker process itself, and how that was calibrated."""
    calibration = details.get("calibration") or {}
    if calibration.get("note"):
        return (f"The worker process itself, before the model loads (Python, torch, transformers, the tokenized "
                f"data): {calibration['note']}.")
    if (details.get("setup") or {}).get("device") == "cuda":
        return ("cuBLAS workspaces and the step's transients (a dequantized weight, DoRA's norm); the CUDA context "
                "and the allocator's reserve are parts of their own.")
    return ""


def activations_note(details: dict) -> str:
    """Why the activations differ from the seed article's coarse count (12 x hidden values per token
    per layer in 16-bit: its GPT-2 1.5B at 1K tokens x batch 32 is about 60 GB), in one line."""
    model, setup, act = details.get("model") or {}, details.get("setup") or {}, details.get("activations") or {}
    tokens = int(setup.get("micro_batch_size") or 0) * int(setup.get("seq_len") or 0)
    coarse = 12 * int(model.get("hidden_size") or 0) * tokens * int(model.get("layers") or 0) * 2
    if not coarse or not act.get("total"):
        return ""
    items = " ".join(act.get("per_layer_items") or {})
    why = ["every tensor autograd saves, counted per operation (Korthikanti et al.)"]
    if setup.get("attention_kernel") in ("eager", "math"):
        why.append(f"the s x s attention probabilities ({setup.get('attention_kernel')} kernel"
                   + (", as SDPA falls back to with attention dropout on the CPU)" if setup.get("attention_kernel") == "math" else ")"))
    if "mask" in items:
        why.append("dropout masks")
    if "one_plus_tanh" in items:
        why.append("GPT-2's gelu_new (four tensors)")
    if setup.get("gradient_checkpointing"):
        why.append("with checkpointing only each layer's input and one layer")
    return (f"{act['total'] / coarse:.1f}x the seed article's coarse count (12 x hidden per token per layer, 16-bit: "
            f"{human_bytes(coarse)} here) because this counts " + ", ".join(why) + ".")


def total_note(total: int, parts_sum: int) -> str:
    """Why the total is not the sum of the parts."""
    return (f"The step's peak plus the fixed runtime: the same total the Train page and `finetune-studio estimate` "
            f"show. The parts peak at different moments of a step, so they sum to more ({human_bytes(parts_sum)}).")


def _swatch(color: str) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor(color))
    return QIcon(pixmap)


class _StackedBar(QWidget):
    """The painted bar: segments left to right, the device limit as a red line with its label."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.parts: list[tuple[str, int]] = []
        self.limit: int | None = None
        self.setMinimumHeight(46)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(320, 46)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        text = self.palette().color(QPalette.ColorRole.WindowText)
        total = sum(v for _, v in self.parts)
        scale_max = max(total, self.limit or 0) * 1.04 or 1
        bar = QRectF(0, 4, self.width() - 1, 22)
        painter.setPen(QPen(text.lighter(150) if text.lightness() < 128 else text.darker(150), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(bar, 3, 3)
        x = bar.left()
        for name, value in self.parts:
            width = bar.width() * value / scale_max
            if width > 0:
                painter.fillRect(QRectF(x, bar.top() + 1, width, bar.height() - 1), QColor(PART_COLORS[name]))
                x += width
        if self.limit:
            lx = bar.left() + bar.width() * self.limit / scale_max
            painter.setPen(QPen(QColor("#dc2626"), 2))
            painter.drawLine(int(lx), 0, int(lx), int(bar.bottom()) + 4)
            label = f"limit {human_bytes(self.limit)}"
            width = painter.fontMetrics().horizontalAdvance(label)
            painter.setPen(text)
            painter.drawText(int(max(0, min(lx - width, self.width() - width))), int(bar.bottom()) + 17, label)
        painter.end()


class MemoryBreakdownWidget(QWidget):
    """Follows an EstimateState: the stacked bar, a verdict line, and a table of the parts."""

    def __init__(self, estimate: EstimateState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._estimate = estimate
        self.title = QLabel("<b>Estimated memory per device</b>")
        self.verdict_label = QLabel()
        self.verdict_label.setWordWrap(True)
        self.limit_label = QLabel()
        self.limit_label.setWordWrap(True)
        self.cards_label = QLabel()
        self.cards_label.setWordWrap(True)
        self.cards_label.setToolTip("The estimate on CUDA against common NVIDIA card sizes, each at its usable "
                                    "memory (a card reports a bit less than its nominal size; backend/estimate/cards.py).")
        self.bar = _StackedBar()
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Part", "Size", "Share"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.notes_label = QLabel()
        self.notes_label.setWordWrap(True)
        self.notes_label.setStyleSheet("color: palette(placeholder-text);")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.title, self.bar, self.verdict_label, self.limit_label, self.cards_label, self.table,
                       self.notes_label):
            layout.addWidget(widget)
        layout.addStretch(1)
        estimate.changed.connect(self._on_estimate_changed)
        estimate.answers_changed.connect(self._show_cards)
        self._on_estimate_changed()
        self._show_cards()

    def _show_cards(self) -> None:
        """The cards the run fits, only beside an estimate: under "No estimate" they would contradict it."""
        sentence = (self._estimate.cards or {}).get("sentence", "") if self._estimate.breakdown is not None else ""
        self.cards_label.setText(f"On CUDA: {sentence} (per GPU)" if sentence else "")
        self.cards_label.setVisible(bool(sentence))

    def verdict(self) -> str:
        return self._estimate.verdict()

    def part_sizes(self) -> dict[str, int]:
        """What the bar shows, part by part (tests read it)."""
        return dict(self.bar.parts)

    def _on_estimate_changed(self) -> None:
        estimate = self._estimate
        breakdown = estimate.breakdown
        self.bar.limit = estimate.limit_bytes
        self.limit_label.setText(f"Device: {estimate.limit_label}" if estimate.limit_label else
                                 "Device: detecting…")
        self._show_cards()
        if breakdown is None:
            self.bar.parts = []
            self.table.setRowCount(0)
            self.verdict_label.setText(f"<span style='color:#dc2626'>No estimate: {estimate.problem}</span>"
                                       if estimate.problem else "Estimating…")
            self.notes_label.setText("")
            self.bar.update()
            return
        parts = breakdown.breakdown()
        details = breakdown.details or {}
        self.bar.parts = [(name, value) for name, value in parts.items() if name in PART_COLORS]
        total = breakdown.sum_bytes or 1
        cpu = (details.get("setup") or {}).get("device") == "cpu"
        self.table.setRowCount(len(parts) + 1)
        for row, (name, value) in enumerate([*parts.items(), ("total", estimate.total_bytes or 0)]):
            words = CPU_RUNTIME_WORDS if name == "runtime" and cpu else PART_WORDS.get(name, name)
            label = QTableWidgetItem(words if name in PART_COLORS else "Total")
            if name == "logits":
                label.setToolTip(logits_note(details))
            elif name == "weights":
                label.setToolTip(weights_note(details))
            elif name == "runtime":
                label.setToolTip(runtime_note(details))
            elif name == "activations":
                label.setToolTip(activations_note(details))
            elif name in CUDA_NOTES:
                label.setToolTip(CUDA_NOTES[name])
            elif name in PART_NOTES:
                label.setToolTip(PART_NOTES[name])
            elif name == "total":
                label.setToolTip(total_note(value, breakdown.sum_bytes))
            if name in PART_COLORS:
                label.setIcon(_swatch(PART_COLORS[name]))
            else:
                font = label.font()
                font.setBold(True)
                label.setFont(font)
            size = QTableWidgetItem(human_bytes(value))
            size.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            share = QTableWidgetItem(f"{value / total:.0%}")
            share.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            for column, item in enumerate((label, size, share)):
                self.table.setItem(row, column, item)
        self.table.resizeRowsToContents()
        frame = 2 * self.table.frameWidth()
        self.table.setFixedHeight(self.table.verticalHeader().length() + self.table.horizontalHeader().height() + frame)
        header = self.table.horizontalHeader()  # wide enough that no part's name is elided
        self.table.setMinimumWidth(frame + sum(max(header.sectionSizeHint(c), self.table.sizeHintForColumn(c))
                                               for c in range(self.table.columnCount())))
        word, color = VERDICTS[estimate.verdict()]
        peak = human_bytes(estimate.total_bytes or 0)
        self.verdict_label.setText(f"<b style='color:{color}'>{word}</b> — predicted total {peak} (the step's peak), "
                                   f"sum of parts {human_bytes(breakdown.sum_bytes)}")
        warnings = list(details.get("warnings") or [])
        if details.get("calibration"):
            warnings.append(f"runtime: {details['calibration']['note']}")
        warnings += [f"{v.field} is estimated as {v.estimate_as} (what runs here)" for v in estimate.verdicts
                     if not v.allowed and v.estimate_as is not None]
        self.notes_label.setText("\n".join(f"Note: {w}" for w in warnings))
        self.bar.update()
