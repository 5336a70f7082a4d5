"""Memory of `gpumon serve` over many hours of ticks and scrapes, accelerated: is it flat?

    .venv/bin/python -m benchmarks.soak [--hours 12] [--gpus 8] [--scrapes-per-tick 5] [--standin]

The daemon runs in this process on simulated GPUs, on a virtual clock ticked as fast as it goes
(an hour of ticks takes about a minute here), with its real HTTP server. A client thread scrapes
it meanwhile over real sockets: /metrics plain and gzipped, /api/v1/state and /healthz, on
keep-alive connections and on new ones, --scrapes-per-tick per tick on average. After the first
simulated 10 minutes (the 300 s history fills, caches warm up), the RSS and the number of live
Python objects are read every simulated hour; the growth per hour is their slope.

Three suspects, each measured alone by turning the others off (--only ticks|scrapes|connections),
so that growth can be pinned on ticks, on scrapes or on connections.

--standin runs the daemon as deployed instead of on the simulator: the real pynvml on the stand-in
libnvidia-ml.so.1 (tests/fakenvml, the scenarios benchmarks.soak_serve plays, looped every 300 s),
the real host source and the flight recorder on. The stand-in's timeline is frozen and moved one
second a tick, in place (its environment variable is a buffer this process owns: setting it anew
through os.environ leaks glibc's old string, 48 bytes a tick, which once read as gpumon's growth).
Beside the RSS it prints what glibc's malloc holds in use (mallinfo2: C code's allocations and
Python's objects over 512 bytes) and pymalloc's blocks in use, so that growth in C is told apart
from Python's.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.serve.daemon import TRIM_EVERY_S, Daemon


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


ROOT = Path(__file__).resolve().parent.parent
EPOCH_US = 10_000_000
"""Where the stand-in's frozen timeline starts (its samples' clock, in µs)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def malloc_in_use_mb() -> float:
    """Bytes glibc's malloc has handed out and not had back, all arenas (mallinfo2), in MB."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):  # not glibc 2.33+
        return float("nan")
    return float(info.uordblks + info.hblkhd) / 1e6


class StandinTime:
    """The stand-in's FAKENVML_NOW_US as a C string this process owns, rewritten in place."""

    WIDTH = 20

    def __init__(self, us: int) -> None:
        self._buf = ctypes.create_string_buffer(self._text(us))
        if ctypes.CDLL(None).putenv(self._buf) != 0:
            raise OSError("putenv failed")

    def _text(self, us: int) -> bytes:
        return b"FAKENVML_NOW_US=" + str(us).rjust(self.WIDTH, "0").encode()

    def set(self, us: int) -> None:
        self._buf.value = self._text(us)


