"""DataPage: step 2, choose the dataset, see it as the model will, and check its lengths.

The file is read in the background with the worker's own reader (format detection included); a
few examples are shown as conversations with the trained-on text highlighted, and a histogram of
token lengths shows how many examples the chosen seq_len cuts. Rows with images show thumbnails and
count the images' tokens through `image_tokens`, the model family's rule (None: the model is not
known, and the rows say "+ N images").
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from backend.core.config.schedule import held_out
from backend.core.paths import resolve_resource
from studio.services.background_call import BackgroundCall
from backend.api.previews import DatasetProfile
from backend.api.vision import ImageRules, data_rules
from backend.api.previews import ObjectiveRecords, read_objective_records, reward_columns
from studio.state.config_state import ConfigState
from studio.state.form_values import config_path, display_path
from studio.widgets.conversation_widget import ConversationWidget
from studio.widgets.field_editors import FieldEditors, description
from studio.widgets.objective_preview_widget import ObjectivePreviewWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.token_histogram_chart import TokenHistogramChart

DEMO_DATASET = "bundled:datasets/demo_train.jsonl"
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".txt")
OBJECTIVE_GUIDES = {
    "dpo": "DPO learns from preference pairs: each record holds a prompt, the chosen answer and the rejected "
           "one (JSONL, JSON, CSV, Parquet or a save_to_disk folder). Read each pair side by side below.",
    "kto": "KTO learns from single answers labelled good or bad: each record holds a prompt, a completion and "
           "a label (true or false). The first records are shown below.",
    "grpo": "GRPO needs only prompts: each record holds a prompt, plus any column a reward reads (an exact_match "
            "reward compares the completion with its column). The model writes the answers while it trains.",
}
"""The page's guide for the objectives beyond SFT (the SFT guide is the header's own)."""
FILTER = "Datasets (*.jsonl *.json *.csv *.parquet *.arrow *.txt);;All files (*)"
TEMPLATED = " · shown through the chat template, its special tokens left out (hover over a cell for them)"
"""The summary's words for records shown as the model reads them (objective_preview_widget.readable)."""


def dropped_file(event: QDragEnterEvent | QDropEvent) -> str:
    """A dropped dataset file, or a dropped folder (a save_to_disk folder, or a folder of files)."""
    for url in event.mimeData().urls():
        path = Path(url.toLocalFile())
        if (path.is_file() and path.suffix.lower() in SUFFIXES) or path.is_dir():
            return str(path)
    return ""


