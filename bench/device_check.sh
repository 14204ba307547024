#!/usr/bin/env bash
# Replaced by bench/gpu_check.sh, the one prepared GPU script (issue 24): this name is kept so that old
# notes still work. Usage (on the GPU machine, .whl carried): bash bench/device_check.sh
exec bash "$(dirname "$0")/gpu_check.sh" "$@"
