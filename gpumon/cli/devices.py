"""`gpumon devices`: a table (or JSON) of the GPUs: index, name, UUID, memory, utilization now."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.cli import flags
from gpumon.clock import MonotonicClock
from gpumon.errors import EXIT_OK
from gpumon.pipeline import Pipeline, describe_source, is_simulated


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
            "error": g.error,
        }
        for g in gpus
    ]
    if args.json:
        json.dump({"source": description, "gpus": rows}, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no GPUs found")
        return EXIT_OK
    print(f"{'GPU':>3}  {'NAME':<36} {'UUID':<40} {'MEMORY USED/TOTAL':>19} {'UTIL':>5}")
    for g in gpus:
        if not g.available:
            print(f"{g.index:>3}  {g.name or '?':<36} {g.uuid or '?':<40} unavailable: {g.error}")
            continue
        mem = f"{_gib(g.mem_used_bytes)} / {_gib(g.mem_total_bytes)} GiB"
        util = f"{g.util_ratio * 100:.0f}%" if g.util_ratio is not None else "n/a"
        print(f"{g.index:>3}  {g.name:<36} {g.uuid:<40} {mem:>19} {util:>5}")
    if is_simulated(description):
        print(f"({describe_source(description)})")
    return EXIT_OK


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1024**3:.1f}"
