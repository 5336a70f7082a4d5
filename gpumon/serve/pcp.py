"""What PCP's pmdaopenmetrics reads from `gpumon serve` (`/metrics/pcp`), for `pcp-dstat --gpu`.

pcp-dstat shows PCP metrics only, and PCP metrics from a Prometheus endpoint are numbers; but
pmdaopenmetrics honours `# PCP5` metadata lines, and with them a metric may be a *string*. So this
endpoint serves a few per-GPU series with PCP metadata: utilization and memory in percent, and the
detector's verdict as the same short codes as the 0.7.4 plugin (`STcpu`, `ok`, ...), one PCP
instance per GPU named `gpu<INDEX>` (the `instname` label). The result reads
`openmetrics.gpumon.gpu.state` = "STcpu" for instance "gpu0", which pcp-dstat prints as text.
This text is PCP's dialect: Prometheus scrapes /metrics, never this.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.serve.snapshot import Snapshot

STATE_CODES = {
    "healthy": "ok",
    "starved-cpu": "STcpu",
    "starved-io": "STio",
    "starved-host": "SThst",
    "stalled": "stall",
    "sync-stall": "sync",
    "underutilized": "under",
    "underutilized-small-kernels": "small",
    "idle": "idle",
    "unknown": "?",
    "starting": "start",
    "mig": "mig",
}
"""The verdict label -> the code dstat shows (also in gpumon/dstat/plugin/dstat_gpu.py, which must stay
standard-library only; a test keeps the two equal). A lost GPU is `lost`; no verdict `-`."""


def state_code(label: str | None, available: bool) -> str:
    if not available:
        return "lost"
    if label is None:
        return "-"
    return STATE_CODES.get(label, label[:5])


@dataclass(frozen=True)
class Row:
    """One GPU as pcp-dstat shows it; None where there is no reading (pcp-dstat leaves it blank)."""

    index: int
    uuid: str
    util_pct: float | None
    mem_pct: float | None
    code: str
    mig: int | None = None
    """A MIG instance's GPU instance id: its PCP instance is `gpu<INDEX>mig<ID>`."""


def rows(s: Snapshot | None) -> list[Row]:
    out = []
    for g in s.tick.gpus if s is not None else ():
        v = s.verdict_for(g.index, g.uuid) if s is not None else None
        mem = (
            100.0 * g.mem_used_bytes / g.mem_total_bytes
            if g.mem_used_bytes is not None and g.mem_total_bytes
            else None
        )
        util = None if g.util_ratio is None else 100.0 * g.util_ratio
        if util is None and g.gpm is not None and g.gpm.graphics_ratio is not None:
            util = 100.0 * g.gpm.graphics_ratio  # a MIG instance: GPM's activity is all there is
        code = state_code(v.label if v is not None else None, g.available)
        out.append(Row(g.index, g.uuid, util, mem, code, g.mig))
    return out


def render(s: Snapshot | None) -> bytes:
    return render_rows(rows(s))


def render_rows(rows: list[Row]) -> bytes:
    """Each series behind `# PCP5 NAME PMID TYPE INDOM SEMANTICS UNITS` metadata (pmdaopenmetrics(1));
    the `instname` label names the PCP instance."""

    def inst(r: Row) -> str:
        name = f"gpu{r.index}" if r.mig is None else f"gpu{r.index}mig{r.mig}"
        return f'{{instname="{name}",gpu="{r.index}",uuid="{r.uuid}"}}'

    out = [
        "# PCP5 gpu.util 144.1.1 u32 144.1 instant none",
        "# HELP gpu_util GPU utilization, percent (gpumon)",
    ]
    out += [f"gpu_util{inst(r)} {round(r.util_pct)}" for r in rows if r.util_pct is not None]
    out += [
        "# PCP5 gpu.mem 144.1.2 u32 144.1 instant none",
        "# HELP gpu_mem GPU memory used, percent (gpumon)",
    ]
    out += [f"gpu_mem{inst(r)} {round(r.mem_pct)}" for r in rows if r.mem_pct is not None]
    out += [
        "# PCP5 gpu.state 144.1.3 string 144.1 instant none",
        "# HELP gpu_state gpumon's verdict as dstat's short code: "
        "ok STcpu STio SThst stall sync under small idle start mig ? lost -",
    ]
    out += [f"gpu_state{inst(r)} {r.code}" for r in rows]
    return ("\n".join(out) + "\n").encode()
