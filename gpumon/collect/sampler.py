"""The sampling loop: ticks on an injected clock, isolates sources, keeps bounded history.

Ticks are scheduled at start + k * interval, not "sleep interval after the last one", so the
cadence does not drift with the time each tick takes. A tick that is late by more than an interval
(a suspended laptop, a blocked host) skips ahead instead of bursting to catch up; skips are counted.

Each source runs isolated, as node_exporter's collectors do: a failure is timed, counted per source
and logged once per cause; the tick goes on with what the other sources gave.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpumon.core.clock import Clock
from gpumon.core.errors import GpumonError
from gpumon.core.model import AttributionStatus, GpuSample, HostSample, Tick, UtilPoint
from gpumon.core.problems import Problems

log = logging.getLogger("gpumon.collect.sampler")

DEFAULT_INTERVAL_S = 1.0
"""One tick a second: NVML's slowest utilization period, and a cost of well under 0.1% of a core."""
DEFAULT_WINDOW_S = 300.0
"""History kept per GPU for the detector: five minutes."""
MAX_UTIL_POINTS_PER_S = 6
"""NVML's finest utilization period is 1/6 s."""


class GpuSource(Protocol):
    name: str

    def poll(self, t_s: float) -> list[GpuSample]: ...


class HostSourceLike(Protocol):
    name: str

    def poll(self, t_s: float, gpu_pids: Any = ()) -> HostSample | None: ...


class JobSourceLike(Protocol):
    """Job attribution: the GPUs back with their `jobs` filled in, and how each of its own
    sources fared (`status`, for gpumon_attribution_up)."""

    name: str
    status: tuple[AttributionStatus, ...]

    def poll(self, t_s: float, gpus: Sequence[GpuSample]) -> list[GpuSample]: ...


@dataclass
class SourceStats:
    """How one source fared: what the exporter reports as gpumon_source_* series."""

    runs: int = 0
    failures: int = 0
    last_success: bool = True
    last_duration_s: float = 0.0
    last_error: str | None = None
    """Why the last reading failed (None after a success)."""

    def copy(self) -> SourceStats:
        """A copy, field for field (dataclasses.replace goes through __init__ by keyword, several
        times slower; the daemon copies each source's after every tick)."""
        new = object.__new__(SourceStats)
        new.__dict__.update(self.__dict__)
        return new


class GpuHistory:
    """A bounded window of one GPU's samples and sub-second utilization points."""

    def __init__(self, window_s: float, interval_s: float) -> None:
        self.samples: deque[GpuSample] = deque(maxlen=max(2, math.ceil(window_s / interval_s) + 1))
        self.points: deque[UtilPoint] = deque(
            maxlen=math.ceil(window_s * MAX_UTIL_POINTS_PER_S) + MAX_UTIL_POINTS_PER_S
        )

    def add(self, sample: GpuSample) -> None:
        self.samples.append(sample)
        last = self.points[-1].t_s if self.points else -math.inf
        self.points.extend(p for p in sample.util_history if p.t_s > last)

    @property
    def last_t_s(self) -> float:
        return self.samples[-1].t_s if self.samples else -math.inf


