"""Play a recorded trace back as if its GPUs and host were live.

At sampler time t (since `start`), the replay hands out the newest recorded tick at or before
trace time t, re-stamped onto the sampler's clock, with the sub-second history of every tick it
skipped, so nothing recorded is lost when the sampler ticks slower than the recording. Speed is
the sampler's clock's business: real time, scaled, or a virtual clock for as fast as possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpumon.core.model import GpuSample, HostSample, Tick, UtilPoint
from gpumon.trace.reader import Trace


class ReplaySource:
    name = "replay"

    def __init__(
        self, trace: Trace | None = None, *, ticks: Iterable[Tick] = (), interval_s: float | None = None
    ) -> None:
        """A trace already read, or a stream of ticks (`analyze --from` reads days of segments
        one tick at a time: only the next tick is held)."""
        if trace is not None:
            ticks = trace.ticks
            interval = trace.header.get("interval_s")
            interval_s = float(interval) if isinstance(interval, (int, float)) else None
        self._ticks: Iterator[Tick] = iter(ticks)
        # Recorded ticks are about one interval apart, never exactly: a tick due within half an
        # interval counts as due, so a replay at the recording's cadence hands out one per tick.
        self._slack_s = interval_s / 2 if interval_s is not None and interval_s > 0 else 0.0
        self._ahead: Tick | None = next(self._ticks, None)
        self._t0 = self._ahead.t_s if self._ahead is not None else 0.0
        self._origin: float | None = None
        self._host: HostSample | None = None

    @property
    def exhausted(self) -> bool:
        return self._ahead is None

    @property
    def first_t_s(self) -> float:
        """The recording's time of its first tick."""
        return self._t0

    def next_data_s(self) -> float | None:
        """When, on the sampler's clock, the next recorded tick falls due (None: not started, or
        nothing left). The sampler jumps over a gap in the recording instead of ticking through it."""
        if self._origin is None or self._ahead is None:
            return None
        return self._ahead.t_s - self._t0 + self._origin - self._slack_s

    def poll(self, t_s: float) -> list[GpuSample]:
        if self._origin is None:
            self._origin = t_s
        due = self._t0 + (t_s - self._origin)
        taken: list[Tick] = []
        while self._ahead is not None and self._ahead.t_s <= due + self._slack_s:
            taken.append(self._ahead)
            self._ahead = next(self._ticks, None)
        if not taken:
            return []
        shift = self._origin - self._t0
        newest = taken[-1]
        if abs(shift) < 1e-6 and len(taken) == 1:  # on the recording's own clock already (analyze)
            self._host = newest.host
            return list(newest.gpus)
        self._host = newest.host._replace(t_s=newest.host.t_s + shift) if newest.host else None
        history: dict[int, list[UtilPoint]] = {}
        for tick in taken:
            for g in tick.gpus:
                history.setdefault(g.index, []).extend(
                    UtilPoint(round(p.t_s + shift, 6), p.util_ratio) for p in g.util_history
                )
        return [
            g._replace(t_s=g.t_s + shift, util_history=tuple(history.get(g.index, ()))) for g in newest.gpus
        ]

    def host_poll(self, t_s: float, gpu_pids: object = ()) -> HostSample | None:
        """The host sample recorded with the tick last handed out by `poll`."""
        return self._host


class ReplayHost:
    """Adapter so the sampler can treat the replay's host side like a live host source."""

    name = "replay-host"

    def __init__(self, replay: ReplaySource) -> None:
        self._replay = replay

    def poll(self, t_s: float, gpu_pids: object = ()) -> HostSample | None:
        return self._replay.host_poll(t_s, gpu_pids)
