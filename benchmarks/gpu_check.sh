#!/usr/bin/env bash
# The real-GPU check (issue 7): on a lent NVIDIA GPU machine without network, in at most 8 minutes.
# Records the real GPU with `gpumon record` (the real NVML path) while the Keras bench trains on
# that GPU, fed for 60 s and then CPU-starved for 60 s, and analyzes the trace against the job's
# own ground truth; runs the starved job again with one loader worker more and holds gpumon's
# predicted speed-up to the measured one; measures NVML's cost per tick and `gpumon serve` at rest
# beside nvitop-exporter on the real driver. Prints everything; commit what it printed under docs/
# (docs/gpu-check.md).
#
# Python packages the machine lacks travel as wheels in .whl/ (benchmarks/fetch_gpu_wheels.sh
# makes them here); the device tool's README explains carrying them. Run from the repo's root:
#   bash benchmarks/gpu_check.sh            (the device tool: carry [".whl"], OUT set)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check-out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3   # the machine's CUDA torch
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH"
else
  export PYTHONPATH="$PWD"
fi
export KERAS_BACKEND="${KERAS_BACKEND:-torch}" PYTHONUNBUFFERED=1
g() { "$PY" -m gpumon "$@"; }
echo "== machine"; uname -a; "$PY" --version; nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu --format=csv 2>&1
echo "== torch"; "$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())'
echo "== gpumon devices (NVML through pynvml)"; g devices; g devices --json
echo "== gpumon record on the real GPU, while the bench trains: fed 60 s, then starved-cpu 60 s"
# stopped by SIGTERM once both runs are over (the trace ends whole); --duration only caps it
"$PY" -m gpumon record --duration 400 -o "$OUT/gpu-trace.jsonl" --force &   # not through g(): $! is gpumon
rec=$!
sleep 20   # with the job's ~15 s of imports, the GPU idles past REST_AFTER_S (30 s): waking is checked below
rm -f "$OUT/truth.jsonl" "$OUT/w2-truth.jsonl"
for p in fed starved-cpu; do
  echo "-- bench $p"
  g bench --pipeline "$p" --duration 60 --truth "$OUT/truth.jsonl" --quiet || echo "gpu_check: bench $p failed"
done
sleep 2
kill -TERM $rec; wait $rec
echo "== a GPU at rest and its waking on the real driver: ticks read at rest, then the job's first ticks"
"$PY" - "$OUT/gpu-trace.jsonl" <<'PYEOF' || echo "gpu_check: the rest check failed"
import sys
from gpumon.trace.reader import read_trace
ticks = [(t.t_s, t.gpus[0]) for t in read_trace(sys.argv[1]).ticks if t.gpus]
rest = [t for t, g in ticks if len(g.util_history) == 1 and not g.processes]
job = next((i for i, (t, g) in enumerate(ticks) if g.processes), None)
print(f"ticks at rest (one point, no process): {len(rest)}, from {rest[0]:.0f} s" if rest else "no tick at rest")
if job is not None:
    for t, g in ticks[job : job + 4]:
        print(f"  {t:6.1f} s: {len(g.processes)} process(es), {len(g.util_history)} samples, util {g.util_ratio}")
PYEOF
echo "== gpumon analyze"
g analyze "$OUT/gpu-trace.jsonl" --truth "$OUT/truth.jsonl" --plot "$OUT/gpu-check.png" || \
  g analyze "$OUT/gpu-trace.jsonl" --truth "$OUT/truth.jsonl"
echo "== what a fix buys (issue 19), on the real GPU: the starved-cpu job again with one loader worker more"
g bench --pipeline starved-cpu --workers 2 --duration 40 --truth "$OUT/w2-truth.jsonl" --quiet \
  || echo "gpu_check: bench starved-cpu --workers 2 failed"
"$PY" -m benchmarks.advice --pair "$OUT/gpu-trace.jsonl" "$OUT/truth.jsonl" "$OUT/w2-truth.jsonl" \
  || echo "gpu_check: advice --pair failed"
echo "== ground truth windows"; cat "$OUT/truth.jsonl"
echo "== Hopper (issue 14): GPM support and activity while fed and starved, clock events, XIDs"
"$PY" -c 'import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(0)
for what, f in (("GPM supported", lambda: n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice),
                ("MIG mode (current, pending)", lambda: n.nvmlDeviceGetMigMode(h)),
                ("clock-event reasons now", lambda: hex(n.nvmlDeviceGetCurrentClocksEventReasons(h))),
                ("supported event types", lambda: hex(n.nvmlDeviceGetSupportedEventTypes(h)))):
    try: print(what + ":", f())
    except Exception as e: print(what + ":", type(e).__name__, e)'
"$PY" -m benchmarks.gpm_summary "$OUT/gpu-trace.jsonl" "$OUT/truth.jsonl" || echo "gpu_check: gpm_summary failed"
echo "== each NVML call's cost on this driver (CPU and wall ms, median of 15)"
timeout 60 "$PY" -m benchmarks.nvml_calls --calls 15 || echo "gpu_check: nvml_calls failed"
echo "== NVML and GPM cost per tick on this machine's GPUs (CPU ms, median of 3 x 30 ticks)"
timeout 120 "$PY" -m benchmarks.nvml_cost --real --ticks 30 --repeats 3 || echo "gpu_check: nvml_cost failed"
echo "== gpumon serve at rest on the real GPU (issue 29): CPU, wake-ups, first sample, nothing held on the GPU; measured past REST_AFTER_S (30 s), when an idle GPU is no longer asked for its samples"
timeout 210 "$PY" -m benchmarks.serve_idle --real --peer nvitop-exporter --rounds 2 --seconds 20 --warmup 35 --starts 5 \
  || { echo "gpu_check: serve_idle beside nvitop-exporter failed; gpumon alone";
       timeout 100 "$PY" -m benchmarks.serve_idle --real --rounds 1 --seconds 20 --warmup 35 --starts 5 \
         || echo "gpu_check: serve_idle failed"; }
echo "== data-parallel ranks (issue 18)"
ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "${ngpu:-0}" -ge 2 ]; then
  echo "-- $ngpu GPUs: 2 ranks (torchrun, NCCL), rank 1 starved, recorded on the real GPUs"
  g record --duration 75 -o "$OUT/ranks-trace.jsonl" --force &
  rec=$!
  sleep 3
  g bench --gpus 2 --straggler 1:starved-cpu --duration 60 --truth "$OUT/ranks-truth.jsonl" --quiet \
    || echo "gpu_check: bench --gpus 2 failed"
  wait $rec
  g analyze "$OUT/ranks-trace.jsonl" --truth "$OUT/ranks-truth.jsonl"
else
  echo "-- one GPU here: the 2-rank run (torchrun + NCCL, one GPU per rank) needs two; skipped."
  echo "   (tests/test_bench.py runs it with gloo ranks on CPUs, driving simulated GPUs)"
fi
