"""RewardEditorWidget: GRPO's reward functions (grpo.rewards), listed, added, removed and edited in place.

Each row is one RewardSpec: its kind, the parameters that kind reads (column, pattern, target,
strings, or a Python file and function) and its weight. Every edit writes the whole list to the
ConfigState, like any other field, so the command line and the saved config follow; each reward is
checked with RewardSpec itself and the first problem is shown in one line. A python reward's file is
only named here: the studio never imports it (the worker loads it).
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from backend.api.previews import reward_columns
from backend.core.config.objectives import REWARD_KINDS, RewardSpec
from studio.state.config_state import ConfigState

KEY = "grpo.rewards"
KIND_FIELDS: dict[str, tuple[str, ...]] = {"exact_match": ("column",), "regex": ("pattern",), "length": ("target",),
                                           "valid_json": (), "banned": ("strings",), "python": ("file", "function")}
"""The parameters each kind reads; only these (and kind, weight) are written to the config."""
LABELS = {"column": "Answer column", "pattern": "Pattern", "target": "Target length", "strings": "Banned strings",
          "file": "Python file", "function": "Function", "weight": "Weight", "kind": "Kind"}
DEFAULTS: dict[str, Any] = {"column": "answer", "pattern": "", "target": 0, "strings": [], "file": "", "function": ""}


def tip(name: str) -> str:
    """A RewardSpec field's description, as one line (the tooltip)."""
    return " ".join((RewardSpec.model_fields[name].description or "").split())


def compact(reward: dict[str, Any]) -> dict[str, Any]:
    """The reward as the config holds it: kind, the parameters its kind reads, weight."""
    kind = reward.get("kind", "exact_match")
    out: dict[str, Any] = {"kind": kind}
    for name in KIND_FIELDS.get(kind, ()):
        out[name] = reward.get(name, DEFAULTS[name])
    out["weight"] = reward.get("weight", 1.0)
    return out


def reward_problem(rewards: list[dict[str, Any]]) -> str:
    """The first reward that RewardSpec refuses, in one line ("" when all are fine)."""
    if not rewards:
        return "GRPO needs at least one reward function: add one"
    for number, reward in enumerate(rewards, start=1):
        try:
            RewardSpec.model_validate(reward)
        except ValidationError as exc:
            message = str(exc.errors()[0].get("msg", exc)).removeprefix("Value error, ")
            return f"Reward {number} ({reward.get('kind', '?')}): {message}"
    return ""


def missing_columns(rewards: list[dict[str, Any]], columns: tuple[str, ...] | None) -> dict[int, str]:
    """Row -> "the data has no column 'X'" for each reward that reads a column the data lacks (nothing
    while the data's columns are unknown)."""
    if columns is None:
        return {}
    return {row: f"the data has no column {column!r}" for row, reward in enumerate(rewards)
            for column in reward_columns([reward]) if column not in columns}


def rewards_problem(rewards: list[dict[str, Any]], columns: tuple[str, ...] | None) -> str:
    """The first problem of the rewards: one RewardSpec refuses, else a column the data lacks ("" if none)."""
    problem = reward_problem(rewards)
    missing = missing_columns(rewards, columns)
    if problem or not missing:
        return problem
    row = min(missing)
    return f"Reward {row + 1} ({rewards[row].get('kind', '?')}): {missing[row]}"


def summary(reward: dict[str, Any]) -> str:
    """One list row: "regex ^\\d+$ · weight 1"."""
    kind = reward.get("kind", "?")
    detail = {"exact_match": lambda r: f"column {r.get('column', '')}", "regex": lambda r: r.get("pattern", ""),
              "length": lambda r: f"{r.get('target', 0)} characters", "valid_json": lambda r: "",
              "banned": lambda r: ", ".join(r.get("strings", [])),
              "python": lambda r: f"{r.get('function', '')} in {r.get('file', '')}"}.get(kind, lambda r: "")(reward)
    weight = float(reward.get("weight", 1.0))
    return " · ".join(part for part in (kind, str(detail)[:60], f"weight {weight:g}") if part)


