"""`gpumon devices`: a table (or JSON) of the GPUs: index, name, UUID, memory, utilization now."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.cli import flags
from gpumon.collect.pipeline import Pipeline
from gpumon.core.clock import MonotonicClock
from gpumon.core.errors import EXIT_OK
from gpumon.core.model import GpuSample, clock_reasons
from gpumon.core.terminal import printable


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "devices", parents=[common], help="list GPUs: index, name, UUID, memory, utilization now"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    flags.add_source_flags(s, speed=False)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pipeline = Pipeline(flags.source_spec(args), MonotonicClock(), attribution=flags.attribution())
    try:
        gpus = pipeline.poll_once() or []
    finally:
        pipeline.close()
    description = pipeline.description
    rows = [
        {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "available": g.available,
            "mem_used_bytes": g.mem_used_bytes,
            "mem_total_bytes": g.mem_total_bytes,
            "util_ratio": g.util_ratio,
            "mig": g.mig,
            "gpm": None if g.gpm is None else {k: v for k, v in g.gpm._asdict().items() if v is not None},
            "clock_event_reasons": None if g.clock_events is None else list(clock_reasons(g.clock_events)),
            "error": g.error,
        }
        for g in gpus
    ]
    if args.json:
        json.dump({"source": description.to_json(), "gpus": rows}, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no GPUs found")
        return EXIT_OK
    print(f"{'GPU':>5}  {'NAME':<36} {'UUID':<40} {'MEMORY USED/TOTAL':>19} {'UTIL':>5} {'SM':>5}")
    for g in gpus:
        gpu = str(g.index) if g.mig is None else f"{g.index}/{g.mig}"  # GPU/MIG instance
        if not g.available:
            name, uuid, error = printable(g.name or "?"), printable(g.uuid or "?"), printable(g.error or "")
            print(f"{gpu:>5}  {name:<36} {uuid:<40} unavailable: {error}")
            continue
        mem = f"{_gib(g.mem_used_bytes)} / {_gib(g.mem_total_bytes)} GiB"
        name, uuid = printable(g.name), printable(g.uuid)  # (a replay's, or a driver's: no escapes)
        print(f"{gpu:>5}  {name:<36} {uuid:<40} {mem:>19} {_util(g):>5} {_sm(g):>5}")
    if description.simulated_gpus:
        print(f"({description.phrase()})")
    return EXIT_OK


def _util(g: GpuSample) -> str:
    """NVML utilization; on a MIG instance (which has none) GPM's graphics activity."""
    value = g.util_ratio
    if value is None and g.gpm is not None:
        value = g.gpm.graphics_ratio
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _sm(g: GpuSample) -> str:
    value = None if g.gpm is None else g.gpm.sm_active_ratio
    return "-" if value is None else f"{value * 100:.0f}%"


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1024**3:.1f}"
