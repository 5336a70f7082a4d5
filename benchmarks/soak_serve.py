"""Memory of a real `gpumon serve` in real time, with the recorder on, scraped as a fleet scrapes it.

    .venv/bin/python -m benchmarks.soak_serve [--minutes 120] [--gpus 8] [--scrapes-per-s 5]
                                              [--state-every-s 10] [--interval 1] [--csv FILE]

A `gpumon serve` process on the stand-in libnvidia-ml.so.1 (tests/fakenvml, 8 GPUs, driver samples
every 1/6 s on the real clock), 1 s cadence, the flight recorder on (segments in a temporary
folder). A client scrapes /metrics --scrapes-per-s times a second, half on one keep-alive
connection and half on a new connection each, and asks /api/v1/state every 10 s. The daemon's
RSS (/proc/PID/status VmRSS) is read every 30 s; after the first 10 minutes (the detector's
windows and the recorder's first segment fill, caches warm up) its slope, by least squares, is
the growth per hour. Goal (issue 29): <= 0.05 MB/h. The slope after 20 minutes is printed too: by
then the range API's 15-minute verdict log is full as well (what fills is not what grows). A slope
needs two readings past its start: a shorter run says "n/a".

To tell what grows with what, run it faster on one side: `--interval 0.05 --scrapes-per-s 0` (20
times the ticks, never scraped) beside `--scrapes-per-s 100 --state-every-s 0.5` (20 times the
requests): whichever grows after its stores are full names the suspect (docs/benchmarks.md).

benchmarks/soak.py is the accelerated, in-process companion (hours of ticks in minutes, suspects
measured one at a time); this one is the daemon as deployed, in real time.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_S = 600.0
FULL_S = 1200.0
"""By then the range API's verdict log is full too: it keeps 15 minutes (gpumon.serve.verdict_log),
so from minute 10 to 15 it still fills. The slope after it tells what grows from what merely fills
(stores bounded by count, as the 200 closed episodes a GPU keeps, fill as slowly as episodes
close); the goal is on the slope after WARM_S."""


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, its anonymous part) in MB. RSS also counts the pages of the libraries and files the
    process maps, which the kernel drops and reads back as the machine's page cache comes and goes
    (a machine whose caches were dropped showed a daemon 5.7 MB "smaller" from one reading to the
    next); the anonymous part is what the daemon itself allocates."""
    rss = anon = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("RssAnon:"):
            anon = int(line.split()[1]) / 1024
    return rss, anon


def slope_per_h(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(m for _, m in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (m - my) for t, m in points) / den * 3600 if den else 0.0


def slope_text(points: list[tuple[float, float]]) -> str:
    return f"{slope_per_h(points):+.3f} MB/h" if len(points) >= 2 else "n/a (too short a run)"


def port_of(log: Path, limit_s: float = 30.0) -> int:
    """The port from the daemon's log line "serving on HOST:PORT"."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "serving on" in line:
                return int(line.split("serving on", 1)[1].split()[0].rsplit(":", 1)[1])
        time.sleep(0.1)
    sys.exit(f"soak_serve: the daemon did not say where it serves:\n{log.read_text()[-2000:]}")


def get(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        print(f"soak_serve: {path}: HTTP {r.status}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=120)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes-per-s", type=float, default=5, help="0: never scraped")
    ap.add_argument("--state-every-s", type=float, default=10.0, help="/api/v1/state this often (0: never)")
    ap.add_argument("--interval", default="1", help="the daemon's --interval (seconds)")
    ap.add_argument("--csv", type=Path, help="write (seconds, RSS MB, anonymous MB) here as they come")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.fakenvml import driver

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        config = driver.simulated_config(
            tmp, "healthy,starved-cpu,starved-io,underutilized", gpus=args.gpus, seconds=300
        )
        env = driver.environment(config, PYTHONPATH=str(ROOT))
        env.pop("FAKENVML_NOW_US", None)
        cmd = [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", "--log-level", "info"]
        cmd += ["--interval", args.interval]
        log = tmp / "serve.log"
        with log.open("w") as err:
            proc = subprocess.Popen([*cmd, "--record-dir", str(tmp / "rec")], cwd=tmp, env=env, stderr=err)
        try:
            port = port_of(log)
            keep = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            began = time.monotonic()
            points: list[tuple[float, float]] = []
            anon: list[tuple[float, float]] = []
            out = args.csv.open("w") if args.csv else None
            k = 0
            next_rss = next_state = 0.0
            gap = 1.0 / args.scrapes_per_s if args.scrapes_per_s > 0 else 1.0
            while (now := time.monotonic() - began) < args.minutes * 60:
                if args.scrapes_per_s <= 0:
                    pass  # never scraped: the loop only reads the RSS (and the state API, if asked)
                elif k % 2 == 0:
                    get(keep, "/metrics")
                else:
                    fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    get(fresh, "/metrics")
                    fresh.close()
                k += 1
                if args.state_every_s > 0 and now >= next_state:
                    get(keep, "/api/v1/state")
                    next_state += args.state_every_s
                if now >= next_rss:
                    mb, anon_mb = memory_mb(proc.pid)
                    points.append((now, mb))
                    anon.append((now, anon_mb))
                    if out:
                        out.write(f"{now:.0f},{mb:.3f},{anon_mb:.3f}\n")
                        out.flush()
                    next_rss += 30.0
                time.sleep(max(0.0, began + k * gap - time.monotonic()))
            after = [p for p in points if p[0] >= WARM_S]
            full = [p for p in points if p[0] >= FULL_S]
            first = points[0][1] if points else 0.0
            print(
                f"gpumon serve, {args.gpus} stand-in GPUs, {args.interval} s ticks, recorder on, "
                f"{args.scrapes_per_s:g} scrapes/s (half new connections) + /api/v1/state every "
                f"{args.state_every_s:g} s (0: never), {args.minutes:g} min: RSS "
                f"{first:.1f} MB at start, {points[-1][1]:.1f} MB at the end; slope after 10 min "
                f"{slope_text(after)} (goal <= 0.05), after 20 min (the verdict log full too) "
                f"{slope_text(full)}; {k if args.scrapes_per_s > 0 else 0} scrapes"
            )
            print(
                "its anonymous part (what the daemon allocates; RSS adds mapped files' pages, which "
                f"come and go with the machine's page cache): slope after 10 min "
                f"{slope_text([p for p in anon if p[0] >= WARM_S])}, after 20 min "
                f"{slope_text([p for p in anon if p[0] >= FULL_S])}"
            )
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
