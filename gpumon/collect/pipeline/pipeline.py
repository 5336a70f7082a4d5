"""Pipeline: sources, sampler and detector built in one place, sinks by subscription."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from gpumon.collect.pipeline.sources import OpenedSources, open_sources
from gpumon.collect.pipeline.spec import AttributionSpec, SourceDescription, SourceSpec
from gpumon.collect.pipeline.supervisor import StopSupervision, Supervisor
from gpumon.collect.sampler import DEFAULT_INTERVAL_S, Sampler
from gpumon.collect.sources.jobs import JobSource
from gpumon.core.clock import Clock
from gpumon.core.model import GpuSample, Tick
from gpumon.core.problems import Problems
from gpumon.core.threads import named_thread
from gpumon.detect.stage import DetectorSink
from gpumon.detect.thresholds import DEFAULT_THRESHOLDS, Thresholds
from gpumon.detect.tracker import MAX_EPISODES_KEPT, Verdict

if TYPE_CHECKING:
    from gpumon.collect.sources.kubelet import KubeletClient


log = logging.getLogger("gpumon")

T = TypeVar("T")

DEFAULT_HISTORY_S = 300.0
"""History kept per GPU: five minutes (at least twice the detector's window, whatever it is)."""
NVML_CALL_TIMEOUT_S = 1.0
"""The longest a sampling thread may stay in one NVML call before it is replaced."""


DEFAULT_ATTRIBUTION = AttributionSpec()
"""Every command attributes GPUs to jobs from the standard places unless told otherwise."""


def history_window_s(requested: float | None, thresholds: Thresholds) -> float:
    """The one rule for how much history the sampler keeps."""
    return max(requested or DEFAULT_HISTORY_S, 2 * thresholds.window_s)


class Pipeline:
    def __init__(
        self,
        spec: SourceSpec,
        clock: Clock,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        history_s: float | None = None,
        retry_nvml: bool = False,
        nvml_call_timeout_s: float = NVML_CALL_TIMEOUT_S,
        sources: OpenedSources | None = None,
        problems: Problems | None = None,
        attribution: AttributionSpec | None = DEFAULT_ATTRIBUTION,
        open_in_background: bool = False,
        episodes_kept: int = MAX_EPISODES_KEPT,
    ) -> None:
        """`episodes_kept`: closed episodes the detector remembers per GPU.

        `open_in_background`: the driver is opened (nvmlInit, supervised as ever) on a thread of
        its own, and `run` or `poll_once` waits for it: the caller goes on meanwhile (the daemon
        imports the rest of itself while a real driver, which may take a second, opens). For a
        caller that keeps a missing driver retrying (`retry_nvml`): an open that fails otherwise
        fails there, not here."""
        self.spec = spec
        self.clock = clock
        self._kubelet: KubeletClient | None = None
        self.problems = problems or Problems(log)
        self.sources = sources or open_sources(spec, clock, self.problems, retry_nvml=retry_nvml)
        guard = self.sources.guard
        self.supervisor = Supervisor(guard, nvml_call_timeout_s) if guard is not None else None
        self._opening: threading.Thread | None = None
        self._open_failed: list[BaseException] = []
        if self.sources.start is not None:
            if open_in_background:
                self._opening = named_thread(self._open, "gpumon-open")
                self._opening.start()
            else:
                self._open()
                if self._open_failed:
                    raise self._open_failed[0]
        self.sampler = Sampler(
            self.sources.gpu,
            self.sources.host,
            clock,
            interval_s=interval_s,
            window_s=history_window_s(history_s, thresholds),
            problems=self.problems,
            job_source=self._job_source(spec, attribution),
        )
        self.detector = DetectorSink(self.sampler, thresholds, episodes_kept)
        self._tick_sinks: list[Callable[[Tick], None]] = []
        self._verdict_sinks: list[Callable[[Tick, list[Verdict]], None]] = []
        self.sampler.on_tick.append(self._after_tick)

    def _open(self) -> None:
        assert self.sources.start is not None
        try:
            self._call(self.sources.start)
        except BaseException as e:
            self.sources.close()
            self._open_failed.append(e)

    def _opened(self, stop: threading.Event | None = None) -> bool:
        """Wait for a background open; raise what it raised. False when `stop` was set first (a
        daemon told to stop while its driver still opens stops at once)."""
        opening = self._opening
        while opening is not None and opening.is_alive():
            if stop is not None and stop.is_set():
                return False
            opening.join(0.1)
        if self._open_failed:
            raise self._open_failed[0]
        return True

    def _job_source(self, spec: SourceSpec, attribution: AttributionSpec | None) -> JobSource | None:
        """Live GPUs get their jobs attributed; a replay keeps the jobs it recorded."""
        if attribution is None or spec.kind == "replay":
            return None
        # a simulated GPU's processes are made up: their pids may be anyone's on this host
        cgroups = attribution.cgroups and spec.kind != "simulated"
        kubelet = None
        if attribution.kubelet_socket is not None:
            # the kubelet's client: only where pods are attributed (most hosts start without it)
            from gpumon.collect.sources.kubelet import KubeletClient

            kubelet = KubeletClient(self.problems, attribution.kubelet_socket, attribution.kubelet_refresh_s)
            kubelet.start()  # its own thread: the kubelet is never asked on a tick or a scrape
            self._kubelet = kubelet
        return JobSource(self.problems, attribution.jobs_dir, attribution.dcgm_dir, cgroups, kubelet=kubelet)

    # -- sinks -----------------------------------------------------------------------------------

    def on_tick(self, sink: Callable[[Tick], None]) -> None:
        """`sink(tick)` after each tick, with what the sources gave (a trace writer)."""
        self._tick_sinks.append(sink)

    def on_verdicts(self, sink: Callable[[Tick, list[Verdict]], None]) -> None:
        """`sink(tick, verdicts)` after each tick, once the detector has judged it."""
        self._verdict_sinks.append(sink)

    def _after_tick(self, tick: Tick) -> None:
        for sink in self._tick_sinks:
            sink(tick)
        if self._verdict_sinks:  # nobody listens (record): the detector costs nothing
            verdicts = self.detector.feed(tick)
            for vsink in self._verdict_sinks:
                vsink(tick, verdicts)

    @property
    def description(self) -> SourceDescription:
        return self.sources.description

    @property
    def thresholds(self) -> Thresholds:
        return self.detector.thresholds

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self.detector.set_thresholds(thresholds)

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        duration_s: float | None = None,
        stop: threading.Event | None = None,
        first_tick_s: float | None = None,
    ) -> None:
        """Sample until `duration_s` has passed, `stop` is set or a replay ends. `first_tick_s`:
        the first tick this soon after start (default: one interval)."""
        if not self._opened(stop):
            return
        self.sampler.start(first_tick_s)
        until = self.sampler.until(duration_s)  # once: a thread that takes over keeps the same end

        def loop() -> None:
            self.sampler.run(
                stop=stop, exhausted=self.sources.exhausted, until_s=until, next_data=self.sources.next_data
            )

        self._call(loop, stop)

    def poll_once(self) -> list[GpuSample]:
        """One reading of the GPUs, as `gpumon devices` shows it."""
        self._opened()
        t = self.clock.now()
        return self._call(lambda: self.sources.gpu.poll(t))

    def _call(self, fn: Callable[[], T], stop: threading.Event | None = None) -> T:
        if self.supervisor is None:
            return fn()
        try:
            return self.supervisor.call(fn, stop)
        except StopSupervision:
            return None  # type: ignore[return-value]  # stopped while stuck: nothing to return

    @property
    def stuck_threads(self) -> int:
        return self.sources.guard.stuck_threads if self.sources.guard is not None else 0

    def close(self) -> None:
        if self._opening is not None:  # an open under way: a moment to finish before the driver closes
            self._opening.join(timeout=0.5)
        if self._kubelet is not None:
            self._kubelet.stop()
        self.sources.close()
