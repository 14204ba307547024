"""The Serve panel: Start serves the bundled model through the CLI, the key works, Stop leaves nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import psutil
import pytest

from studio.widgets.serve_widget import ServeWidget

WAIT_MS = 180_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _servers_of(cli_pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(cli_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_start_serves_with_the_key_shown_and_stop_leaves_nothing(qtbot, bundled_model):
    panel = ServeWidget()
    qtbot.addWidget(panel)
    assert not panel.start_button.isEnabled()  # no run picked yet
    panel.set_target(str(bundled_model))
    port = _free_port()
    panel.port_spin.setValue(port)
    panel.device_combo.setCurrentIndex(panel.device_combo.findData("cpu"))
    assert panel.argv()[-6:] == ["--port", str(port), "--engine", "auto", "--device", "cpu"]
    panel.start_button.click()
    assert panel.running() and panel.stop_button.isEnabled() and not panel.port_spin.isEnabled()
    qtbot.waitUntil(panel.ready, timeout=WAIT_MS)
    url, key = panel.url_edit.text(), panel.token_edit.text()
    assert url == f"http://127.0.0.1:{port}/v1" and key.startswith("fs-")
    assert key not in panel.log.toPlainText() and "--continuous-batching" in panel.command_edit.text()
    assert str(bundled_model) in panel.status_label.text()
    request = urllib.request.Request(f"{url}/chat/completions", method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        data=json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode())
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert json.load(reply)["usage"]["completion_tokens"] > 0
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{url}/models", headers={"Authorization": "Bearer no"}))
    assert refused.value.code == 401
    assert panel._process is not None
    family = [psutil.Process(int(panel._process.processId())), *_servers_of(int(panel._process.processId()))]
    assert len(family) >= 3  # the CLI, the server, the model's process
    panel.stop_button.click()
    qtbot.waitUntil(lambda: not panel.running(), timeout=60_000)
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive
    assert "port is free" in panel.status_label.text() and panel.token_edit.text() == ""
    assert "leaked semaphore" not in panel.log.toPlainText()  # the resource tracker's warning is filtered
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
    assert panel.start_button.isEnabled()


def test_a_taken_port_is_the_panels_one_red_line(qtbot, bundled_model):
    panel = ServeWidget()
    qtbot.addWidget(panel)
    panel.set_target(str(bundled_model))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        panel.port_spin.setValue(holder.getsockname()[1])
        panel.start_button.click()
        qtbot.waitUntil(lambda: not panel.running(), timeout=60_000)
    assert panel.status_label.text().startswith(f"port {panel.port_spin.value()} on 127.0.0.1 is taken")
    assert "c0392b" in panel.status_label.styleSheet() and panel.token_edit.text() == ""


def test_the_panel_offers_every_served_format_the_calibrated_ones_included(qtbot, bundled_model):
    panel = ServeWidget()
    qtbot.addWidget(panel)
    panel.set_target(str(bundled_model))
    offered = [panel.format_combo.itemData(i) for i in range(panel.format_combo.count())]
    assert offered[0] is None and {"gptq-int4", "awq-int4", "w8a8"} <= set(offered[1:])
    assert "--format" not in panel.argv()
    panel.format_combo.setCurrentIndex(panel.format_combo.findData("gptq-int4"))
    assert panel.argv()[panel.argv().index("--format") + 1] == "gptq-int4"


def test_the_panel_imports_no_torch():
    code = ("import sys; import studio.widgets.serve_widget; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


def test_the_export_page_serves_the_picked_run(qtbot, make_studio):
    from tests.fakes import fake_command
    from tests.studio.test_export_page import finished_run

    studio = make_studio(fake_command("normal"))
    first, second = finished_run(studio, "first"), finished_run(studio, "second")
    page = studio.pages["export"]
    studio.window.show_page("export")
    for folder in (first, second):
        page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(folder.path)))
        assert page.serve.argv()[page.serve.argv().index("serve") + 1] == str(folder.path)
    assert page.serve.start_button.isEnabled() and not page.serve.stop_button.isEnabled()
