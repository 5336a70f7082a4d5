"""The range API under back-to-back requests: 20 `/api/v1/analysis?since=10m` to a real daemon.

    .venv/bin/python -m benchmarks.range_api [--gpus 8] [--speed 20] [--requests 20]

Starts `gpumon serve --simulate ... --gpus N --speed S --record-dir DIR` (the recorder on), waits
until it holds 11 minutes of the daemon's clock (33 s at 20x: relative times count back from the
daemon's clock, so since=10m is ten simulated minutes), measures the daemon's CPU over 30 quiet
seconds, then sends the requests back to back on one connection and reads the daemon's CPU
(/proc/PID/stat) over the minute that starts with the first. Prints each request's latency (median,
max), how each was answered (X-Gpumon-Analysis), and the daemon's CPU share over that minute, with
and without its quiet share. At --speed 20 the quiet daemon samples 20 ticks a second, and each
tick is new data, so most requests are analyzed afresh rather than served from the cache: harder
than a real-time daemon, where back-to-back requests within a second share one answer. Goal (issue
29): each answer <= 0.3 s; the requests cost <= 10% of a core over the minute.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = "starved-cpu,healthy,starved-io,stalled"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--speed", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--quiet-s", type=float, default=30.0)
    args = ap.parse_args()
    if args.gpus < 4:  # one GPU per simulated scenario at least (gpumon's --simulate says the same)
        ap.error("--gpus: at least 4, one for each of the 4 simulated scenarios")
    directory = tempfile.mkdtemp(prefix="gpumon-range-api-")
    port = free_port()
    cmd = [sys.executable, "-m", "gpumon", "serve", "--simulate", SCENARIOS, "--gpus", str(args.gpus)]
    cmd += ["--speed", f"{args.speed:g}", "--record-dir", directory, "--listen", f"127.0.0.1:{port}"]
    cmd += ["--log-level", "warning"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        deadline = time.monotonic() + 660 / args.speed + 120
        while True:
            try:
                conn.request("GET", "/api/v1/state")
                state = json.loads(conn.getresponse().read())
                if state.get("ticks", 0) >= 660:
                    break
            except (OSError, ValueError, http.client.HTTPException):
                conn.close()
            if time.monotonic() > deadline:
                sys.exit("the daemon never held 11 minutes of samples")
            time.sleep(0.5)
        quiet0, t0 = cpu_s(proc.pid), time.monotonic()
        time.sleep(args.quiet_s)
        quiet = (cpu_s(proc.pid) - quiet0) / (time.monotonic() - t0)
        conn.close()  # an idle keep-alive connection is closed by the daemon: a fresh one
        start_cpu, start = cpu_s(proc.pid), time.monotonic()
        latencies, answered, ticks = [], [], []
        for _ in range(args.requests):
            t = time.perf_counter()
            conn.request("GET", "/api/v1/analysis?since=10m")
            r = conn.getresponse()
            body = r.read()
            latencies.append(time.perf_counter() - t)
            answered.append(f"{r.status} {r.headers.get('X-Gpumon-Analysis', '')}".strip())
            if r.status == 200:
                ticks.append(json.loads(body)["range"]["ticks"])
        time.sleep(max(0.0, 60.0 - (time.monotonic() - start)))
        minute = (cpu_s(proc.pid) - start_cpu) / (time.monotonic() - start)
    finally:
        proc.terminate()
        proc.wait(10)
    print(
        f"{args.requests} x /api/v1/analysis?since=10m, {args.gpus} simulated GPUs at {args.speed:g}x, "
        f"recorder on ({directory})"
    )
    print(f"latency: median {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    print(f"ticks per answer: {min(ticks, default=0)} to {max(ticks, default=0)}")
    print("answered: " + ", ".join(f"{k} x{answered.count(k)}" for k in sorted(set(answered))))
    print(
        f"daemon CPU over the minute: {minute:.1%} of a core (quiet: {quiet:.1%}; "
        f"the requests: {minute - quiet:+.2%})"
    )


if __name__ == "__main__":
    main()
