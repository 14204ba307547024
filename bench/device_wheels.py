"""Fill .whl/ with the wheels the lent GPU machine lacks, for bench/gpu_check.sh.

That machine has no network and its own Python 3.12 with CUDA torch 2.11, transformers 5.17,
huggingface_hub 1.33, peft and accelerate, but not pydantic, datasets, bitsandbytes, gguf or kernels
(the device notes list its packages). Versions carried are this checkout's environment's, so the GPU
run tests the code paths CI tests: transformers 5.25 refuses to import without huggingface_hub >= 2.4,
which needs httpx2/httpcore2 (and they truststore, idna, anyio, h11) and a newer click; transformers
also needs kernels (and kernels tomlkit) and a newer regex. A call carries at most 64 MiB with the
working tree, so what travels is slimmed: bitsandbytes' wheel (43 MB: one CUDA library per CUDA
release and ROCm build) keeps its CPU library and the CUDA 13.0 one (the machine's torch is cu130),
and hf-xet (only used to download, which the offline check never does) is left to the machine's own.

    python bench/device_wheels.py    # then: run(command="bash bench/gpu_check.sh", carry=[".whl"])
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".whl"
PACKAGES = [
    # the project's own stack, newer than or missing from the machine's
    "transformers", "peft", "datasets", "dill", "multiprocess", "pydantic", "pydantic_core", "annotated-types",
    "typing-inspection", "platformdirs", "gguf", "bitsandbytes", "liger-kernel",
    # what transformers 5.25 needs that the machine lacks or has too old (importlib.metadata.requires)
    "huggingface_hub", "httpx2", "httpcore2", "truststore", "idna", "anyio", "h11", "click", "kernels", "tomlkit",
    "regex",
    # the calibrated exports' gpu test (tests/backend/test_export_calibrated.py -m gpu)
    "compressed-tensors",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]
KEEP_CUDA = ("cuda130",)
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


def travelling_tree() -> int:
    """Bytes of what a device call sends besides carried paths: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in set(listed) if n and (ROOT / n.decode()).is_file())


def main() -> int:
    OUT.mkdir(exist_ok=True)
    wanted = [pinned(p) for p in PACKAGES]
    versions = {w.split("==")[0].replace("-", "_").lower(): (w.split("==") + [None])[1] for w in wanted}
    for old in OUT.glob("*.whl"):  # one version of each (two stop the whole install there), nothing unwanted
        name, version = old.name.split("-")[:2]
        if name.lower() not in versions or versions[name.lower()] not in (None, version):
            old.unlink()
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "-d", str(OUT)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + wanted, check=True)
    for wheel in OUT.glob("bitsandbytes-*.whl"):
        slim_bitsandbytes(wheel)
    wheels = sorted(OUT.glob("*.whl"), key=lambda p: -p.stat().st_size)
    size = sum(p.stat().st_size for p in wheels)
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    tree = travelling_tree()
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; working tree {tree / 2**20:.1f} MiB; together "
          f"{(size + tree) / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a device call carries")
    return 0 if size + tree < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
