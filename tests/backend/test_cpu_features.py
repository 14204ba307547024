"""Native bf16 is read from the CPU's flags; anything unreadable is "no"."""

from __future__ import annotations

import subprocess
import sys

from backend.cpu_features import native_bf16

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
    code = "import sys, backend.cpu_features as c; c.native_bf16(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
