"""The detector stage: after each tick, cut a window per GPU from the sampler's ring buffers and
feed it to the fleet detector. The pipeline runs it for `watch`, `serve` and `analyze` (which
replays a trace through the sampler on a virtual clock), so live and offline verdicts agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


class DetectorSink:
    """The detector stage of the pipeline: after each tick, a window per GPU in, verdicts out.
    Keeps the latest verdicts (what the daemon publishes)."""

    def __init__(self, sampler: Sampler, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.sampler = sampler
        self.thresholds = thresholds
        self.fleet = FleetDetector(thresholds)
        self.latest: list[Verdict] = []

    def feed(self, tick: Tick) -> list[Verdict]:
        verdicts = self.fleet.feed(windows_for(self.sampler, tick, self.thresholds))
        self.latest = verdicts
        return verdicts

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """New thresholds (SIGHUP) for every GPU, from the next tick on; totals are kept."""
        self.thresholds = thresholds
        self.fleet.thresholds = thresholds
        for det in self.fleet.gpus.values():
            det.thresholds = thresholds
