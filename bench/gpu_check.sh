#!/usr/bin/env bash
# The GPU proof in one run of at most 8 minutes on an offline GPU machine (issue 24): wheels carried in
# .whl/ go to /tmp/site; the gpu-marked tests; Llama-3.2-1B LoRA (12 GB preset) and Llama-3.1-8B QLoRA
# (16 GB preset) on random-weight models built on the GPU from their real config.json, 2048-token rows
# where every position is a target, through the real CLI: the estimate against CUDA max allocated and
# reserved; steady-state useful tokens/s and peaks against a bare transformers + peft Trainer (warm-up
# left out, 20 steps measured; torch.profiler's top kernels where the studio's MFU is under 25%); merged
# and GGUF exports of the 1B run with their checks; optionally the longest row per card, capped. One
# markdown table last. Everything goes to $WORK/out; $OUT (the device call's, which brings back at most
# 8 files) gets summary.md and gpu_check_outputs.tgz holding all of it.
#   here first:      python bench/device_wheels.py
#   on the GPU:      run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=560)
#   CPU dry run:     GPU_CHECK_DRY=1 PYTHON=.venv/bin/python bash bench/gpu_check.sh   (shrunken models, CPU)
# GPU_CHECK_PARTS (default "text") picks what runs after the environment: "text" the gpu tests, the text presets,
# the exports and the longest row; "vlm" the VLM presets (Qwen2.5-VL-7B QLoRA 16 GB, Gemma-3-4B LoRA 24 GB) on
# random-weight models built from their real config.json (bench/gpu_vlm_models.py), rows of one image at the
# preset's cap, the estimate against CUDA max allocated and reserved (about 5 minutes: a call of its own,
#   run(command="GPU_CHECK_PARTS=vlm bash bench/gpu_check.sh", carry=[".whl"], timeout_s=420)).
set -uo pipefail
DRY=${GPU_CHECK_DRY:-0}
PARTS=${GPU_CHECK_PARTS:-text}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check$([ "$DRY" = 1 ] && echo -dry)}
BACK=${OUT:-}
OUT=$WORK/out
rm -rf "$WORK/home" "$WORK/site" "$OUT" && mkdir -p "$OUT" && : >"$OUT/steps.jsonl"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
# Hub kernels: not switched off here, so that the tests and the CLI runs prove the product's own switch;
# the bench scripts that load a model themselves (builds, the bare Trainer) switch them off (bench/hub_kernels.py).
unset USE_HUB_KERNELS DISABLE_KERNEL_MAPPING
export FINETUNE_STUDIO_HOME=$WORK/home QT_QPA_PLATFORM=offscreen
if [ "$DRY" = 1 ]; then  # CPU: tiny widths, short rows, few steps; budgets for 2 busy cores
  SEQ=256 ROWS=24 WARM=1 MEASURED=2 PROF=1 SCALE=3 DRYFLAG=--dry
else
  SEQ=2048 ROWS=64 WARM=2 MEASURED=20 PROF=2 SCALE=1 DRYFLAG=
fi
TOTAL=$((WARM + MEASURED))
T0=$(date +%s)

# step NAME TIMEOUT_S COMMAND...: runs it under `timeout`, its output to $OUT/NAME.log, a line to steps.jsonl
step() {
  local name=$1 limit=$(($2 * SCALE)) start rc; shift 2
  start=$(date +%s)
  echo "== $name (at most ${limit} s, $(( start - T0 )) s in)"
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1; rc=$?
  tail -n 4 "$OUT/$name.log"
  printf '{"step": "%s", "rc": %d, "seconds": %d, "limit": %d%s}\n' "$name" "$rc" $(( $(date +%s) - start )) \
    "$limit" "${STEP_EXTRA:-}" >>"$OUT/steps.jsonl"
  return $rc
}

