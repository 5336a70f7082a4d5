"""Wire the detector to the sampler: after each tick, cut a window per GPU from the sampler's ring
buffers and feed it to the fleet detector. The same sink serves `watch`, `serve` and `analyze`
(which replays a trace through the sampler on a virtual clock), so live and offline verdicts agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from gpumon.detector.config import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detector.evidence import GpuWindow
from gpumon.detector.tracker import FleetDetector, Verdict
from gpumon.model import Tick
from gpumon.sampler import Sampler

T = TypeVar("T")


def _recent(items: Iterable[T], since: float, t_of: Callable[[T], float]) -> tuple[T, ...]:
    """The items newer than `since`, oldest first, reading a deque from its newest end."""
    out: list[T] = []
    for item in reversed(items):  # type: ignore[call-overload]
        if t_of(item) <= since:
            break
        out.append(item)
    out.reverse()
    return tuple(out)


def windows_for(sampler: Sampler, tick: Tick, th: Thresholds) -> list[GpuWindow]:
    t = tick.t_s
    hosts = _recent(sampler.host_history, t - th.host_window_s, lambda h: h.t_s)
    out = []
    for g in tick.gpus:
        hist = sampler.history.get((g.index, g.uuid))
        if hist is None:
            continue
        out.append(
            GpuWindow(
                t_s=t,
                gpu=g,
                samples=_recent(hist.samples, t - th.window_s, lambda s: s.t_s),
                points=_recent(hist.points, t - th.window_s, lambda p: p.t_s),
                hosts=hosts,
            )
        )
    return out


@dataclass
class DetectorSink:
    """Call after each tick (`sampler.on_tick.append(sink)`); keeps the latest verdict per GPU."""

    sampler: Sampler
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    on_verdicts: list[Callable[[Tick, list[Verdict]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fleet = FleetDetector(self.thresholds)
        self.latest: list[Verdict] = []
        self._lock = threading.Lock()

    def __call__(self, tick: Tick) -> None:
        verdicts = self.fleet.feed(windows_for(self.sampler, tick, self.thresholds))
        with self._lock:
            self.latest = verdicts
        for callback in self.on_verdicts:
            callback(tick, verdicts)
