"""`gpumon serve`: the exporter daemon, a pipeline (gpumon.pipeline) with the fleet's sinks.

Threads: the sampler ticks in its own (supervised) thread and, as a verdict subscriber, publishes
an immutable Snapshot after each tick;
HTTP requests read only that snapshot (rendered /metrics is cached per snapshot). The main thread
waits for signals: SIGTERM/SIGINT stop within 2 s, SIGHUP reloads the configuration. systemd hears
READY once the first tick is published, WATCHDOG from the sampling loop (so a wedged sampler gets
restarted), RELOADING and STOPPING.
"""

from __future__ import annotations

import html
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpumon import __version__
from gpumon.clock import Clock, MonotonicClock
from gpumon.config import Config
from gpumon.detector.tracker import Verdict
from gpumon.exporter import GpumonCollector
from gpumon.model import Tick
from gpumon.pipeline import Pipeline, SourceSpec, describe_source
from gpumon.pipeline.sources import OpenedSources
from gpumon.problems import Problems
from gpumon.sdnotify import Notifier
from gpumon.snapshot import GpuCounters, Snapshot, to_state_json
from gpumon.web import Routes, WebServer
from gpumon.webconfig import load_web_config

log = logging.getLogger("gpumon")


def source_spec(cfg: Config) -> SourceSpec:
    return SourceSpec.from_settings(
        simulate=cfg.simulate,
        gpus=cfg.gpus,
        seed=cfg.seed,
        sample_period_s=cfg.sample_period_s,
        replay=cfg.replay,
        drive=cfg.drive,
    )


