"""`gpumon serve`: the exporter daemon, a pipeline (gpumon.pipeline) with the fleet's sinks.

Threads: the sampler ticks in its own (supervised) thread and, as a verdict subscriber, publishes
an immutable Snapshot after each tick; HTTP requests (gpumon.web, one event loop) read only that
snapshot (/metrics is rendered once per snapshot; only its age is filled in per scrape). The main
thread waits for signals with sigwait, so nothing wakes while idle: SIGTERM/SIGINT stop within
2 s, SIGHUP reloads the configuration. systemd hears READY once the first tick is published,
WATCHDOG from the sampling loop while NVML gives fresh data (so a wedged sampler or a hung driver
gets the service restarted), RELOADING and STOPPING.
"""

from __future__ import annotations

import html
import itertools
import logging
import os
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import utils as _prom_utils
from prometheus_client.exposition import choose_encoder

from gpumon import __version__
from gpumon.clock import Clock, MonotonicClock
from gpumon.config import Config
from gpumon.detector.tracker import Episode, StarvationDetector, Verdict
from gpumon.exporter import GpumonCollector
from gpumon.model import Tick
from gpumon.pipeline import AttributionSpec, Pipeline, SourceSpec, describe_source
from gpumon.pipeline.sources import OpenedSources
from gpumon.problems import Problems
from gpumon.recorder import Recorder, default_directory, unix_offset_of
from gpumon.sdnotify import Notifier
from gpumon.snapshot import GpuCounters, Snapshot, to_state_json
from gpumon.web import Routes, WebServer
from gpumon.webconfig import load_web_config

log = logging.getLogger("gpumon")


def attribution_spec(cfg: Config) -> AttributionSpec | None:
    """Where jobs and pods are read from; the kubelet only where it is (auto) or when told (on)."""
    if not cfg.job_attribution:
        return None
    k8s = cfg.kubernetes == "on" or (cfg.kubernetes == "auto" and os.path.exists(cfg.kubelet_socket))
    return AttributionSpec(
        cfg.jobs_dir,
        cfg.dcgm_job_mapping_dir,
        kubelet_socket=cfg.kubelet_socket if k8s else None,
        kubelet_refresh_s=cfg.kubelet_refresh_s,
    )


def source_spec(cfg: Config) -> SourceSpec:
    return SourceSpec.from_settings(
        simulate=cfg.simulate,
        gpus=cfg.gpus,
        seed=cfg.seed,
        sample_period_s=cfg.sample_period_s,
        replay=cfg.replay,
        drive=cfg.drive,
        gpm=cfg.gpm,
    )


FIRST_TICK_S = 0.1
"""The first sample comes this soon after start (later ones on the interval's grid)."""


def _iso_arg(unix_s: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="microseconds")


def _float_text(value: float) -> str:
    """A number as the exposition formats write it (prometheus_client's own function)."""
    return str(_prom_utils.floatToGoString(value))  # type: ignore[no-untyped-call]


RECENT_EPISODES = 20
"""Episodes per GPU in the state API (the detector keeps more; `gpumon report` reads these)."""
AGE_SENTINEL = 123456789.125
"""Rendered in place of the sample age, which is filled in when a scraper asks."""