class DataPage(QWidget):
    """Path, format, split, a conversation preview and the token-length histogram."""

    dataset_chosen = Signal(str)
    """Emitted with the config path after the person picked a dataset."""
    profile_ready = Signal(object)
    """Emitted with the DatasetProfile once the chosen file was read (or found unreadable)."""

    def __init__(self, state: ConfigState, editors: FieldEditors, parent: QWidget | None = None,
                 synchronous: bool = False) -> None:
        super().__init__(parent)
        self._state = state
        self.profile: DatasetProfile | None = None
        self.model_rules: Callable[[Path | None], ImageRules] = data_rules
        """The model folder's image rules (tokens per image of (width, height), images a row may hold),
        asked again at each read: a text model refuses image rows as training would."""
        self._loader = BackgroundCall(self, synchronous=synchronous)
        self._loader.finished.connect(self._on_loader_finished)
        self._loader.failed.connect(self._on_loader_failed)
        self.setAcceptDrops(True)

        self.header = header = PageHeaderWidget("Data", "Choose the examples to learn from: JSONL, JSON, CSV, Parquet, TXT or "
                                          "a datasets save_to_disk folder (drop it here). Alpaca, ShareGPT, "
                                          "messages and plain text are detected, with their images, or mapped by "
                                          "a LLaMA-Factory dataset_info.json beside the file; only the "
                                          "assistant's text (highlighted) is trained on.")
        self._sft_guide = header.guide.text()
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("/path/to/examples.jsonl")
        self.path_edit.setToolTip(description("data.path"))
        self.path_edit.editingFinished.connect(self._on_path_edit_editing_finished)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._on_browse_clicked)
        folder = QPushButton("Folder…")
        folder.setToolTip("A datasets save_to_disk folder, or a folder of dataset files")
        folder.clicked.connect(self._on_folder_clicked)
        demo = QPushButton("Use the demo dataset")
        demo.clicked.connect(lambda: self.choose(DEMO_DATASET))
        self.summary_label = QLabel("—")
        self.summary_label.setWordWrap(True)
        self.split_label = QLabel()

        pick = QGroupBox("Dataset file")
        form = QFormLayout(pick)
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        row.addWidget(folder)
        row.addWidget(demo)
        form.addRow("File", row)
        form.addRow("Detected", self.summary_label)
        options_row = QWidget()  # a widget, not a bare layout: the form gives a nested grid too little height
        options = QGridLayout(options_row)
        options.setContentsMargins(0, 0, 0, 0)
        pairs = (("Format", editors.editor("data.format")),
                 ("Validation split", editors.editor("data.validation_split", decimals=2, step=0.01)),
                 ("Max examples", editors.editor("data.max_examples", none_text="all")),
                 ("Sequence length", editors.editor("train.seq_len")))
        for index, (label, widget) in enumerate(pairs):
            row, column = divmod(index, 2)
            options.addWidget(QLabel(label), row, column * 2)
            options.addWidget(widget, row, column * 2 + 1)
        truncate = editors.editor("data.truncate")
        truncate.setText("Truncate longer examples")
        options.addWidget(truncate, 0, 4)
        skip = editors.editor("data.skip_invalid")
        skip.setText("Skip invalid examples")
        options.addWidget(skip, 1, 4)
        options.setColumnStretch(5, 1)
        form.addRow("Options", options_row)
        form.addRow("Split", self.split_label)

        self.preview = ConversationWidget()
        self.objective_preview = ObjectivePreviewWidget()
        self.records: ObjectiveRecords | None = None
        """What was read for a DPO, KTO or GRPO objective (None for SFT)."""
        self.previews = QStackedWidget()  # SFT: conversations; beyond SFT: the records' fields side by side
        self.previews.addWidget(self.preview)
        self.previews.addWidget(self.objective_preview)
        self.histogram = TokenHistogramChart()
        self.truncated_label = QLabel()
        self.truncated_label.setWordWrap(True)
        self.approx_label = QLabel()
        self.approx_label.setWordWrap(True)
        self.approx_label.setStyleSheet("color: palette(placeholder-text);")
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.histogram, 1)
        right_layout.addWidget(self.truncated_label)
        right_layout.addWidget(self.approx_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.previews)
        split.addWidget(right)
        self.lengths_box = right
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([1, 1])  # halves, whatever the chart's size hint asks (the preview shows thumbnails too)

        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(pick)
        layout.addWidget(split, 1)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    # --- choosing -----------------------------------------------------------------------------
    def choose(self, path: str) -> None:
        self._state.set("data.path", path)
        self.dataset_chosen.emit(path)

    def _on_path_edit_editing_finished(self) -> None:
        value = config_path(self.path_edit.text())
        if value != self._state.get("data.path"):
            self.choose(value)

    def _on_browse_clicked(self) -> None:
        start = resolve_resource(self._state.get("data.path") or DEMO_DATASET)
        path, _ = QFileDialog.getOpenFileName(self, "Choose a dataset", str(start.parent), FILTER)
        if path:
            self.choose(path)

    def _on_folder_clicked(self) -> None:
        start = resolve_resource(self._state.get("data.path") or DEMO_DATASET)
        path = QFileDialog.getExistingDirectory(self, "Choose a dataset folder", str(start.parent))
        if path:
            self.choose(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        if dropped_file(event):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        path = dropped_file(event)
        if path:
            event.acceptProposedAction()
            self.choose(path)

    # --- reading ------------------------------------------------------------------------------
    def _on_state_changed(self, key: str) -> None:
        if key in ("", "data.path"):
            self.path_edit.setText(display_path(self._state.get("data.path")))
        if key in ("", "data.path", "data.format", "data.skip_invalid", "model.path", "technique.objective") or (
                key == "grpo.rewards" and self._state.get("technique.objective") == "grpo"):
            self.reload()
        if key in ("", "train.seq_len"):
            self.histogram.set_seq_len(int(self._state.get("train.seq_len")))
        if key in ("", "data.validation_split", "data.max_examples", "data.truncate", "train.seq_len"):
            self._show_numbers()

    def reload(self) -> None:
        """Read the chosen file again (in the background)."""
        data, model, fmt = (self._state.get("data.path"), self._state.get("model.path"),
                            self._state.get("data.format"))
        skip = bool(self._state.get("data.skip_invalid"))
        objective = self._state.get("technique.objective")
        self.summary_label.setText("Reading…")
        if objective != "sft":
            needed = reward_columns(self._state.get("grpo.rewards")) if objective == "grpo" else ()
            self._loader.call(lambda: read_objective_records(data, objective, needed, model_path=model))
            return
        rules = self.model_rules

        def read() -> DatasetProfile:
            count, most = rules(resolve_resource(model) if model else None)
            return DatasetProfile.read(data, model, fmt, skip_invalid=skip, max_images=most, image_tokens=count)
        self._loader.call(read)

    def is_loading(self) -> bool:
        return self._loader.is_busy()

    def _on_loader_failed(self, error: str) -> None:
        self._on_loader_finished(DatasetProfile(self._state.get("data.path"), problem=error))

    def _on_loader_finished(self, profile: DatasetProfile | ObjectiveRecords) -> None:
        if isinstance(profile, ObjectiveRecords):
            self._show_records(profile)
            return
        self.records = None
        self.header.guide.setText(self._sft_guide)
        self.previews.setCurrentWidget(self.preview)
        self.lengths_box.setVisible(True)
        self.profile = profile
        if profile.problem:
            hint = f" ({profile.hint})" if profile.hint else ""
            self.summary_label.setText(f"<span style='color:#dc2626'>{profile.problem}{hint}</span>")
            self.preview.set_conversations([])
        else:
            notes = "".join(f"<br><span style='color:#d97706'>{html.escape(note)}</span>" for note in profile.notes)
            images = sum(profile.image_counts)
            among = "" if profile.measured >= profile.count else f" in the {profile.measured:,} measured examples"
            pictures = f" · {images:,} images{among}" if images else ""
            self.summary_label.setText(f"<b>{profile.format}</b> · {profile.count:,} examples{pictures}{notes}")
            self.preview.set_conversations(profile.preview, profile.preview_images, profile.preview_tokens)
        self._show_numbers()
        self.profile_ready.emit(profile)

    def _show_records(self, records: ObjectiveRecords) -> None:
        """A DPO, KTO or GRPO dataset: its fields side by side; the SFT token histogram does not apply."""
        self.records = records
        self.header.guide.setText(OBJECTIVE_GUIDES.get(records.objective, self._sft_guide))
        self.previews.setCurrentWidget(self.objective_preview)
        self.lengths_box.setVisible(False)
        self.objective_preview.set_records(records)
        if records.problem:
            hint = f" ({records.hint})" if records.hint else ""
            self.summary_label.setText(f"<span style='color:#dc2626'>{html.escape(records.problem + hint, quote=False)}</span>")
        else:
            columns = ", ".join(records.columns)
            notes = "".join(f"<br><span style='color:#d97706'>{html.escape(note)}</span>" for note in records.notes)
            self.summary_label.setText(f"<b>{records.what} for {records.objective}</b> · {records.count:,} records "
                                       f"· fields {html.escape(columns, quote=False)}"
                                       f"{TEMPLATED if records.templated else ''}{notes}")
        self.profile = DatasetProfile(records.path, count=records.count, problem=records.problem, hint=records.hint)
        self._show_numbers()
        self.profile_ready.emit(self.profile)

    def _show_numbers(self) -> None:
        profile = self.profile
        if profile is None or profile.problem:
            self.histogram.set_lengths([])
            self.split_label.setText("—")
            self.truncated_label.setText("")
            self.approx_label.setText("")
            return
        used = min(profile.count, self._state.get("data.max_examples") or profile.count)
        held = held_out(used, float(self._state.get("data.validation_split")))
        self.split_label.setText(f"{used - held:,} train · {held:,} validation")
        if self.records is not None:  # token lengths are measured for supervised data only
            return
        whole, profile = profile, profile.within(self._state.get("data.max_examples"))  # what training reads
        self.histogram.set_lengths(profile.lengths, profile.text_lengths)
        seq_len = int(self._state.get("train.seq_len"))
        share = profile.truncated_share(seq_len)
        longest = max(profile.lengths) if profile.lengths else 0
        fate = "truncated" if self._state.get("data.truncate") else "refused"
        if share > 0:
            verdict = (f"<span style='color:#dc2626'><b>{share:.1%}</b> of examples are longer than seq_len "
                       f"{seq_len} and will be {fate}</span>")
        else:
            verdict = f"<span style='color:#16a34a'><b>0.0%</b>: no example is longer than seq_len {seq_len}</span>"
        answer = whole.longest_answer()
        answer_text = f" · longest answer {answer:,} tokens (the memory estimate's logits)" if answer else ""
        self.truncated_label.setText(f"{verdict} · longest {longest:,} tokens{answer_text}")
        source = (f"the model's tokenizer ({Path(profile.tokenizer).parent.name})" if profile.tokenizer
                  else "a word count × 1.3 (no tokenizer.json in the model folder)")
        sample = f"; measured on {profile.measured:,} of {used:,} examples" if profile.measured < used else ""
        pictures = ""
        if profile.image_counts and any(profile.image_counts):
            pictures = (" Bars: text and image tokens (the model's rule); orange outline: text alone."
                        if profile.image_tokens_known else " Images not counted: the model's image tokens are unknown.")
        self.approx_label.setText(f"Approximate: tokens counted with {source} on \"role: text\" lines, without "
                                  f"the chat template, which adds a few tokens per message{sample}.{pictures}")
