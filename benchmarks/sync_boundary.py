"""Where sync-stall begins: ranks waiting 50-80% of their time for a straggler (issue 25.4).

    .venv/bin/python -m benchmarks.sync_boundary [--ranks 3] [--passes 1,2,3,6] [--duration 30]

Each run records the simulated GPUs driven by `gpumon bench --gpus N --straggler N-1:starved-cpu
--straggler-passes P` (torch DDP over gloo on this CPU-only machine: rank R drives GPU R; more
passes, a slower straggler, longer waits for the others) with `gpumon record --drive`, every GPU
mapped to one Slurm job as the shipped prolog writes it. Per waiting rank it reports what the rank
measured itself (the share of each step it spent blocked in the all-reduce: the truth calls 50% or
more sync-stall), the GPU's duty and power over the settled part of the run (the stand-in's power
model: docs/testing.md), and the share of settled seconds read sync-stall by the detector with the
peer rule (`sync_peer_gaps`) and without it (the power rule alone, as before issue 25.4).

The power figures are the stand-in driver's model of a GPU (busy, spinning in a collective, idle),
not a measurement on a real GPU: no GPU was lent to this work. What the run measures for real is
how long the ranks wait, and where the detector's boundary falls against the truth's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.driven import require_judged
from gpumon.analyze.trace_report import analyze
from gpumon.detect.thresholds import Thresholds

ROOT = Path(__file__).resolve().parent.parent


def gpumon(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpumon", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def map_job(jobs: Path, ranks: int) -> None:
    """The shipped prolog's files: every rank's GPU held by Slurm job 7."""
    env = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(jobs),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_USER": "bench",
        "SLURM_JOB_GPUS": ",".join(str(r) for r in range(ranks)),
    }
    subprocess.run([str(ROOT / "contrib/slurm/gpumon-prolog")], env=env, check=True, timeout=30)


def one_run(folder: Path, ranks: int, passes: int, duration: int) -> list[dict[str, Any]]:
    jobs, drive, truth, trace = folder / "jobs", folder / "drive", folder / "truth.jsonl", folder / "t.jsonl"
    map_job(jobs, ranks)
    drive.touch()
    recorder = gpumon(
        "record",
        "--drive",
        str(drive),
        "--duration",
        "900",
        "-o",
        str(trace),
        env={"GPUMON_JOBS_DIR": str(jobs)},
    )
    straggler = ranks - 1
    job = gpumon(
        "bench", "--gpus", str(ranks), "--straggler", f"{straggler}:starved-cpu",
        "--straggler-passes", str(passes), "--duration", str(duration),
        "--drive", str(drive), "--truth", str(truth), "--quiet",
    )  # fmt: skip
    _, err = job.communicate(timeout=900)
    time.sleep(3)  # the last steps reach the recorder
    recorder.terminate()
    recorder.communicate(timeout=60)
    if job.returncode != 0:
        sys.exit(f"bench failed: {err[-800:]}")
    records = [json.loads(line) for line in truth.read_text().splitlines()]
    th = Thresholds()
    peer = analyze(str(trace), th)
    power_only = analyze(str(trace), replace(th, sync_peer_gaps=1.0))
    started = peer.header["started_unix_s"]
    rows = []
    for gpu in sorted(peer.gpus, key=lambda g: g.index):
        if gpu.index == straggler:
            continue
        mine = [r for r in records if r["gpu"] == gpu.index]
        first = min(r["start_unix_s"] for r in mine) - started + th.window_s + th.confirm_s
        last = max(r["end_unix_s"] for r in mine) - started
        settled = [v for v in gpu.verdicts if first <= v.t_s <= last]
        (alone,) = [g for g in power_only.gpus if g.index == gpu.index]
        settled_alone = [v for v in alone.verdicts if first <= v.t_s <= last]
        if not settled:
            continue
        rows.append(
            {
                "passes": passes,
                "gpu": gpu.index,
                "waited": round(statistics.mean(r["sync_share"] for r in mine), 3),
                "truth_sync_windows": f"{sum(r['expected'] == 'sync-stall' for r in mine)}/{len(mine)}",
                "duty": round(statistics.median(v.evidence.duty_cycle or 0.0 for v in settled), 3),
                "power": round(statistics.median(v.evidence.power_ratio or 0.0 for v in settled), 3),
                "straggler_gaps": round(
                    statistics.median(v.evidence.waiting_share for v in settled if v.evidence.waiting_share)
                    if any(v.evidence.waiting_share for v in settled)
                    else 0.0,
                    3,
                ),
                "sync_stall_peer_rule": round(
                    sum(v.state == "sync-stall" for v in settled) / len(settled), 3
                ),
                "sync_stall_power_rule": round(
                    sum(v.state == "sync-stall" for v in settled_alone) / max(1, len(settled_alone)), 3
                ),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--passes", default="1,2,3,6", help="the straggler's passes, one run each")
    ap.add_argument("--duration", type=int, default=30)
    args = ap.parse_args()
    if args.ranks < 2:
        ap.error("--ranks: at least 2 (a straggler and a rank that waits for it)")
    try:
        passes_list = [int(p) for p in args.passes.split(",")]
    except ValueError:
        ap.error(f"--passes: whole numbers separated by commas, got {args.passes!r}")
    if min(passes_list) < 1:  # (split gives one item at least; an empty one is no int)
        ap.error(f"--passes: each at least 1, got {args.passes!r}")
    require_judged(ap, "--duration", args.duration, "a rank's first step")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpumon-sync-") as tmp:
        for passes in passes_list:
            folder = Path(tmp) / f"p{passes}"
            folder.mkdir()
            for row in one_run(folder, args.ranks, passes, args.duration):
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        f"\n{'passes':>6} {'gpu':>3} {'waited':>7} {'truth':>7} {'duty':>5} {'power':>6} "
        f"{'peer gaps':>9} {'sync-stall: peer rule':>22} {'power rule alone':>17}"
    )
    for r in rows:
        print(
            f"{r['passes']:>6} {r['gpu']:>3} {r['waited']:>7.0%} {r['truth_sync_windows']:>7} "
            f"{r['duty']:>5.0%} {r['power']:>6.0%} {r['straggler_gaps']:>9.0%} "
            f"{r['sync_stall_peer_rule']:>22.0%} {r['sync_stall_power_rule']:>17.0%}"
        )


if __name__ == "__main__":
    main()
