"""PruneWidget: the Export page's Prune section: rank a run's layers, key/value head groups and FFN channels,
remove what is picked, and show the figures before and after (backend/jobs/prune.py in a fresh worker).

The picks are checked against the model's config.json before a worker starts (backend/pruning/request.py,
the CLI's own check), so a layer out of range or an uneven head pick is one red line, not a failed job.
The ranking is a table to tick what to cut (studio/widgets/prune_ranking_widget.py), which fills the
fields; the report is the CLI's text (backend/pruning/report.py). Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from backend.core.errors import JobError
from backend.core.protocol import PhaseChanged
from backend.api.pruning import RANKING, REPORT, format_report, read_json
from backend.api.pruning import MIN_FFN_KEEP, PruneRequest, Shape, out_problem
from backend.core.runs.run_folder import RunFolder
from studio.job_controller import JobController, JobOutcome, failure_text
from studio.widgets.prune_ranking_widget import FFN_QUARTER_KEEP, PruneRankingWidget


FIELDS = (("--drop-layers", "Drop layers"), ("--layers", "the least important layers"),
          ("--drop-heads", "Drop head groups per layer"), ("--ffn-keep", "Keep FFN channels"))
HINT = "Rank lists what matters least; tick what to cut there, then Prune. Prune shows the figures before and after."
"""The CLI's flags, as the refusals shared with the CLI name them, and the fields they are here."""


def in_words(message: str) -> str:
    """A refusal shared with the CLI, naming this tab's fields instead of the CLI's flags."""
    for flag, field in FIELDS:
        message = message.replace(flag, field)
    return message


