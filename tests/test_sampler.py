"""The sampler on a fake clock: drift-free cadence, skipping when blocked, isolated sources,
bounded history."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest

from gpumon.collect.sampler import Sampler
from gpumon.core.clock import VirtualClock
from gpumon.core.model import GpuProcess, GpuSample, HostSample, UtilPoint
from gpumon.core.problems import Problems


class StubGpus:
    """GPU source whose readings take `cost_s` of clock time; can fail or change GPUs on demand."""

    name = "nvml"

    def __init__(self, clock: VirtualClock, cost_s: float = 0.0, n: int = 2) -> None:
        self.clock, self.cost_s, self.n = clock, cost_s, n
        self.fail: Exception | None = None
        self.uuid_suffix = ""

    def poll(self, t_s: float) -> list[GpuSample]:
        self.clock.advance(self.cost_s)
        if self.fail is not None:
            raise self.fail
        return [
            GpuSample(
                t_s=t_s,
                index=i,
                uuid=f"GPU-{i}{self.uuid_suffix}",
                name="stub",
                util_ratio=0.5,
                processes=(GpuProcess(1000 + i, None),),
                util_history=tuple(UtilPoint(t_s - k / 6, 0.5) for k in range(5, -1, -1)),
            )
            for i in range(self.n)
        ]


class StubHost:
    name = "host"
    first_reading_is_baseline = True

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.pids_seen: list[list[int]] = []
        self.polled_at: list[float] = []

    def poll(self, t_s: float, gpu_pids: list[int] = ()) -> HostSample | None:
        self.pids_seen.append(list(gpu_pids))
        self.polled_at.append(t_s)
        if self.fail is not None:
            raise self.fail
        return HostSample(t_s, 8, 0.1, 0.2, 0.0, 1.0, 0.0)


def test_ticks_do_not_drift_with_the_time_each_tick_takes() -> None:
    clock = VirtualClock(1000.0)
    s = Sampler(StubGpus(clock, cost_s=0.3), StubHost(), clock, interval_s=1.0)
    times: list[float] = []
    s.on_tick.append(lambda t: times.append(t.t_s))
    s.run(duration_s=50)
    assert len(times) == 50
    assert times == pytest.approx([1000.0 + k for k in range(1, 51)])


def test_a_blocked_tick_skips_ahead_instead_of_bursting() -> None:
    clock = VirtualClock()
    gpus = StubGpus(clock)
    s = Sampler(gpus, None, clock, interval_s=1.0)
    times: list[float] = []

    def sink(t) -> None:
        times.append(t.t_s)
        if len(times) == 3:
            clock.advance(4.5)  # the machine froze for 4.5 s after the third tick

    s.on_tick.append(sink)
    s.run(duration_s=12)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) == pytest.approx(5.0) and min(gaps) >= 0.99
    assert s.skipped_ticks == 4
    assert times[-1] <= 12.0


def test_a_failing_source_is_counted_logged_once_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    host = StubHost()
    host.fail = OSError("/proc/stat: permission denied")
    s = Sampler(StubGpus(clock), host, clock, problems=Problems(logging.getLogger("t.sampler")))
    with caplog.at_level(logging.INFO, logger="t.sampler"):
        ticks = [s.tick() for _ in range(5)]
        host.fail = None
        ok = s.tick()
    assert all(len(t.gpus) == 2 and t.host is None and t.source_errors == ("host",) for t in ticks)
    assert ok.host is not None and ok.source_errors == ()
    assert s.stats["host"].failures == 5 and s.stats["host"].last_success
    assert s.stats["nvml"].failures == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "permission denied" in warnings[0].getMessage()
    assert any("recovered after 5 failures" in r.getMessage() for r in caplog.records)


def test_gpu_source_failure_leaves_host_running_and_is_visible_in_the_tick() -> None:
    clock = VirtualClock()
    gpus = StubGpus(clock)
    gpus.fail = RuntimeError("nvmlDeviceGetCount failed: Driver Not Loaded")
    s = Sampler(gpus, StubHost(), clock)
    t = s.tick()
    assert t.gpus == () and t.host is not None and t.source_errors == ("nvml",)
    assert s.stats["nvml"].last_success is False


def test_host_source_is_asked_about_the_gpu_processes() -> None:
    clock = VirtualClock()
    host = StubHost()
    Sampler(StubGpus(clock, n=3), host, clock).tick()
    assert host.pids_seen[-1] == [1000, 1001, 1002]


def test_a_first_tick_at_once_leaves_the_host_out_and_reads_its_baseline_a_quarter_later() -> None:
    """The daemon's first tick comes at once (its first answer as soon as the GPUs are read): the
    host is not read in it (the real host source loads psutil at its first reading); its baseline
    is read a quarter of an interval later, with that tick's GPU processes, and the second tick
    carries the host as before."""
    clock = VirtualClock(1000.0)
    host = StubHost()
    s = Sampler(StubGpus(clock, n=2), host, clock, interval_s=1.0)
    seen: list[tuple[float, bool, int]] = []
    s.on_tick.append(lambda t: seen.append((t.t_s, t.host is not None, len(host.polled_at))))
    s.start(first_tick_s=0.0)
    s.run(until_s=1002.0)
    assert seen == [(1000.0, False, 0), (1001.0, True, 2), (1002.0, True, 3)]
    assert host.polled_at == pytest.approx([1000.25, 1001.0, 1002.0])
    assert host.pids_seen == [[1000, 1001]] * 3


def test_a_replayed_host_is_read_with_a_first_tick_taken_at_once() -> None:
    """A replay's host gives its recorded sample from the first reading: the first tick keeps it."""
    clock = VirtualClock(1000.0)
    host = StubHost()
    host.first_reading_is_baseline = False
    s = Sampler(StubGpus(clock, n=1), host, clock, interval_s=1.0)
    hosts: list[bool] = []
    s.on_tick.append(lambda t: hosts.append(t.host is not None))
    s.start(first_tick_s=0.0)
    s.run(until_s=1001.0)
    assert hosts == [True, True]
    assert host.polled_at == pytest.approx([1000.0, 1001.0])


