#!/usr/bin/env bash
# Install into .venv and run the whole test suite (the README's second command).
# torch==2.13.0 comes first: it is the CPU build; an open range would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e ".[dev]"
export QT_QPA_PLATFORM=offscreen
python -m pytest -q "$@"
