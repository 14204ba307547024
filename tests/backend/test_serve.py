"""`finetune-studio serve`: the launch lines per engine, and the embedded server on the bundled model.

The server tests start one real `transformers serve` (continuous batching, CPU) through the CLI and
talk to it with the openai client: concurrent answers, a wrong token, then Stop (SIGINT to the CLI,
as Ctrl-C) with every process gone and the port free.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from backend.cli.app import main
from backend.runtime.processes import module_command, worker_env
from backend.serving import Card, resolve
from backend.serving import engines
from backend.serving.engines import (HIDDEN, choose_engine, llama_cpp_launch, transformers_launch,
                                     vllm_launch)
from backend.serving.server_process import ServerProcess, port_taken_line
from backend.serving.source import ServeSource
from backend.serving.tf_server import TOKEN_ENV

TOKEN = "fs-test-token"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- launch lines (no server) ---------------------------------------------------------------------

def test_transformers_on_the_cpu_batches_continuously_offline_with_a_sized_cache(bundled_model):
    launch = transformers_launch(resolve(str(bundled_model), None), 8123, TOKEN, "cpu")
    assert "--continuous-batching" in launch.argv
    assert _flag(launch.argv, "--host") == "127.0.0.1" and _flag(launch.argv, "--port") == "8123"
    # 8 sequences x 1024 tokens (the bundled model's positions) in pages of 256: not 90% of the RAM
    assert _flag(launch.argv, "--max-model-len") == "1024" and _flag(launch.argv, "--cb-num-blocks") == "32"
    assert launch.env[TOKEN_ENV] == TOKEN and TOKEN not in " ".join(launch.argv) and TOKEN not in launch.shown
    assert launch.env["HF_HUB_OFFLINE"] == "1" and launch.env["USE_HUB_KERNELS"] == "0"
    assert launch.env["DISABLE_KERNEL_MAPPING"] == "1"
    assert launch.model == str(bundled_model) and launch.argv[4] == str(bundled_model)


def test_transformers_on_a_gpu_leaves_the_cache_to_free_memory_unless_bounded(bundled_model):
    source = resolve(str(bundled_model), None)
    launch = transformers_launch(source, 8128, TOKEN, "cuda")
    assert _flag(launch.argv, "--device") == "cuda" and "--continuous-batching" in launch.argv
    assert "--cb-num-blocks" not in launch.argv and "--max-model-len" not in launch.argv
    bounded = transformers_launch(source, 8128, TOKEN, "cuda", context=512, seqs=4)
    assert _flag(bounded.argv, "--max-model-len") == "512" and _flag(bounded.argv, "--cb-num-blocks") == "8"


def test_vllm_runs_the_serving_estimate_line_with_the_token_in_its_env(bundled_model, monkeypatch):
    source = resolve(str(bundled_model), None)
    card = Card(24.0, 0.85, 1, 16, 2048)
    launch = vllm_launch(source, 8124, TOKEN, card, context=512)
    for flag, value in (("--tensor-parallel-size", "1"), ("--block-size", "16"), ("--gpu-memory-utilization", "0.85"),
                        ("--max-model-len", "512"), ("--host", "127.0.0.1"), ("--port", "8124")):
        assert _flag(launch.argv, flag) == value
    most = int(_flag(launch.argv, "--max-num-seqs"))
    assert most > 1
    both = vllm_launch(source, 8124, TOKEN, card, context=512, concurrency=most - 1)
    assert _flag(both.argv, "--max-num-seqs") == str(most - 1) and _flag(both.argv, "--max-model-len") == "512"
    with pytest.raises(ValueError, match=rf"only {most} sequences of 512 tokens fit"):
        vllm_launch(source, 8124, TOKEN, card, context=512, concurrency=most + 1)
    assert launch.argv[:2][-1] == "serve" and launch.env["VLLM_API_KEY"] == TOKEN and TOKEN not in launch.shown
    monkeypatch.setattr(engines, "installed", lambda module: False)
    with pytest.raises(ValueError, match="vLLM is not installed"):
        choose_engine(source, "vllm", "cuda")
    assert choose_engine(source, "auto", "cuda") == "transformers"
    monkeypatch.setattr(engines, "installed", lambda module: module == "vllm")
    assert choose_engine(source, "auto", "cuda") == "vllm" and choose_engine(source, "auto", "cpu") == "transformers"


def test_gguf_goes_to_llama_cpp_or_says_why_not(tmp_path, monkeypatch):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    source = ServeSource(str(tmp_path / "model.gguf"), {"model_type": "llama"}, "gguf-q8_0")
    monkeypatch.setattr(engines, "installed", lambda module: False)
    with pytest.raises(ValueError, match=r"llama-cpp-python's server is not installed.*--format merged"):
        choose_engine(source, "auto", "cpu")
    monkeypatch.setattr(engines, "installed", lambda module: module != "sse_starlette")  # built without [server]
    with pytest.raises(ValueError, match=r"llama-cpp-python\[server\]"):
        choose_engine(source, "auto", "cpu")
    monkeypatch.setattr(engines, "installed", lambda module: True)
    assert choose_engine(source, "auto", "cpu") == "llama-cpp"
    with pytest.raises(ValueError, match="served by llama.cpp"):
        choose_engine(source, "transformers", "cpu")
    launch = llama_cpp_launch(source, 8125, TOKEN, context=2048)
    assert launch.argv[1:3] == ["-m", "llama_cpp.server"] and launch.env["API_KEY"] == TOKEN
    assert _flag(launch.argv, "--host") == "127.0.0.1" and _flag(launch.argv, "--n_ctx") == "2048"
    assert _flag(launch.argv, "--interrupt_requests") == "false"  # concurrent clients are not cut off
    assert TOKEN not in " ".join(launch.argv) and TOKEN not in launch.shown and HIDDEN in launch.shown
    assert "--clip_model_path" not in launch.argv  # a text export: no projector
    (tmp_path / "mmproj.gguf").write_bytes(b"GGUF")  # a vision-language export's pair
    launch = llama_cpp_launch(source, 8125, TOKEN)
    assert _flag(launch.argv, "--chat_format") == "mtmd"
    assert _flag(launch.argv, "--clip_model_path") == str(tmp_path / "mmproj.gguf")
    assert any("mtmd" in note for note in launch.notes)


def test_a_run_without_its_merged_export_names_the_export_to_make(tmp_path):
    note = (f"not exported yet: sized from /base/config.json; `finetune-studio export {tmp_path} --format merged` "
            f"writes {tmp_path}/exports/merged")
    source = ServeSource(str(tmp_path / "exports" / "merged"), {}, "merged", notes=[note])
    with pytest.raises(ValueError, match=rf"make it first with `finetune-studio export {tmp_path} --format merged`"):
        transformers_launch(source, 8126, TOKEN, "cpu")


def test_a_run_is_served_from_its_merged_export_or_told_to_make_it(tmp_path, bundled_model, capsys):
    import shutil

    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder
    from tests.conftest import PRESET

    folder = RunFolder.create(RunConfig.load(PRESET, ["name=to-serve"]), root=tmp_path)
    code = main(["serve", str(folder.path), "--port", "0", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"`finetune-studio export {folder.path} --format merged`" in err
    merged = folder.path / "exports" / "merged"
    shutil.copytree(bundled_model, merged)
    (merged / "export_report.json").write_text('{"format": "merged"}')
    launch = transformers_launch(resolve(str(folder.path), None), 8129, TOKEN, "cpu")
    assert launch.model == str(merged) and launch.argv[4] == str(merged)


def test_a_taken_port_is_one_line_and_nothing_starts(bundled_model, capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["serve", str(bundled_model), "--port", str(port), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert port_taken_line(port) in err and len(err.splitlines()) == 1 and "token" not in capsys.readouterr().out


def test_a_server_that_lost_the_race_for_its_port_says_so(bundled_model):
    launch = transformers_launch(resolve(str(bundled_model), None), 8127, TOKEN, "cpu")
    server = ServerProcess(launch, TOKEN)
    server.lines.extend(["INFO: Started", "ERROR: [Errno 98] error while attempting to bind: address already in use"])
    assert server.failure() == port_taken_line(8127)


def test_the_server_process_never_fetches_a_flash_attention_kernel(monkeypatch):
    from transformers.utils import import_utils

    from backend.serving.tf_server import no_kernel_fallback

    monkeypatch.setattr(import_utils, "is_flash_attn_kernel_fallback_available", lambda fa_version: True)
    no_kernel_fallback()
    assert import_utils.is_flash_attn_kernel_fallback_available(2) is False
    # the model's process: multiprocessing's spawn imports the main module as __mp_main__
    monkeypatch.setattr(import_utils, "is_flash_attn_kernel_fallback_available", lambda fa_version: True)
    import runpy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported (by this test)
        runpy.run_module("backend.serving.tf_server", run_name="__mp_main__")
    assert import_utils.is_flash_attn_kernel_fallback_available(2) is False


# --- the embedded server on the bundled model -----------------------------------------------------

def start_cli(model: Path | str, *more: str) -> dict:
    """`finetune-studio serve MODEL --port 0 --device cpu [MORE]`, read until it says ready."""
    # Ctrl-C as a terminal sends it: a suite started in the background (`&` without job control) ignores
    # SIGINT, which its children inherit, and Python then installs no KeyboardInterrupt for it.
    process = subprocess.Popen([*module_command("backend.cli"), "serve", str(model), "--port", "0",
                                "--device", "cpu", *more], env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("ready:"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(180):
        process.kill()
        pytest.fail("the server did not say ready:\n" + "\n".join(lines[-20:]))
    text = "\n".join(lines)
    return {"process": process, "lines": lines, "token": re.search(r"^token:\s+(\S+)", text, re.M).group(1),
            "port": int(re.search(r"--port (\d+)", text).group(1)),
            "pid": int(re.search(r"^pid:\s+(\d+)", text, re.M).group(1)),
            "model": re.search(r"^ready:\s+\S+\s+model (.+)$", text, re.M).group(1)}


@pytest.fixture(scope="module")
def served(bundled_model):
    info = start_cli(bundled_model)
    yield info
    if info["process"].poll() is None:
        info["process"].kill()


def test_the_server_answers_concurrent_openai_clients(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{served['port']}/v1", api_key=served["token"], timeout=60)

    def ask(index: int) -> tuple[str, int]:
        reply = client.chat.completions.create(model=served["model"], max_tokens=8,
                                               messages=[{"role": "user", "content": f"Count to {index}"}])
        return reply.choices[0].message.content, reply.usage.completion_tokens

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(4)))
    stream = client.chat.completions.create(model=served["model"], max_tokens=4, stream=True,
                                            messages=[{"role": "user", "content": "Hi"}])
    assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) >= 1
    assert all(isinstance(text, str) and 0 < tokens <= 8 for text, tokens in answers)
    assert sum("127.0.0.1" in line and "chat/completions" in line and "200" in line for line in served["lines"]) >= 4


def test_a_wrong_or_missing_token_is_refused_with_401(served):
    from openai import AuthenticationError, OpenAI

    base = f"http://127.0.0.1:{served['port']}/v1"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/models", timeout=10)
    assert refused.value.code == 401


def test_stop_ends_every_process_and_frees_the_port(served):
    server = psutil.Process(served["pid"])
    family = [server, *server.children(recursive=True)]
    assert len(family) >= 2  # transformers serve runs the model in a process of its own
    served["process"].send_signal(signal.SIGINT)  # Ctrl-C
    assert served["process"].wait(60) == 0
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, [p.pid for p in alive]
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", served["port"]))
    deadline = time.monotonic() + 5
    while not any(line.startswith("stopped:") for line in served["lines"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"stopped: port {served['port']} is free" in served["lines"]


def test_a_killed_cli_takes_its_server_with_it(bundled_model):
    started = start_cli(bundled_model)
    server = psutil.Process(started["pid"])
    family = [server, *server.children(recursive=True)]
    started["process"].kill()  # SIGKILL: no chance to stop the server itself
    started["process"].wait(10)
    _, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, [p.cmdline()[:3] for p in alive]
