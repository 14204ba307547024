"""The GGUF export served by llama.cpp's server, end to end, where llama-cpp-python[server] is installed.

A `slow` check (`pytest -m slow`): CI has no llama-cpp-python. Trains the bundled model for two steps,
exports gguf-q8_0, serves it through `finetune-studio serve`, asks it from concurrent OpenAI clients,
refuses a wrong token, and stops on Ctrl-C leaving the port free.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from backend.runtime.processes import module_command, worker_env
from backend.serving.engines import LLAMA_CPP_SERVER, installed
from tests.backend.test_serve import start_cli
from tests.conftest import PRESET, ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not all(map(installed, LLAMA_CPP_SERVER)),
                                 reason="llama-cpp-python[server] is not installed")]


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([*module_command("backend.cli"), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_a_gguf_export_is_served_by_llama_cpp_and_stops_clean(tmp_path, monkeypatch):
    from openai import AuthenticationError, OpenAI

    env = {**worker_env(), "FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    out = _cli("train", str(PRESET), "--set", "train.max_steps=2", env=env)
    run = re.search(r"adapter:\s+(\S+)/adapter", out).group(1)
    _cli("export", run, "--format", "gguf-q8_0", env=env)
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", env["FINETUNE_STUDIO_HOME"])
    served = start_cli(run, "--format", "gguf-q8_0")
    try:
        assert any(line.startswith("engine:  llama-cpp") for line in served["lines"])
        client = OpenAI(base_url=f"http://127.0.0.1:{served['port']}/v1", api_key=served["token"], timeout=60)

        def ask(index: int) -> int:
            reply = client.chat.completions.create(model=served["model"], max_tokens=6,
                                                   messages=[{"role": "user", "content": f"Count to {index}"}])
            return reply.usage.completion_tokens

        with ThreadPoolExecutor(4) as pool:
            assert all(0 < tokens <= 6 for tokens in pool.map(ask, range(4)))
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()
        family = [psutil.Process(served["pid"]), *psutil.Process(served["pid"]).children(recursive=True)]
        served["process"].send_signal(signal.SIGINT)
        assert served["process"].wait(60) == 0
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", served["port"]))
    finally:
        if served["process"].poll() is None:
            served["process"].kill()
    assert os.path.isfile(os.path.join(run, "exports", "gguf-q8_0", "model.gguf"))
