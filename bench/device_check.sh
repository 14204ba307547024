#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (no network there): wheels carried in .whl/
# are installed to /tmp/site, then the gpu-marked tests and the GPU throughput bench run.
# Usage (from the repo root on the GPU machine): bash bench/device_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$OUT/gpu.txt"
export FINETUNE_STUDIO_HOME=/tmp/fs-home
timeout 300 python3 -m pytest -p no:cacheprovider -q -m gpu tests/backend/test_gpu.py -o addopts="" 2>&1 | tee "$OUT/gpu_tests.txt"
if [ -f bench/estimate_accuracy.py ]; then
  timeout 150 python3 bench/estimate_accuracy.py --gpu 2>&1 | tail -40 | tee "$OUT/estimate_gpu.txt"
fi
timeout 150 python3 bench/throughput.py --rounds 2 --steps 40 2>&1 | tail -8 | tee "$OUT/throughput_gpu.txt"
