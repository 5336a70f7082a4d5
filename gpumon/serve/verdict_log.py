"""The verdicts the daemon gave over its last few minutes, kept so that /api/v1/analysis can
answer a short range in-process (gpumon.serve.recent_range) instead of replaying the recording.

Fed from the sampling thread after each tick (a few tuples per GPU, no copies of samples); read
from the analysis thread. Appending to a deque and swapping one attribute are atomic, so neither
side takes a lock the other (or a scrape) could wait on.
"""

from __future__ import annotations

import bisect
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gpumon.core.model import Tick
from gpumon.detect.tracker import Episode, Verdict

KEPT_S = 900.0
"""How far back the log reaches (plus the detector's pre-roll): a longer range is replayed from the
recording in a process of its own."""
MAX_TICKS = 20_000
"""The log's bound in ticks, whatever the interval (at 1 s: about KEPT_S; at 0.05 s: 1,000 s)."""
MAX_VERDICTS = 160_000
"""The log's bound in GPU verdicts, whatever the GPU count: about 8 MB at most. It binds for many
GPUs at a short interval (64 GPUs at 0.05 s: 2,500 ticks, two minutes, not KEPT_S; a range older is
replayed); at 1 s, KEPT_S binds first up to 175 GPUs."""


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
_PER_GPU = 5
"""A logged tick's entries per GPU: its _Ident, then the verdict's t_s, label, since_s, wasted."""


class Logged:
    """One tick's verdicts, packed: a flat tuple of five references per GPU, its identity shared
    with the ticks before while it holds (less than half the memory of a Judged per GPU; the log keeps
    up to MAX_TICKS of them). `gpus` unpacks them as Judged."""

    __slots__ = ("_packed", "t_s", "unix_s")

    def __init__(self, unix_s: float, t_s: float, packed: tuple[object, ...]) -> None:
        self.unix_s = unix_s
        self.t_s = t_s
        self._packed = packed

    @property
    def gpus(self) -> tuple[Judged, ...]:
        p = self._packed
        new = tuple.__new__
        out = []
        for k in range(0, len(p), _PER_GPU):
            ident: Any = p[k]
            out.append(new(Judged, (*ident[:4], *p[k + 1 : k + _PER_GPU], ident[4])))
        return tuple(out)


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

    ticks: list[Logged]
    latest: Latest
    thresholds_since_unix_s: float
    """The thresholds in force were set then (or the log began): older verdicts used others."""

    def index_at(self, unix_s: float) -> int:
        """The position of the first tick at or after `unix_s`."""
        return bisect.bisect_left(self.ticks, unix_s, key=lambda e: e.unix_s)


class VerdictLog:
    def __init__(self, interval_s: float, preroll_s: float, kept_s: float = KEPT_S) -> None:
        ticks = int((kept_s + preroll_s) / interval_s) + 2
        self._ticks: deque[Logged] = deque(maxlen=min(MAX_TICKS, ticks))
        self._latest: Latest | None = None
        self._reset_at = -float("inf")
        self._labels: dict[str, str] = {}
        self._idents: dict[tuple[int, str], _Ident] = {}
        """Each GPU's identity as last logged (one per GPU seen: replaced when it changes)."""

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
        packed: list[object] = []
        idents = self._idents
        for v in verdicts:
            key = (v.index, v.uuid)
            g = samples.get(key)
            jobs = tuple((j.job_id, j.user) for j in g.jobs) if g is not None and g.jobs else ()
            ident = (v.index, v.uuid, v.name, g.mig if g is not None else None, jobs)
            known = idents.get(key)
            if known != ident:
                known = idents[key] = ident
            label = self._labels.setdefault(v.label, sys.intern(v.label))  # one string per label
            packed += (known, v.t_s, label, v.since_s, v.wasted_gpu_s)
        if len(idents) > 2 * len(samples) + 8:  # GPUs gone (MIG instances remade): forget them
            self._idents = {key: ident for key, ident in idents.items() if key in samples}
        self._ticks.append(Logged(unix_s, tick.t_s, tuple(packed)))
        per_tick = max(1, len(packed) // _PER_GPU)
        while len(self._ticks) * per_tick > MAX_VERDICTS:  # many GPUs at a short interval
            self._ticks.popleft()  # atomic, as the append: view() copies the deque whole
        self._latest = Latest(unix_s, tick.t_s, episodes, closed_kept)

    def thresholds_changed(self, unix_s: float) -> None:
        """After a reload that changed the thresholds: verdicts before now were judged by others."""
        self._reset_at = unix_s

    @property
    def newest_unix_s(self) -> float | None:
        latest = self._latest
        return None if latest is None else latest.unix_s

    def view(self) -> LogView | None:
        latest = self._latest  # first: every tick up to it is already in the deque
        if latest is None:
            return None
        ticks = list(self._ticks)  # one C call under the GIL: never sees a half-appended deque
        while ticks and ticks[-1].unix_s > latest.unix_s:
            ticks.pop()
        return LogView(ticks, latest, self._reset_at)
