"""FieldEditors: one editor widget per RunConfig field, bound both ways to a ConfigState.

The editor's kind and limits come from the pydantic field (Literal -> combo box, bool -> check
box, int / float with ge / le / gt -> spin boxes, optional numbers -> a spin box whose lowest value
reads "off"), and its tooltip is the field's description: the same text the CLI prints as help.
So a new config field needs no GUI code beyond naming it on a page.
"""

from __future__ import annotations

import typing
from typing import Any

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

from backend.core.config.run_config import RunConfig, section_models
from studio.state.config_state import ConfigState

SECTIONS: dict[str, type] = section_models()
"""Every RunConfig section by name (model, data, technique, train, export, hardware, kto, grpo)."""
INT_MAX = 2_000_000_000
FLOAT_MAX = 1e9


def field_info(key: str) -> Any:
    """The pydantic field of a dotted key (`train.seq_len`), or of a top-level one (`name`)."""
    if "." not in key:
        return RunConfig.model_fields[key]
    section, name = key.split(".", 1)
    return SECTIONS[section].model_fields[name]


def description(key: str) -> str:
    return " ".join((field_info(key).description or "").split())


def _bounds(info: Any) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low_is_exclusive, high_is_exclusive) from the field's constraints."""
    from backend.core.config.help import field_bounds

    return field_bounds(info)


def _kind(annotation: Any) -> tuple[str, bool, tuple[Any, ...]]:
    """("choice" | "bool" | "int" | "float" | "str", optional, choices)."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if optional:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return "choice", optional, typing.get_args(annotation)
    for kind, python in (("bool", bool), ("int", int), ("float", float)):
        if annotation is python:
            return kind, optional, ()
    return "str", optional, ()


def _names(problem: str, key: str) -> bool:
    """Whether an error sentence is about `key` (named whole, not as part of a longer key)."""
    at = problem.find(key)
    while at >= 0:
        end = at + len(key)
        if (at == 0 or not (problem[at - 1].isalnum() or problem[at - 1] in "._")) and \
                (end == len(problem) or not (problem[end].isalnum() or problem[end] == "_")):
            return True
        at = problem.find(key, at + 1)
    return False


class FieldEditors(QObject):
    """Creates editors for dotted keys and keeps them and the ConfigState in step."""

    def __init__(self, state: ConfigState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.editors: dict[str, list[QWidget]] = {}
        """Every editor made for each key (a key may be edited on two pages)."""
        self._updating = False
        self.flagged: dict[str, str] = {}
        """Keys whose editor shows the draft's problem (key -> the one-line error), beside the field itself."""
        state.changed.connect(self._on_state_changed)

    def editor(self, key: str, decimals: int = 3, step: float | None = None, none_text: str = "off") -> QWidget:
        """A new editor for `key`, showing the state's value, with the field's tooltip.

        Floats show `decimals` places; an optional number's lowest value reads `none_text`.
        """
        info = field_info(key)
        kind, optional, choices = _kind(info.annotation)
        low, high, low_open, high_open = _bounds(info)
        widget: QWidget
        if kind == "choice":
            widget = QComboBox()
            widget.addItems([str(c) for c in choices])
            widget.currentTextChanged.connect(lambda text, k=key: self._push(k, text))
        elif kind == "bool":
            widget = QCheckBox()
            widget.toggled.connect(lambda on, k=key: self._push(k, bool(on)))
        elif kind == "int":
            widget = QSpinBox()
            bottom = int(low) if low is not None else -INT_MAX
            if optional:
                bottom -= 1
                widget.setSpecialValueText(none_text)
            widget.setRange(bottom, int(high) if high is not None else INT_MAX)
            widget.setAccelerated(True)
            widget.setGroupSeparatorShown(True)
            widget.valueChanged.connect(lambda v, k=key, w=widget, o=optional: self._push(
                k, None if o and v == w.minimum() else int(v)))
        elif kind == "float":
            widget = QDoubleSpinBox()
            widget.setDecimals(decimals)
            smallest = 10 ** -decimals
            bottom = -FLOAT_MAX if low is None else float(low) + (smallest if low_open else 0.0)
            if optional:  # the lowest value means None, so it sits just below the first valid one
                bottom = float(low) if low is not None else 0.0
                widget.setSpecialValueText(none_text)
            top = FLOAT_MAX if high is None else float(high) - (smallest if high_open else 0.0)
            widget.setRange(bottom, top)
            widget.setSingleStep(step if step is not None else max(smallest, 0.1 if decimals <= 2 else smallest * 10))
            widget.valueChanged.connect(lambda v, k=key, w=widget, o=optional: self._push(
                k, None if o and v <= w.minimum() else float(v)))
        else:
            widget = QLineEdit()
            widget.editingFinished.connect(lambda k=key, w=widget: self._push(k, w.text().strip()))
        widget.setToolTip(description(key))
        widget.setObjectName(key)
        self.editors.setdefault(key, []).append(widget)
        self._show(key)
        self._flag_problem()
        return widget

    def first(self, key: str) -> QWidget:
        """The first editor made for `key` (tests drive it)."""
        return self.editors[key][0]

    # --- both directions ----------------------------------------------------------------------
    def _push(self, key: str, value: Any) -> None:
        if not self._updating:
            self.state.set(key, value)

    def _on_state_changed(self, key: str) -> None:
        for name in self.editors if key == "" else [key]:
            if name in self.editors:
                self._show(name)
        self._flag_problem()

    def _flag_problem(self) -> None:
        """Mark the editor(s) of the field the draft's error names: a red edge and the sentence in its tooltip."""
        problem = self.state.problem()
        named = [k for k in sorted(self.editors, key=len, reverse=True) if problem and _names(problem, k)]
        flagged = {key: problem for key in named[:2]}
        for key in set(self.flagged) | set(flagged):
            for widget in self.editors.get(key, []):
                if key in flagged:
                    widget.setStyleSheet("border: 1px solid #dc2626;")
                    widget.setToolTip(f"{flagged[key]}\n\n{description(key)}")
                else:
                    widget.setStyleSheet("")
                    widget.setToolTip(description(key))
        self.flagged = flagged

    def _show(self, key: str) -> None:
        value = self.state.get(key)
        self._updating = True
        try:
            for widget in self.editors[key]:
                if isinstance(widget, QComboBox):
                    widget.setCurrentText(str(value))
                elif isinstance(widget, QCheckBox):
                    widget.setChecked(bool(value))
                elif isinstance(widget, (QSpinBox, QDoubleSpinBox)):
                    widget.setValue(widget.minimum() if value is None else value)
                elif isinstance(widget, QLineEdit):
                    widget.setText("" if value is None else str(value))
        finally:
            self._updating = False

    def set_enabled(self, enabled: bool) -> None:
        """Lock every editor while a run is going (the running config must not seem to change)."""
        for widgets in self.editors.values():
            for widget in widgets:
                widget.setEnabled(enabled)