def test_a_first_tick_an_interval_away_reads_the_host_with_it_after_a_baseline() -> None:
    clock = VirtualClock(1000.0)
    host = StubHost()
    s = Sampler(StubGpus(clock, n=1), host, clock, interval_s=1.0)
    hosts: list[bool] = []
    s.on_tick.append(lambda t: hosts.append(t.host is not None))
    s.run(duration_s=2)
    assert hosts == [True, True]
    assert host.polled_at == pytest.approx([1000.0, 1001.0, 1002.0])
    assert host.pids_seen[0] == []  # the baseline, before any GPU was read


def test_a_sources_duration_is_its_real_time_not_the_clocks() -> None:
    """gpumon_source_duration_seconds: what a reading took in real seconds, also when the samples
    are stamped by a virtual clock (replay at --speed max) that a slow source moves by hours."""
    clock = VirtualClock()
    real = iter([10.0, 10.25, 10.25, 10.5, 20.0, 20.004, 20.004, 20.01])
    s = Sampler(StubGpus(clock, cost_s=3600.0), StubHost(), clock, timer=lambda: next(real))
    s.tick()
    assert s.stats["nvml"].last_duration_s == pytest.approx(0.25)
    assert s.stats["host"].last_duration_s == pytest.approx(0.25)
    s.tick()
    assert s.stats["nvml"].last_duration_s == pytest.approx(0.004)
    assert s.stats["host"].last_duration_s == pytest.approx(0.006)


def test_history_is_bounded_by_the_window_however_long_it_runs() -> None:
    clock = VirtualClock()
    s = Sampler(StubGpus(clock), StubHost(), clock, interval_s=1.0, window_s=60.0)
    s.run(duration_s=5000)
    hist = s.history[(0, "GPU-0")]
    assert len(hist.samples) <= 61 and len(hist.points) <= 60 * 6 + 6
    assert len(s.host_history) <= 61
    assert hist.samples[-1].t_s == pytest.approx(5000.0)
    pts = [p.t_s for p in hist.points]
    assert pts == sorted(pts) and len(set(pts)) == len(pts), "no duplicated sub-second points"


