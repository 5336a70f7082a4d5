"""What a recorded trace holds of issue 14's signals: GPM activity per truth window, clock events,
XIDs and MIG instances. Run by benchmarks/gpu_check.sh on a real GPU after the fed/starved bench.

    python -m benchmarks.gpm_summary TRACE [TRUTH]

Per GPU (and MIG instance): whether GPM was read; with a truth file (`gpumon bench --truth`), the
mean of each GPM ratio over the ticks inside each truth window (by its pipeline: fed, starved-cpu,
...); the clock-event reasons seen and their seconds; the XIDs counted.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from gpumon.analyze.truth import read_truth
from gpumon.core.model import GpmActivity, clock_reasons
from gpumon.trace.reader import read_trace

RATIOS = ("graphics_ratio", "sm_active_ratio", "sm_occupancy_ratio", "tensor_ratio", "dram_bw_ratio")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("truth", nargs="?")
    args = ap.parse_args()
    trace = read_trace(args.trace)
    started = float(trace.header.get("started_unix_s") or 0.0)
    windows = read_truth(args.truth) if args.truth else []
    units: dict[tuple[int, int | None], list] = defaultdict(list)
    for tick in trace.ticks:
        for g in tick.gpus:
            units[(g.index, g.mig)].append(g)
    for (index, mig), samples in sorted(units.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        where = f"GPU {index}" + (f" MIG {mig}" if mig is not None else "")
        with_gpm = [g for g in samples if g.gpm is not None]
        print(f"{where} ({samples[-1].name}): {len(samples)} ticks, GPM in {len(with_gpm)}")
        for s, e, expected, pipeline, gpu in windows:
            if gpu not in (None, index) or mig is not None:
                continue
            inside = [g.gpm for g in with_gpm if s - started <= g.t_s <= e - started]
            if not inside:
                continue
            means = " ".join(f"{name.removesuffix('_ratio')} {_mean(inside, name)}" for name in RATIOS)
            print(f"  {pipeline or expected:<14} {len(inside):>4} ticks  {means}")
        if not windows and with_gpm:
            means = " ".join(
                f"{name.removesuffix('_ratio')} {_mean([g.gpm for g in with_gpm], name)}" for name in RATIOS
            )
            print(f"  all ticks      {means}")
        reasons: dict[str, int] = defaultdict(int)
        for g in samples:
            if g.clock_events is not None:
                for r in clock_reasons(g.clock_events):
                    reasons[r] += 1
        held = dict(samples[-1].clock_event_s)
        seen = ", ".join(f"{r} in {n} ticks ({held.get(r, 0):.0f} s)" for r, n in sorted(reasons.items()))
        print(f"  clock events: {seen or 'none (or not reported)'}")
        print(f"  XIDs: {', '.join(f'{x.xid} x{x.seen}' for x in samples[-1].xids) or 'none'}")


def _mean(acts: list[GpmActivity | None], name: str) -> str:
    values = [getattr(a, name) for a in acts if a is not None and getattr(a, name) is not None]
    return f"{statistics.mean(values):.0%}" if values else "n/a"


if __name__ == "__main__":
    main()
