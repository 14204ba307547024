"""MainWindow: the page list, the page stack, menus, actions, the log dock and the status bar.

Layout only, no logic: the window reports what the person asked for (`start_requested`, ...) and
shows what it is told. Pages are installed by the app; until then each slot shows a placeholder,
so the window can paint before the pages (pydantic, pyqtgraph) are even imported. Closing asks the
close guards the controllers registered, so a close during a run can become "stop, save, then close".
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QStyle,
    QWidget,
)

from backend.core.paths import resources_dir
from studio.widgets.log_view_widget import LogViewWidget

PAGES = (("model", "Model"), ("data", "Data"), ("techniques", "Techniques"), ("train", "Train"), ("runs", "Runs"),
         ("export", "Export"), ("chat", "Chat"))
"""(key, title) of each page, in the order a first run walks through them."""
LOG_MAX_LINES = 5000
"""The log pane keeps only the newest lines, so a chatty worker cannot grow the studio's memory."""


def fitted_geometry(wanted: QRect, available: QRect, frame_height: int = 0) -> QRect:
    """`wanted` shrunk to the available area (less the title bar's height) and moved inside it."""
    width = min(wanted.width(), available.width())
    height = min(wanted.height(), available.height() - frame_height)
    x = min(max(wanted.x(), available.x()), available.right() + 1 - width)
    y = min(max(wanted.y(), available.y() + frame_height), available.bottom() + 1 - height)
    return QRect(x, y, width, height)


def icon(name: str) -> QIcon:
    """resources/icons/<name>.svg (or the app icon's PNG renders for "app")."""
    folder = resources_dir() / "icons"
    if name == "app":
        result = QIcon()
        for size in (16, 32, 48, 64, 128, 256):
            png = folder / f"app-{size}.png"
            if png.is_file():
                result.addFile(str(png), QSize(size, size))
        return result if not result.isNull() else QIcon(str(folder / "app.svg"))
    path = folder / f"{name}.svg"
    return QIcon(str(path)) if path.is_file() else QIcon()


