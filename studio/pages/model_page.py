"""ModelPage: step 1, choose the model to fine-tune and see what it is.

A local Hugging Face folder (Browse, or drop it on the page), a hub id downloaded on request into the
studio's models folder (then used as a local folder), or the bundled tiny model. The page
reads only config.json and file names: architecture, parameter count (the estimator's count, so it
agrees with the memory estimate), context length, dtype, and whether the folder ships its own Python
(`auto_map`), which runs only if the person ticks trust_remote_code.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.paths import HUB_PREFIX, has_weight_files, resolve_resource
from studio.services.model_info import ModelInfo
from studio.state.config_state import ConfigState
from studio.state.form_values import config_path, display_path
from studio.widgets.adapter_picker_widget import AdapterPickerWidget
from studio.widgets.field_editors import FieldEditors, description
from studio.widgets.hub_download_widget import HubDownloadWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.discard_question import discard_edits
from studio.widgets.preset_picker_widget import PresetPickerWidget
from studio.widgets.units import human_count
from studio.widgets.vertical_scroll_area import VerticalScrollArea
from studio.widgets.vision_facts_widget import VisionFactsWidget

BUNDLED_MODEL = "bundled:tiny"


def dropped_folder(event: QDragEnterEvent | QDropEvent) -> str:
    """The model folder a drag carries: a folder, or the folder of a dropped config.json."""
    for url in event.mimeData().urls():
        path = Path(url.toLocalFile())
        if path.is_dir():
            return str(path)
        if path.name == "config.json" and path.is_file():
            return str(path.parent)
    return ""


class ModelPage(QWidget):
    """Path, Browse, bundled model, a hub download, the model's facts and trust_remote_code."""

    model_chosen = Signal(str)
    """Emitted with the config path (`bundled:tiny` or a folder) after the person picked a model."""

    def __init__(self, state: ConfigState, editors: FieldEditors, parent: QWidget | None = None,
                 hub_endpoint: str | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self.info = ModelInfo(path="")
        self.setAcceptDrops(True)
        header = PageHeaderWidget("Model", "Choose the model to fine-tune: a Hugging Face model folder on "
                                           "this computer (Browse, or drop the folder on this page), a model "
                                           "from the Hugging Face Hub (downloaded when you ask), or the small "
                                           "model bundled with the studio.")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("/path/to/a/model/folder (holding config.json)")
        self.path_edit.setToolTip(description("model.path"))
        self.path_edit.editingFinished.connect(self._on_path_edit_editing_finished)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._on_browse_clicked)
        bundled = QPushButton("Use the bundled model")
        bundled.clicked.connect(lambda: self.choose(BUNDLED_MODEL))
        self.hub = HubDownloadWidget(hub_endpoint)
        self.hub.downloaded.connect(self._on_hub_downloaded)
        self.hub.config_fetched.connect(self._on_hub_config_fetched)

        self.presets = PresetPickerWidget()
        self.presets.chosen.connect(self._on_presets_chosen)
        self.presets.show_loaded(state.source)
        state.started_over.connect(self._on_state_started_over)
        start = QGroupBox("Start from a preset (a real model, sized for a card)")
        QVBoxLayout(start).addWidget(self.presets)

        pick = QGroupBox("Where the model comes from")
        rows = QFormLayout(pick)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(browse)
        path_row.addWidget(bundled)
        rows.addRow("Folder", path_row)
        rows.addRow("Hub id", self.hub)

        self.adapter = AdapterPickerWidget(state)
        adapter = QGroupBox("Start from an earlier run's adapter (optional)")
        adapter_layout = QVBoxLayout(adapter)
        note = QLabel("Keep training an adapter, e.g. DPO or GRPO after an SFT run. Its rank, alpha and method "
                      "must match the Techniques page's.")
        note.setWordWrap(True)
        adapter_layout.addWidget(note)
        adapter_layout.addWidget(self.adapter)

        self.facts: dict[str, QLabel] = {}
        about = QGroupBox("About this model")
        facts = QFormLayout(about)
        for key, label in (("architecture", "Architecture"), ("parameters", "Parameters"),
                           ("shape", "Layers · hidden · heads"), ("context", "Context length"),
                           ("dtype", "Stored dtype"), ("vocab", "Vocabulary"), ("weights", "Weights"),
                           ("tokenizer", "Tokenizer")):
            value = QLabel("—")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.facts[key] = value
            facts.addRow(label, value)

        self.vision = VisionFactsWidget()

        self.trust_check = editors.editor("model.trust_remote_code")
        self.trust_check.setText("Trust remote code (run Python shipped inside the model folder)")
        self.trust_note = QLabel()
        self.trust_note.setWordWrap(True)
        security = QGroupBox("Code in the model folder")
        security_layout = QVBoxLayout(security)
        security_layout.addWidget(self.trust_note)
        security_layout.addWidget(self.trust_check)

        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet("color: #dc2626;")
        content = QWidget()
        rows_layout = QVBoxLayout(content)
        rows_layout.setContentsMargins(0, 0, 0, 0)
        for part in (start, pick, self.problem_label, adapter, about, self.vision, security):
            rows_layout.addWidget(part)
        rows_layout.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(VerticalScrollArea(content), 1)  # a small window scrolls the rows, never squeezes them
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    # --- choosing -----------------------------------------------------------------------------
    def choose(self, path: str) -> None:
        """Use this model (a folder or `bundled:...`), as if the person picked it."""
        self._state.set("model.path", path)
        self.model_chosen.emit(path)

    def _on_hub_downloaded(self, folder: str) -> None:
        """A finished download: keep a preset's `hub:` path when it names this folder, else use the folder."""
        current = self._state.get("model.path") or ""
        if current.startswith(HUB_PREFIX) and resolve_resource(current) == Path(folder):
            self._on_state_changed("model.path")
            self.model_chosen.emit(current)
        else:
            self.choose(folder)

    def _on_presets_chosen(self, path: Path) -> None:
        if discard_edits(self, self._state, f"the preset {path.stem}"):
            self.use_preset(path)

    def _on_hub_config_fetched(self, folder: str) -> None:
        """config.json alone arrived: the model is its hub path (so Download and Start's verdict name it)."""
        repo = self.hub.edit.text().strip()
        current = self._state.get("model.path") or ""
        if current.startswith(HUB_PREFIX) and resolve_resource(current) == Path(folder):
            self._on_state_changed("model.path")
            self.model_chosen.emit(current)
        else:
            self.choose(HUB_PREFIX + repo)

    def use_preset(self, path: Path) -> None:
        """Start the whole draft over from a preset file; a hub model not yet here is offered for download."""
        try:
            raw = RunConfig.load(path).model_dump(mode="json")
        except ConfigError as exc:
            self.problem_label.setText(str(exc))
            self.problem_label.setVisible(True)
            return
        self._state.replace(raw, source=path)
        self.model_chosen.emit(raw["model"]["path"])

    def _on_state_started_over(self) -> None:
        """A preset or File > Open config replaced the draft: the preset list and the Hub id say what the
        new draft holds (a hub model not yet here is offered for download; else the Hub id is cleared)."""
        self.presets.show_loaded(self._state.source)
        model = self._state.get("model.path") or ""
        missing = model.startswith(HUB_PREFIX) and not has_weight_files(resolve_resource(model))
        self.hub.edit.setText(model[len(HUB_PREFIX):] if missing else "")

    def _on_path_edit_editing_finished(self) -> None:
        value = config_path(self.path_edit.text())
        if value != self._state.get("model.path"):
            self.choose(value)

    def _on_browse_clicked(self) -> None:
        start = resolve_resource(self._state.get("model.path") or BUNDLED_MODEL)
        folder = QFileDialog.getExistingDirectory(self, "Choose a model folder", str(start.parent))
        if folder:
            self.choose(folder)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        if dropped_folder(event):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        folder = dropped_folder(event)
        if folder:
            event.acceptProposedAction()
            self.choose(folder)

    # --- showing ------------------------------------------------------------------------------
    def _on_state_changed(self, key: str) -> None:
        if key in ("", "model.path"):
            path = self._state.get("model.path")
            self.path_edit.setText(display_path(path))
            self.show_info(ModelInfo.read(path))
            if path.startswith(HUB_PREFIX) and not has_weight_files(resolve_resource(path)):
                fetched = (resolve_resource(path) / "config.json").is_file()
                self.problem_label.setText(
                    f"{path[len(HUB_PREFIX):]} is not downloaded yet: press Download in the Hub id row (it lands "
                    f"in {resolve_resource(path)})" + (". Its config.json is here, so the estimate shows; Start "
                    "waits for the weights." if fetched else ", or Config only to see its estimate first."))
                self.problem_label.setVisible(True)
        if key in ("", "model.path", "model.trust_remote_code"):
            self._show_trust()

    def show_info(self, info: ModelInfo) -> None:
        self.info = info
        self.problem_label.setText(info.problem)
        self.problem_label.setVisible(bool(info.problem))
        f = self.facts
        arch = info.architecture or "—"
        f["architecture"].setText(f"{arch} ({info.model_type})" if info.model_type else arch)
        f["parameters"].setText((f"{human_count(info.parameters)}  ({info.parameters:,})" if info.parameters
                                 else "unknown") + ("; the language model as the estimate counts it, each part "
                                                    "below" if info.vision.is_vlm and info.parameters else ""))
        shape = [str(v) if v is not None else "?" for v in (info.layers, info.hidden_size, info.heads)]
        kv = f" (KV heads {info.kv_heads})" if info.kv_heads and info.kv_heads != info.heads else ""
        f["shape"].setText(" · ".join(shape) + kv if info.layers else "—")
        f["context"].setText(f"{info.context_length:,} tokens" if info.context_length else "unknown")
        f["dtype"].setText(info.dtype or "not stated")
        f["vocab"].setText(f"{info.vocab_size:,} tokens" if info.vocab_size else "—")
        f["weights"].setText(info.weights or ("no weight files found: enough to estimate, Start waits for the "
                                              "weights" if info.folder else "—"))
        f["weights"].setStyleSheet("color: #dc2626;" if info.folder and not info.weights else "")
        f["tokenizer"].setText("tokenizer.json found" if info.has_tokenizer else "no tokenizer.json")
        if info.warnings:
            f["parameters"].setToolTip("\n".join(info.warnings))
        self.vision.show_folder(info.folder, info.vision)

    def _show_trust(self) -> None:
        info, trusted = self.info, bool(self._state.get("model.trust_remote_code"))
        if info.needs_remote_code:
            classes = ", ".join(sorted(str(v) for v in info.auto_map.values()))[:200]
            verdict = ("ticked: its code will run in the worker" if trusted else
                       "<b>not ticked: loading will be refused</b>")
            self.trust_note.setText(f"This model ships its own Python code (auto_map: {classes}). "
                                    f"Tick the box only if you trust its author; {verdict}.")
        else:
            self.trust_note.setText("This model needs no code of its own (no auto_map in config.json); "
                                    "leave the box unticked.")
