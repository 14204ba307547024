"""PruneRankingWidget: the prune ranking (prune_ranking.json) as a table to tick what to cut.

Layers least important first, each layer's key/value head groups least important first, and each
layer's FFN channels (how much of the score the weakest quarter holds). Ticking a layer or a head
group, or the FFN row's "cut the weakest quarter", says `picks_changed`; the Prune tab fills that field
from `picked_layers()`, `picked_heads()` and `ffn_quarter_picked()` (the picks backend/pruning/request.py
takes: drop_layers, drop_heads as LAYER:GROUP, ffn_keep). Torch-free.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHeaderView, QTreeWidget, QTreeWidgetItem, QWidget

PICK = Qt.ItemDataRole.UserRole
"""Each tickable row's pick as text: "layer:I", "head:LAYER:GROUP" or "ffn"."""
FFN_QUARTER_KEEP = 0.75
"""The FFN share kept when the weakest quarter is cut."""


class PruneRankingWidget(QTreeWidget):
    """Three sections (layers, head groups, FFN channels), a row per unit with its score and a tick box."""

    picks_changed = Signal(str)
    """A tick box was ticked or cleared: the kind of pick ("layer", "head" or "ffn")."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setColumnCount(2)
        self.setHeaderLabels(("Cut", "Score"))
        self.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.header().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.header().setStretchLastSection(False)
        self.setUniformRowHeights(True)
        self.setToolTip("Tick what to cut: the Prune fields above follow. Least important first in each section.")
        self._filling = False
        self.itemChanged.connect(self._on_self_item_changed)

    def set_ranking(self, ranking: dict[str, Any]) -> None:
        """Show `ranking` (the prune job's prune_ranking.json), nothing ticked. KeyError/TypeError: another format."""
        self._filling = True
        try:
            self.clear()
            self._layers(ranking["layers"])
            self._heads(ranking["heads"])
            self._ffn(ranking["ffn"])
        finally:
            self._filling = False

    def _section(self, title: str, how: str) -> QTreeWidgetItem:
        section = QTreeWidgetItem(self, [title])
        section.setToolTip(0, how)
        section.setExpanded(True)
        return section

    def _row(self, parent: QTreeWidgetItem, text: str, score: str, pick: str | None,
             tip: str = "") -> QTreeWidgetItem:
        row = QTreeWidgetItem(parent, [text, score])
        row.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if pick is not None:
            row.setData(0, PICK, pick)
            row.setFlags(row.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            row.setCheckState(0, Qt.CheckState.Unchecked)
        if tip:
            row.setToolTip(0, tip)
        return row

    def _layers(self, layers: dict[str, Any]) -> None:
        section = self._section("Layers", layers["how"])
        scores = {s["layer"]: s for s in layers["scores"]}
        for i in layers["least_important_first"]:
            kind = scores[i].get("layer_type") or ""
            self._row(section, f"layer {i}" + (f" ({kind})" if kind else ""), f"{scores[i]['score']:.4f}",
                      f"layer:{int(i)}")

    def _heads(self, heads: dict[str, Any]) -> None:
        section = self._section("Head groups", heads["how"] + ". Each layer must lose the same number of groups.")
        for layer, (order, scores) in enumerate(zip(heads["least_important_first"], heads["scores"])):
            for group in order:
                self._row(section, f"layer {layer} · group {group}", f"{scores[group]:.3g}",
                          f"head:{layer}:{int(group)}", "a key/value group, with the query heads that share it")

    def _ffn(self, ffn: dict[str, Any]) -> None:
        section = self._section("FFN channels", f"{ffn['how']}; {ffn['intermediate_size']} per layer")
        self._row(section, "cut each layer's weakest quarter", "", "ffn",
                  f"keep {FFN_QUARTER_KEEP:.0%} of the FFN channels in every layer")
        for layer, row in enumerate(ffn["per_layer"]):
            self._row(section, f"layer {layer}: weakest quarter holds", f"{row['weakest_quarter_share']:.1%}", None,
                      f"min {row['min']:.3g}, median {row['median']:.3g}, max {row['max']:.3g}")

    def _picked(self, kind: str) -> list[list[int]]:
        """The ticked picks of one kind, as their numbers ("head:3:1" -> [3, 1])."""
        found = []
        for s in range(self.topLevelItemCount()):
            section = self.topLevelItem(s)
            for r in range(section.childCount()):
                row = section.child(r)
                pick = str(row.data(0, PICK) or "").split(":")
                if pick[0] == kind and row.checkState(0) == Qt.CheckState.Checked:
                    found.append([int(v) for v in pick[1:]])
        return found

    def picked_layers(self) -> list[int]:
        return sorted(layer for layer, in self._picked("layer"))

    def picked_heads(self) -> list[tuple[int, int]]:
        return sorted((layer, group) for layer, group in self._picked("head"))

    def ffn_quarter_picked(self) -> bool:
        return bool(self._picked("ffn"))

    def _on_self_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if not self._filling and column == 0 and item.data(0, PICK):
            self.picks_changed.emit(str(item.data(0, PICK)).split(":")[0])
