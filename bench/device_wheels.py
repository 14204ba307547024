"""Fill .whl/ with the wheels the lent GPU machine lacks, for bench/device_check.sh.

That machine has no network and its own Python 3.12 with CUDA torch, transformers, peft and
accelerate, but not pydantic, datasets, bitsandbytes, gguf or liger-kernel (the device notes list
its packages). A call carries at most 64 MiB with the working tree (~25 MB), and bitsandbytes'
wheel alone is 43 MB: one CUDA library per CUDA release and ROCm build. So its wheel is rewritten
keeping the CPU library and the CUDA 13 ones (the machine's torch is built for CUDA 13.0), which
brings the set to ~27 MB. Versions are this checkout's environment's, so the GPU run tests the
same code paths as CI (transformers is carried too: the machine's 5.17 predates what CI runs).

    python bench/device_wheels.py            # then: run(command="bash bench/device_check.sh", carry=[".whl"])
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".whl"
PACKAGES = ["transformers", "peft", "datasets", "dill", "multiprocess", "pydantic", "pydantic_core",
            "annotated-types", "typing-inspection", "platformdirs", "gguf", "bitsandbytes", "liger-kernel"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
KEEP_CUDA = ("cuda130", "cuda132")
LIMIT = 64 * 2**20


def pinned(name: str) -> str:
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name  # not installed here (liger-kernel is CUDA-only): the newest


def slim_bitsandbytes(wheel: Path) -> None:
    """Drop the CUDA and ROCm libraries the machine cannot load; RECORD loses their lines too."""
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        dropped = {i.filename for i in src.infolist() if "/libbitsandbytes_" in i.filename
                   and ("cuda" in i.filename or "rocm" in i.filename) and not any(k in i.filename for k in KEEP_CUDA)}
        for item in src.infolist():
            if item.filename in dropped:
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(line for line in data.split(b"\n") if line.split(b",")[0].decode() not in dropped)
            dst.writestr(item, data)
    slim.replace(wheel)


def main() -> int:
    OUT.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "-d", str(OUT)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [pinned(p) for p in PACKAGES], check=True)
    for wheel in OUT.glob("bitsandbytes-*.whl"):
        slim_bitsandbytes(wheel)
    wheels = sum(p.stat().st_size for p in OUT.glob("*.whl"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((ROOT / name.decode()).stat().st_size for name in tracked if name and (ROOT / name.decode()).is_file())
    print(f"{len(list(OUT.glob('*.whl')))} wheels, {wheels / 2**20:.1f} MiB; with the tracked tree "
          f"{(wheels + tree) / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a device call carries")
    return 0 if wheels + tree < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