def test_gpus_that_vanish_are_forgotten_after_a_window() -> None:
    clock = VirtualClock()
    gpus = StubGpus(clock)
    s = Sampler(gpus, None, clock, interval_s=1.0, window_s=10.0)
    s.run(duration_s=5)
    gpus.uuid_suffix = "-replaced"  # same indexes, new boards
    s.run(duration_s=20)
    assert set(s.history) == {(0, "GPU-0-replaced"), (1, "GPU-1-replaced")}


def test_stop_event_ends_the_loop() -> None:
    clock = VirtualClock()
    stop = threading.Event()
    s = Sampler(StubGpus(clock), None, clock)
    s.on_tick.append(lambda t: stop.set() if s.ticks == 7 else None)
    s.run(stop=stop)
    assert s.ticks == 7


class FastStub(StubGpus):
    """A GPU source that asks to be sampled between ticks (GPM on MIG instances)."""

    activity_period_s: float | None = 0.2

    def __init__(self, clock: VirtualClock, fail_fast: bool = False) -> None:
        super().__init__(clock)
        self.activity: list[float] = []
        self.fail_fast = fail_fast

    def sample_activity(self, t_s: float) -> None:
        self.activity.append(round(t_s, 6))
        if self.fail_fast:
            raise RuntimeError("driver said no")


def test_a_source_that_asks_is_sampled_between_ticks_on_the_tick_grid() -> None:
    clock = VirtualClock(100.0)
    gpus = FastStub(clock)
    s = Sampler(gpus, None, clock, interval_s=1.0)
    ticks: list[float] = []
    s.on_tick.append(lambda t: ticks.append(t.t_s))
    s.run(duration_s=3)
    assert ticks == pytest.approx([101.0, 102.0, 103.0])
    # four steps between ticks (the tick itself takes the fifth), none on a tick, none after the end
    expected = [round(100.0 + k + j * 0.2, 6) for k in range(3) for j in range(1, 5)]
    assert gpus.activity == pytest.approx(expected)


class SlowHost(StubHost):
    """A host whose reading takes clock time (the real one's first: psutil's import)."""

    def __init__(self, clock: VirtualClock, cost_s: float) -> None:
        super().__init__()
        self.clock, self.cost_s = clock, cost_s

    def poll(self, t_s: float, gpu_pids: list[int] = ()) -> HostSample | None:
        self.clock.advance(self.cost_s)
        return super().poll(t_s, gpu_pids)


@pytest.mark.parametrize(("interval_s", "host_cost_s"), [(1.0, 0.06), (10.0, 0.0)])
def test_the_host_baseline_after_a_first_tick_at_once_keeps_the_activity_grid(
    interval_s: float, host_cost_s: float
) -> None:
    """The host's baseline is read in its turn among the steps between the first two ticks: each
    step is taken on the tick's grid, as between any two ticks (it once slept through them)."""
    clock = VirtualClock(100.0)
    gpus = FastStub(clock)
    host = SlowHost(clock, host_cost_s)
    s = Sampler(gpus, host, clock, interval_s=interval_s)
    s.start(first_tick_s=0.0)
    s.run(until_s=100.0 + 2 * interval_s)
    steps = round(interval_s / 0.2) - 1
    expected = [round(100.0 + k * interval_s + j * 0.2, 6) for k in range(2) for j in range(1, steps + 1)]
    assert gpus.activity == pytest.approx(expected, abs=host_cost_s + 1e-9)
    assert host.polled_at[0] == pytest.approx(100.0 + interval_s / 4, abs=host_cost_s + 1e-9)


def test_failing_steps_between_ticks_are_a_problem_not_a_stop(caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock()
    gpus = FastStub(clock, fail_fast=True)
    s = Sampler(gpus, None, clock, interval_s=1.0, problems=Problems(logging.getLogger("t")))
    ticks: list[float] = []
    s.on_tick.append(lambda t: ticks.append(t.t_s))
    with caplog.at_level(logging.WARNING):
        s.run(duration_s=3)
    assert len(ticks) == 3 and len(gpus.activity) == 12
    assert sum("activity sampling between ticks: driver said no" in r.message for r in caplog.records) == 1, (
        "logged once"
    )
