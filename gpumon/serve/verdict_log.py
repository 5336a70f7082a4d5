"""The verdicts the daemon gave over its last few minutes, kept so that /api/v1/analysis can
answer a short range in-process (gpumon.serve.recent_range) instead of replaying the recording.

Fed from the sampling thread after each tick; read on the HTTP server's event loop (a copy, handed
to the analysis thread). The log is a ring of columns made at its first tick: each tick's times and
each GPU's three numbers are doubles in arrays, and what a GPU's verdicts share from tick to tick
(its identity, its label) one tuple shared by the ticks while it holds. A tick leaves behind no
Python object of its own (216 bytes of columns for 8 GPUs; ~570 bytes of objects that lived 15
minutes, scattered among the ticks' short-lived ones, before), so a daemon's memory does not climb
while the log fills; only a label or job that changes makes a new shared tuple.

Neither side takes a lock the other could wait on: the writer counts a sequence number up before
and after it writes a tick, and a reader that finds it odd, or moved while it copied, copies again.
"""

from __future__ import annotations

import bisect
import sys
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, overload

from gpumon.core.model import Tick
from gpumon.detect.tracker import Episode, Verdict

KEPT_S = 900.0
"""How far back the log reaches (plus the detector's pre-roll): a longer range is replayed from the
recording in a process of its own."""
MAX_TICKS = 20_000
"""The log's bound in ticks, whatever the interval (at 1 s: about KEPT_S; at 0.05 s: 1,000 s)."""
MAX_VERDICTS = 160_000
"""The log's bound in GPU verdicts, whatever the GPU count: about 4.3 MB of columns at most. It
binds for many GPUs at a short interval (64 GPUs at 0.05 s: 2,500 ticks, two minutes, not KEPT_S;
a range older is replayed); at 1 s, KEPT_S binds first up to 175 GPUs."""


class Judged(NamedTuple):
    """One GPU's verdict at one tick, as the range analysis needs it."""

    index: int  # type: ignore[assignment]  # the GPU's index, not tuple.index
    uuid: str
    name: str
    mig: int | None
    t_s: float
    label: str
    since_s: float
    """When the episode under way began (the detector's clock): which episode the tick belongs to."""
    wasted_gpu_s: float
    """The detector's running total (Verdict.wasted_gpu_s)."""
    jobs: tuple[tuple[str, str | None], ...]


_Ident = tuple[int, str, str, int | None, tuple[tuple[str, str | None], ...]]
"""What a GPU's verdicts share from tick to tick: (index, uuid, name, MIG instance, jobs)."""
_Layout = tuple[tuple[_Ident, str], ...]
"""A tick's GPUs in order: each one's identity and label (shared by the ticks while they hold)."""
_PER_GPU = 3
"""A logged tick's numbers per GPU: the verdict's t_s, since_s and wasted_gpu_s."""
VIEW_TRIES = 50
"""How often a reader copies the log again when the writer was writing (a tick is written in
microseconds: once or twice is the most seen), handing the interpreter to it between tries, before it
gives up (the range is then replayed from the recording)."""


class Logged:
    """One tick's verdicts, read from a copy of the log's columns: `gpus` builds them as Judged."""

    __slots__ = ("_at", "_layout", "_values", "t_s", "unix_s")

    def __init__(self, unix_s: float, t_s: float, layout: _Layout, values: array[float], at: int) -> None:
        self.unix_s = unix_s
        self.t_s = t_s
        self._layout = layout
        self._values = values
        self._at = at

    @property
    def gpus(self) -> tuple[Judged, ...]:
        values, k = self._values, self._at
        new = tuple.__new__
        out = []
        for ident, label in self._layout:
            out.append(new(Judged, (*ident[:4], values[k], label, values[k + 1], values[k + 2], ident[4])))
            k += _PER_GPU
        return tuple(out)


