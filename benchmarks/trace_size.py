"""Trace format 2's size and cost, against version 1 and the other codecs considered.

    .venv/bin/python -m benchmarks.trace_size [--hours 1] [--scenarios starved-cpu,healthy]
    .venv/bin/python -m benchmarks.trace_size --gpu-day [--hours 24]

--gpu-day: what the daemon's recorder (gpumon.trace.recorder) writes for one GPU of each scenario
that issue 29 names (starved, healthy, bursty, MIG with GPM), through its real writer into a
temporary directory, on a virtual clock (the `serve --speed max` path): MB per GPU-day, bytes per
tick, and the recorder's CPU per tick (its writer, timed in-process). Goal: at most 4 MB.

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
import os
import tempfile
import time
import zlib
from collections.abc import Callable

from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.core.clock import VirtualClock
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.trace.compact import Encoder
from gpumon.trace.recorder import Recorder
from gpumon.trace.records import tick_to_dict
from gpumon.trace.segments import list_segments
from gpumon.trace.writer import TraceWriterV2

GPU_DAY_SCENARIOS = (
    ("starved", "starved-cpu"),
    ("healthy", "healthy"),
    ("bursty", "starved-io"),
    ("MIG with GPM", "starved-cpu-mig"),
)
"""Issue 29's scenarios, as the simulator names them: bursty is starved-io (bursts between irregular
gaps); MIG with GPM is one MIG instance, GPM only (the simulator's MIG scenario)."""


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


def recorded_bytes(scenario: str, seconds: float) -> tuple[int, int]:
    """(bytes on disk, ticks) of what the daemon's recorder writes for one simulated GPU."""
    clock = VirtualClock()
    pipeline = Pipeline(
        SourceSpec.from_settings(simulate=scenario),
        clock,
        problems=Problems(logging.getLogger("bench")),
        attribution=None,
    )
    with tempfile.TemporaryDirectory() as directory:
        rec = Recorder(directory, {"kind": "simulated"}, 1.0, lambda: 1_796_083_200.0, block=True)
        rec.start()
        ticks = 0

        def count(tick: Tick) -> None:
            nonlocal ticks
            ticks += 1

        pipeline.on_tick(rec.submit)
        pipeline.on_tick(count)
        pipeline.run(seconds)
        rec.close(timeout_s=60)
        pipeline.close()
        return sum(s.bytes for s in list_segments(directory)), ticks


def writer_cpu_us(ticks: list[Tick], repeats: int = 5) -> float:
    """The recorder's own CPU per tick: encode, compress, write (median of `repeats` passes)."""
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for i in range(repeats):
            w = TraceWriterV2(os.path.join(directory, f"{i}.jsonl.gz"), {"type": "header"})
            start = time.process_time()
            for t in ticks:
                w.write_tick(t)
            runs.append(time.process_time() - start)
            w.close(w.last_t_s, "duration")
    return sorted(runs)[len(runs) // 2] / len(ticks) * 1e6


def gpu_day(hours: float) -> None:
    print(f"one GPU per scenario, 1 s ticks, driver samples at 1/6 s, {hours:g} h recorded, scaled to a day")
    print(f"{'scenario':14} {'simulated as':16} {'MB/GPU-day':>10} {'bytes/tick':>10} {'CPU us/tick':>11}")
    for name, scenario in GPU_DAY_SCENARIOS:
        size, n = recorded_bytes(scenario, hours * 3600)
        cpu = writer_cpu_us(sample(scenario, 1000))
        print(f"{name:14} {scenario:16} {size * 86400 / n / 1e6:10.2f} {size / n:10.1f} {cpu:11.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=None, help="(default 1; with --gpu-day 24)")
    ap.add_argument("--scenarios", default="starved-cpu,healthy")
    ap.add_argument("--gpu-day", action="store_true", help="the recorder's MB per GPU-day, per scenario")
    args = ap.parse_args()
    if args.gpu_day:
        gpu_day(args.hours or 24.0)
        return
    args.hours = args.hours or 1.0
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
