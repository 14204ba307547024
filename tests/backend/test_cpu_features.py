"""Native bf16 is read from the CPU's flags; anything unreadable is "no"."""

from __future__ import annotations

import subprocess
import sys

import pytest

from backend.core.cpu_features import native_bf16

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\nbugs\t\t: spectre_v1\n"


def test_flags_decide(tmp_path):
    for extra, expected in (("avx512_bf16", True), ("amx_bf16 amx_tile", True), ("avx512_vnni", False), ("", False)):
        path = tmp_path / f"cpuinfo-{extra or 'none'}"
        path.write_text(FLAGS.format(extra=extra))
        assert native_bf16(str(path)) is expected, extra


def test_unreadable_means_no(tmp_path):
    assert native_bf16(str(tmp_path / "missing")) is False
    (tmp_path / "empty").write_text("")
    assert native_bf16(str(tmp_path / "empty")) is False


def test_torch_free():
    code = "import sys, backend.core.cpu_features as c; c.native_bf16(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_worker_env_sets_the_runtime_settings_and_the_user_wins():
    from backend.core.cpu_features import RUNTIME_ENV
    from backend.runtime.processes import worker_env

    env = worker_env({"PATH": "/usr/bin"})
    assert all(env[name] == value for name, value in RUNTIME_ENV.items())
    assert worker_env({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"})["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


GROWTH = """
import torch
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
torch.set_num_threads(1)
w = torch.randn(768, 256).to(torch.bfloat16)
w @ w[:256].t()
before = rss()
for rows in range(100, 400):  # packed rows of every length, as a run on packed data meets them
    torch.randn(rows, 256).to(torch.bfloat16) @ w.t()
    torch.randn(rows, 768).to(torch.bfloat16) @ w
print(rss() - before)
"""


@pytest.mark.skipif(not native_bf16(), reason="bf16 is emulated on this CPU: oneDNN compiles no kernel per shape "
                                              "(the unbounded run grows 0 MB here), so nothing to bound")
def test_bf16_products_of_every_row_length_do_not_grow_the_worker():
    """On a CPU with native bf16, measured without the bounds: +368 MB over these 300 lengths (one
    compiled kernel kept per shape, in two caches of 1,024); with the worker's environment, tens of MB."""
    from backend.runtime.processes import worker_env

    out = subprocess.run([sys.executable, "-c", GROWTH], capture_output=True, text=True, check=True,
                         env=worker_env()).stdout
    assert int(out.strip()) < 120, f"grew {out.strip()} MB"
