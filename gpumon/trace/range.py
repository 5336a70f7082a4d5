"""A recorder's directory read as one stream of ticks over a wall-clock range (`analyze --from`).

Segments are read one after another, one tick at a time, so memory does not grow with the range.
Each segment is a trace with its own clock; its ticks are put on one timeline, seconds since
`origin_unix_s`. Only segments that can hold samples of the range are opened. Where segments
overlap (a clock stepped back, two daemons on one directory), a tick not later than the one before
is passed over and counted in the warnings.

A segment is placed by its header's `started_unix_s`, checked against its name (its first tick's
time, in whole seconds): a header that puts the first tick far from that time, earlier, or later
when another segment follows, is wrong (a segment runs from its name's time until the next one's),
and the segment is placed by its name instead, with a warning naming it. Trusted as it was, a header
an hour ahead put its ticks on the next segments' hour, and those were passed over as overlapping.
The check costs one comparison per segment, at its first tick.

Nothing recorded is lost to one bad file: a segment that cannot be read (truncated, corrupt, not
gzip, two files joined, a FIFO or a symlink named like one) is skipped with a warning naming it and
why, after the ticks it held up to the damage, and the segments after it are read as usual. The
warnings are bounded per kind (MAX_WARNINGS_PER_KIND lines, then a count of the rest), so that a
flood of one kind never hides another.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpumon.core.errors import TraceError
from gpumon.core.model import Tick, UtilPoint
from gpumon.core.timepoints import EARLIEST_S, LATEST_S
from gpumon.trace.reader import iter_trace
from gpumon.trace.segments import Segment, list_segments, shown_path

MAX_WARNINGS_PER_KIND = 10
"""Warnings of one kind said for a range: the first few, then one line with the count of the rest.
Per kind: 200 stray files once took all the places of a shared cap, and the overlap of two
segments, which costs ticks, was never said."""
HEADER_SLACK_S = 2.0
"""How far a segment's first tick, placed by its header, may be from its name's time (the first
tick's, in whole seconds, so up to 1 s before it) before the header is doubted."""


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
    skipped_segments: int = 0
    """Segments that could not be read (or not whole): each is named in the warnings."""
    first_skipped: str | None = None
    """Why the first of them was skipped (what an empty range says; a stray file named like a
    segment is only warned of)."""
    warnings: list[str] = field(default_factory=list)
    said: dict[str, int] = field(default_factory=dict)
    """Warnings kept, per kind."""
    more_warnings: dict[str, int] = field(default_factory=dict)
    """Warnings not shown, per kind."""
    after_until_unix_s: float | None = None
    """The latest time known to be recorded after `until_unix_s` (None: nothing is)."""
    now_unix_s: float = 0.0

    def warn(self, text: str, kind: str) -> None:
        n = self.said.get(kind, 0)
        if n < MAX_WARNINGS_PER_KIND:
            self.said[kind] = n + 1
            self.warnings.append(text)
        else:
            self.more_warnings[kind] = self.more_warnings.get(kind, 0) + 1


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
    directory: str,
    since: float,
    until: float = math.inf,
    gpus: GpuSelection | None = None,
    now: float | None = None,
) -> tuple[Span, Iterator[Tick]]:
    """The span (filled in while reading) and the ticks with `since <= time < until` (until the
    recording's end by default), on a timeline whose 0 is `since` (or the first segment's start,
    when later). `now`: the wall clock (injected by tests)."""
    skipped: list[str] = []
    segments = list_segments(directory, skipped)
    chosen = select(segments, since, until)
    origin = max(since, chosen[0].start_unix_s - 60) if chosen else since
    span = Span(directory, since, until, origin)
    for w in skipped:
        span.warn(w, "stray files")
    later = [s.start_unix_s for s in segments if s.start_unix_s >= until]
    span.after_until_unix_s = later[-1] if later else None
    span.now_unix_s = time.time() if now is None else now
    # where each segment's time ends: the next one's start (the newest's, never)
    ends = {s.path: n.start_unix_s for s, n in itertools.pairwise(segments)}
    return span, _ticks(span, chosen, gpus, ends, segments[-1].path if segments else None)


def _iso(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(unix_s))


