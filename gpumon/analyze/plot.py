"""`gpumon analyze --plot`: one timeline per GPU (sub-second utilization, duty cycle, its episodes
shaded, each change of state marked) and one for the host (CPU, busiest core, iowait).
matplotlib is optional (extra `plot`).

Drawn to be attached to a bug report: the shading is the report's own episodes (the same start and
end the text prints), the legends sit to the right of the plots (never over a title or the data),
and a caller may mark moments of its own (`gpumon demo` marks where its starved phase began).
tests/test_plot.py checks that layout with matplotlib's bounding boxes.
"""

from __future__ import annotations

import importlib.util
from typing import Any

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
    "starting": "#9ecae1",
    "mig": "#f7f7f7",
    "unknown": "#eeeeee",
}
MAX_GPUS_PLOTTED = 16
CHANGE_COLOR = "#303030"
MARK_COLOR = "#7b2cbf"
WIDTH_IN = 13.0
LEGEND_IN = 2.7
"""The band to the right of the plots that holds the legends."""
ROW_IN = 1.75
TOP_IN = 0.75
BOTTOM_IN = 0.6
GAP_IN = 0.5
_LEGEND: dict[str, Any] = {
    "loc": "upper left",
    "bbox_to_anchor": (1.01, 1.0),
    "fontsize": 8,
    "title_fontsize": 8,
}
"""Outside the plot, to its right: a legend never hides a title or the data."""


def require_matplotlib() -> None:
    """Fail before any work when --plot cannot be drawn."""

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency(f"--plot needs matplotlib: {install_hint('plot')}")


def plot(a: Analysis, path: str, marks: tuple[tuple[float, str], ...] = ()) -> None:
    """Draw `a` into the PNG file `path`; `marks`: (t_s, what happened) lines of the caller's."""
    require_matplotlib()
    # here, not at the top: extra plot: only when a plot is drawn
    import matplotlib.pyplot as plt

    fig = draw(a, marks)
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        # (not every OSError has a strerror: a FIFO's is "not seekable", once shown as "None")
        raise OutputError(f"{path}: cannot write the plot: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def draw(a: Analysis, marks: tuple[tuple[float, str], ...] = ()) -> Any:
    """The figure (a matplotlib Figure, on the Agg backend); the caller closes it."""
    require_matplotlib()
    # here, not at the top: extra plot: only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    # here, not at the top: extra plot: only when a plot is drawn
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    assert a.trace is not None, "--plot draws one trace file"
    gpus = a.gpus[:MAX_GPUS_PLOTTED]
    rows = len(gpus) + 1
    height = TOP_IN + BOTTOM_IN + rows * ROW_IN + (rows - 1) * GAP_IN
    fig, axes = plt.subplots(rows, 1, figsize=(WIDTH_IN, height), sharex=True, squeeze=False)
    fig.subplots_adjust(
        left=0.7 / WIDTH_IN,
        right=1 - LEGEND_IN / WIDTH_IN,
        top=1 - TOP_IN / height,
        bottom=BOTTOM_IN / height,
        hspace=GAP_IN / ROW_IN,
    )
    axes = axes[:, 0]
    points: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for tick in a.trace.ticks:
        for sample in tick.gpus:
            points.setdefault((sample.index, sample.uuid), []).extend(
                (p.t_s, p.util_ratio) for p in sample.util_history
            )
    seen_labels: set[str] = set()
    changes = 0
    for ax, g in zip(axes, gpus):
        # the report's own episodes: shaded from the start the text prints, not from the first
        # verdict that names the state (a state is reported once it held for a few seconds)
        for e in g.episodes:
            end = e.end_s if e.end_s is not None else a.end_s
            ax.axvspan(
                e.start_s,
                end,
                color=STATE_COLORS.get(e.label, "#ffffff"),
                alpha=0.25,
                lw=0,
                gid=f"episode {e.label} {e.start_s:.1f} {end:.1f}",
            )
            seen_labels.add(e.label)
        known = [e for e in g.episodes if e.state != "unknown"]
        for after in known[1:]:
            ax.axvline(after.start_s, color=CHANGE_COLOR, lw=1.2, ls="--", gid=f"change {after.start_s:.1f}")
            changes += 1
        for t_s, _ in marks:
            ax.axvline(t_s, color=MARK_COLOR, lw=1.6, ls=":", gid=f"mark {t_s:.1f}")
        pts = points.get((g.index, g.uuid), [])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], color="#1f77b4", lw=0.6, alpha=0.7)
        duty = [(v.t_s, v.evidence.duty_cycle * 100) for v in g.verdicts if v.evidence.duty_cycle is not None]
        if duty:
            ax.plot([d[0] for d in duty], [d[1] for d in duty], color="black", lw=1.6)
        ax.set_ylim(-5, 105)
        ax.set_ylabel("%")
        then = f", then {g.final_label}" if g.final_label else ""
        where = f"GPU {g.index}" + (f" MIG {g.mig}" if g.mig is not None else "")
        ax.set_title(
            f"{where} {g.name}: {g.main_label}{then}, wasted {g.wasted_gpu_s:.0f} GPU-s",
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
        host_ax.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="host", title_fontsize=8
        )
    for t_s, _ in marks:
        host_ax.axvline(t_s, color=MARK_COLOR, lw=1.6, ls=":", gid=f"mark {t_s:.1f}")
    host_ax.set_ylim(-5, 105)
    host_ax.set_ylabel("%")
    host_ax.set_title("host", fontsize=9, loc="left")
    host_ax.set_xlabel("seconds since the start of the recording")
    host_ax.grid(alpha=0.3)
    if gpus:
        handles: list[Any] = [
            Line2D([], [], color="#1f77b4", lw=0.8, label="utilization (driver samples)"),
            Line2D([], [], color="black", lw=1.6, label=f"duty cycle ({a.thresholds.window_s:g} s window)"),
        ]
        if changes:
            handles.append(Line2D([], [], color=CHANGE_COLOR, lw=1.2, ls="--", label="change of state"))
        handles += [
            Line2D([], [], color=MARK_COLOR, lw=1.6, ls=":", label=f"{what} ({t_s:.0f} s)")
            for t_s, what in marks
        ]
        handles += [
            Patch(color=STATE_COLORS[s], alpha=0.5, label=s) for s in STATE_COLORS if s in seen_labels
        ]
        axes[0].legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            title="GPU",
            title_fontsize=8,
        )
    more = f" (first {MAX_GPUS_PLOTTED} of {len(a.gpus)} GPUs)" if len(a.gpus) > MAX_GPUS_PLOTTED else ""
    shown = a.path if len(a.path) <= 90 else "..." + a.path[-87:]
    fig.suptitle(
        f"gpumon analyze {shown}{more}", fontsize=11, x=0.7 / WIDTH_IN, ha="left", y=1 - 0.12 / height
    )
    return fig
