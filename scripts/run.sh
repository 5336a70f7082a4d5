#!/usr/bin/env bash
# The main job (README): sets up gpumon, then watches this machine's GPUs through NVML, or, when
# there is no NVIDIA driver, a simulated fleet with one CPU-starved and one healthy GPU.
# Leaves a trace under gpumon-run/. Extra arguments go to `gpumon record` (e.g. --duration 60).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
source_flags=()
if ! gpumon devices >/dev/null 2>&1; then
  echo "run: no NVIDIA driver here (libnvidia-ml.so.1): using simulated GPUs" >&2
  source_flags=(--simulate starved-cpu,healthy --seed 1)
fi
gpumon devices "${source_flags[@]}"
mkdir -p gpumon-run
trace="gpumon-run/trace-$(date +%Y%m%d-%H%M%S).jsonl"
gpumon record "${source_flags[@]}" --duration 20 -o "$trace" "$@"
echo "run: trace written to $trace (format: docs/trace-format.md)" >&2