def _placed(seg: Segment, started: float, first_t_s: float, ends: float) -> float:
    """The segment's start (what its ticks' t_s are added to): its header's `started`, unless that
    puts its first tick more than HEADER_SLACK_S from its name's time, earlier (on the segments
    before) or later while another segment follows (on that one's time): then its name's. A header
    ahead of the newest segment's name costs no other segment: it is kept."""
    first = started + first_t_s
    if abs(first - seg.start_unix_s) <= HEADER_SLACK_S:
        return started
    if first < seg.start_unix_s or ends < math.inf:
        return seg.start_unix_s - first_t_s
    return started


def _ticks(
    span: Span,
    chosen: list[Segment],
    gpus: GpuSelection | None,
    ends: dict[str, float],
    newest: str | None,
) -> Iterator[Tick]:
    last = -math.inf
    for seg in chosen:
        span.segments.append(seg.path)
        warnings: list[str] = []
        kinds: list[str] = []
        hidden: dict[str, int] = {}
        read = 0
        items = iter_trace(seg.path, warnings, gpus, kinds, hidden)
        try:
            header = next(items)
            assert isinstance(header, dict)
            started = header.get("started_unix_s")
            if not isinstance(started, (int, float)):
                raise TraceError(seg.path, 1, "the header has no started_unix_s: cannot place it in time")
            if not EARLIEST_S <= started <= LATEST_S:  # (a date in 14645 once ended the report, exit 1)
                raise TraceError(
                    seg.path,
                    1,
                    f"started_unix_s {started:g} is not a time from 1970 to 9999: cannot place it",
                )
            if span.header is None:
                span.header = header
            for item in items:
                if not isinstance(item, Tick):
                    continue
                if read == 0:
                    placed = _placed(seg, started, item.t_s, ends.get(seg.path, math.inf))
                    if placed != started:
                        span.warn(
                            f"{shown_path(seg.path)}: its header's started_unix_s {started:.0f} puts its "
                            f"first tick at {_iso(started + item.t_s)}, not at {_iso(seg.start_unix_s)} "
                            "as its name says: placed by its name",
                            "segment headers off their names",
                        )
                        started = placed
                unix = started + item.t_s
                if not EARLIEST_S <= unix <= LATEST_S:
                    raise TraceError(
                        seg.path,
                        None,
                        f"a tick at t_s {item.t_s:g} falls outside 1970 to 9999: cannot place it in time",
                    )
                read += 1
                if unix < span.since_unix_s:
                    continue
                if unix >= span.until_unix_s:  # since <= t < until
                    span.after_until_unix_s = max(span.after_until_unix_s or unix, unix)
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
        except TraceError as e:  # one bad segment costs its own damaged part, never the others
            span.skipped_segments += 1
            kept = f"its first {read} tick(s) read, the rest" if read else "segment"
            warnings.append(f"{e}: {kept} skipped")
            kinds.append("unreadable segments")
            if span.first_skipped is None:
                span.first_skipped = warnings[-1]
        finally:
            # a segment left at the range's end (or by an error of this reader's) is closed now:
            # its reader's count of what it did not say is made then, and read below
            items.close()
        for w, kind in zip(warnings, kinds, strict=True):
            if seg.path == newest and kind in ("torn", "partial"):
                continue  # being written, most likely: no end yet is no news
            span.warn(w, kind)
        for kind, n in hidden.items():  # the segment's own warnings past its cap: counted, not shown
            span.more_warnings[kind] = span.more_warnings.get(kind, 0) + n
    if span.overlapping:
        span.warn(
            f"{span.directory}: {span.overlapping} tick(s) passed over: segments overlap in time "
            "(a clock stepped back, or two daemons writing one directory)",
            "overlap",
        )
    after = span.after_until_unix_s
    if after is not None and after > span.now_unix_s:  # a range that ends before the data: say why
        span.warn(
            f"{span.directory}: the recording goes on after the range, to {_iso(after)} or later, "
            f"which is after now: a simulation run faster than real time (--speed) is stamped ahead "
            f"of the wall clock; the range ends at {_iso(span.until_unix_s)}: leave out --until to "
            "read the whole recording",
            "after now",
        )
    for kind, n in span.more_warnings.items():
        span.warnings.append(f"{span.directory}: {n} more warning(s) not shown ({kind})")


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
    host = tick.host._replace(t_s=tick.host.t_s + dt) if tick.host is not None else None
    return tick._replace(t_s=tick.t_s + dt, gpus=tuple(shifted), host=host)
