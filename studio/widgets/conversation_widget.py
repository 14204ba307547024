"""ConversationWidget: a few dataset examples shown as the conversations the model will see.

Every message shows its role; assistant messages, the only text the loss is computed on, are
highlighted and tagged "trained on", so a person sees at once what the model learns to write and
what it only reads. A row with images shows their thumbnails beside it and an "image k" tag where
each sits in the text; its header says its tokens, the image tokens counted when the model says them.
"""

from __future__ import annotations

import html
import itertools
import re
from typing import Any, Sequence

from PySide6.QtCore import QUrl
from PySide6.QtGui import QColor, QImage, QPalette, QTextDocument
from PySide6.QtWidgets import QTextBrowser, QWidget

from backend.core.data.conversation import IMAGE_MARKER
from backend.core.data.images import ImageRef
from studio.widgets.thumbnail import SIDE, thumbnail

MAX_CHARS = 600
"""Longer messages are cut in the preview (not in training)."""
_MARKER = re.compile(re.escape(html.escape(IMAGE_MARKER)))


def tokens_text(text: int, pictures: int | None, count: int) -> str:
    """"164 tokens (32 text + 132 for 2 images)", or "32 text tokens + 2 images" when the model does not say."""
    if not count:
        return f"{text:,} tokens"
    images = f"{count} image{'s' if count > 1 else ''}"
    if pictures is None:
        return f"{text:,} text tokens + {images}"
    return f"{text + pictures:,} tokens ({text:,} text + {pictures:,} for {images})"


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
        self._images: list[Sequence[ImageRef]] = []
        self._tokens: list[tuple[int, int | None]] = []
        self._thumbnails: dict[str, QImage] = {}
        self.trained_count = 0
        """Assistant messages shown (the "trained on" ones); tests read it."""

    def set_conversations(self, conversations: list[list[dict[str, str]]] | tuple, images: Sequence = (),
                          tokens: Sequence[tuple[int, int | None]] = ()) -> None:
        """images: per conversation, its ImageRefs (thumbnails); tokens: per conversation, (text tokens,
        image tokens or None when the model does not say)."""
        self._conversations = [list(c) for c in conversations]
        self._images = list(images)
        self._tokens = list(tokens)
        self._thumbnails = {f"thumb:{n}-{k}": thumbnail(ref) for n, refs in enumerate(self._images, start=1)
                            for k, ref in enumerate(refs, start=1)}
        self._render()

    @property
    def thumbnail_count(self) -> int:
        """Thumbnails shown (tests read it)."""
        return len(self._thumbnails)

    def loadResource(self, kind: int, url: QUrl) -> Any:  # noqa: N802 (Qt override)
        """The thumbnails, by the names _render gives them (setHtml clears added resources)."""
        image = self._thumbnails.get(url.toString())
        if image is not None and kind == QTextDocument.ResourceType.ImageResource.value:
            return image
        return super().loadResource(kind, url)

    def _render(self) -> None:
        palette = self.palette()
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        trained_bg = _blend(base, QColor("#22c55e"), 0.22)
        other_bg = _blend(base, text, 0.06)
        muted = _blend(text, base, 0.45)
        parts, trained = [], 0
        for number, conversation in enumerate(self._conversations, start=1):
            refs = self._images[number - 1] if number <= len(self._images) else ()
            counted = self._tokens[number - 1] if number <= len(self._tokens) else None
            tokens = f" · {tokens_text(counted[0], counted[1], len(refs))}" if counted else ""
            parts.append(f"<p style='color:{muted}; margin-top:10px'><b>Example {number}</b>{tokens}</p>")
            if refs:
                thumbs = "".join(f"<img src='thumb:{number}-{k}'><br>" for k in range(1, len(refs) + 1))
                parts.append(f"<table width='100%' cellspacing='0' cellpadding='0'><tr><td width='{SIDE + 8}' "
                             f"valign='top'>{thumbs}</td><td>")
            tag = itertools.count(1)
            for message in conversation:
                role = message.get("role", "")
                content = message.get("content", "")
                if len(content) > MAX_CHARS:
                    content = content[:MAX_CHARS] + " …"
                body = html.escape(content).replace("\n", "<br>")
                if refs:
                    body = _MARKER.sub(lambda _, tag=tag: f"<span style='color:{muted}'>[image {next(tag)}]</span>",
                                       body)
                is_trained = role in ("assistant", "text")
                trained += is_trained
                badge = (" <span style='color:#16a34a'>· trained on</span>" if is_trained else "")
                background = trained_bg if is_trained else other_bg
                parts.append(
                    f"<table width='100%' cellpadding='6' style='background-color:{background}; "
                    f"margin-bottom:4px'><tr><td><span style='color:{muted}'><b>{html.escape(role)}</b>"
                    f"</span>{badge}<br>{body}</td></tr></table>"
                )
            if refs:
                parts.append("</td></tr></table>")
        self.trained_count = trained
        self.setHtml("".join(parts))

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() == event.Type.PaletteChange and self._conversations:
            self._render()