class Daemon:
    def __init__(
        self,
        cfg: Config,
        reload: Callable[[], Config] | None = None,
        clock: Clock | None = None,
        sources: OpenedSources | None = None,
        notifier: Notifier | None = None,
        problems: Problems | None = None,
    ) -> None:
        self.cfg = cfg
        self._reload = reload
        self.stop_event = threading.Event()
        self.clock = clock or MonotonicClock()
        self.notifier = notifier or Notifier()
        self.web_config = load_web_config(cfg.web_config_file)
        self.pipeline = Pipeline(
            source_spec(cfg),
            self.clock,
            interval_s=cfg.interval_s,
            thresholds=cfg.thresholds,
            history_s=cfg.window_s,
            retry_nvml=True,
            nvml_call_timeout_s=cfg.nvml_call_timeout_s,
            sources=sources,
            problems=problems,
        )
        self.sampler = self.pipeline.sampler
        self.detector = self.pipeline.detector
        self.sources = self.pipeline.sources
        self.pipeline.on_verdicts(self._publish)
        self.snapshot: Snapshot | None = None
        self._render_lock = threading.Lock()
        self._rendered: dict[str, tuple[int, bytes, str]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GpumonCollector(lambda: self.snapshot, self.clock.now))
        self._ready = threading.Event()
        self.web: WebServer | None = None
        self._sampler_thread: threading.Thread | None = None

    # -- publishing ----------------------------------------------------------------------------

    def _publish(self, tick: Tick, verdicts: list[Verdict]) -> None:
        counters = {
            key: GpuCounters(
                dict(det.seconds_in_state),
                dict(det.starved_seconds_by_cause),
                dict(det.episodes_started),
                det.wasted_gpu_s,
            )
            for key, det in self.detector.fleet.gpus.items()
        }
        self.snapshot = Snapshot(
            t_s=tick.t_s,
            tick=tick,
            verdicts=tuple(verdicts),
            counters=counters,
            sources={k: _copy_stats(v) for k, v in self.sampler.stats.items()},
            ticks=self.sampler.ticks,
            skipped_ticks=self.sampler.skipped_ticks,
            source_description=self.sources.description,
            problems=self.pipeline.problems.active(),
            problem_totals=dict(self.pipeline.problems.totals),
        )
        self.notifier.watchdog()  # from the sampling loop: a wedged sampler stops the pings
        if not self._ready.is_set():
            self._ready.set()

    def render_metrics(self, accept: str) -> tuple[bytes, str]:
        """The exposition for this snapshot, rendered once and served to every scraper."""
        encoder, content_type = choose_encoder(accept)
        snap = self.snapshot
        stamp = id(snap)
        with self._render_lock:
            cached = self._rendered.get(content_type)
            if cached is None or cached[0] != stamp or snap is None:
                body = encoder(self.registry)
                cached = (stamp, body, content_type)
                self._rendered[content_type] = cached
        return cached[1], cached[2]

    def state(self) -> dict[str, Any]:
        snap = self.snapshot
        if snap is None:
            return {"schema": "gpumon-state/1", "ready": False, "gpus": []}
        doc = to_state_json(snap, self.clock.now() - snap.t_s)
        doc["ready"] = True
        doc["interval_s"] = self.cfg.interval_s
        return doc

    def health(self) -> tuple[bool, str]:
        snap = self.snapshot
        if snap is None:
            return False, "starting: no sample yet"
        age = self.clock.now() - snap.t_s
        limit = 3 * self.cfg.interval_s + 5
        if age > limit:
            return False, f"stale: the newest sample is {age:.0f} s old (limit {limit:g} s)"
        return True, f"ok: {len(snap.tick.gpus)} GPU(s), newest sample {age:.1f} s old"

    def landing(self) -> str:
        kind = describe_source(self.sources.description)
        return (
            f"<!doctype html><html><head><title>gpumon</title></head><body><h1>gpumon {__version__}</h1>"
            f"<p>Catches GPUs starved by their input pipeline. Sampling {html.escape(kind)}.</p><ul>"
            '<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>'
            '<li><a href="/api/v1/state">/api/v1/state</a>: GPUs, host, verdicts and evidence (JSON)</li>'
            '<li><a href="/healthz">/healthz</a>: health</li></ul></body></html>'
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        """Start sampling and serving; returns the port (useful with port 0)."""
        self._sampler_thread = threading.Thread(target=self._sample, name="gpumon-sampler", daemon=True)
        self._sampler_thread.start()
        port = self.start_http_only()
        host = self.cfg.host_port[0]
        scheme = "https" if self.web_config.tls else "http"
        log.info("serving on %s:%d (%s), sampling every %g s", host or "*", port, scheme, self.cfg.interval_s)
        return port

    def start_http_only(self) -> int:
        """Serve what is already sampled; `start` adds the sampling thread (tests tick by hand)."""
        routes = Routes(self.render_metrics, self.state, self.health, self.landing)
        self.web = WebServer(
            self.cfg.host_port, routes, self.web_config, self.cfg.max_connections, self.cfg.request_timeout_s
        )
        self.web.start()
        return self.web.port

    def _sample(self) -> None:
        try:
            self.pipeline.run(stop=self.stop_event)
        except Exception:  # a bug in the loop: exit so systemd restarts us, rather than serve stale data
            log.exception("the sampler stopped")
            self.stop_event.set()

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the first published sample; a stop (SIGTERM during start-up) ends the wait."""
        deadline = time.monotonic() + timeout
        while not self._ready.is_set() and not self.stop_event.is_set() and time.monotonic() < deadline:
            self._ready.wait(0.1)
        ok = self._ready.is_set()
        if ok and self.snapshot is not None:
            self.notifier.ready(f"sampling {len(self.snapshot.tick.gpus)} GPU(s)")
        return ok

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
        if (new.listen, new.simulate, new.replay, new.interval_s) != (
            self.cfg.listen,
            self.cfg.simulate,
            self.cfg.replay,
            self.cfg.interval_s,
        ):
            log.warning("reload: listen, interval, simulate and replay change only on restart")
        self.pipeline.set_thresholds(new.thresholds)
        logging.getLogger().setLevel(new.log_level.upper())
        if self.web is not None:
            self.web.reconfigure(web)
        self.cfg = new
        log.info("configuration reloaded")
        self.notifier.ready("configuration reloaded")

    def stop(self) -> None:
        self.notifier.stopping()
        self.stop_event.set()
        if self.web is not None:
            self.web.stop()
        if self._sampler_thread is not None:
            self._sampler_thread.join(timeout=1.5)
        self.pipeline.close()


def _copy_stats(st: Any) -> Any:
    from dataclasses import replace

    return replace(st)


def run_forever(daemon: Daemon) -> int:
    """Serve until SIGTERM or SIGINT; SIGHUP reloads. Returns the exit code."""
    hup = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop_event.set())
    signal.signal(signal.SIGHUP, lambda *_: hup.set())
    daemon.start()
    if (
        not daemon.wait_ready(timeout=max(30.0, 10 * daemon.cfg.interval_s))
        and not daemon.stop_event.is_set()
    ):
        log.warning("no sample yet after start: serving anyway")
    while not daemon.stop_event.is_set():
        daemon.stop_event.wait(0.2)
        if hup.is_set():
            hup.clear()
            daemon.reload()
    start = time.monotonic()
    daemon.stop()
    log.info("stopped in %.2f s", time.monotonic() - start)
    return 0