class MainWindow(QMainWindow):
    """Pages on the left, the chosen page in the middle, the log below, the environment in the status bar."""

    start_requested = Signal()
    """Emitted when the person pressed Start (button, menu or Ctrl+Return)."""
    stop_requested = Signal()
    """Emitted when the person pressed Stop and save (button, menu or Ctrl+.)."""
    cancel_requested = Signal()
    """Emitted when the person pressed Cancel (stop without saving)."""
    resume_requested = Signal()
    """Emitted when the person pressed Resume (from the newest complete checkpoint)."""
    theme_requested = Signal(str)
    """Emitted with "system", "light" or "dark" when the person picked a theme."""
    save_config_requested = Signal()
    """Emitted when the person chose File > Save config."""
    open_config_requested = Signal(str)
    """Emitted with the YAML file the person chose in File > Open config."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Finetune Studio")
        self.setWindowIcon(icon("app"))
        self.resize(1280, 800)
        self._close_guards: list[Callable[[], bool]] = []
        self._close_hooks: list[Callable[[], None]] = []
        self.pages: dict[str, QWidget] = {}
        """Installed pages by key (model, data, techniques, train, runs, export, chat)."""
        self._running = False
        self.ask_config_path: Callable[[], str] = self._ask_config_path
        """Asks which config file to open ("" for none); tests replace it."""

        self.page_list = QListWidget()
        self.page_list.setObjectName("PageList")
        self.page_list.setIconSize(QSize(22, 22))
        self.page_list.setFixedWidth(170)
        self.stack = QStackedWidget()
        for number, (key, title) in enumerate(PAGES, start=1):
            QListWidgetItem(icon(key), f"{number}  {title}", self.page_list)
            placeholder = QLabel(f"Loading {title}…")
            placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
            self.stack.addWidget(placeholder)
        self.page_list.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.page_list.setCurrentRow(0)
        central = QWidget()
        row = QHBoxLayout(central)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.page_list)
        row.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.log_view = LogViewWidget(LOG_MAX_LINES)
        self.log_view.setPlaceholderText("Phases, checkpoints, errors and the worker's log appear here.")
        self.log_dock = QDockWidget("Log", self)
        self.log_dock.setObjectName("LogDock")
        self.log_dock.setWidget(self.log_view)
        self.log_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                                  | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)
        self.resizeDocks([self.log_dock], [110], Qt.Orientation.Vertical)

        self.run_status = QLabel("Ready")
        self.env_label = QLabel("Checking the environment…")
        self.statusBar().addWidget(self.run_status, 1)
        self.statusBar().addPermanentWidget(self.env_label)
        self._start_blocker = ""
        self._make_actions()
        self.set_running(False)

    # --- actions and menus ----------------------------------------------------------------------
    def _action(self, text: str, shortcut: str, tip: str, signal: Signal, icon_name: str = "") -> QAction:
        action = QAction(icon(icon_name) if icon_name else QIcon(), text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
            action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        action.setToolTip(f"{tip} ({shortcut})" if shortcut else tip)
        action.triggered.connect(signal)
        self.addAction(action)
        return action

    def _make_actions(self) -> None:
        self.start_action = self._action("Start", "Ctrl+Return", "Start training", self.start_requested, "start")
        self.stop_action = self._action("Stop and save", "Ctrl+.", "Stop at the next step and save a checkpoint",
                                        self.stop_requested, "stop")
        self.cancel_action = self._action("Cancel", "", "Stop at the next step without saving",
                                          self.cancel_requested, "cancel")
        self.resume_action = self._action("Resume", "", "Continue a run from its newest complete checkpoint",
                                          self.resume_requested, "resume")
        self.save_config_action = self._action("Save config…", "Ctrl+S", "Save the setup as a YAML config",
                                               self.save_config_requested)
        self.open_config_action = QAction("Open config…", self, shortcut=QKeySequence.StandardKey.Open)
        self.open_config_action.setToolTip("Start the setup over from a RunConfig YAML file (one the CLI trains)")
        self.open_config_action.triggered.connect(self._on_open_config_triggered)
        quit_action = QAction("Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        file_menu.addAction(self.open_config_action)
        file_menu.addAction(self.save_config_action)
        file_menu.addSeparator()
        file_menu.addAction(quit_action)
        run_menu = menu.addMenu("&Run")
        for action in (self.start_action, self.stop_action, self.cancel_action, self.resume_action):
            run_menu.addAction(action)
        view_menu = menu.addMenu("&View")
        for number, (key, title) in enumerate(PAGES, start=1):
            go = QAction(icon(key), title, self, shortcut=QKeySequence(f"Ctrl+{number}"))
            go.triggered.connect(lambda _=False, k=key: self.show_page(k))
            view_menu.addAction(go)
        view_menu.addSeparator()
        view_menu.addAction(self.log_dock.toggleViewAction())
        theme_menu = view_menu.addMenu("Theme")
        self.theme_actions: dict[str, QAction] = {}
        group = QActionGroup(self)
        for name in ("system", "light", "dark"):
            action = QAction(name.capitalize() if name != "system" else "Follow the system", self, checkable=True)
            action.triggered.connect(lambda _=False, n=name: self.theme_requested.emit(n))
            group.addAction(action)
            theme_menu.addAction(action)
            self.theme_actions[name] = action

    # --- pages ----------------------------------------------------------------------------------
    def install_page(self, key: str, page: QWidget) -> None:
        """Put `page` in its slot (replacing the placeholder)."""
        index = [k for k, _ in PAGES].index(key)
        old = self.stack.widget(index)
        current = self.stack.currentIndex()
        self.stack.insertWidget(index, page)
        self.stack.removeWidget(old)
        old.deleteLater()
        self.stack.setCurrentIndex(current)
        self.pages[key] = page

    def show_page(self, key: str) -> None:
        self.page_list.setCurrentRow([k for k, _ in PAGES].index(key))

    def current_page(self) -> str:
        return PAGES[max(0, self.stack.currentIndex())][0]

    # --- readouts -------------------------------------------------------------------------------
    def set_running(self, running: bool) -> None:
        self._running = running
        if running:
            self.resume_action.setEnabled(False)
        self.start_action.setEnabled(not running and not self._start_blocker)
        self.stop_action.setEnabled(running)
        self.cancel_action.setEnabled(running)
        self.save_config_action.setEnabled(not running)
        self.open_config_action.setEnabled(not running)

    def set_stoppable(self, stoppable: bool) -> None:
        """Stop and Cancel only while the run can still be stopped (off once its last event came)."""
        self.stop_action.setEnabled(self._running and stoppable)
        self.cancel_action.setEnabled(self._running and stoppable)

    def set_start_blocker(self, reason: str) -> None:
        """Why Start cannot go on this machine ("" lets it): Start is disabled and its tooltip says why."""
        self._start_blocker = reason
        self.start_action.setEnabled(not self._running and not reason)
        shortcut = self.start_action.shortcut().toString()
        self.start_action.setToolTip(f"Cannot start: {reason}" if reason else f"Start training ({shortcut})")

    def set_resume_target(self, label: str, tip: str = "") -> None:
        """The Resume button's text, naming the run it acts on ("" disables it: nothing to resume)."""
        self.resume_action.setEnabled(bool(label) and not self._running)
        self.resume_action.setText(label or "Resume")
        self.resume_action.setToolTip(tip or label or "No run with a complete checkpoint to resume")

    def add_close_guard(self, guard: Callable[[], bool]) -> None:
        """Asked, in order, when the window is closed; one returning False keeps it open (a run to stop first)."""
        self._close_guards.append(guard)

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Called once every guard let the window close (save the layout and settings)."""
        self._close_hooks.append(hook)

    def set_theme_checked(self, name: str) -> None:
        if name in self.theme_actions:
            self.theme_actions[name].setChecked(True)

    def set_environment(self, summary: str, details: str) -> None:
        self.env_label.setText(summary)
        self.env_label.setToolTip(details)

    def append_log(self, line: str) -> None:
        self.log_view.append_line(line)

    def log_text(self) -> str:
        return self.log_view.toPlainText()

    def _on_open_config_triggered(self) -> None:
        path = self.ask_config_path()
        if path:
            self.open_config_requested.emit(path)

    def _ask_config_path(self) -> str:
        path, _ = QFileDialog.getOpenFileName(self, "Open a config", "", "Run configs (*.yaml *.yml);;All files (*)")
        return path

    def show_problem(self, text: str) -> None:
        """One line in the status bar (until the next message) and in the log."""
        self.statusBar().showMessage(text)
        self.append_log(text)

    def fit_to_screen(self) -> None:
        """Shrink and move the window into its screen's available area (a 1024x700 screen, or a layout
        saved on a bigger monitor): the right edge and the status bar must never open off-screen."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is None:
            return
        frame = self.style().pixelMetric(QStyle.PixelMetric.PM_TitleBarHeight) if not self.isVisible() else \
            self.frameGeometry().height() - self.geometry().height()
        self.setGeometry(fitted_geometry(self.geometry(), screen.availableGeometry(), frame))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        if not all(guard() for guard in self._close_guards):
            event.ignore()
            return
        for hook in self._close_hooks:
            hook()
        super().closeEvent(event)
