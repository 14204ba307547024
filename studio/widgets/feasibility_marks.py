"""FeasibilityMarks: the Techniques page's options that cannot run on this machine, marked with why.

The worker's plan refuses what this machine cannot run (backend.estimate.feasibility); the page says so
before Start instead of ten seconds after it. A choice that is set and cannot run turns its label
red (amber where the worker runs a faithful fallback instead) with the sentence as its tooltip;
an option not chosen that could not run here is disabled (a combo's item, an unticked check box)
with the sentence as the item's or the label's tooltip; a note under the form lists them all.
"""

from __future__ import annotations

import html
from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QWidget

from studio.state.estimate_state import FEASIBILITY_KEYS, EstimateState
from studio.widgets.field_editors import description

RED, AMBER = "#dc2626", "#d97706"


class FeasibilityMarks:
    """Applies the estimate's verdicts to the page's labels and editors, and writes the note."""

    def __init__(self, estimate: EstimateState, labels: dict[str, QLabel], editor: Callable[[str], QWidget],
                 note: QLabel) -> None:
        self._estimate, self._labels, self._editor, self.note = estimate, labels, editor, note
        self.unavailable: dict[str, str] = {}
        """'key value' -> why it cannot run here, for the options not chosen (tests read it)."""
        note.setWordWrap(True)
        note.setTextFormat(Qt.TextFormat.RichText)
        estimate.changed.connect(self.refresh)

    def refresh(self) -> None:
        chosen = {v.field: v for v in self._estimate.verdicts}
        self.unavailable = {}
        for key in sorted(set(FEASIBILITY_KEYS) | set(chosen)):
            if key in self._labels:
                self._mark(key, chosen.get(key))
        lines = []
        for verdict in self._estimate.verdicts:
            if verdict.blocks:
                fix = f" ({verdict.fix})" if verdict.fix else ""
                why = html.escape(verdict.message() + fix, quote=False)
                lines.append(f"<span style='color:{RED}'>Cannot start here: {why}; the estimate leaves it out.</span>")
            elif verdict.downgrade_to:
                lines.append(f"<span style='color:{AMBER}'>Runs as {html.escape(verdict.downgrade_to, quote=False)}: "
                             f"{html.escape(verdict.reason, quote=False)}.</span>")
        if self.unavailable:
            names = ", ".join(html.escape(name, quote=False) for name in self.unavailable)
            lines.append(f"Not on this machine (hover over an option for why): {names}.")
        self.note.setText("<br>".join(lines))
        self.note.setVisible(bool(lines))

    def _mark(self, key: str, verdict) -> None:
        label = self._labels[key]
        label.setToolTip(description(key))
        label.setStyleSheet("")
        if verdict is not None:
            label.setStyleSheet(f"color: {AMBER if verdict.downgrade_to else RED};")
            label.setToolTip(f"{description(key)}\n\n"
                             + (f"Runs as {verdict.downgrade_to} here: {verdict.reason}" if verdict.downgrade_to
                                else f"Cannot run here: {verdict.reason}"))
        if key not in FEASIBILITY_KEYS:
            return
        editor = self._editor(key)
        if isinstance(editor, QComboBox):
            model = editor.model()
            for index in range(editor.count()):
                value = editor.itemText(index)
                reason = self._estimate.would_refuse(key, value)
                if isinstance(model, QStandardItemModel):
                    model.item(index).setEnabled(not reason or index == editor.currentIndex())
                editor.setItemData(index, reason or None, Qt.ItemDataRole.ToolTipRole)
                if reason:
                    self.unavailable[f"{key.split('.', 1)[1]} {value}"] = reason
        elif isinstance(editor, QCheckBox):
            reason = "" if editor.isChecked() else self._estimate.would_refuse(key, True)
            editor.setEnabled(not reason)  # a ticked one that cannot run stays enabled, to untick it
            if reason:
                self.unavailable[key.split(".", 1)[1]] = reason
                label.setToolTip(f"{description(key)}\n\nNot on this machine: {reason}")
