"""The detector stage: after each tick, cut a window per GPU from the sampler's ring buffers and
feed it to the fleet detector. The pipeline runs it for `watch`, `serve` and `analyze` (which
replays a trace through the sampler on a virtual clock), so live and offline verdicts agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from gpumon.core.model import GpuSample, HostSample, Tick, UtilPoint
from gpumon.detect.advisor import Advisor
from gpumon.detect.evidence import GpuWindow
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.tracker import FleetDetector, Verdict

T = TypeVar("T")


class GpuHistoryLike(Protocol):
    """One GPU's recent samples and sub-second utilization points, oldest first."""

    @property
    def samples(self) -> Sequence[GpuSample]: ...

    @property
    def points(self) -> Sequence[UtilPoint]: ...


class HistoriesLike(Protocol):
    """The sampler's ring buffers, as the stage reads them (gpumon.collect.sampler.Sampler): the
    detector's layer names the shape it needs and never imports the collection layer."""

    @property
    def history(self) -> Mapping[tuple[int, str], GpuHistoryLike]: ...

    @property
    def host_history(self) -> Sequence[HostSample]: ...


def _recent(items: Sequence[T], since: float) -> tuple[T, ...]:
    """The items newer than `since`, oldest first, reading a deque of NamedTuples whose first
    field is their time from its newest end (so a tick costs the window, not the history)."""
    out = []
    for item in reversed(items):
        if item[0] <= since:  # type: ignore[index]
            break
        out.append(item)
    out.reverse()
    return tuple(out)


def _recent_hosts(hosts: Sequence[HostSample], since: float) -> tuple[HostSample, ...]:
    out = []
    for h in reversed(hosts):
        if h.t_s <= since:
            break
        out.append(h)
    out.reverse()
    return tuple(out)


def windows_for(sampler: HistoriesLike, tick: Tick, th: Thresholds) -> list[GpuWindow]:
    t = tick.t_s
    hosts = _recent_hosts(sampler.host_history, t - th.host_window_s)
    since = t - th.window_s
    out = []
    for g in tick.gpus:
        hist = sampler.history.get((g.index, g.uuid))
        if hist is not None:
            out.append(GpuWindow(t, g, _recent(hist.samples, since), _recent(hist.points, since), hosts))
    return out


class DetectorSink:
    """The detector stage of the pipeline: after each tick, a window per GPU in, verdicts out.
    Keeps the latest verdicts (what the daemon publishes)."""

    def __init__(self, sampler: HistoriesLike, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.sampler = sampler
        self.thresholds = thresholds
        self.fleet = FleetDetector(thresholds)
        self.advisor = Advisor(thresholds)
        """What a fix buys, per GPU and episode (docs/detector.md)."""
        self.latest: list[Verdict] = []

    def feed(self, tick: Tick) -> list[Verdict]:
        verdicts = self.fleet.feed(windows_for(self.sampler, tick, self.thresholds))
        self.advisor.feed(verdicts)
        self.latest = verdicts
        return verdicts

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """New thresholds (SIGHUP) for every GPU, from the next tick on; totals are kept."""
        self.thresholds = thresholds
        self.fleet.thresholds = thresholds
        self.advisor.thresholds = thresholds
        for det in self.fleet.gpus.values():
            det.thresholds = thresholds
