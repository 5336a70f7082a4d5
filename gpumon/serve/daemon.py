"""`gpumon serve`: the daemon's wiring and lifecycle. A pipeline (gpumon.collect.pipeline) samples
and judges; after each tick the daemon publishes an immutable Snapshot (gpumon.serve.snapshot), and
everything it serves reads only that: the exposition (gpumon.serve.exposition, rendered once per
snapshot), the state API, health, PCP's endpoint; the analysis API reads the flight recorder.

Threads: the sampler ticks in its own (supervised) thread and publishes; HTTP requests run on one
event loop (gpumon.serve.http); the main thread waits for signals with sigwait, so nothing wakes
while idle: SIGTERM/SIGINT stop within 2 s, SIGHUP reloads the configuration. systemd hears READY
once the first tick is published, WATCHDOG from the sampling loop while NVML gives fresh data (so a
wedged sampler or a hung driver gets the service restarted), RELOADING and STOPPING.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumon.collect.pipeline import Pipeline
from gpumon.collect.pipeline.sources import OpenedSources
from gpumon.config.settings import SETTINGS, Config
from gpumon.core import memory
from gpumon.core.clock import Clock, MonotonicClock
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.core.threads import named_thread
from gpumon.detect.remedies import Advice
from gpumon.detect.tracker import Episode, StarvationDetector, Verdict
from gpumon.serve import health
from gpumon.serve.exposition import Exposition
from gpumon.serve.http import Routes, WebServer
from gpumon.serve.landing import landing_page
from gpumon.serve.sampling import EPISODES_KEPT, daemon_pipeline
from gpumon.serve.sdnotify import Notifier
from gpumon.serve.signals import DAEMON_SIGNALS, block_signals, wake_main_thread
from gpumon.serve.snapshot import GpuCounters, Snapshot, to_state_json
from gpumon.serve.verdict_log import VerdictLog
from gpumon.serve.webconfig import load_web_config
from gpumon.trace.recorder import Recorder, unix_offset_of
from gpumon.trace.segments import default_directory

if TYPE_CHECKING:
    from gpumon.serve.analysis_api import AnalysisApi, Answer

log = logging.getLogger("gpumon")

FIRST_TICK_S = 0.0
"""The first sample comes as soon as the sources are open (later ones on the interval's grid); it
carries the GPUs, the host's rates come from the second tick on (Sampler.start)."""
TRIM_EVERY_S = 60.0
"""How often (real time) the sampling thread hands malloc's free pages back (gpumon.core.memory):
a trim takes 0.2-0.5 ms here (a thousandth of a per cent of a core at this cadence). Every ten
minutes, the RSS rose between trims by what the next gave back (0.2-0.4 MB); side by side with that,
a minute's trim held the same level within the noise, with lower peaks (docs/benchmarks.md)."""


class Daemon:
    def __init__(
        self,
        cfg: Config,
        reload: Callable[[], Config] | None = None,
        clock: Clock | None = None,
        sources: OpenedSources | None = None,
        notifier: Notifier | None = None,
        problems: Problems | None = None,
        duration_s: float | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        """`duration_s`: stop (exit 0) after this long on the sampler's clock (a demo, a
        simulation at --speed max); by default, serve until told to stop. `pipeline`: one built
        already (gpumon.serve.sampling.daemon_pipeline, on the same clock), else built here."""
        self.cfg = cfg
        self.duration_s = duration_s
        self._reload = reload
        self.stop_event = threading.Event()
        self.clock = clock or MonotonicClock()
        self.notifier = notifier or Notifier()
        self.web_config = load_web_config(cfg.web_config_file)
        self.pipeline = pipeline or daemon_pipeline(cfg, self.clock, sources=sources, problems=problems)
        self.sampler = self.pipeline.sampler
        self.detector = self.pipeline.detector
        self.sources = self.pipeline.sources
        self._unix_offset = unix_offset_of(self.clock, isinstance(self.clock, MonotonicClock))
        self._ready = threading.Event()
        self.recorder = self._recorder(cfg)
        if self.recorder is not None:
            self.pipeline.on_tick(self.recorder.submit)
        self.pipeline.on_verdicts(self._publish)
        self.snapshot: Snapshot | None = None
        self.exposition = Exposition(lambda: self.snapshot, self.clock.now)
        th = cfg.thresholds
        self.recent = (
            VerdictLog(cfg.interval_s, th.window_s + th.confirm_s) if self.recorder is not None else None
        )
        self.freshness = health.NvmlFreshness(self.pipeline.spec.real_gpus, self.clock.now())
        self.web: WebServer | None = None
        self._sampler_thread: threading.Thread | None = None
        self.failed = False
        """The sampling loop died: the process must end with a failure (systemd restarts it)."""
        self._closed_episodes: dict[tuple[int, str], tuple[int, tuple[Episode, ...]]] = {}
        self._hostname = socket.gethostname()
        self._trim_clock = time.monotonic
        self._next_trim = self._trim_clock() + TRIM_EVERY_S

    def _recorder(self, cfg: Config) -> Recorder | None:
        """The flight recorder (gpumon.trace.recorder): on for real GPUs unless `record = "off"`;
        for simulated and replayed ones only when told where (record_dir) or `record = "on"`, so a
        demo never mixes made-up samples into a machine's history."""
        real = self.pipeline.spec.real_gpus
        if cfg.record == "off" or (cfg.record == "auto" and not real and cfg.record_dir is None):
            return None
        real_time = isinstance(self.clock, MonotonicClock)
        directory = cfg.record_dir or default_directory()
        log.info("recording every sample to %s", directory)
        return Recorder(
            directory,
            self.sources.description.to_json(),
            cfg.interval_s,
            self._unix_offset,
            segment_s=cfg.record_segment_s,
            max_age_s=cfg.record_max_age_s,
            max_bytes=cfg.record_max_bytes,
            block=not real_time,  # a simulation at full speed waits for the disk, losing nothing
            held=True,  # it starts writing once the first sample is out (_publish releases it)
        )

    # -- publishing ----------------------------------------------------------------------------

    def _publish(self, tick: Tick, verdicts: list[Verdict]) -> None:
        counters = {
            key: GpuCounters(
                dict(det.seconds_in_state),
                dict(det.starved_seconds_by_cause),
                dict(det.episodes_started),
                det.wasted_gpu_s,
                self._recent_episodes(key, det),
            )
            for key, det in self.detector.fleet.gpus.items()
        }
        self.freshness.observe(tick, self.sampler.stats.get(self.sources.gpu.name))
        unix_offset = self._unix_offset()
        if self.recent is not None:
            episodes = {key: c.episodes for key, c in counters.items()}
            self.recent.record(tick, verdicts, tick.t_s + unix_offset, episodes, EPISODES_KEPT)
        self.snapshot = Snapshot(
            t_s=tick.t_s,
            tick=tick,
            verdicts=tuple(verdicts),
            counters=counters,
            sources={k: v.copy() for k, v in self.sampler.stats.items()},
            ticks=self.sampler.ticks,
            skipped_ticks=self.sampler.skipped_ticks,
            source_description=self.sources.description,
            problems=self.pipeline.problems.active(),
            problem_totals=dict(self.pipeline.problems.totals),
            unix_offset_s=unix_offset,
            hostname=self._hostname,
            recorder=self.recorder.stats() if self.recorder is not None else None,
            advice=self._advice(tick.t_s),
        )
        if self.nvml_trouble(tick.t_s)[0] != "stale":
            self.notifier.watchdog()  # from the sampling loop: a wedged sampler stops the pings
        if not self._ready.is_set():
            self._ready.set()
            if self.recorder is not None:
                self.recorder.release()
            # systemd hears READY with the first sample, however long the driver took to open (the
            # HTTP server is up already: start() starts it before the sampling thread)
            self.notifier.ready(f"sampling {len(tick.gpus)} GPU(s)")
        now = self._trim_clock()
        if now >= self._next_trim:
            self._next_trim = now + TRIM_EVERY_S
            memory.trim()

    def _advice(self, t_s: float) -> dict[tuple[int, str], Advice]:
        """What a fix buys on each GPU that has something to say (starved, or fed)."""
        advisor = self.detector.advisor
        found = ((key, advisor.current(key, t_s)) for key in self.detector.fleet.gpus)
        return {key: a for key, a in found if a is not None}

    def _recent_episodes(self, key: tuple[int, str], det: StarvationDetector) -> tuple[Episode, ...]:
        """The last EPISODES_KEPT closed ones, all the daemon's detector keeps (copied only when one
        closed), and the open one."""
        started = sum(det.episodes_started.values())
        cached = self._closed_episodes.get(key)
        if cached is None or cached[0] != started:
            # (bounded here too: a pipeline the caller built may keep more)
            closed = tuple(itertools.islice(reversed(det.episodes), EPISODES_KEPT))[::-1]
            cached = self._closed_episodes[key] = (started, closed)
        current = det.current
        return cached[1] + ((current,) if current is not None else ())

    # -- what is served --------------------------------------------------------------------------

    @functools.cached_property
    def analysis(self) -> AnalysisApi:
        """The range API (gpumon.serve.analysis_api), made and imported at its first request:
        nothing of it is needed for the first sample."""
        from gpumon.serve.analysis_api import AnalysisApi  # not needed for the first sample

        return AnalysisApi(
            self.recorder.directory if self.recorder is not None else None,
            lambda: self.cfg,
            recent=self.recent,
            header=lambda: {"source": self.sources.description.to_json(), "interval_s": self.cfg.interval_s},
            now=lambda: self.clock.now() + self._unix_offset(),
        )

    async def _analysis(self, query: str, client: str) -> Answer:
        return await self.analysis.answer(query, client)

    def nvml_trouble(self, now: float) -> tuple[str | None, str]:
        return self.freshness.trouble(
            now, self.cfg.nvml_stale_s, self.sampler.stats.get(self.sources.gpu.name)
        )

    def render_metrics(self, accept: str, gzip_ok: bool = False) -> tuple[bytes, str, str | None]:
        return self.exposition.render(accept, gzip_ok)

    def render_pcp(self) -> bytes:

        from gpumon.serve.pcp import render  # PCP's dialect, for the few hosts that ask: loaded then

        return render(self.snapshot)

    def state(self) -> dict[str, Any]:
        snap = self.snapshot
        if snap is None:
            return {
                "schema": "gpumon-state/1",
                "ready": False,
                "source": self.sources.description.to_json(),
                "gpus": [],
            }
        doc = to_state_json(snap, self.clock.now() - snap.t_s)
        doc["ready"] = True
        doc["interval_s"] = self.cfg.interval_s
        return doc

    def health(self) -> tuple[bool, str]:
        now = self.clock.now()
        return health.health(self.snapshot, now, self.cfg.interval_s, self.nvml_trouble(now))

    def landing(self) -> str:
        return landing_page(self.sources.description.phrase())

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        """Start serving and sampling; returns the port (useful with port 0)."""
        if self.recorder is not None:
            self.recorder.start()
        port = self.start_http_only()
        self._sampler_thread = named_thread(self._sample, "gpumon-loop")
        self._sampler_thread.start()
        host = self.cfg.host_port[0]
        scheme = "https" if self.web_config.tls else "http"
        shown = f"[{host}]" if ":" in host else (host or "*")
        log.info("serving on %s:%d (%s), sampling every %g s", shown, port, scheme, self.cfg.interval_s)
        return port

    def start_http_only(self) -> int:
        """Serve what is already sampled; `start` adds the sampling thread (tests tick by hand)."""
        routes = Routes(
            self.render_metrics, self.state, self.health, self.landing, self.render_pcp, self._analysis
        )
        self.web = WebServer(
            self.cfg.host_port,
            routes,
            self.web_config,
            self.cfg.max_connections,
            self.cfg.request_timeout_s,
            self.cfg.keepalive_timeout_s,
        )
        self.web.start()
        return self.web.port

    def _sample(self) -> None:
        try:
            self.pipeline.run(self.duration_s, stop=self.stop_event, first_tick_s=FIRST_TICK_S)
            if self.duration_s is not None and not self.stop_event.is_set():
                log.info("ran for --duration %g s: stopping", self.duration_s)
                self.stop_event.set()
                wake_main_thread()
                return
            exhausted = self.sources.exhausted
            if exhausted is not None and exhausted():
                log.info("the replay ended: serving its last sample")
                return
        except Exception:  # a bug in the loop: exit so systemd restarts us, rather than serve stale data
            log.exception("the sampler stopped")
        if not self.stop_event.is_set():  # the loop ended without being asked to
            self.failed = True
            self.stop_event.set()
            wake_main_thread()

    @property
    def ready(self) -> bool:
        """The first sample is published."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the first published sample (in-process users: the demo, benchmarks); a stop
        ends the wait."""
        deadline = time.monotonic() + timeout
        while not self._ready.is_set() and not self.stop_event.is_set() and time.monotonic() < deadline:
            self._ready.wait(0.05)
        return self._ready.is_set()

    def reload(self) -> None:
        if self._reload is None:
            return
        self.notifier.reloading()
        try:
            new = self._reload()
            web = load_web_config(new.web_config_file)
        except Exception as e:  # a bad file must not take the daemon down: keep the old settings
            log.error("reload failed, keeping the running configuration: %s", e)
            self.notifier.ready("reload failed")
            return
        changed = [
            k for k, s in SETTINGS.items() if not s.spec.reloads and getattr(new, k) != getattr(self.cfg, k)
        ]
        if changed or web.tls != self.web_config.tls:
            log.warning("reload: %s: takes effect only on restart", ", ".join(changed) or "TLS on or off")
        if new.thresholds != self.cfg.thresholds and self.recent is not None:
            self.recent.thresholds_changed(self.clock.now() + self._unix_offset())
        self.pipeline.set_thresholds(new.thresholds)
        logging.getLogger().setLevel(new.log_level.upper())
        if self.web is not None:
            self.web.reconfigure(web)
        self.web_config = web
        # what runs: the new settings, but those that change only on restart as they started (a
        # later reload without them warned again of a change that never was: found by a
        # hostile-input pass)
        self.cfg = dataclasses.replace(new, **{k: getattr(self.cfg, k) for k in changed})
        log.info("configuration reloaded")
        self.notifier.ready("configuration reloaded")

    def stop(self) -> None:
        self.notifier.stopping()
        self.stop_event.set()
        if self.web is not None:
            self.web.stop()
        if self._sampler_thread is not None:
            self._sampler_thread.join(timeout=1.5)
        if self.recorder is not None:
            self.recorder.close()  # what is queued is written, the segment ends whole
        self.pipeline.close()


def run_forever(daemon: Daemon) -> int:
    """Serve until SIGTERM or SIGINT; SIGHUP reloads. Returns the exit code: 0 after a stop
    asked for by a signal, 1 when the sampling loop died (systemd's Restart=on-failure)."""
    block_signals()
    daemon.start()
    # signals are taken from the start, also while the driver opens (it may take a minute): a
    # SIGTERM then stops at once; if no sample has come by `patience`, say so once
    patience = time.monotonic() + max(30.0, 10 * daemon.cfg.interval_s)
    collector_back = time.monotonic() + memory.HOLD_COLLECTOR_MAX_S
    waiting = held = True
    while not daemon.stop_event.is_set():
        if held and (daemon.ready or time.monotonic() >= collector_back):
            held = False
            memory.settle()  # the collector, held while the daemon started, runs again
        if waiting and (daemon.ready or time.monotonic() >= patience):
            waiting = False
            if not daemon.ready:
                log.warning("no sample yet after start: serving anyway")
        if waiting:
            info = signal.sigtimedwait(DAEMON_SIGNALS, min(1.0, max(0.0, patience - time.monotonic())))
            if info is None:
                continue
            sig = info.si_signo
        else:
            sig = signal.sigwait(DAEMON_SIGNALS)
        if sig == signal.SIGHUP:
            daemon.reload()
        elif sig in (signal.SIGTERM, signal.SIGINT):
            daemon.stop_event.set()
    start = time.monotonic()
    daemon.stop()
    log.info("stopped in %.2f s", time.monotonic() - start)
    return 1 if daemon.failed else 0
