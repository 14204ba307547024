#!/usr/bin/env bash
# Install into .venv and fine-tune the bundled model on the bundled demo data (the README's first
# command). Headless: prints progress and a summary; open the window afterwards with `finetune-studio`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e .
finetune-studio train resources/presets/tiny_lora.yaml "$@"
