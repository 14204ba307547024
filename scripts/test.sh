#!/usr/bin/env bash
# Install into .venv and run the whole test suite (the README's second command).
# torch==2.13.0 comes first: it is the CPU build; an open range would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Xvfb lets one test open the real window and take screenshots (skipped, with a reason, without it).
if ! command -v Xvfb >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq xvfb >/dev/null) || echo "note: could not install xvfb"
fi
python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e ".[dev]"
export QT_QPA_PLATFORM=offscreen
python -m pytest -q "$@"
