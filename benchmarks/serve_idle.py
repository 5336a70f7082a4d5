"""What `gpumon serve` costs when nobody scrapes it: CPU share of one core, 8 GPUs, 1 s interval.

    .venv/bin/python -m benchmarks.serve_idle [--seconds 60] [--repeats 3] [--gpus 8]

A real `gpumon serve` process on the stand-in libnvidia-ml.so.1 (tests/fakenvml), so the real
pynvml path runs as on a GPU machine, with the real host source (psutil). After a warm-up, the
process's own CPU time (utime + stime from /proc/PID/stat) over --seconds gives its share of a
core; the median of --repeats windows is reported, with the wake-ups per second of its threads
(voluntary context switches), since an idle daemon should sleep, not poll.

Goal (issue 11): at most 0.1% of a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wakeups(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=15)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.fakenvml import driver

    with tempfile.TemporaryDirectory() as tmp:
        config = driver.simulated_config(
            Path(tmp), "healthy,starved-cpu,starved-io,underutilized", gpus=args.gpus, seconds=300
        )
        env = driver.environment(config, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(args.warmup)
            shares, wakes = [], []
            for _ in range(args.repeats):
                c0, w0, t0 = cpu_seconds(proc.pid), wakeups(proc.pid), time.monotonic()
                time.sleep(args.seconds)
                dt = time.monotonic() - t0
                shares.append((cpu_seconds(proc.pid) - c0) / dt)
                wakes.append((wakeups(proc.pid) - w0) / dt)
        finally:
            proc.terminate()
            proc.wait(10)
    print(
        f"gpumon serve, {args.gpus} stand-in GPUs, 1 s interval, no scraper: "
        f"{statistics.median(shares) * 100:.3f}% of a core (median of {args.repeats} x {args.seconds:g} s; "
        f"each: {', '.join(f'{s * 100:.3f}%' for s in shares)}); "
        f"{statistics.median(wakes):.1f} wake-ups/s"
    )


if __name__ == "__main__":
    main()
