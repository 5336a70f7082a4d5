"""Trace format 2's size and cost, against version 1 and the other codecs considered.

    .venv/bin/python -m benchmarks.trace_size [--hours 1] [--scenarios starved-cpu,healthy]

Samples a simulated fleet for --hours on a virtual clock (driver samples at 1/6 s, ticks of 1 s,
what the daemon records by default), then encodes the same ticks several ways, each flushed after
every tick as a recorder must be (a kill -9 may cost only the tick being written):
- version 1 (JSON Lines), raw and through zlib;
- version 2's compact records (gpumon.trace.compact.Encoder) through zlib levels 1, 6, 9, and through
  zstandard levels 3, 9, 19 when the `zstandard` package is installed (it is not a dependency).
Reports MB per GPU per day and CPU microseconds per tick for each. Goal (issue 16): at most 6 MB
per GPU per day.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import zlib
from collections.abc import Callable

from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.core.clock import VirtualClock
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.trace.compact import Encoder
from gpumon.trace.records import tick_to_dict


def sample(scenarios: str, seconds: float) -> list[Tick]:
    clock = VirtualClock()
    pipeline = Pipeline(
        SourceSpec.from_settings(simulate=scenarios),
        clock,
        problems=Problems(logging.getLogger("bench")),
        attribution=None,
    )
    ticks: list[Tick] = []
    pipeline.on_tick(ticks.append)
    pipeline.run(seconds)
    pipeline.close()
    return ticks


def zlib_stream(level: int) -> Callable[[bytes], int]:
    z = zlib.compressobj(level, zlib.DEFLATED, 31)
    return lambda data: len(z.compress(data)) + len(z.flush(zlib.Z_SYNC_FLUSH))


def zstd_stream(level: int) -> Callable[[bytes], int] | None:
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None
    z = zstandard.ZstdCompressor(level=level).compressobj()
    return lambda data: len(z.compress(data)) + len(z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--scenarios", default="starved-cpu,healthy")
    args = ap.parse_args()
    ticks = sample(args.scenarios, args.hours * 3600)
    gpus = max(len(t.gpus) for t in ticks)
    per_day = 86400 / (args.hours * 3600) / gpus / 1e6

    def v1(t: Tick) -> bytes:
        return json.dumps(tick_to_dict(t), separators=(",", ":")).encode() + b"\n"

    enc = Encoder()

    def v2(t: Tick) -> bytes:
        return json.dumps(enc.encode(t), separators=(",", ":")).encode() + b"\n"

    v1_lines = [v1(t) for t in ticks]
    v2_lines = [v2(t) for t in ticks]
    print(f"{len(ticks)} ticks of {gpus} GPU(s) ({args.scenarios}), {args.hours:g} h simulated")
    print(f"{'encoding':34} {'MB/GPU/day':>10} {'us/tick':>8}")
    rows: list[tuple[str, list[bytes], Callable[[bytes], int] | None]] = [
        ("v1 JSON Lines, raw", v1_lines, lambda d: len(d)),
        ("v1 + zlib 6, flushed per tick", v1_lines, zlib_stream(6)),
        ("v2 compact, raw", v2_lines, lambda d: len(d)),
        ("v2 + zlib 1", v2_lines, zlib_stream(1)),
        ("v2 + zlib 6 (what gpumon writes)", v2_lines, zlib_stream(6)),
        ("v2 + zlib 9", v2_lines, zlib_stream(9)),
        ("v2 + zstd 3", v2_lines, zstd_stream(3)),
        ("v2 + zstd 9", v2_lines, zstd_stream(9)),
        ("v2 + zstd 19", v2_lines, zstd_stream(19)),
    ]
    for name, lines, codec in rows:
        if codec is None:
            print(f"{name:34} {'(pip install zstandard to compare)':>20}")
            continue
        start = time.process_time()
        size = sum(codec(line) for line in lines)
        cpu = time.process_time() - start
        print(f"{name:34} {size * per_day:10.2f} {cpu / len(lines) * 1e6:8.0f}")


if __name__ == "__main__":
    main()