class RewardEditorWidget(QWidget):
    """The reward list with Add and Remove, the selected reward's form, and one line of problem."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self._rows: list[dict[str, Any]] = []
        self._writing = False
        self._showing = False
        self.columns: tuple[str, ...] | None = None
        """The data's columns as the Data page read them (None: unknown): a reward's missing column is flagged."""
        self.ask_file: Callable[[], str] = self._ask_file
        """Asks for a python reward's file; tests replace it to skip the dialog."""
        self.list = QListWidget()
        self.list.setMaximumHeight(84)
        self.list.setToolTip(" ".join((RewardSpec.__doc__ or "").split()) or "The reward functions")
        self.list.currentRowChanged.connect(self._on_list_current_row_changed)
        self.new_kind = QComboBox()
        self.new_kind.addItems(list(REWARD_KINDS))
        self.new_kind.setToolTip(tip("kind"))
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("Add a reward function of the chosen kind")
        self.add_button.clicked.connect(lambda: self.add(self.new_kind.currentText()))
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the selected reward function")
        self.remove_button.clicked.connect(lambda: self.remove(self.list.currentRow()))
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(QLabel("New reward:"))  # the kind of the one Add adds, not the selected row's
        buttons.addWidget(self.new_kind)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)

        self.fields: dict[str, QWidget] = {}
        self.kind = QComboBox()
        self.kind.addItems(list(REWARD_KINDS))
        self.kind.currentTextChanged.connect(lambda text: self._edit("kind", text))
        self.weight = QDoubleSpinBox()
        self.weight.setRange(-100.0, 100.0)
        self.weight.setDecimals(2)
        self.weight.setSingleStep(0.1)
        self.weight.valueChanged.connect(lambda value: self._edit("weight", float(value)))
        self.target = QSpinBox()
        self.target.setRange(0, 1_000_000)
        self.target.valueChanged.connect(lambda value: self._edit("target", int(value)))
        texts = {name: QLineEdit() for name in ("column", "pattern", "strings", "file", "function")}
        for name, edit in texts.items():
            edit.editingFinished.connect(lambda n=name, e=edit: self._edit(n, self._text_value(n, e.text())))
        texts["strings"].setPlaceholderText("comma-separated, e.g. As an AI, I cannot")
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setToolTip("Choose the .py file (it is only named here; the worker loads it)")
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        file_row = QWidget()
        file_layout = QHBoxLayout(file_row)
        file_layout.setContentsMargins(0, 0, 0, 0)
        file_layout.addWidget(texts["file"], 1)
        file_layout.addWidget(self.browse_button)
        self.fields.update({"kind": self.kind, "weight": self.weight, "target": self.target, **texts})
        self.form = QFormLayout()
        self.form.setContentsMargins(0, 0, 0, 0)
        self.field_labels: dict[str, QLabel] = {}
        for name in ("kind", "column", "pattern", "target", "strings", "file", "function", "weight"):
            label = QLabel(LABELS[name])
            label.setToolTip(tip(name))
            self.fields[name].setToolTip(tip(name))
            self.field_labels[name] = label
            self.form.addRow(label, file_row if name == "file" else self.fields[name])
        self.problem_label = QLabel()
        self.problem_label.setStyleSheet("color: #dc2626;")
        self.problem_label.setWordWrap(True)
        self.problem_label.setTextFormat(Qt.TextFormat.PlainText)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        layout.addLayout(buttons)
        layout.addLayout(self.form)
        layout.addWidget(self.problem_label)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    # --- reading the config ------------------------------------------------------------------------
    def rewards(self) -> list[dict[str, Any]]:
        """The list as written to the config (compact dicts)."""
        return [compact(row) for row in self._rows]

    def problem(self) -> str:
        return self.problem_label.text()

    def _on_state_changed(self, key: str) -> None:
        if self._writing or key not in ("", KEY):
            return
        try:
            value = self._state.get(KEY)
        except (KeyError, TypeError):
            value = None
        rows = value if isinstance(value, list) else []
        self._rows = [{**DEFAULTS, "weight": 1.0, **(r if isinstance(r, dict) else {})} for r in rows]
        self._refresh_list(max(0, min(self.list.currentRow(), len(self._rows) - 1)))

    def set_columns(self, columns: tuple[str, ...] | None) -> None:
        """The data's columns (None: unknown): rows whose column the data lacks turn red."""
        self.columns = columns
        self._refresh_list(self.list.currentRow())

    # --- editing -----------------------------------------------------------------------------------
    def add(self, kind: str) -> None:
        """A new reward of `kind`, selected, its parameters still to fill in."""
        self._rows.append({**DEFAULTS, "kind": kind, "weight": 1.0})
        self._write()
        self._refresh_list(len(self._rows) - 1)

    def remove(self, row: int) -> None:
        if 0 <= row < len(self._rows):
            del self._rows[row]
            self._write()
            self._refresh_list(min(row, len(self._rows) - 1))

    def set_field(self, name: str, value: Any) -> None:
        """Set one parameter of the selected reward, as typing it would (tests drive this)."""
        self._edit(name, value)
        self._show_row(self.list.currentRow())

    def _edit(self, name: str, value: Any) -> None:
        row = self.list.currentRow()
        if self._showing or not 0 <= row < len(self._rows) or self._rows[row].get(name) == value:
            return
        self._rows[row][name] = value
        self._write()
        self._mark_rows()
        if name == "kind":
            self._show_row(row)

    @staticmethod
    def _text_value(name: str, text: str) -> Any:
        if name == "strings":
            return [part.strip() for part in text.split(",") if part.strip()]
        return text.strip()

    def _write(self) -> None:
        self._writing = True
        try:
            self._state.set(KEY, self.rewards())
        finally:
            self._writing = False
        self._show_problem()

    def _on_browse_button_clicked(self) -> None:
        path = self.ask_file()
        if path:
            self.set_field("file", path)

    def _ask_file(self) -> str:
        path, _ = QFileDialog.getOpenFileName(self, "Choose the reward's Python file", "", "Python (*.py)")
        return path

    # --- showing -----------------------------------------------------------------------------------
    def _refresh_list(self, select: int) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for _ in self._rows:
            self.list.addItem("")
        self._mark_rows()
        self.list.setCurrentRow(select if self._rows else -1)
        self.list.blockSignals(False)
        self._show_row(select)
        self._show_problem()

    def _mark_rows(self) -> None:
        """Each row's summary; red, with why, where the reward reads a column the data lacks."""
        missing = missing_columns(self.rewards(), self.columns)
        for row, reward in enumerate(self._rows):
            item = self.list.item(row)
            item.setText(summary(reward) + (f"  ({missing[row]})" if row in missing else ""))
            item.setForeground(QBrush(QColor("#dc2626")) if row in missing else QBrush())
            item.setToolTip(missing.get(row, ""))

    def _on_list_current_row_changed(self, row: int) -> None:
        self._show_row(row)

    def _show_row(self, row: int) -> None:
        has = 0 <= row < len(self._rows)
        self.remove_button.setEnabled(has)
        reward = self._rows[row] if has else {"kind": "exact_match", **DEFAULTS, "weight": 1.0}
        kind = reward.get("kind", "exact_match")
        self._showing = True
        try:
            self.kind.setCurrentText(kind)
            self.weight.setValue(float(reward.get("weight", 1.0)))
            self.target.setValue(int(reward.get("target", 0) or 0))
            for name in ("column", "pattern", "file", "function"):
                self.fields[name].setText(str(reward.get(name, "")))
            self.fields["strings"].setText(", ".join(reward.get("strings", [])))
        finally:
            self._showing = False
        for name in ("kind", "column", "pattern", "target", "strings", "file", "function", "weight"):
            shown = has and (name in ("kind", "weight") or name in KIND_FIELDS.get(kind, ()))
            self.form.setRowVisible(self.field_labels[name], shown)

    def _show_problem(self) -> None:
        problem = rewards_problem(self.rewards(), self.columns)
        self.problem_label.setText(problem)
        self.problem_label.setVisible(bool(problem))
