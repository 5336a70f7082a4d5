"""Memory of `gpumon serve` over many hours of ticks and scrapes, accelerated: is it flat?

    .venv/bin/python -m benchmarks.soak [--hours 12] [--gpus 8] [--scrapes-per-tick 5]

The daemon runs in this process on simulated GPUs, on a virtual clock ticked as fast as it goes
(an hour of ticks takes about a minute here), with its real HTTP server. A client thread scrapes
it meanwhile over real sockets: /metrics plain and gzipped, /api/v1/state and /healthz, on
keep-alive connections and on new ones, --scrapes-per-tick per tick on average. After the first
simulated 10 minutes (the 300 s history fills, caches warm up), the RSS and the number of live
Python objects are read every simulated hour; the growth per hour is their slope.

Three suspects, each measured alone by turning the others off (--only ticks|scrapes|connections),
so that growth can be pinned on ticks, on scrapes or on connections.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import threading
import time
from pathlib import Path

from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.serve.daemon import Daemon


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
    args = ap.parse_args()
    if args.gpus < 4:  # one GPU per simulated scenario at least (gpumon's --simulate says the same)
        ap.error("--gpus: at least 4, one for each of the 4 simulated scenarios")
    clock = VirtualClock()
    d = Daemon(
        Config(simulate="healthy,starved-cpu,starved-io,idle", gpus=args.gpus, listen="127.0.0.1:0"),
        clock=clock,
    )
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
    total = int(args.hours * 3600)
    t0 = time.monotonic()
    for k in range(1, total + 1):
        clock.advance(1.0)
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
            print(
                f"  {k / 3600:5.1f} h simulated: RSS {rss[-1]:.2f} MB, {objects[-1]} objects, "
                f"{scrapes[0]} scrapes, {time.monotonic() - t0:.0f} s real",
                flush=True,
            )
    stop.set()
    worker.join(5) if scrape else None
    d.stop()
    if len(hours) >= 2:
        print(
            f"soak ({args.only or 'ticks, scrapes and connections'}): {args.hours:g} simulated hours, "
            f"{args.gpus} GPUs, "
            f"{scrapes[0]} HTTP requests: RSS {rss[0]:.2f} -> {rss[-1]:.2f} MB "
            f"({slope(hours, rss) * 1000:+.0f} KB/h), live objects {objects[0]} -> {objects[-1]} "
            f"({slope(hours, objects):+.1f}/h)"
        )


if __name__ == "__main__":
    main()