@dataclass(eq=False)  # state, not a value: equal only to itself
class Sampler:
    """Reads the sources on a fixed grid and keeps each GPU's and the host's recent samples."""

    gpu_source: GpuSource
    host_source: HostSourceLike | None
    clock: Clock
    interval_s: float = DEFAULT_INTERVAL_S
    window_s: float = DEFAULT_WINDOW_S
    on_tick: list[Callable[[Tick], None]] = field(default_factory=list)
    problems: Problems = field(default_factory=lambda: Problems(log))
    timer: Callable[[], float] = time.perf_counter
    """What a source's reading is timed with (gpumon_source_duration_seconds): real seconds, whatever
    `clock` the samples are stamped with (a virtual one replays faster than real time). A vDSO read,
    where the process's CPU clock it replaced is a system call: ~2 us each at a 1 s cadence here, six
    a tick."""
    job_source: JobSourceLike | None = None

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.history: dict[tuple[int, str], GpuHistory] = {}
        self.host_history: deque[HostSample] = deque(
            maxlen=max(2, math.ceil(self.window_s / self.interval_s) + 1)
        )
        self.stats: dict[str, SourceStats] = {}
        self.ticks = 0
        self.skipped_ticks = 0
        self.last_tick: Tick | None = None
        self._lock = threading.Lock()
        self._start: float | None = None
        self._k = 1
        self._host_after_first = False
        """The first tick, taken at once, leaves the host out; its baseline is read a little after
        (`_host_baseline`): the daemon's first answer waits neither for that reading nor for what
        the host source loads at its first (psutil, ~7 ms: pipeline.sources.HostOnFirstPoll)."""

    # -- one tick ------------------------------------------------------------------------------

    def _run(self, name: str, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        stats = self.stats.setdefault(name, SourceStats())
        start = self.timer()
        try:
            result = fn(*args)
            ok = True
        except Exception as e:  # isolation: one failing source never stops the others
            why = str(e) if isinstance(e, GpumonError) else f"{type(e).__name__}: {e}"
            self.problems.note(f"{name}:failed", f"source {name} failed: {why}")
            stats.last_error = why
            result, ok = None, False
        stats.runs += 1
        stats.last_success = ok
        if ok:
            stats.last_error = None
        stats.failures += 0 if ok else 1
        stats.last_duration_s = self.timer() - start
        if ok and self.problems.any_active:
            self.problems.clear(f"{name}:failed")
        return ok, result

    def tick(self, t_s: float | None = None) -> Tick:
        t = self.clock.now() if t_s is None else t_s
        errors = []
        ok, gpus = self._run(self.gpu_source.name, self.gpu_source.poll, t)
        if not ok:
            errors.append(self.gpu_source.name)
            gpus = []
        host: HostSample | None = None
        if self._host_after_first and self.ticks:
            self._host_after_first = False  # ticks driven by hand, not by run(): read as before
        if self.host_source is not None and not self._host_after_first:
            pids = _pids(gpus)
            ok, host = self._run(self.host_source.name, self.host_source.poll, t, pids)
            if not ok:
                errors.append(self.host_source.name)
        attribution: tuple[AttributionStatus, ...] = ()
        if self.job_source is not None and gpus:
            ok, attributed = self._run(self.job_source.name, self.job_source.poll, t, gpus)
            if ok:
                gpus = attributed
                attribution = self.job_source.status
            else:
                errors.append(self.job_source.name)
                attribution = (
                    AttributionStatus(
                        self.job_source.name, False, self.stats[self.job_source.name].last_error
                    ),
                )
        tick = Tick(t_s=t, gpus=tuple(gpus), host=host, source_errors=tuple(errors), attribution=attribution)
        with self._lock:
            self._remember(tick)
        for sink in self.on_tick:
            sink(tick)
        return tick

    def _remember(self, tick: Tick) -> None:
        for g in tick.gpus:
            key = (g.index, g.uuid)
            hist = self.history.get(key)
            if hist is None:
                hist = self.history[key] = GpuHistory(self.window_s, self.interval_s)
            hist.add(g)
        if tick.host is not None:
            self.host_history.append(tick.host)
        # GPUs gone for a whole window are forgotten: memory stays bounded under hot-plug churn.
        stale = [k for k, h in self.history.items() if h.last_t_s < tick.t_s - self.window_s]
        for key in stale:
            del self.history[key]
        self.ticks += 1
        self.last_tick = tick

    # -- the loop ------------------------------------------------------------------------------

    def start(self, first_tick_s: float | None = None) -> None:
        """Take the baseline readings and fix the tick schedule (once; later calls do nothing):
        the first tick `first_tick_s` after now (default one interval), the others on its grid.

        A first tick sooner than a quarter of the interval (the daemon's: its first /metrics as
        soon as the GPUs are read) has no host sample, as a rate over a few milliseconds would be
        noise (/proc/stat counts in 10 ms ticks): a host whose first reading is only a baseline is
        read a quarter of an interval after that tick (`_host_baseline`), not in it."""
        if self._start is None:
            first = self.interval_s if first_tick_s is None else min(first_tick_s, self.interval_s)
            if first >= self.interval_s / 4:
                self._prime()
            else:
                # (a replay's host gives its recorded samples from the first: read with the tick)
                self._host_after_first = getattr(self.host_source, "first_reading_is_baseline", False)
            self._start = self.clock.now() + first - self.interval_s
            self._k = 1

    def until(self, duration_s: float | None) -> float | None:
        """The end, on the sampler's clock, of a run that lasts `duration_s` from the next tick on."""
        self.start()
        assert self._start is not None
        return None if duration_s is None else self._start + (self._k - 1) * self.interval_s + duration_s

    def run(
        self,
        duration_s: float | None = None,
        stop: threading.Event | None = None,
        exhausted: Callable[[], bool] | None = None,
        *,
        until_s: float | None = None,
        next_data: Callable[[], float | None] | None = None,
    ) -> None:
        """Tick every interval until `duration_s` has passed (or the clock reaches `until_s`),
        `stop` is set or the source ends.

        The first tick comes one interval after the start, so rates have a baseline to compare.
        The schedule lives on the sampler, not in this call: a fresh thread that takes over from
        one stuck in a source (gpumon.collect.pipeline.supervisor) carries on with the same grid and end.
        `next_data` (a replay): when the source has data again; the ticks before it, which would
        have nothing to read, are passed over (not counted as skipped).
        """
        if until_s is None:
            until_s = self.until(duration_s)
        self.start()
        assert self._start is not None
        start = self._start
        while True:
            if stop is not None and stop.is_set():
                return
            target = start + self._k * self.interval_s
            if until_s is not None and target > until_s + 1e-9:
                return
            delay = target - self.clock.now()
            if delay > 0:
                self._wait(target, stop)
            elif delay < -self.interval_s:
                # resume on the next grid point still ahead, rather than tick late and then early
                missed = math.ceil(-delay / self.interval_s)
                self.skipped_ticks += missed
                log.warning("sampler fell %d tick(s) behind; skipping ahead", missed)
                self._k += missed
                continue
            if stop is not None and stop.is_set():
                return
            self._k += 1  # before the tick: a thread that takes over starts with the next one
            self.tick()
            if exhausted is not None and exhausted():
                return
            due = next_data() if next_data is not None else None
            if due is not None:
                self._k = max(self._k, math.ceil((due - start) / self.interval_s - 1e-9))

    def _wait(self, target: float, stop: threading.Event | None) -> None:
        """Sleep until `target`. Meanwhile, where the GPU source asks for it (GPM activity on MIG
        instances, which have no utilization samples: gpumon.collect.sources.nvml.gpm), call its
        `sample_activity` every `activity_period_s` on the tick's grid; the tick itself takes the
        last of them. After a first tick taken at once, the host's baseline in its turn among
        them (`_host_baseline`)."""
        host_at = self._host_baseline_at(target)
        period = getattr(self.gpu_source, "activity_period_s", None)
        if not period or period >= self.interval_s:
            if host_at is not None and not self._host_baseline(host_at, stop):
                return
            self.clock.sleep(target - self.clock.now(), stop)
            return
        at = target - self.interval_s + period
        while at < target - period / 2:
            if host_at is not None and host_at <= at:
                if not self._host_baseline(host_at, stop):
                    return
                host_at = None
            now = self.clock.now()
            if at > now:
                self.clock.sleep(at - now, stop)
            if stop is not None and stop.is_set():
                return
            if self.clock.now() < at + period / 2:  # not one long overdue (a slow host): skip those
                try:
                    self.gpu_source.sample_activity(self.clock.now())  # type: ignore[attr-defined]
                except Exception as e:  # isolation, as for the tick's own reading
                    self.problems.note(
                        f"{self.gpu_source.name}:activity",
                        f"source {self.gpu_source.name}: activity sampling between ticks: {e}",
                    )
            at += period
        if host_at is not None and not self._host_baseline(host_at, stop):
            return
        remaining = target - self.clock.now()
        if remaining > 0:
            self.clock.sleep(remaining, stop)

    def _host_baseline_at(self, target: float) -> float | None:
        """When the host's baseline is due before the tick at `target`: a quarter of an interval
        after a first tick taken at once (None: not due, or no longer before that tick, which then
        reads the host as its baseline itself)."""
        first = self.last_tick
        if not self._host_after_first or first is None or self.ticks != 1:
            return None
        at = first.t_s + self.interval_s / 4
        return at if at < target else None

    def _host_baseline(self, at: float, stop: threading.Event | None) -> bool:
        """After a first tick taken at once: the host's baseline at `at`, with that tick's GPU
        processes (whose trees the host source then starts to follow), so the second tick's rates
        are over three quarters of an interval, as ever over more than a quarter of one. False
        where `stop` was set meanwhile."""
        now = self.clock.now()
        if at > now:
            self.clock.sleep(at - now, stop)
        if stop is not None and stop.is_set():
            return False
        self._host_after_first = False
        first = self.last_tick
        if self.host_source is not None and first is not None:
            self._run(self.host_source.name, self.host_source.poll, self.clock.now(), _pids(first.gpus))
        return True

    def _prime(self) -> None:
        """A baseline reading for sources that report rates (host CPU, disk)."""
        if self.host_source is not None:
            self._run(self.host_source.name, self.host_source.poll, self.clock.now(), [])


def _pids(gpus: Sequence[GpuSample]) -> list[int]:
    """The processes on these GPUs, each once, in order: what the host source follows."""
    return sorted({p.pid for g in gpus for p in g.processes})
