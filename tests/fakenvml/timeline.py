"""Turn a gpumon trace into the stand-in driver's config, so its GPUs replay a simulated workload.

    python -m tests.fakenvml.timeline TRACE -o CONFIG [--loop] [--fault '...']...

Every workload pattern is defined once, in gpumon's simulator: record it with
`gpumon record --simulate ...`, then let the stand-in libnvidia-ml.so.1 play it back to pynvml,
gpustat and nvitop alike.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from gpumon.trace.reader import read_trace


def config_from_trace(
    trace_path: str,
    *,
    loop: bool = False,
    faults: Iterable[str] = (),
    util_period_us: int = 166_667,
    epoch_us: int = 0,
    pid_map: dict[int, int] | None = None,
) -> str:
    trace = read_trace(trace_path)
    t0 = trace.ticks[0].t_s - 1.0 if trace.ticks else 0.0
    lines = [
        f"# from {trace_path}",
        f"epoch_us {epoch_us}",
        f"loop {int(loop)}",
        f"util_period_us {util_period_us}",
    ]
    seen: dict[int, str] = {}
    body: list[str] = []
    for tick in trace.ticks:
        for g in tick.gpus:
            if not g.available:
                continue
            if g.index not in seen:
                seen[g.index] = g.uuid
                limit_mw = int((g.power_limit_w or 0) * 1000)
                lines.append(f"gpu {g.index} {g.mem_total_bytes or 0} {limit_mw} {g.uuid} {g.name}")
            for point in g.util_history:
                t_us = max(0, round((point.t_s - t0) * 1e6))
                body.append(f"s {g.index} {t_us} {round(point.util_ratio * 100)}")
            procs = []
            for proc in g.processes:
                pid = (pid_map or {}).get(proc.pid, proc.pid)
                procs.append(f"{pid} {proc.gpu_mem_bytes or 0}")
            t_us = max(0, round((tick.t_s - t0) * 1e6))
            body.append(
                f"t {g.index} {t_us} {g.mem_used_bytes or 0} {int((g.power_w or 0) * 1000)} "
                f"{int(g.temp_c or 0)} {int((g.pcie_rx_bytes_per_s or 0) / 1024)} "
                f"{int((g.pcie_tx_bytes_per_s or 0) / 1024)} {len(procs)} {' '.join(procs)}".rstrip()
            )
    lines.extend(f"fault {f}" for f in faults)
    return "\n".join(lines + body) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--loop", action="store_true")
    ap.add_argument("--fault", action="append", default=[])
    args = ap.parse_args()
    Path(args.output).write_text(config_from_trace(args.trace, loop=args.loop, faults=args.fault))


if __name__ == "__main__":
    main()