class PruneWidget(QGroupBox):
    """Rank / Prune / Stop, the picks, an output folder, a status line and the ranking or report as text."""

    def __init__(self, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__("Rank and remove layers, head groups, FFN channels", parent)
        self.jobs = jobs
        self._path = ""
        self._last: Path | None = None  # the file the running job will write
        self.layers_edit = QLineEdit()
        self.layers_edit.setPlaceholderText("e.g. 12,13, or tick below")  # short: the field is narrow
        self.layers_edit.setToolTip("Layer indices to remove, from the ranking (ticking a layer there fills this)")
        self.count_spin = QSpinBox()
        self.count_spin.setRange(0, 999)
        self.count_spin.setSpecialValueText("none")
        self.count_spin.setToolTip("Drop this many of the least important layers (when no indices are given)")
        self.heads_spin = QSpinBox()
        self.heads_spin.setRange(0, 999)
        self.heads_spin.setSpecialValueText("none")
        self.heads_spin.setToolTip("Key/value groups removed from every layer, each with its query heads: "
                                   "transformers keeps one head count for all layers")
        self.heads_edit = QLineEdit()
        self.heads_edit.setPlaceholderText("e.g. 0:1,1:0 (layer:group)")
        self.heads_edit.setToolTip("The key/value groups to remove, as LAYER:GROUP from the ranking (ticking a group "
                                   "there fills this), the same number in every layer; when given, the count above "
                                   "is not used")
        self.ffn_spin = QDoubleSpinBox()
        self.ffn_spin.setDecimals(3)
        self.ffn_spin.setRange(MIN_FFN_KEEP, 1.0)  # the floor the CLI refuses below (pruning/request.py)
        self.ffn_spin.setSingleStep(0.05)
        self.ffn_spin.setValue(1.0)
        self.ffn_spin.setToolTip("Share of FFN channels kept in every layer (1.00 keeps them all)")
        self.out_edit = QLineEdit()
        self.out_edit.setPlaceholderText("RUN_DIR/pruned")
        self.overwrite_check = QCheckBox("Overwrite what that folder holds")
        form = QFormLayout()
        form.addRow("Drop layers", self.layers_edit)
        form.addRow("or the least important", self.count_spin)
        form.addRow("Drop head groups per layer", self.heads_spin)
        form.addRow("or these head groups", self.heads_edit)
        form.addRow("Keep FFN channels", self.ffn_spin)
        form.addRow("Output folder", self.out_edit)
        form.addRow("", self.overwrite_check)
        self.rank_button = QPushButton("Rank")
        self.rank_button.setToolTip("Measure every layer, head group and FFN channel on the run's training data")
        self.rank_button.clicked.connect(lambda: self._start(rank_only=True))
        self.prune_button = QPushButton("Prune")
        self.prune_button.setToolTip("Merge the adapter, remove the picks, write the model and measure it again")
        self.prune_button.clicked.connect(lambda: self._start(rank_only=False))
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.jobs.cancel)
        buttons = QHBoxLayout()
        for button in (self.rank_button, self.prune_button, self.stop_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.hint = QLabel(HINT)  # a label, not a placeholder: it wraps in the narrow column
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet("color: palette(placeholder-text);")
        self.ranking = PruneRankingWidget()
        self.ranking.picks_changed.connect(self._on_ranking_picks_changed)
        self.text = QTextBrowser()
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        layout.addWidget(self.hint, 1, Qt.AlignmentFlag.AlignTop)
        layout.addWidget(self.ranking, 1)
        layout.addWidget(self.text, 1)
        self._show_view(self.hint)
        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        jobs.running_changed.connect(lambda _running: self._update_buttons())
        self._update_buttons()

    def set_run(self, path: str) -> None:
        """The run to prune; its last report or ranking (if any) is shown."""
        if self.jobs.is_running() or path == self._path:
            return
        self._path = path
        self._say("")
        self._show_view(self.hint)
        for name in (f"pruned/{REPORT}", RANKING):
            found = read_json(Path(path) / name) if path else None
            if found is not None:
                self._show(found, rank_only=name == RANKING)
                break
        self._update_buttons()

    def params(self, rank_only: bool) -> dict[str, Any]:
        """What the controls ask the prune job for."""
        params: dict[str, Any] = {"rank_only": rank_only, "overwrite": self.overwrite_check.isChecked()}
        if self.out_edit.text().strip():
            params["out"] = str(Path(self.out_edit.text().strip()).expanduser().absolute())
        if rank_only:
            return params
        text = self.layers_edit.text().replace(" ", "")
        if text:
            params["drop_layers"] = [int(v) if v.isdigit() else v for v in text.split(",") if v]
        elif self.count_spin.value():
            params["layers"] = self.count_spin.value()
        heads = self.heads_edit.text().replace(" ", "")
        if heads:
            params["drop_heads"] = [v for v in heads.split(",") if v]
        elif self.heads_spin.value():
            params["drop_heads"] = self.heads_spin.value()
        if self.ffn_spin.value() < 1.0:
            params["ffn_keep"] = round(self.ffn_spin.value(), 4)
        return params

    def problem(self, folder: RunFolder, params: dict[str, Any]) -> str:
        """Why these picks cannot be pruned from this run, in one line ("" when they can)."""
        try:
            config = folder.load_config()
            model = folder.path / "model" if config.technique.method == "full" else config.resolved_model_path()
            if any(not isinstance(v, int) for v in params.get("drop_layers", [])):
                return "Drop layers: give layer indices separated by commas, e.g. 12,13"
            if not params["rank_only"] and not set(params) & {"drop_layers", "layers", "drop_heads", "ffn_keep"}:
                return ("nothing to prune: give layers to drop, head groups or a share of FFN channels to keep, "
                        "or press Rank to see what matters least first")
            PruneRequest.parse(params).check(Shape.read(model))
            if not params["rank_only"]:
                out = Path(params.get("out") or folder.path / "pruned")
                problem = out_problem(out, params["overwrite"], [folder.path, model])
                if problem:
                    return problem.replace("pass --overwrite", "tick Overwrite").replace("--out", "another folder")
        except JobError as exc:
            return in_words(exc.message)
        except ValueError as exc:
            return f"cannot read {folder.config_path}: {exc}"
        return ""

    def _start(self, rank_only: bool) -> None:
        if not self._path or self.jobs.is_running():
            return
        folder = RunFolder(self._path)
        params = self.params(rank_only)
        problem = self.problem(folder, params)
        if problem:
            self._say(problem[0].upper() + problem[1:], error=True)
            return
        out = Path(params.get("out") or folder.path / "pruned")
        self._last = folder.path / RANKING if rank_only else out / REPORT
        self._show_view(self.hint)
        self._say("Ranking…" if rank_only else "Pruning…")
        self.jobs.start(folder, folder.load_config(), job="prune", params=params)

    def _on_jobs_event_received(self, event: Any) -> None:
        if isinstance(event, PhaseChanged):
            self._say(f"{event.phase.replace('_', ' ').capitalize()}: {event.detail}" if event.detail else event.phase)

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        if outcome.ok and self._last is not None:
            found = read_json(self._last)
            if found is None:
                self._say(f"the prune finished but {self._last} is missing or unreadable", error=True)
                return
            self._show(found, rank_only=self._last.name == RANKING)
            self._say("Ranked: least important first." if self._last.name == RANKING else
                      f"Pruned: {found.get('path')}. Train its heal.yaml to recover what pruning cost.")
        elif outcome.status == "cancelled":
            self._say("Stopped: nothing was pruned.")
        else:
            self._say(failure_text("Prune", outcome), error=True)

    def _show(self, payload: dict[str, Any], rank_only: bool) -> None:
        try:
            if rank_only:
                self.ranking.set_ranking(payload)
            else:
                self.text.setPlainText(format_report(payload))
            self._show_view(self.ranking if rank_only else self.text)
        except (KeyError, TypeError):
            self._show_view(self.hint)
            self._say("the saved prune report is from another version and cannot be shown", error=True)

    def _show_view(self, view: QWidget) -> None:
        """One of the hint, the ranking table and the report text."""
        for each in (self.hint, self.ranking, self.text):
            each.setVisible(each is view)
        if view is self.hint:
            self.ranking.clear()
            self.text.clear()

    def _on_ranking_picks_changed(self, kind: str) -> None:
        """The ticks of one kind become the field the Prune button reads (the others keep what was typed)."""
        if kind == "layer":
            self.layers_edit.setText(",".join(map(str, self.ranking.picked_layers())))
        elif kind == "head":
            self.heads_edit.setText(",".join(f"{layer}:{group}" for layer, group in self.ranking.picked_heads()))
        elif kind == "ffn":
            self.ffn_spin.setValue(FFN_QUARTER_KEEP if self.ranking.ffn_quarter_picked() else 1.0)

    def _update_buttons(self) -> None:
        running = self.jobs.is_running()
        for button in (self.rank_button, self.prune_button):
            button.setEnabled(bool(self._path) and not running)
        self.stop_button.setEnabled(running)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #dc2626;" if error else "")
