#!/usr/bin/env bash
# The main job (README): sets up gpumon, watches this machine's GPUs live for 45 s while recording
# a trace, then analyzes the trace and draws its timeline. Without an NVIDIA driver it says so and
# watches a simulated fleet instead: one GPU that turns CPU-starved after 30 s, one starved by
# storage, one healthy. Leaves gpumon-run/trace-*.jsonl and .png. Extra arguments go to
# `gpumon watch` (e.g. --duration 120).
set -euo pipefail
cd "$(dirname "$0")/.."
GPUMON_EXTRAS=plot source scripts/setup.sh
source_flags=()
if ! gpumon devices >/dev/null 2>&1; then
  echo "run: no NVIDIA driver here (libnvidia-ml.so.1): using simulated GPUs" >&2
  source_flags=(--simulate healthy-then-starved,starved-io,healthy --seed 1)
fi
gpumon devices "${source_flags[@]}"
mkdir -p gpumon-run
trace="gpumon-run/trace-$(date +%Y%m%d-%H%M%S).jsonl"
echo
gpumon watch "${source_flags[@]}" --duration 45 -o "$trace" "$@"
echo
gpumon analyze "$trace" --plot "${trace%.jsonl}.png"