@dataclass(frozen=True)
class _Rendered:
    """One snapshot's exposition in one format, split around the age (filled in per scrape)."""

    stamp: int
    content_type: str
    head: bytes
    tail: bytes
    gz_head: bytes
    gz_state: Any
    """zlib compressor after `head`: a copy finishes the gzip stream with the age and tail."""
    t_s: float


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
    ) -> None:
        """`duration_s`: stop (exit 0) after this long on the sampler's clock (a demo, a
        simulation at --speed max); by default, serve until told to stop."""
        self.cfg = cfg
        self.duration_s = duration_s
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
            attribution=attribution_spec(cfg),
        )
        self.sampler = self.pipeline.sampler
        self.detector = self.pipeline.detector
        self.sources = self.pipeline.sources
        self._unix_offset = unix_offset_of(self.clock, isinstance(self.clock, MonotonicClock))
        self.recorder = self._recorder(cfg)
        if self.recorder is not None:
            self.pipeline.on_tick(self.recorder.submit)
        self.pipeline.on_verdicts(self._publish)
        self.snapshot: Snapshot | None = None
        self._render_lock = threading.Lock()
        self._rendered: dict[str, _Rendered] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GpumonCollector(lambda: self.snapshot, lambda snap: AGE_SENTINEL))
        self._ready = threading.Event()
        self.web: WebServer | None = None
        self._sampler_thread: threading.Thread | None = None
        self.failed = False
        """The sampling loop died: the process must end with a failure (systemd restarts it)."""
        self._started_t = self.clock.now()
        self._nvml_fresh_t: float | None = None
        self._closed_episodes: dict[tuple[int, str], tuple[int, tuple[Episode, ...]]] = {}
        self._hostname = socket.gethostname()
        self._analysis_running = False

    def _recorder(self, cfg: Config) -> Recorder | None:
        """The flight recorder (gpumon.recorder): on for real GPUs unless `record = "off"`; for
        simulated and replayed ones only when told where (record_dir) or `record = "on"`, so a demo
        never mixes made-up samples into a machine's history."""
        real = self.pipeline.spec.kind == "nvml"
        if cfg.record == "off" or (cfg.record == "auto" and not real and cfg.record_dir is None):
            return None
        real_time = isinstance(self.clock, MonotonicClock)
        directory = cfg.record_dir or default_directory()
        log.info("recording every sample to %s", directory)
        return Recorder(
            directory,
            self.sources.description,
            cfg.interval_s,
            self._unix_offset,
            segment_s=cfg.record_segment_s,
            max_age_s=cfg.record_max_age_s,
            max_bytes=cfg.record_max_bytes,
            block=not real_time,  # a simulation at full speed waits for the disk, losing nothing
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
        gpu_ok = self.sampler.stats.get(self.sources.gpu.name)
        if (
            gpu_ok is not None
            and gpu_ok.last_success
            and (not tick.gpus or any(g.available for g in tick.gpus))
        ):
            self._nvml_fresh_t = tick.t_s
        self.snapshot = Snapshot(
            t_s=tick.t_s,
            tick=tick,
            verdicts=tuple(verdicts),
            counters=counters,
            sources={k: replace(v) for k, v in self.sampler.stats.items()},
            ticks=self.sampler.ticks,
            skipped_ticks=self.sampler.skipped_ticks,
            source_description=self.sources.description,
            problems=self.pipeline.problems.active(),
            problem_totals=dict(self.pipeline.problems.totals),
            unix_offset_s=self._unix_offset(),
            hostname=self._hostname,
            recorder=self.recorder.stats() if self.recorder is not None else None,
        )
        if self.nvml_trouble(tick.t_s)[0] != "stale":
            self.notifier.watchdog()  # from the sampling loop: a wedged sampler stops the pings
        if not self._ready.is_set():
            self._ready.set()

    def _recent_episodes(self, key: tuple[int, str], det: StarvationDetector) -> tuple[Episode, ...]:
        """The last RECENT_EPISODES closed ones (copied only when one closed) and the open one."""
        started = sum(det.episodes_started.values())
        cached = self._closed_episodes.get(key)
        if cached is None or cached[0] != started:
            closed = tuple(itertools.islice(reversed(det.episodes), RECENT_EPISODES))[::-1]
            cached = self._closed_episodes[key] = (started, closed)
        current = det.current
        return cached[1] + ((current,) if current is not None else ())

    def nvml_trouble(self, now: float) -> tuple[str | None, str]:
        """Fresh NVML data means a successful reading with a GPU answering (or none installed).

        ("stale", why): none for `nvml_stale_s` after there had been some, or a driver-wide call
        hangs: /healthz fails and the watchdog pings stop, so systemd restarts the service (a new
        process is the only way out of a hung driver call).
        ("absent", why): none since start, for `nvml_stale_s`: /healthz fails, but the pings go
        on (the daemon retries the driver with backoff; a restart would not bring one)."""
        if self.pipeline.spec.kind != "nvml":
            return None, ""
        limit = self.cfg.nvml_stale_s
        stats = self.sampler.stats.get(self.sources.gpu.name)
        why = (stats.last_error if stats is not None else None) or "no GPU answered"
        if self._nvml_fresh_t is not None:
            age = now - self._nvml_fresh_t
            if age >= limit:
                return "stale", f"no fresh NVML data for {age:.0f} s (limit {limit:g} s): {why}"
            return None, ""
        if now - self._started_t >= limit:
            return "absent", f"no NVML data since start: {why}"
        return None, ""

    def render_metrics(self, accept: str, gzip_ok: bool = False) -> tuple[bytes, str, str | None]:
        """The exposition for this snapshot, rendered once and served to every scraper; only the
        sample age is filled in per scrape (so it stays true when the sampler stops)."""
        encoder, content_type = choose_encoder(accept)
        snap = self.snapshot
        stamp = id(snap)
        with self._render_lock:
            r = self._rendered.get(content_type)
            if r is None or r.stamp != stamp:
                r = self._render(encoder(self.registry), stamp, content_type, snap)
                self._rendered[content_type] = r
        age = b"" if snap is None else _float_text(round(max(0.0, self.clock.now() - r.t_s), 3)).encode()
        if not gzip_ok:
            return r.head + age + r.tail, content_type, None
        c = r.gz_state.copy()
        return r.gz_head + c.compress(age + r.tail) + c.flush(), content_type, "gzip"

    @staticmethod
    def _render(body: bytes, stamp: int, content_type: str, snap: Snapshot | None) -> _Rendered:
        marker = _float_text(AGE_SENTINEL).encode()
        head, found, tail = body.partition(marker)
        if not found or marker in tail:
            head, tail = body, b""
        comp = zlib.compressobj(6, zlib.DEFLATED, 31)
        gz_head = comp.compress(head)
        return _Rendered(stamp, content_type, head, tail, gz_head, comp, snap.t_s if snap else 0.0)

    async def analysis(self, query: str) -> tuple[int, bytes]:
        """/api/v1/analysis?since=TIME&until=TIME&gpu=N,M: `gpumon analyze --from` over the
        recorder's directory, as JSON. One at a time (429 while one runs), the range at most
        analysis_max_range_s, in its own niced process stopped after analysis_timeout_s: an analysis
        never holds up the sampler or a scrape, and never takes the daemon's memory with it."""
        import asyncio
        import json as json_mod
        import re
        import shutil
        import sys
        from urllib.parse import parse_qs

        from gpumon.cli.flags import time_point

        def problem(status: int, why: str) -> tuple[int, bytes]:
            return status, json_mod.dumps({"error": why}).encode()

        if self.recorder is None:
            return problem(404, "the recorder is off (record = off, or simulated GPUs without record_dir)")
        if self._analysis_running:
            return problem(429, "an analysis is running: one at a time; try again shortly")
        try:
            q = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=10)
        except ValueError:
            return problem(400, "too many query parameters")
        unknown = sorted(set(q) - {"since", "until", "gpu"})
        if unknown:
            return problem(400, f"unknown parameter {unknown[0]!r}: since, until and gpu are known")

        def when(text: str) -> float:
            # a '+' left unescaped in a query is a space: 14:00+01:00 arrives as "14:00 01:00"
            return time_point(re.sub(r"(T\d\d:\d\d(?::\d\d(?:\.\d+)?)?) (\d\d:?\d\d)$", r"\1+\2", text))

        try:
            since = when(q.get("since", ["1h"])[-1])
            until = when(q["until"][-1]) if "until" in q else time.time()
        except Exception as e:  # argparse.ArgumentTypeError: its message names the value
            return problem(400, f"{e}")
        gpus = q.get("gpu", [""])[-1]
        if gpus and not all(x.strip().isdigit() for x in gpus.split(",")):
            return problem(400, f"gpu: expected indices such as 0 or 0,3; got {gpus!r}")
        limit = self.cfg.analysis_max_range_s
        if until - since > limit:
            return problem(
                400,
                f"the range is {until - since:.0f} s, more than {limit:g} s: ask for less, or run "
                "gpumon analyze --from on the host",
            )
        th = self.cfg.thresholds
        nice = shutil.which("nice")  # coreutils' (where setpriority is filtered, it runs it as is)
        args = [nice, "-n", "19"] if nice else []
        args += [
            sys.executable,
            "-m",
            "gpumon",
            "analyze",
            "--json",
            "--jobs",
            "1",
            "--from",
            self.recorder.directory,
        ]
        args += ["--since", _iso_arg(since), "--until", _iso_arg(until)]
        args += ["--gpu", gpus] if gpus else []
        args += [f"--threshold={k}={getattr(th, k)}" for k in th.__slots__]
        self._analysis_running = True
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), self.cfg.analysis_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                limit_s = self.cfg.analysis_timeout_s
                return problem(503, f"the analysis took longer than {limit_s:g} s: ask for a shorter range")
        except OSError as e:
            return problem(503, f"cannot start the analysis: {e.strerror}")
        finally:
            self._analysis_running = False
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return problem(404 if "no samples" in why[0] else 500, why[0].removeprefix("gpumon: error: "))
        return 200, out

    def render_pcp(self) -> bytes:
        from gpumon import pcp

        return pcp.render(self.snapshot)

    def state(self) -> dict[str, Any]:
        snap = self.snapshot
        if snap is None:
            return {
                "schema": "gpumon-state/1",
                "ready": False,
                "source": self.sources.description,
                "gpus": [],
            }
        doc = to_state_json(snap, self.clock.now() - snap.t_s)
        doc["ready"] = True
        doc["interval_s"] = self.cfg.interval_s
        return doc

    def health(self) -> tuple[bool, str]:
        snap = self.snapshot
        if snap is None:
            return False, "starting: no sample yet"
        now = self.clock.now()
        age = now - snap.t_s
        limit = 3 * self.cfg.interval_s + 5
        if age > limit:
            return False, f"stale: the newest sample is {age:.0f} s old (limit {limit:g} s)"
        trouble, why = self.nvml_trouble(now)
        if trouble is not None:
            return False, f"nvml: {why}"
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
        if self.recorder is not None:
            self.recorder.start()
        self._sampler_thread = threading.Thread(target=self._sample, name="gpumon-loop", daemon=True)
        self._sampler_thread.start()
        port = self.start_http_only()
        host = self.cfg.host_port[0]
        scheme = "https" if self.web_config.tls else "http"
        shown = f"[{host}]" if ":" in host else (host or "*")
        log.info("serving on %s:%d (%s), sampling every %g s", shown, port, scheme, self.cfg.interval_s)
        return port

    def start_http_only(self) -> int:
        """Serve what is already sampled; `start` adds the sampling thread (tests tick by hand)."""
        routes = Routes(
            self.render_metrics, self.state, self.health, self.landing, self.render_pcp, self.analysis
        )
        self.web = WebServer(
            self.cfg.host_port, routes, self.web_config, self.cfg.max_connections, self.cfg.request_timeout_s
        )
        self.web.start()
        return self.web.port

    def _sample(self) -> None:
        try:
            self.pipeline.run(self.duration_s, stop=self.stop_event, first_tick_s=FIRST_TICK_S)
            if self.duration_s is not None and not self.stop_event.is_set():
                log.info("ran for --duration %g s: stopping", self.duration_s)
                self.stop_event.set()
                _wake_main_thread()
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
            _wake_main_thread()

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the first published sample; a stop (SIGTERM during start-up) ends the wait."""
        deadline = time.monotonic() + timeout
        while not self._ready.is_set() and not self.stop_event.is_set() and time.monotonic() < deadline:
            self._ready.wait(0.05)
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
        restart_only = (
            "listen",
            "interval_s",
            "simulate",
            "replay",
            "drive",
            "gpus",
            "seed",
            "max_connections",
            "gpm",
        )
        changed = [k for k in restart_only if getattr(new, k) != getattr(self.cfg, k)]
        if changed or web.tls != self.web_config.tls:
            log.warning("reload: %s change only on restart", ", ".join(changed) or "turning TLS on or off")
        self.pipeline.set_thresholds(new.thresholds)
        logging.getLogger().setLevel(new.log_level.upper())
        if self.web is not None:
            self.web.reconfigure(web)
        self.web_config = web
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
        if self.recorder is not None:
            self.recorder.close()  # what is queued is written, the segment ends whole
        self.pipeline.close()


_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}
_MAIN_THREAD = threading.main_thread().ident


def _wake_main_thread() -> None:
    """SIGUSR1 to ourselves: the main thread, in sigwait, notices that the daemon stopped."""
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    except OSError:
        pass


def block_signals() -> None:
    """Hold the daemon's signals for sigwait, in this thread and every thread started after.
    Called first thing in `serve`, so a SIGHUP during start-up is a reload, not a death."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)


def run_forever(daemon: Daemon) -> int:
    """Serve until SIGTERM or SIGINT; SIGHUP reloads. Returns the exit code: 0 after a stop
    asked for by a signal, 1 when the sampling loop died (systemd's Restart=on-failure)."""
    block_signals()
    daemon.start()
    if (
        not daemon.wait_ready(timeout=max(30.0, 10 * daemon.cfg.interval_s))
        and not daemon.stop_event.is_set()
    ):
        log.warning("no sample yet after start: serving anyway")
    while not daemon.stop_event.is_set():
        sig = signal.sigwait(_SIGNALS)
        if sig == signal.SIGHUP:
            daemon.reload()
        elif sig in (signal.SIGTERM, signal.SIGINT):
            daemon.stop_event.set()
    start = time.monotonic()
    daemon.stop()
    log.info("stopped in %.2f s", time.monotonic() - start)
    return 1 if daemon.failed else 0
