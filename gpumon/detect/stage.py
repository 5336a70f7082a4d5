"""The detector stage: after each tick, cut a window per GPU from the sampler's ring buffers and
feed it to the fleet detector. The pipeline runs it for `watch`, `serve` and `analyze` (which
replays a trace through the sampler on a virtual clock), so live and offline verdicts agree.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from gpumon.core.model import GpuSample, HostSample, Tick, UtilPoint
from gpumon.detect.advisor import Advisor
from gpumon.detect.evidence import PERIOD_POINTS, GpuWindow, sample_period
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.tracker import MAX_EPISODES_KEPT, FleetDetector, Verdict

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
    """The items newer than `since`, oldest first, from a sequence of samples with a `t_s`, in
    increasing order (the sampler's ring buffers only append later ones). A binary search for the
    cut and a copy in C: this runs twice per GPU per tick, over a window of ~200 points (a Python
    loop over them was a fifth of an idle daemon's tick)."""
    if not items or _time(items[0]) > since:
        return tuple(items)
    return tuple(islice(items, bisect_right(items, since, key=_time), None))


_time: Callable[[Any], float] = attrgetter("t_s")


def window_cutter(
    sampler: HistoriesLike, tick: Tick, th: Thresholds
) -> tuple[Callable[[GpuSample], GpuWindow | None], Callable[[GpuSample], tuple[int, float | None]]]:
    """Each GPU's window at the tick, cut when asked (None: no history), and how many driver
    samples it holds and their period, read without cutting it: the detector cuts the windows of
    the GPUs it judges only (a GPU at rest carries its verdict on: FleetDetector.judge). The host
    window is cut once, at the first."""
    t = tick.t_s
    since = t - th.window_s
    hosts: list[tuple[HostSample, ...]] = []

    def cut(g: GpuSample) -> GpuWindow | None:
        hist = sampler.history.get((g.index, g.uuid))
        if hist is None:
            return None
        if not hosts:
            hosts.append(_recent(sampler.host_history, t - th.host_window_s))
        return GpuWindow(t, g, _recent(hist.samples, since), _recent(hist.points, since), hosts[0])

    def shape(g: GpuSample) -> tuple[int, float | None]:
        hist = sampler.history.get((g.index, g.uuid))
        if hist is None:
            return 0, None
        points = hist.points
        n = (
            len(points)
            if not points or _time(points[0]) > since
            else len(points) - bisect_right(points, since, key=_time)
        )
        newest = list(islice(reversed(points), min(n, PERIOD_POINTS)))
        newest.reverse()
        return n, sample_period(newest)

    return cut, shape


class DetectorSink:
    """The detector stage of the pipeline: after each tick, a window per GPU in, verdicts out.
    Keeps the latest verdicts (what the daemon publishes)."""

    def __init__(
        self,
        sampler: HistoriesLike,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        episodes_kept: int = MAX_EPISODES_KEPT,
    ) -> None:
        """`episodes_kept`: closed episodes remembered per GPU (and their advice)."""
        self.sampler = sampler
        self.thresholds = thresholds
        self.fleet = FleetDetector(thresholds, episodes_kept)
        self.advisor = Advisor(thresholds, episodes_kept)
        """What a fix buys, per GPU and episode (docs/detector.md)."""
        self.latest: list[Verdict] = []

    def feed(self, tick: Tick) -> list[Verdict]:
        cut, shape = window_cutter(self.sampler, tick, self.thresholds)
        verdicts = self.fleet.judge(tick.t_s, tick.gpus, cut, shape)
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
