"""`gpumon analyze --plot`: one timeline per GPU (sub-second utilization, duty cycle, states shaded)
and one for the host (CPU, busiest core, iowait). matplotlib is optional (extra `plot`)."""

from __future__ import annotations

import importlib.util
from itertools import groupby

from gpumon.analyze.trace_report import Analysis
from gpumon.core.errors import MissingDependency, OutputError
from gpumon.core.extras import install_hint

STATE_COLORS = {
    "healthy": "#2ca02c",
    "starved-cpu": "#d62728",
    "starved-io": "#ff7f0e",
    "starved-host": "#e377c2",
    "stalled": "#404040",
    "sync-stall": "#9467bd",
    "underutilized": "#bcbd22",
    "underutilized-small-kernels": "#dbdb8d",
    "idle": "#c7c7c7",
    "unknown": "#eeeeee",
}
MAX_GPUS_PLOTTED = 16


def require_matplotlib() -> None:
    """Fail before any work when --plot cannot be drawn."""

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency(f"--plot needs matplotlib: {install_hint('plot')}")


def plot(a: Analysis, path: str) -> None:
    require_matplotlib()
    # here, not at the top: extra plot: only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    # here, not at the top: extra plot: only when a plot is drawn
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    gpus = a.gpus[:MAX_GPUS_PLOTTED]
    rows = len(gpus) + 1
    fig, axes = plt.subplots(rows, 1, figsize=(13, 1.7 * rows + 1.2), sharex=True, squeeze=False)
    axes = axes[:, 0]
    points: dict[tuple[int, str], list[tuple[float, float]]] = {}
    assert a.trace is not None, "--plot draws one trace file"
    for tick in a.trace.ticks:
        for sample in tick.gpus:
            points.setdefault((sample.index, sample.uuid), []).extend(
                (p.t_s, p.util_ratio) for p in sample.util_history
            )
    seen_labels: set[str] = set()
    for ax, g in zip(axes, gpus):
        for label, run in groupby(g.verdicts, key=lambda v: v.label):
            run_list = list(run)
            start = run_list[0].t_s - 1.0
            ax.axvspan(start, run_list[-1].t_s, color=STATE_COLORS.get(label, "#ffffff"), alpha=0.25, lw=0)
            seen_labels.add(label)
        pts = points.get((g.index, g.uuid), [])
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] * 100 for p in pts],
                color="#1f77b4",
                lw=0.6,
                alpha=0.7,
                label="utilization (driver samples)",
            )
        duty = [(v.t_s, v.evidence.duty_cycle * 100) for v in g.verdicts if v.evidence.duty_cycle is not None]
        if duty:
            ax.plot(
                [d[0] for d in duty],
                [d[1] for d in duty],
                color="black",
                lw=1.6,
                label=f"duty cycle ({a.thresholds.window_s:g} s window)",
            )
        ax.set_ylim(-5, 105)
        ax.set_ylabel("%")
        then = f", then {g.final_label}" if g.final_label else ""
        ax.set_title(
            f"GPU {g.index} {g.name}: {g.main_label}{then}, wasted {g.wasted_gpu_s:.0f} GPU-s",
            fontsize=9,
            loc="left",
        )
        ax.grid(alpha=0.3)
    host_ax = axes[-1]
    if a.host:
        ts = [h[0] for h in a.host]
        host_ax.plot(ts, [h[1] * 100 for h in a.host], label="host CPU (all cores)", color="#1f77b4")
        host_ax.plot(ts, [h[3] * 100 for h in a.host], label="busiest core", color="#d62728", lw=1)
        if any(h[2] is not None for h in a.host):
            host_ax.plot(ts, [(h[2] or 0) * 100 for h in a.host], label="iowait", color="#ff7f0e")
        host_ax.legend(loc="upper right", fontsize=7, ncol=3)
    host_ax.set_ylim(-5, 105)
    host_ax.set_ylabel("%")
    host_ax.set_title("host", fontsize=9, loc="left")
    host_ax.set_xlabel("seconds since the start of the recording")
    host_ax.grid(alpha=0.3)
    if gpus:
        axes[0].legend(loc="upper right", fontsize=7, ncol=2)
    handles = [Patch(color=STATE_COLORS[s], alpha=0.5, label=s) for s in STATE_COLORS if s in seen_labels]
    more = f" (first {MAX_GPUS_PLOTTED} of {len(a.gpus)} GPUs)" if len(a.gpus) > MAX_GPUS_PLOTTED else ""
    fig.suptitle(f"gpumon: {a.path}{more}", fontsize=11)
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=len(handles),
        bbox_to_anchor=(0.5, 0.965),
        fontsize=8,
        title="state",
        title_fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the plot: {e.strerror}") from None
    finally:
        plt.close(fig)
