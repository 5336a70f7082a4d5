"""The bench's ground truth (`gpumon bench --truth`): a labeled timeline of how input-bound the job
was, window by window, and how the detector's verdicts agree with it (`gpumon analyze --truth`,
the demo, the real-job tests, the benchmarks)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from gpumon.analyze.trace_report import Analysis
from gpumon.core.errors import TraceError
from gpumon.core.files import NotRegularFile, read_regular


@dataclass
class TruthReport:
    judged: int
    agreed: int
    starved_windows: int
    starved_flagged: int
    fed_windows: int
    fed_unflagged: int
    skipped: int
    """Windows outside the trace, within the detector's settling time after a job started (its
    window plus confirmation), or only moderately input-bound."""
    sync_windows: int = 0
    """Windows of a data-parallel rank blocked in the collective half its time or more."""
    sync_flagged: int = 0

    @property
    def agreement(self) -> float:
        return self.agreed / self.judged if self.judged else 0.0

    def render(self, path: str) -> str:
        return (
            f"ground truth {path}: {self.judged} windows judged, {self.agreed} agree "
            f"({self.agreement:.0%}); highly input-bound flagged starved {self.starved_flagged}/"
            f"{self.starved_windows}; not input-bound left unflagged "
            f"{self.fed_unflagged}/{self.fed_windows}; "
            + (
                f"waiting in the collective flagged sync-stall {self.sync_flagged}/{self.sync_windows}; "
                if self.sync_windows
                else ""
            )
            + f"{self.skipped} not judged (moderately input-bound, settling after a job started, "
            "or outside the trace)"
        )


TruthWindow = tuple[float, float, str, str, int | None]
"""(start_unix_s, end_unix_s, expected state, pipeline, GPU or None for the only one) from
`gpumon bench --truth` (with --gpus, one record per rank, on GPU = rank)."""


MAX_TRUTH_BYTES = 16 << 20
"""A bench run writes a record (~200 bytes) per phase and rank: 16 MiB is far beyond any."""


def read_truth(truth_path: str) -> list[TruthWindow]:
    """The ground-truth file, checked whole before any analysis runs: a missing, binary or
    garbled file is one line naming the file and line (exit 4)."""
    windows = []
    try:
        data = read_regular(truth_path, MAX_TRUTH_BYTES)  # (never a FIFO's wait, nor /dev/zero's all)
    except NotRegularFile as e:
        raise TraceError(truth_path, None, f"{e.strerror}, not a truth file") from None
    except OSError as e:
        raise TraceError(truth_path, None, f"cannot open: {e.strerror}") from None
    if len(data) > MAX_TRUTH_BYTES:
        raise TraceError(truth_path, None, f"larger than {MAX_TRUTH_BYTES >> 20} MiB: not a truth file")
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            w = json.loads(raw.decode("utf-8"))
            start, end = float(w["start_unix_s"]), float(w["end_unix_s"])
            if not (math.isfinite(start) and math.isfinite(end)):
                raise ValueError
            gpu = w.get("gpu")
            if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0):
                raise ValueError
            windows.append((start, end, str(w["expected"]), str(w.get("pipeline", "")), gpu))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
            raise TraceError(truth_path, n, "not a gpumon bench truth record") from None
    if not windows:
        raise TraceError(truth_path, None, "no truth records (written by gpumon bench --truth)")
    return windows


def compare_truth(a: Analysis, truth: str | list[TruthWindow]) -> TruthReport:
    """Judge each decisive truth window by the verdicts inside it (their majority, once settled)."""
    started = a.header.get("started_unix_s")
    if not isinstance(started, (int, float)):
        raise TraceError(a.path, 1, "the header has no started_unix_s: cannot line up --truth")
    records = read_truth(truth) if isinstance(truth, str) else truth
    settle = a.thresholds.window_s + a.thresholds.confirm_s
    all_verdicts = [v for g in a.gpus for v in g.verdicts]
    first = min((v.t_s for v in all_verdicts), default=0.0)
    rep = TruthReport(0, 0, 0, 0, 0, 0, 0)
    job_start: dict[int | None, float] = {}
    previous: dict[int | None, tuple[float, str]] = {}
    for s, e, expected, pipeline, gpu in records:
        start, end = s - started, e - started
        verdicts = all_verdicts if gpu is None else [v for v in all_verdicts if v.index == gpu]
        # A new job (another pipeline, or a break between windows) starts a settling span: the
        # detector needs its window and confirmation after every change (docs/detector.md).
        last = previous.get(gpu)
        if last is None or pipeline != last[1] or start - last[0] > 2.0:
            job_start[gpu] = start
        previous[gpu] = (end, pipeline)
        ready = max(first, job_start[gpu]) + settle
        inside = [v for v in verdicts if start <= v.t_s < end and v.t_s >= ready and v.state != "unknown"]
        if expected not in ("starved", "healthy", "sync-stall") or not inside or end <= ready:
            rep.skipped += 1
            continue
        starved = sum(v.state == "starved" for v in inside) > len(inside) / 2
        spinning = sum(v.state == "sync-stall" for v in inside) > len(inside) / 2
        rep.judged += 1
        if expected == "starved":
            rep.starved_windows += 1
            rep.starved_flagged += starved
            rep.agreed += starved
        elif expected == "sync-stall":
            rep.sync_windows += 1
            rep.sync_flagged += spinning
            rep.agreed += spinning
        else:
            fine = not starved and not spinning
            rep.fed_windows += 1
            rep.fed_unflagged += fine
            rep.agreed += fine
    return rep
