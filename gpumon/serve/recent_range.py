"""A short range of the recording analyzed from the verdicts the daemon already gave
(gpumon.serve.verdict_log), in a few milliseconds, instead of replaying the segments.

The answer is `gpumon analyze --from DIR --since S --until U`'s, built as that replay builds it:
time in each state from the per-tick verdicts, waste from the detector's running total, episodes
cut at `since` (the one under way then starts there, with the waste since), the open one closed at
the last tick. What differs is where the verdicts come from: the daemon's own, judged on the
samples before they were rounded for the recording and with all the history before the range,
where the replay starts afresh a pre-roll (window + confirmation) before `since`. They agree
wherever the pre-roll is enough to judge the range's first seconds as the daemon did, which is
what the pre-roll is for (docs/detector.md); an episode already under way at `since` keeps its
mean duty, worst evidence and causes over all of it (the replay's covers the pre-roll on).

None when the log cannot answer exactly that: the range starts before the log (or before the
thresholds last changed), ends before its newest tick, or holds more episodes of a GPU than the
daemon keeps at hand; the caller then replays the recording.
"""

from __future__ import annotations

import math
from typing import Any

from gpumon.analyze.trace_report import Analysis, GpuReport
from gpumon.detect.thresholds import Thresholds
from gpumon.detect.tracker import Episode
from gpumon.serve.verdict_log import Judged, LogView
from gpumon.trace.range import Span, select
from gpumon.trace.segments import list_segments


def analyze_recent(
    log: LogView,
    directory: str,
    since: float,
    until: float,
    gpus: frozenset[int] | None,
    th: Thresholds,
    header: dict[str, Any],
) -> Analysis | None:
    latest = log.latest
    if until <= latest.unix_s or not log.ticks:
        return None  # a range that ends before now: the recording's (it may hold ticks since)
    start = log.index_at(since)
    if start == 0 or log.ticks[start - 1].unix_s < log.thresholds_since_unix_s:
        return None  # nothing logged before `since`: the log does not reach back that far
    ticks = log.ticks[start:]
    if not ticks:
        return None  # nothing in the range: the replay says why, naming what the recording spans
    preroll = th.window_s + th.confirm_s
    segments = list_segments(directory)
    chosen = select(segments, since - preroll, until)
    origin = max(since - preroll, chosen[0].start_unix_s - 60) if chosen else since - preroll
    offset = latest.unix_s - latest.t_s - origin
    """Add to the detector's time for the range's timeline (seconds since `origin`)."""
    before = {(j.index, j.uuid): j for j in log.ticks[start - 1].gpus}
    interval = float(header.get("interval_s") or 1.0)
    reports: dict[tuple[int, str], GpuReport] = {}
    seen: dict[tuple[int, str], list[Judged]] = {}
    for entry in ticks:
        for j in entry.gpus:
            if gpus is not None and j.index not in gpus:
                continue
            key = (j.index, j.uuid)
            rep = reports.get(key)
            if rep is None:
                rep = reports[key] = GpuReport(j.index, j.uuid, j.name)
                rep.mig = j.mig
                seen[key] = []
            mine = seen[key]
            dt = min(j.t_s - mine[-1].t_s, th.window_s) if mine else interval
            mine.append(j)
            rep.seconds_by_label[j.label] += dt
            for job, user in j.jobs:
                rep.jobs.setdefault(job, user)
    since_t = since - latest.unix_s + latest.t_s  # `since` on the detector's clock
    for key, rep in reports.items():
        episodes = latest.episodes.get(key, ())
        closed = [e for e in episodes if e.end_s is not None]
        if len(closed) >= latest.closed_kept and closed[0].end_s is not None and closed[0].end_s > since_t:
            return None  # older episodes of the range are no longer at hand
        mine = seen[key]
        prior = before.get(key)
        w0 = prior.wasted_gpu_s if prior is not None else 0.0
        rep.wasted_gpu_s = max(0.0, mine[-1].wasted_gpu_s - w0)
        kept = []
        for e in episodes:
            if e.end_s is not None and e.end_s <= since_t:
                continue
            if e.end_s is None:  # the open one ends at the range's end, as the replay closes it
                e = e._replace(end_s=mine[-1].t_s)
            if e.start_s < since_t:  # under way at `since`: it starts there, with the waste since
                w1 = w0
                for j in mine:
                    if j.since_s != e.start_s:
                        break
                    w1 = j.wasted_gpu_s
                e = e._replace(start_s=since_t, wasted_gpu_s=round(max(0.0, w1 - w0), 3))
            kept.append(_moved(e, offset))
        rep.episodes = kept
    if not reports:
        return None  # no such GPU: the replay's answer names it
    first, last = ticks[0], ticks[-1]
    asked = since - origin
    span = Span(
        directory,
        since,
        until,
        origin,
        segments=[s.path for s in chosen if s is chosen[-1] or _next_start(chosen, s) > since],
        header=header,
        first_unix_s=first.unix_s,
        last_unix_s=last.unix_s,
        ticks=len(ticks),
    )
    end = last.t_s + offset
    first_s = first.unix_s - origin
    return Analysis(
        path=directory,
        header=header,
        thresholds=th,
        gpus=sorted(reports.values(), key=lambda r: (r.index, r.uuid)),
        host=[],
        duration_s=end - (first_s if math.isfinite(first_s) else asked),
        end_s=end,
        warnings=[],
        span=span,
    )


def _next_start(chosen: list[Any], seg: Any) -> float:
    i = chosen.index(seg)
    return float(chosen[i + 1].start_unix_s) if i + 1 < len(chosen) else math.inf


def _moved(e: Episode, offset: float) -> Episode:
    """The episode on the range's timeline."""
    causes = tuple((t + offset, c) for t, c in e.causes)
    end = None if e.end_s is None else e.end_s + offset
    return e._replace(start_s=e.start_s + offset, end_s=end, causes=causes)
