"""A recorder's directory read as one stream of ticks over a wall-clock range (`analyze --from`).

Segments are read one after another, one tick at a time, so memory does not grow with the range.
Each segment is a trace with its own clock; its ticks are put on one timeline, seconds since
`origin_unix_s`. Only segments that can hold samples of the range are opened. Where segments
overlap (a clock stepped back, two daemons on one directory), a tick not later than the one before
is passed over and counted in the warnings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gpumon.core.errors import TraceError
from gpumon.core.model import Tick, UtilPoint
from gpumon.trace.reader import iter_trace
from gpumon.trace.segments import Segment, list_segments


@dataclass
class Span:
    """What a range read found; filled in as the stream is read."""

    directory: str
    since_unix_s: float
    until_unix_s: float
    origin_unix_s: float
    segments: list[str] = field(default_factory=list)
    header: dict[str, Any] | None = None
    first_unix_s: float | None = None
    last_unix_s: float | None = None
    ticks: int = 0
    overlapping: int = 0
    warnings: list[str] = field(default_factory=list)


def select(segments: list[Segment], since: float, until: float) -> list[Segment]:
    """Segments that may hold samples between `since` and `until` (a segment runs until the next
    one starts; the last one, until now)."""
    chosen = []
    for i, seg in enumerate(segments):
        ends = segments[i + 1].start_unix_s if i + 1 < len(segments) else math.inf
        # a segment is named after its first tick's time (whole seconds): nothing in it is earlier
        if seg.start_unix_s < until and ends > since:
            chosen.append(seg)
    return chosen


@dataclass(frozen=True)
class GpuSelection:
    """Which GPU indices to read: those listed (all when None) whose index % mod == rem (a
    worker's share, when several processes analyze one range)."""

    indices: frozenset[int] | None = None
    mod: int = 1
    rem: int = 0

    def __call__(self, index: int) -> bool:
        return (self.indices is None or index in self.indices) and index % self.mod == self.rem


def read_range(
    directory: str, since: float, until: float, gpus: GpuSelection | None = None
) -> tuple[Span, Iterator[Tick]]:
    """The span (filled in while reading) and the ticks with `since <= time < until`, on a
    timeline whose 0 is `since` (or the first segment's start, when later)."""
    segments = list_segments(directory)
    chosen = select(segments, since, until)
    origin = max(since, chosen[0].start_unix_s - 60) if chosen else since
    span = Span(directory, since, until, origin)
    return span, _ticks(span, chosen, gpus, segments[-1].path if segments else None)


def _ticks(
    span: Span, chosen: list[Segment], gpus: GpuSelection | None, newest: str | None
) -> Iterator[Tick]:
    last = -math.inf
    for seg in chosen:
        span.segments.append(seg.path)
        warnings: list[str] = []
        items = iter_trace(seg.path, warnings, gpus)
        try:
            header = next(items)
        except TraceError:
            raise
        assert isinstance(header, dict)
        if span.header is None:
            span.header = header
        started = header.get("started_unix_s")
        if not isinstance(started, (int, float)):
            raise TraceError(seg.path, 1, "the header has no started_unix_s: cannot place it in time")
        for item in items:
            if not isinstance(item, Tick):
                continue
            unix = started + item.t_s
            if unix < span.since_unix_s:
                continue
            if unix >= span.until_unix_s:  # since <= t < until
                break
            if unix <= last:
                span.overlapping += 1
                continue
            last = unix
            if span.first_unix_s is None:
                span.first_unix_s = unix
            span.last_unix_s = unix
            span.ticks += 1
            yield _shift(item, started - span.origin_unix_s)
        if seg.path == newest:  # being written, most likely: no end yet is no news
            warnings = [w for w in warnings if "without its end" not in w and "partial last record" not in w]
        span.warnings += warnings
    if span.overlapping:
        span.warnings.append(
            f"{span.directory}: {span.overlapping} tick(s) passed over: segments overlap in time "
            "(a clock stepped back, or two daemons writing one directory)"
        )


def _shift(tick: Tick, dt: float) -> Tick:
    """The tick moved by `dt` seconds onto the range's timeline."""
    shifted = []
    for g in tick.gpus:
        shifted.append(
            g._replace(
                t_s=g.t_s + dt,
                util_history=tuple(UtilPoint(p.t_s + dt, p.util_ratio) for p in g.util_history),
            )
        )
    host = replace(tick.host, t_s=tick.host.t_s + dt) if tick.host is not None else None
    return replace(tick, t_s=tick.t_s + dt, gpus=tuple(shifted), host=host)
