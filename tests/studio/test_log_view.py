"""The log pane keeps following new lines through resizes, and stops only when the person scrolls up."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from studio.main_window import MainWindow


def test_the_log_follows_new_lines_after_the_dock_shrinks_until_scrolled_up(qtbot):
    window = MainWindow()
    qtbot.addWidget(window)
    window.resize(1600, 1000)
    window.show()
    bar = window.log_view.verticalScrollBar()
    for i in range(50):
        window.append_log(f"line {i}")
    QApplication.processEvents()
    assert bar.value() == bar.maximum() > 0
    window.resizeDocks([window.log_dock], [60], Qt.Orientation.Vertical)  # less room: more range above
    QApplication.processEvents()
    window.append_log("after the resize")
    QApplication.processEvents()
    assert bar.value() == bar.maximum()
    bar.setValue(bar.maximum() - 5)  # the person scrolls up to read: the pane stays there
    window.append_log("while reading")
    QApplication.processEvents()
    assert bar.value() == bar.maximum() - 6 and not window.log_view.following
    bar.setValue(bar.maximum())  # back to the end: following again
    window.append_log("and on")
    QApplication.processEvents()
    assert bar.value() == bar.maximum() and window.log_view.following
