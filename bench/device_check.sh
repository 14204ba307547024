#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (no network there): wheels carried in .whl/
# are installed to /tmp/site, then the gpu-marked tests and the GPU throughput bench run.
# First, here: python bench/device_wheels.py (fills the ignored .whl/ with what that machine lacks, ~25 MiB).
# Usage (from the repo root on the GPU machine, .whl carried): bash bench/device_check.sh
# (at most ~10 min: the timeouts add up to 580 s)
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
timeout 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/backend/test_gpu.py -o addopts="" 2>&1 | tee "$OUT/gpu_tests.txt"
# Issue 8's GPU goal: a 0.6B model built from a config, bf16, LoRA and QLoRA, uneven-length alpaca
# data, studio vs the bare Trainer: useful tokens/s (goal >= 1.5x) and peak memory (goal <= baseline).
ALPACA=tests/fixtures/peer-data/alpaca_en_demo.json
timeout 210 python3 bench/throughput.py --model-size 0.6b --data $ALPACA --seq-len 1024 --method lora \
  --rounds 2 --steps 30 2>&1 | tee "$OUT/throughput_gpu_lora.txt"
timeout 170 python3 bench/throughput.py --model-size 0.6b --data $ALPACA --seq-len 1024 --method qlora \
  --rounds 1 --steps 30 2>&1 | tee "$OUT/throughput_gpu_qlora.txt"
if [ "${ESTIMATE:-0}" = 1 ]; then  # measured on the H200 in session 1; rerun only when the estimator changed
  timeout 150 python3 bench/estimate_accuracy.py --gpu 2>&1 | tail -40 | tee "$OUT/estimate_gpu.txt"
fi
