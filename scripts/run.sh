#!/usr/bin/env bash
# The main job (README). With an NVIDIA driver: sets up gpumon, watches this machine's GPUs live
# for 45 s while recording a trace, then analyzes it and draws its timeline (gpumon-run/).
# Without one: `gpumon demo`, a real Keras training job on a simulated GPU, fed for a minute and
# then CPU-starved for a minute, served by the exporter, ending with the verdicts, the
# ground-truth agreement and a plot (gpumon-demo/). Extra arguments go to `gpumon watch` or
# `gpumon demo` (e.g. --phase-seconds 30).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! "${PYTHON:-python3}" -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' 2>/dev/null &&
   ! { [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, keras' 2>/dev/null; }; then
  echo "run: no NVIDIA driver here: the demo trains a real Keras job on the CPU, so this first run" \
    "installs torch 2.13.0 (CPU build, about 1.2 GB in .venv; 1-3 minutes where the wheel is on disk," \
    "several more to download it). Later runs start at once." >&2
fi
if GPUMON_EXTRAS=plot source scripts/setup.sh && gpumon devices >/dev/null 2>&1; then
  gpumon devices
  mkdir -p gpumon-run
  trace="gpumon-run/trace-$(date +%Y%m%d-%H%M%S).jsonl"
  echo
  gpumon watch --duration 45 -o "$trace" "$@"
  echo
  exec gpumon analyze "$trace" --plot "${trace%.jsonl}.png"
fi
echo "run: no NVIDIA driver here (libnvidia-ml.so.1): running gpumon demo on a simulated GPU" >&2
GPUMON_EXTRAS=plot,bench source scripts/setup.sh
exec gpumon demo "$@"
