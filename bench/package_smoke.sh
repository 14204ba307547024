#!/usr/bin/env bash
# Build the PyInstaller one-folder bundle and smoke-test it: --help, `runs list`, a bare worker
# (`--worker` must answer WorkerReady) and a 5-step headless LoRA fine-tune of the bundled tiny model
# that runs entirely inside the bundle. Prints the build time and the bundle size.
#
# Not part of the test run or CI: the build takes 10-20 minutes on 2 cores and the bundle is over a
# gigabyte (see packaging/README.md).
#
# Usage (from anywhere; uses the checkout's .venv, installing PyInstaller into it if missing):
#   bash bench/package_smoke.sh              # build, then test
#   bash bench/package_smoke.sh --no-build   # test the bundle already in packaging/pyinstaller/dist
#   bash bench/package_smoke.sh --no-clean   # rebuild reusing PyInstaller's cache (faster, not timed clean)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD=1
CLEAN=--clean
for arg in "$@"; do
    case "$arg" in
        --no-build) BUILD=0 ;;
        --no-clean) CLEAN= ;;
        *) echo "package_smoke: unknown option $arg (--no-build, --no-clean)" >&2; exit 2 ;;
    esac
done

if [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
else
    echo "package_smoke: no .venv in $ROOT (run scripts/quickstart.sh first)" >&2
    exit 1
fi

SPEC=packaging/pyinstaller/finetune_studio.spec
DIST=packaging/pyinstaller/dist
WORK=packaging/pyinstaller/build
BUNDLE="$DIST/finetune-studio"
EXE="$ROOT/$BUNDLE/finetune-studio"

if [ "$BUILD" = 1 ]; then
    if ! python -c "import PyInstaller" 2>/dev/null; then
        echo "installing pyinstaller into $VIRTUAL_ENV"
        pip install -q --disable-pip-version-check "pyinstaller>=6.10" || exit 1
    fi
    echo "building $BUNDLE with PyInstaller $(python -c 'import PyInstaller; print(PyInstaller.__version__)') (log: $WORK/build.log)"
    mkdir -p "$WORK"
    start=$(date +%s)
    # nice: the build is long and CPU-bound; it should not starve a desktop or other jobs.
    if ! nice -n 10 pyinstaller --noconfirm $CLEAN --log-level WARN --distpath "$DIST" --workpath "$WORK" \
            "$SPEC" > "$WORK/build.log" 2>&1; then
        tail -40 "$WORK/build.log"
        echo "package_smoke: BUILD FAILED after $(( $(date +%s) - start )) s" >&2
        exit 1
    fi
    BUILD_S=$(( $(date +%s) - start ))
    echo "build time: ${BUILD_S} s ($(( BUILD_S / 60 )) min $(( BUILD_S % 60 )) s)"
fi
[ -x "$EXE" ] || { echo "package_smoke: no bundle at $EXE" >&2; exit 1; }
echo "bundle size: $(du -sh "$BUNDLE" | cut -f1) ($(find "$BUNDLE" -type f | wc -l) files) in $BUNDLE"

# Run the bundle as a user would: outside the checkout, without the venv on any path, with its own
# data folder. `bundled:` paths must resolve inside the bundle, not to this checkout.
deactivate 2>/dev/null || true
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export FINETUNE_STUDIO_HOME="$TMP/home"
unset PYTHONPATH PYTHONHOME FINETUNE_STUDIO_RESOURCES
cd "$TMP"
fail=0
check() {  # check NAME COMMAND...: run, keep the output, say PASS/FAIL
    local name="$1"; shift
    local t0=$(date +%s)
    if "$@" > "$TMP/$name.out" 2> "$TMP/$name.err"; then
        echo "PASS $name ($(( $(date +%s) - t0 )) s)"
    else
        echo "FAIL $name (exit $?)"; tail -n 20 "$TMP/$name.out" "$TMP/$name.err"; fail=1
    fi
}

check help timeout 120 "$EXE" --help
check runs_list timeout 120 "$EXE" runs list
# A bare worker with nothing on stdin: it must answer WorkerReady (torch imported, capabilities
# probed) on stdout, then stop because no StartJob came (exit 2 is expected).
timeout 300 "$EXE" --worker < /dev/null > "$TMP/worker.out" 2> "$TMP/worker.err"
if grep -q '"type": *"WorkerReady"' "$TMP/worker.out"; then
    echo "PASS worker_ready: $(head -c 300 "$TMP/worker.out")"
else
    echo "FAIL worker_ready"; tail -n 20 "$TMP/worker.out" "$TMP/worker.err"; fail=1
fi
# The window, drawn offscreen: Qt plugins, the style sheet and the icons come from the bundle. The
# startup probe prints STARTUP_READY once the first page has painted, then quits.
if QT_QPA_PLATFORM=offscreen FINETUNE_STUDIO_STARTUP_PROBE=1 timeout 120 "$EXE" > "$TMP/window.out" 2> "$TMP/window.err" \
        && grep -q STARTUP_READY "$TMP/window.out"; then
    echo "PASS window_offscreen"
else
    echo "FAIL window_offscreen"; tail -n 20 "$TMP/window.out" "$TMP/window.err"; fail=1
fi
# transformers code that is not compiled in must still import, from the .py copy in the bundle.
check source_fallback timeout 300 "$EXE" -m transformers.models.bert.configuration_bert

PRESET="$ROOT/$BUNDLE/_internal/resources/presets/tiny_lora.yaml"
t0=$(date +%s)
if timeout 900 "$EXE" train "$PRESET" --set train.max_steps=5 > "$TMP/train.out" 2> "$TMP/train.err" \
        && grep -q '^finished' "$TMP/train.out"; then
    adapter=$(sed -n 's/^adapter: *//p' "$TMP/train.out")
    if [ -n "$adapter" ] && ls "$adapter"/adapter_model.safetensors > /dev/null 2>&1; then
        echo "PASS train_5_steps ($(( $(date +%s) - t0 )) s)"
        sed 's/^/    /' "$TMP/train.out"
    else
        echo "FAIL train_5_steps: finished but no adapter_model.safetensors in '$adapter'"; fail=1
    fi
else
    echo "FAIL train_5_steps ($(( $(date +%s) - t0 )) s)"
    tail -n 30 "$TMP/train.out" "$TMP/train.err"
    run_dir=$(sed -n 's/^run folder: *//p' "$TMP/train.err" | head -1)
    [ -n "$run_dir" ] && [ -f "$run_dir/worker.log" ] && { echo "--- $run_dir/worker.log"; tail -n 30 "$run_dir/worker.log"; }
    fail=1
fi

[ "$fail" = 0 ] && echo "package_smoke: all checks passed" || echo "package_smoke: SOME CHECKS FAILED"
exit "$fail"