# 1. wheels (30 s): this project's versions over the machine's; on the dry run only installed, not used
if [ -d .whl ]; then
  if [ "$DRY" = 1 ]; then
    step wheels 30 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --only-binary=:all: --python-version 3.12 --target "$WORK/site" .whl/*.whl
  else
    step wheels 30 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || { echo "wheels failed"; exit 1; }
  fi
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
case ":$PYTHONPATH:" in *":$PWD:"*) ;; *) export PYTHONPATH=$PYTHONPATH:$PWD ;; esac

# 2. versions and the CUDA context, measured alone on the card (15 s)
step env 15 "$PY" - "$OUT/env.json" <<'PYEOF'
import json, sys, torch, transformers, peft
env = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
       "python": sys.version.split()[0], "gpu": "none (CPU)"}
try:
    import bitsandbytes; env["bitsandbytes"] = bitsandbytes.__version__
except Exception as exc:  # reported, not fatal: the QLoRA steps say the rest
    env["bitsandbytes"] = f"not importable: {exc}"
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    env.update(gpu=torch.cuda.get_device_name(0), total_bytes=total, context_bytes=total - free)
json.dump(env, open(sys.argv[1], "w"), indent=1); print(env)
PYEOF
export GPU_CHECK_CONTEXT_BYTES=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('context_bytes') or '')" "$OUT/env.json" 2>/dev/null)

PRESETS=resources/presets
if part text; then
# 3. gpu tests (110 s, in the background) beside the model builds (90 s)
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 6")
( step gpu_tests 110 "$PY" -m pytest -p no:cacheprovider -q -m gpu tests/backend/test_gpu.py -o addopts="" $XDIST ) &
TESTS=$!
step build 90 "$PY" bench/gpu_models.py --out "$WORK" --seq-len "$SEQ" --rows "$ROWS" $DRYFLAG
wait $TESTS
DETAIL=$(grep -Eo "[0-9]+ (passed|failed|skipped|error)[^=]*" "$OUT/gpu_tests.log" | tail -1)
sed -i "s|\"step\": \"gpu_tests\"|\"step\": \"gpu_tests\", \"detail\": \"${DETAIL:-no pytest summary}\", \"background\": true|" "$OUT/steps.jsonl"

# 4. each preset: estimate + training through the CLI (studio side), then the bare Trainer on the same
preset() {  # NAME PRESET MODEL METHOD TRAIN_S BASELINE_S
  step "$1" "$5" "$PY" bench/gpu_preset_run.py --preset "$PRESETS/$2" --name "$1" --model "$WORK/$3" \
    --data "$WORK/long_rows.jsonl" --out "$OUT" --warmup "$WARM" --steps "$MEASURED" --profile-steps "$PROF" \
    --seq-len "$SEQ" --timeout $(($5 * SCALE - 10))
  local run; run=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_dir'] or '')" "$OUT/$1.json" 2>/dev/null)
  [ -n "$run" ] && step "throughput_$1" "$6" "$PY" bench/throughput.py --preset "$PRESETS/$2" --model "$WORK/$3" \
    --data "$WORK/long_rows.jsonl" --seq-len "$SEQ" --method "$4" --warmup "$WARM" --steps "$TOTAL" --rounds 1 \
    --set train.gradient_accumulation_steps=1 --set train.warmup_steps=0 --set data.validation_split=0 \
    --studio-run "$run" --json-out "$OUT/throughput_$1.json"
  echo "$run" >"$WORK/$1.run"
}
preset lora_1b llama-3.2-1b_lora_12gb.yaml 1b lora 45 40
preset qlora_8b llama-3.1-8b_qlora_16gb.yaml 8b qlora 95 80

# 5. side by side (55 s): merged and GGUF exports of the 1B run with their checks; the longest row, capped
RUN1B=$(cat "$WORK/lora_1b.run" 2>/dev/null)
if [ -n "$RUN1B" ]; then
  for fmt in merged gguf-f16; do
    ( step "export_${fmt%%-*}" 55 "$PY" -m studio export "$RUN1B" --format "$fmt"
      cp "$RUN1B/exports/$fmt/export_report.json" "$OUT/export_${fmt%%-*}.json" 2>/dev/null ) &
  done
fi
( step maxlen 55 "$PY" bench/gpu_maxlen.py --preset "$PRESETS/llama-3.2-1b_lora_12gb.yaml" --model "$WORK/1b" \
    --out "$OUT" --timeout $((45 * SCALE)) --set train.gradient_accumulation_steps=1 --set train.warmup_steps=0 ) &
wait
fi

# 5b. the VLM presets: the estimate (one image a row at the cap) against CUDA's peaks; a step's peak does not
# depend on how many steps follow, so fewer measured steps than the text presets and no profile
if part vlm; then
  step build_vlm 120 "$PY" bench/gpu_vlm_models.py --out "$WORK" --rows "$ROWS" $DRYFLAG
  cp "$WORK/build_vlm.json" "$OUT/" 2>/dev/null
  vlm_preset() {  # NAME PRESET MODEL TRAIN_S
    step "$1" "$4" "$PY" bench/gpu_preset_run.py --preset "$PRESETS/$2" --name "$1" --model "$WORK/$3" \
      --data "$WORK/$3_rows/train.jsonl" --out "$OUT" --warmup "$WARM" --steps $((MEASURED < 5 ? MEASURED : 5)) \
      --profile-steps 0 --timeout $(($4 * SCALE - 10))
  }
  vlm_preset qlora_vl7b qwen2.5-vl-7b_qlora_16gb.yaml vl7b 110
  vlm_preset lora_gemma4b gemma-3-4b_lora_24gb.yaml gemma4b 90
fi

# 6. the table
echo "== summary ($(( $(date +%s) - T0 )) s in all)"
printf '{"step": "wall", "seconds": %d}\n' $(( $(date +%s) - T0 )) >>"$OUT/steps.jsonl"
"$PY" bench/gpu_summary.py "$OUT" --profiles
"$PY" bench/gpu_summary.py "$OUT" | tee "$OUT/summary.md"
if [ -n "$BACK" ]; then
  cp "$OUT/summary.md" "$BACK/" && tar czf "$BACK/gpu_check_outputs.tgz" -C "$OUT" .
fi
