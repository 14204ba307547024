"""ConversationWidget: a few dataset examples shown as the conversations the model will see.

Every message shows its role; assistant messages, the only text the loss is computed on, are
highlighted and tagged "trained on", so a person sees at once what the model learns to write and
what it only reads.
"""

from __future__ import annotations

import html

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QTextBrowser, QWidget

MAX_CHARS = 600
"""Longer messages are cut in the preview (not in training)."""


def _blend(a: QColor, b: QColor, t: float) -> str:
    return QColor(int(a.red() * (1 - t) + b.red() * t), int(a.green() * (1 - t) + b.green() * t),
                  int(a.blue() * (1 - t) + b.blue() * t)).name()


class ConversationWidget(QTextBrowser):
    """Read-only rich text of conversations ([{role, content}] lists)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setPlaceholderText("Pick a dataset to preview its examples.")
        self._conversations: list[list[dict[str, str]]] = []
        self.trained_count = 0
        """Assistant messages shown (the "trained on" ones); tests read it."""

    def set_conversations(self, conversations: list[list[dict[str, str]]] | tuple) -> None:
        self._conversations = [list(c) for c in conversations]
        self._render()

    def _render(self) -> None:
        palette = self.palette()
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        trained_bg = _blend(base, QColor("#22c55e"), 0.22)
        other_bg = _blend(base, text, 0.06)
        muted = _blend(text, base, 0.45)
        parts, trained = [], 0
        for number, conversation in enumerate(self._conversations, start=1):
            parts.append(f"<p style='color:{muted}; margin-top:10px'><b>Example {number}</b></p>")
            for message in conversation:
                role = message.get("role", "")
                content = message.get("content", "")
                if len(content) > MAX_CHARS:
                    content = content[:MAX_CHARS] + " …"
                body = html.escape(content).replace("\n", "<br>")
                is_trained = role in ("assistant", "text")
                trained += is_trained
                tag = (" <span style='color:#16a34a'>· trained on</span>" if is_trained else "")
                background = trained_bg if is_trained else other_bg
                parts.append(
                    f"<table width='100%' cellpadding='6' style='background-color:{background}; "
                    f"margin-bottom:4px'><tr><td><span style='color:{muted}'><b>{html.escape(role)}</b>"
                    f"</span>{tag}<br>{body}</td></tr></table>"
                )
        self.trained_count = trained
        self.setHtml("".join(parts))

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange and self._conversations:
            self._render()
