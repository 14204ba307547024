"""HardwareWidget: how many processes and machines a run uses, and the files a multi-node run needs.

Strategy, processes per machine (capped by the GPUs the monitor sees; with no GPU only ddp may run
several CPU processes), GPU ids, FSDP CPU offload, machines and the rendezvous address. With more
than one machine the studio never logs in anywhere: it shows the accelerate config, the command to
run on each machine and a SLURM script, each read-only with Copy and Save.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import yaml
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from backend.core.config.run_config import ConfigError
from studio.state.config_state import ConfigState
from studio.widgets.field_editors import FieldEditors

FIELDS = (("hardware.strategy", "Strategy"), ("hardware.num_processes", "Processes per machine"),
          ("hardware.gpu_ids", "GPU ids"), ("hardware.fsdp_cpu_offload", "FSDP CPU offload"),
          ("hardware.num_machines", "Machines"), ("hardware.main_process_ip", "Main machine IP"),
          ("hardware.main_process_port", "Main machine port"),
          ("hardware.rendezvous_timeout_s", "Wait for machines (s)"))
MULTINODE_KEYS = ("hardware.main_process_ip", "hardware.main_process_port", "hardware.rendezvous_timeout_s")
FILES = (("accelerate", "accelerate config", "accelerate_config.yaml"),
         ("commands", "Per-machine commands", "commands.sh"), ("slurm", "SLURM script", "finetune.sbatch"))


class HardwareWidget(QGroupBox):
    """The hardware form and, for several machines, the generated launch files."""

    def __init__(self, state: ConfigState, editors: FieldEditors, parent: QWidget | None = None) -> None:
        super().__init__("Hardware", parent)
        self._state = state
        self._gpus = 0
        self.ask_save_path: Callable[[str], str] = self._ask_save_path
        """Asks where to save a file (given a suggested name); tests replace it."""
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        self.editors: dict[str, QWidget] = {}
        self.labels: dict[str, QLabel] = {}
        for key, text in FIELDS:
            widget = editors.editor(key)
            widget.setMinimumWidth(150)
            label = QLabel(text)
            label.setToolTip(widget.toolTip())
            self.editors[key], self.labels[key] = widget, label
            form.addRow(label, widget)
        self.cap_label = QLabel()
        self.cap_label.setWordWrap(True)
        self.cap_label.setStyleSheet("color: palette(placeholder-text);")
        self.tabs = QTabWidget()
        self.texts: dict[str, QPlainTextEdit] = {}
        fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        for key, title, _ in FILES:
            text = QPlainTextEdit()
            text.setReadOnly(True)
            text.setFont(fixed)
            text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            text.setMinimumHeight(160)
            self.texts[key] = text
            self.tabs.addTab(text, title)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.save_button = QPushButton("Save…")
        self.save_button.clicked.connect(self._on_save_button_clicked)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.save_button)
        self.multinode = QWidget()
        multinode_layout = QVBoxLayout(self.multinode)
        multinode_layout.setContentsMargins(0, 0, 0, 0)
        multinode_layout.addWidget(QLabel("Run these on the machines (the studio starts only machine 0's "
                                          "share when you press Start here):", wordWrap=True))
        multinode_layout.addWidget(self.tabs)
        multinode_layout.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.cap_label)
        layout.addWidget(self.multinode)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    def set_gpu_count(self, count: int) -> None:
        """The GPUs the monitor sees; caps the processes per machine."""
        if count != self._gpus:
            self._gpus = count
            self._on_state_changed("hardware.strategy")

    def process_cap(self) -> int:
        strategy = self._state.get("hardware.strategy")
        if strategy == "single":
            return 1
        if self._gpus:
            return self._gpus
        return max(1, os.cpu_count() or 1) if strategy == "ddp" else 1

    def _on_state_changed(self, key: str) -> None:
        if key == "" or key.startswith("hardware."):
            strategy = self._state.get("hardware.strategy")
            cap = self.process_cap()
            self.editors["hardware.num_processes"].setMaximum(cap)
            seen = f"{self._gpus} GPU(s) seen" if self._gpus else "no GPU seen"
            self.cap_label.setText(f"Processes per machine: at most {cap} ({seen}"
                                   + ("; ddp runs CPU processes over gloo" if not self._gpus and strategy == "ddp"
                                      else "") + ").")
            fsdp = strategy == "fsdp"
            self.editors["hardware.fsdp_cpu_offload"].setVisible(fsdp)
            self.labels["hardware.fsdp_cpu_offload"].setVisible(fsdp)
            several = int(self._state.get("hardware.num_machines")) > 1
            for name in MULTINODE_KEYS:
                self.editors[name].setVisible(several)
                self.labels[name].setVisible(several)
        self._update_files()

    def _update_files(self) -> None:
        several = int(self._state.get("hardware.num_machines")) > 1
        self.multinode.setVisible(several)
        if not several:
            return
        from backend.api.distributed import accelerate_config, multinode_commands, slurm_script

        try:
            config = self._state.config()
        except (ConfigError, ValueError) as exc:
            for text in self.texts.values():
                text.setPlainText(f"# fix the setup first: {exc}")
            return
        path = Path(self._state.source).name if self._state.source is not None else "run.yaml"
        self.texts["accelerate"].setPlainText(yaml.safe_dump(accelerate_config(config), sort_keys=False))
        self.texts["commands"].setPlainText("\n".join(multinode_commands(config, path)) + "\n")
        self.texts["slurm"].setPlainText(slurm_script(config, path))

    def current_text(self) -> str:
        return self.texts[FILES[self.tabs.currentIndex()][0]].toPlainText()

    def _on_copy_button_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.current_text())

    def _ask_save_path(self, suggested: str) -> str:
        path, _ = QFileDialog.getSaveFileName(self, "Save", suggested)
        return path

    def _on_save_button_clicked(self) -> None:
        path = self.ask_save_path(FILES[self.tabs.currentIndex()][2])
        if path:
            try:
                Path(path).write_text(self.current_text(), encoding="utf-8")
            except OSError as exc:
                self.save_button.setToolTip(f"Not saved: {exc}")