def standin_child(argv: list[str], gpus: int) -> int:
    """Run this benchmark again with the stand-in's environment (the library path must be set
    before the process starts)."""
    sys.path.insert(0, str(ROOT))
    from tests.fakenvml import driver

    with tempfile.TemporaryDirectory() as folder:
        config = driver.simulated_config(
            Path(folder), "healthy,starved-cpu,starved-io,underutilized", gpus=gpus, seconds=300
        )
        env = driver.environment(config, FAKENVML_NOW_US=str(EPOCH_US), PYTHONPATH=str(ROOT))
        return subprocess.call([sys.executable, "-m", "benchmarks.soak", *argv], env=env, cwd=ROOT)


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=12)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scrapes-per-tick", type=float, default=5)
    ap.add_argument("--only", choices=["ticks", "scrapes", "connections"])
    ap.add_argument(
        "--standin",
        action="store_true",
        help="the GPUs on the stand-in driver, the real host source, the recorder on (see above)",
    )
    args = ap.parse_args()
    if args.standin and "FAKENVML_CONFIG" not in os.environ:
        sys.exit(standin_child(sys.argv[1:], args.gpus))
    if args.gpus < 4:  # one GPU per simulated scenario at least (gpumon's --simulate says the same)
        ap.error("--gpus: at least 4, one for each of the 4 simulated scenarios")
    clock = VirtualClock()
    standin_time = StandinTime(EPOCH_US) if args.standin else None
    recording = tempfile.TemporaryDirectory() if args.standin else None
    if recording is not None:
        cfg = Config(listen="127.0.0.1:0", record="on", record_dir=str(Path(recording.name) / "rec"))
    else:
        cfg = Config(simulate="healthy,starved-cpu,starved-io,idle", gpus=args.gpus, listen="127.0.0.1:0")
    d = Daemon(cfg, clock=clock)
    # the daemon hands free memory back once a minute of its own clock, real time when deployed: here
    # once a simulated minute, as deployed (on the real clock it would trim once an hour of ticks,
    # and the RSS read would swing with when the last trim fell)
    d._trim_clock = clock.now
    d._next_trim = clock.now() + TRIM_EVERY_S
    if d.recorder is not None:
        d.recorder.start()
    port = d.start_http_only()
    scrape = args.only in (None, "scrapes", "connections")
    new_conns = args.only in (None, "connections")
    tick = args.only in (None, "ticks", "scrapes", "connections")
    ticks_done = [0]
    scrapes = [0]
    stop = threading.Event()

    def client() -> None:
        paths = [
            ("/metrics", {}),
            ("/metrics", {"Accept-Encoding": "gzip"}),
            ("/api/v1/state", {}),
            ("/healthz", {}),
        ]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        i = 0
        while not stop.is_set():
            if args.only != "connections" and scrapes[0] > ticks_done[0] * args.scrapes_per_tick:
                time.sleep(0.0005)
                continue
            path, headers = paths[i % len(paths)]
            i += 1
            if new_conns and i % 2:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request("GET", path, headers=headers)
                conn.getresponse().read()
            except OSError:
                if stop.is_set():
                    break
                raise
            scrapes[0] += 1
        conn.close()

    worker = threading.Thread(target=client, daemon=True)
    if scrape:
        worker.start()
    d.sampler.start()
    warm = 600
    hours: list[float] = []
    rss: list[float] = []
    objects: list[float] = []
    in_use: list[float] = []
    total = int(args.hours * 3600)
    t0 = time.monotonic()
    for k in range(1, total + 1):
        clock.advance(1.0)
        if standin_time is not None:
            standin_time.set(EPOCH_US + k * 1_000_000)
        if tick or k <= warm:
            d.sampler.tick()
        ticks_done[0] = k
        while (
            scrape
            and args.only != "connections"
            and scrapes[0] < k * args.scrapes_per_tick
            and worker.is_alive()
        ):
            time.sleep(0.0002)  # the scraper sets the pace: --scrapes-per-tick per tick, really
        if k >= warm and (k - warm) % 3600 == 0:
            gc.collect()
            hours.append(k / 3600)
            rss.append(rss_mb())
            objects.append(len(gc.get_objects()))
            in_use.append(malloc_in_use_mb())
            print(
                f"  {k / 3600:5.1f} h simulated: RSS {rss[-1]:.2f} MB, {objects[-1]} objects, "
                f"malloc in use {in_use[-1]:.3f} MB, pymalloc blocks {sys.getallocatedblocks()}, "
                f"{scrapes[0]} scrapes, {time.monotonic() - t0:.0f} s real",
                flush=True,
            )
    stop.set()
    worker.join(5) if scrape else None
    d.stop()
    if recording is not None:
        recording.cleanup()
    if len(hours) >= 2:
        print(
            f"soak ({args.only or 'ticks, scrapes and connections'}): {args.hours:g} simulated hours, "
            f"{args.gpus} GPUs, "
            f"{scrapes[0]} HTTP requests: RSS {rss[0]:.2f} -> {rss[-1]:.2f} MB "
            f"({slope(hours, rss) * 1000:+.0f} KB/h), live objects {objects[0]} -> {objects[-1]} "
            f"({slope(hours, objects):+.1f}/h), malloc in use {in_use[0]:.3f} -> {in_use[-1]:.3f} MB "
            f"({slope(hours, in_use) * 1000:+.0f} KB/h)"
        )


if __name__ == "__main__":
    main()