class Ticks(Sequence[Logged]):
    """A view's ticks, oldest first, made as they are read (the analysis thread reads them; the
    event loop only copies the columns)."""

    def __init__(
        self,
        unix: array[float],
        t: array[float],
        layouts: list[_Layout | None],
        values: array[float],
        order: Sequence[int],
        step: int,
    ) -> None:
        self._unix, self._t, self._layouts, self._values = unix, t, layouts, values
        self._order, self._step = order, step

    def __len__(self) -> int:
        return len(self._order)

    def _at(self, slot: int) -> Logged:
        return Logged(
            self._unix[slot], self._t[slot], self._layouts[slot] or (), self._values, slot * self._step
        )

    @overload
    def __getitem__(self, i: int) -> Logged: ...

    @overload
    def __getitem__(self, i: slice) -> list[Logged]: ...

    def __getitem__(self, i: int | slice) -> Logged | list[Logged]:
        if isinstance(i, slice):
            return [self._at(slot) for slot in self._order[i]]
        return self._at(self._order[i])

    def __iter__(self) -> Iterator[Logged]:
        return map(self._at, self._order)


class Latest(NamedTuple):
    """The newest tick logged, with each GPU's episodes then: the last closed ones and the open one."""

    unix_s: float
    t_s: float
    episodes: Mapping[tuple[int, str], tuple[Episode, ...]]
    closed_kept: int
    """At most this many closed episodes per GPU are in `episodes`: when there are that many,
    older ones may be missing."""


class LogView(NamedTuple):
    """A consistent copy: the ticks up to and including `latest`."""

    ticks: Sequence[Logged]
    latest: Latest
    thresholds_since_unix_s: float
    """The thresholds in force were set then (or the log began): older verdicts used others."""

    def index_at(self, unix_s: float) -> int:
        """The position of the first tick at or after `unix_s`."""
        return bisect.bisect_left(self.ticks, unix_s, key=lambda e: e.unix_s)


