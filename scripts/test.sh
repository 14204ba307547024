#!/usr/bin/env bash
# Install into .venv and run the whole test suite (the README's second command).
# torch==2.13.0 comes first: it is the CPU build; an open range would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Xvfb and Qt's xcb libraries let one test open the real window and take screenshots (it is
# skipped, with a reason, without them).
XCB_PACKAGES="xvfb libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && ! dpkg -s $XCB_PACKAGES >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq $XCB_PACKAGES >/dev/null) || echo "note: could not install $XCB_PACKAGES"
fi
python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e ".[dev]"
export QT_QPA_PLATFORM=offscreen
# The boundaries first (pyproject.toml [tool.importlinter], [tool.ruff]): a broken one fails in seconds.
lint-imports
ruff check .
python -m pytest -q "$@"
