"""Play a recorded trace back as if its GPUs and host were live.

At sampler time t (since `start`), the replay hands out the newest recorded tick at or before
trace time t, re-stamped onto the sampler's clock, with the sub-second history of every tick it
skipped, so nothing recorded is lost when the sampler ticks slower than the recording. Speed is
the sampler's clock's business: real time, scaled, or a virtual clock for as fast as possible.
"""

from __future__ import annotations

from dataclasses import replace

from gpumon.model import GpuSample, HostSample, Tick, UtilPoint
from gpumon.trace import Trace


class ReplaySource:
    name = "replay"

    def __init__(self, trace: Trace) -> None:
        self._ticks = trace.ticks
        # Recorded ticks are about one interval apart, never exactly: a tick due within half an
        # interval counts as due, so a replay at the recording's cadence hands out one per tick.
        interval = trace.header.get("interval_s")
        self._slack_s = interval / 2 if isinstance(interval, (int, float)) and interval > 0 else 0.0
        self._t0 = trace.ticks[0].t_s if trace.ticks else 0.0
        self._next = 0
        self._origin: float | None = None
        self._host: HostSample | None = None

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self._ticks)

    def next_data_s(self) -> float | None:
        """When, on the sampler's clock, the next recorded tick falls due (None: not started, or
        nothing left). The sampler jumps over a gap in the recording instead of ticking through it."""
        if self._origin is None or self.exhausted:
            return None
        return self._ticks[self._next].t_s - self._t0 + self._origin - self._slack_s

    def poll(self, t_s: float) -> list[GpuSample]:
        if self._origin is None:
            self._origin = t_s
        due = self._t0 + (t_s - self._origin)
        taken: list[Tick] = []
        while self._next < len(self._ticks) and self._ticks[self._next].t_s <= due + self._slack_s:
            taken.append(self._ticks[self._next])
            self._next += 1
        if not taken:
            return []
        shift = self._origin - self._t0
        newest = taken[-1]
        self._host = replace(newest.host, t_s=newest.host.t_s + shift) if newest.host else None
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