class VerdictLog:
    def __init__(self, interval_s: float, preroll_s: float, kept_s: float = KEPT_S) -> None:
        self._max_ticks = min(MAX_TICKS, int((kept_s + preroll_s) / interval_s) + 2)
        # the ring, made at the first tick (when the GPU count is known) and again only if a tick
        # brings more GPUs than it was made for (MIG instances made)
        self._cap = 0
        self._width = 0
        """GPUs a tick's row has room for."""
        self._unix: array[float] = array("d")
        self._t: array[float] = array("d")
        self._layouts: list[_Layout | None] = []
        self._values: array[float] = array("d")
        self._head = 0
        """The slot the next tick goes to."""
        self._count = 0
        self._written = 0
        self._widest_at = 0
        """When (in ticks written) the last tick as wide as the ring came: once it has left the ring,
        a narrower ring holds more ticks, as the bound in verdicts allows."""
        self._seq = 0
        """Odd while the writer writes: a reader that sees it odd, or changed, copies again."""
        self._latest: Latest | None = None
        self._reset_at = -float("inf")
        self._labels: dict[str, str] = {}
        self._idents: dict[tuple[int, str], _Ident] = {}
        """Each GPU's identity as last logged (one per GPU seen: replaced when it changes)."""
        self._layout: _Layout = ()

    def record(
        self,
        tick: Tick,
        verdicts: Iterable[Verdict],
        unix_s: float,
        episodes: Mapping[tuple[int, str], tuple[Episode, ...]],
        closed_kept: int,
    ) -> None:
        """From the sampling thread, after each tick."""
        samples = {(g.index, g.uuid): g for g in tick.gpus}
        layout = self._layout
        pairs: list[tuple[_Ident, str]] = []
        numbers: list[float] = []
        idents = self._idents
        same = True
        for n, v in enumerate(verdicts):
            key = (v.index, v.uuid)
            g = samples.get(key)
            jobs = tuple((j.job_id, j.user) for j in g.jobs) if g is not None and g.jobs else ()
            ident = (v.index, v.uuid, v.name, g.mig if g is not None else None, jobs)
            known = idents.get(key)
            if known != ident:
                known = idents[key] = ident
            label = self._labels.setdefault(v.label, sys.intern(v.label))  # one string per label
            pair = layout[n] if n < len(layout) else None
            if pair is None or pair[0] is not known or pair[1] is not label:
                pair, same = (known, label), False
            pairs.append(pair)
            numbers += (v.t_s, v.since_s, v.wasted_gpu_s)
        if len(idents) > 2 * len(samples) + 8:  # GPUs gone (MIG instances remade): forget them
            self._idents = {key: ident for key, ident in idents.items() if key in samples}
        if not same or len(pairs) != len(layout):
            layout = self._layout = tuple(pairs)  # a label, a job or the GPUs changed: a new one
        row = array("d", numbers)  # (anything that may fail, before the log is touched)
        n = len(pairs)
        self._written += 1
        self._seq += 1  # odd: a reader copying now copies again
        try:
            if n > self._width or not self._cap:
                self._remake(max(1, n))
                self._widest_at = self._written
            elif n < self._width and self._written - self._widest_at > self._cap:
                self._remake(max(n, *(len(x or ()) for x in self._layouts)))  # the widest tick left
                self._widest_at = self._written  # (at the latest, the widest now leaves a ring later)
            elif n == self._width:
                self._widest_at = self._written
            slot = self._head
            self._unix[slot] = unix_s
            self._t[slot] = tick.t_s
            self._layouts[slot] = layout
            at = slot * self._width * _PER_GPU
            self._values[at : at + len(row)] = row
            self._head = (slot + 1) % self._cap
            self._count = min(self._count + 1, self._cap)
            self._latest = Latest(unix_s, tick.t_s, episodes, closed_kept)
        finally:
            self._seq += 1

    def _remake(self, width: int) -> None:
        """The ring for ticks of `width` GPUs, the newest ticks kept in order: as many ticks as both
        bounds allow, its memory taken now (at the first tick, and when the widest tick changes)."""
        cap = max(1, min(self._max_ticks, MAX_VERDICTS // width))
        ticks = [self._slot(i) for i in self._order()][-cap:]
        self._cap, self._width = cap, width
        self._unix, self._t = array("d", bytes(8 * cap)), array("d", bytes(8 * cap))
        self._layouts = [None] * cap
        self._values = array("d", bytes(8 * cap * width * _PER_GPU))
        for slot, (unix_s, t_s, layout, row) in enumerate(ticks):
            self._unix[slot], self._t[slot], self._layouts[slot] = unix_s, t_s, layout
            at = slot * width * _PER_GPU
            self._values[at : at + len(row)] = row
        self._count = len(ticks)
        self._head = self._count % cap

    def _order(self) -> range | list[int]:
        """The slots of the ticks kept, oldest first."""
        return _oldest_first(self._head, self._count, self._cap)

    def _slot(self, i: int) -> tuple[float, float, _Layout, array[float]]:
        layout = self._layouts[i] or ()
        at = i * self._width * _PER_GPU
        return self._unix[i], self._t[i], layout, self._values[at : at + len(layout) * _PER_GPU]

    def thresholds_changed(self, unix_s: float) -> None:
        """After a reload that changed the thresholds: verdicts before now were judged by others."""
        self._reset_at = unix_s

    @property
    def newest_unix_s(self) -> float | None:
        latest = self._latest
        return None if latest is None else latest.unix_s

    def view(self) -> LogView | None:
        """A consistent copy of the log (its columns: the ticks are made as they are read); None
        before its first tick, or if the writer was writing at each of VIEW_TRIES tries."""
        for _ in range(VIEW_TRIES):
            seq = self._seq
            if not seq % 2:
                latest = self._latest
                if latest is None:
                    return None
                unix, t, layouts, values = self._unix[:], self._t[:], self._layouts[:], self._values[:]
                width, head, count, cap = self._width, self._head, self._count, self._cap
                # (CPython switches threads at calls and loops, none of them here: this second
                # look is for an interpreter that would)
                if self._seq == seq:
                    break
            time.sleep(0)  # let the writer finish its tick
        else:
            return None
        order = _oldest_first(head, count, cap)
        return LogView(Ticks(unix, t, layouts, values, order, width * _PER_GPU), latest, self._reset_at)


def _oldest_first(head: int, count: int, cap: int) -> range | list[int]:
    """A ring's slots holding ticks, oldest first (`head`: the slot the next tick goes to)."""
    return range(count) if count < cap else [*range(head, cap), *range(head)]
