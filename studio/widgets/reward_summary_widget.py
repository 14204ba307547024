"""RewardSummaryWidget: GRPO's reward functions as a few lines on the Techniques page, edited in a dialog.

The full editor (list, add/remove, each kind's parameters) is taller than the rest of the GRPO
settings together; in place it made the page scroll at 1280x800. The page keeps what a user must
see before Start (which rewards, their weights, the first problem) and the editor opens on demand.
Edits in the dialog write to the ConfigState at once, like every other field, so there is no
Apply: Close keeps them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.state.config_state import ConfigState
from studio.widgets.reward_editor_widget import KEY, RewardEditorWidget, rewards_problem, summary


LINES_WIDTH = 150
"""The rewards' lines' least width: an editor's (150), so the Objective column is no wider for them."""
DETAIL = 18
"""Characters of a reward's detail (pattern, column, strings) on the page; the tooltip has it whole."""


def short(reward: dict) -> str:
    """One page line: "regex · ^(yes|no)$ · ×0.5" (the editor's summary() names more)."""
    detail = {"exact_match": reward.get("column", ""), "regex": reward.get("pattern", ""),
              "length": f"{reward.get('target', 0)} chars", "banned": ", ".join(reward.get("strings", [])),
              "python": reward.get("function", "")}.get(reward.get("kind", ""), "")
    detail = str(detail)
    if len(detail) > DETAIL:
        detail = detail[:DETAIL - 1] + "…"
    return " · ".join(p for p in (reward.get("kind", "?"), detail, f"×{float(reward.get('weight', 1.0)):g}") if p)


class RewardSummaryWidget(QWidget):
    """One line per reward and the first problem in red; its `label` holds "Edit…" for the editor dialog."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines = QLabel()
        self.lines.setTextFormat(Qt.TextFormat.PlainText)
        self.lines.setMinimumWidth(LINES_WIDTH)
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Add, remove and change the reward functions")
        self.edit_button.clicked.connect(self.open_editor)
        self.label = QWidget()
        """The form row's label, "Rewards" with Edit… under it: the label column has the room beside two
        reward lines that the field column lacks under them (GRPO's page fits 1280x800 unscrolled)."""
        label_layout = QVBoxLayout(self.label)
        label_layout.setContentsMargins(0, 0, 0, 0)
        label_layout.setSpacing(0)
        label_layout.addWidget(QLabel("Rewards"))
        label_layout.addWidget(self.edit_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.problem_label = QLabel()
        self.problem_label.setStyleSheet("color: #dc2626;")
        self.problem_label.setWordWrap(True)
        self.problem_label.setTextFormat(Qt.TextFormat.PlainText)
        layout = QVBoxLayout(self)  # one narrow column: the row fits beside its label, never under it
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.lines)
        layout.addWidget(self.problem_label)
        layout.addStretch(1)

        self.dialog = QDialog(self)
        self.dialog.setWindowTitle("GRPO rewards")
        self.editor = RewardEditorWidget(state)
        """The editor in the dialog (it follows the config while hidden, so it is never stale)."""
        self.editor.list.setMaximumHeight(16777215)  # the dialog has the room the page lacked
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.dialog.close)
        box = QVBoxLayout(self.dialog)
        box.addWidget(QLabel("Each completion's reward is the weighted sum of these functions' scores."))
        box.addWidget(self.editor, 1)
        box.addWidget(close)
        self.dialog.resize(520, 420)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    def open_editor(self) -> None:
        """Show the editor dialog (window-modal; every edit is already in the config when it closes)."""
        self.dialog.open()

    def text(self) -> str:
        return self.lines.text()

    def problem(self) -> str:
        return self.problem_label.text()

    def set_columns(self, columns: tuple[str, ...] | None) -> None:
        """The data's columns as the Data page read them (None: unknown): a reward reading another is flagged."""
        self.editor.set_columns(columns)
        self._on_state_changed("")

    def _on_state_changed(self, key: str) -> None:
        if key not in ("", KEY):
            return
        rows = self.editor.rewards()  # the editor read the config first (it connected to it first)
        self.lines.setText("\n".join(short(r) for r in rows) or "none")
        self.lines.setToolTip("\n".join(summary(r) for r in rows) or "No reward function: GRPO needs one")
        problem = rewards_problem(rows, self.editor.columns)
        self.problem_label.setText(problem)
        self.problem_label.setVisible(bool(problem))
