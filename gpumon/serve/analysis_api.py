"""/api/v1/analysis?since=TIME&until=TIME&gpu=N,M: `gpumon analyze --from` over the flight
recorder's directory, as JSON (docs/recorder.md).

A range that reaches the newest tick and starts within the daemon's verdict log (the last 15
minutes) is answered in-process from the verdicts the daemon gave (gpumon.serve.recent_range), on
a thread of its own at nice 19; any other is replayed in its own process at nice 10, stopped after
analysis_timeout_s, which dies with the daemon (PR_SET_PDEATHSIG, and killed when the server
stops). Answers are cached per (query, thresholds) until a new tick arrives. One analysis at a time:
the same query shares the running one's answer (SHARING_MAX requests at most), another gets 429
(Retry-After: 1). The CPU used is charged to a budget (gpumon.serve.cpu_budget): while it is spent,
429 with Retry-After, and the clients refused so wait in line, one place per address: once it
refills, the client refused first goes first if it comes back within its Retry-After (and a grace),
so a client that polls, even with ever-new queries, cannot take every refill from one at another
address that waits as told. Nothing
here runs on the event loop or takes a lock a scrape takes. Statuses: 400 for a query that cannot
be right (unknown parameter, since after until, a range too long), 404 for one that finds nothing
(no samples, no such GPU), 429/503 to try again later (with Retry-After), 500 only for a failure of
gpumon's own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import logging
import os
import re
import resource
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from gpumon.config.settings import Config
from gpumon.core.errors import EXIT_BAD_TRACE, EXIT_USAGE
from gpumon.core.timepoints import iso_utc, time_point
from gpumon.serve.cpu_budget import CpuBudget
from gpumon.serve.verdict_log import LogView, VerdictLog
from gpumon.trace.segments import list_segments

log = logging.getLogger("gpumon")

REPLAY_NICE = 10
"""The replaying process's nice value (the in-process analysis thread runs at 19: it is short)."""
CACHED_ANSWERS = 16
"""Answers kept, each for one (query, thresholds), while the data it covers is unchanged."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _problem(status: int, why: str, retry_after_s: int | None = None) -> Answer:
    headers = (("Retry-After", str(retry_after_s)),) if retry_after_s is not None else ()
    return Answer(status, json.dumps({"error": why}).encode(), headers)


def _point(name: str, text: str, now: float) -> float:
    """A query's time parameter; ValueError naming it."""
    try:
        return _when(text, now)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _when(text: str, now: float) -> float:
    # a '+' left unescaped in a query is a space: 14:00+01:00 arrives as "14:00 01:00"
    return time_point(re.sub(r"(T\d\d:\d\d(?::\d\d(?:\.\d+)?)?) (\d\d:?\d\d)$", r"\1+\2", text), now)


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the analysis is killed on the server's stop instead


_PRCTL = _libc_prctl()
"""Found before any fork: the child must not import or look up anything (other threads may hold
locks it would wait for)."""


def _die_with_parent() -> None:
    """In the child, before exec: killed when the daemon's thread that started it ends."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


IN_LINE = 16
"""Client addresses remembered in the order the spent budget refused them (more are refused, not
queued): one place each, whatever queries an address asks, so a client that asks ever-new ones
holds one place, not the whole line."""
TURN_GRACE_S = 10.0
"""How long after its Retry-After a client in line keeps its turn: one that has gone away holds
up the others no longer than this."""
SHARING_MAX = 8
"""Requests that may wait for the running analysis's answer (the same query); more get 429 at
once. A waiting connection is being served, so it is never closed to make room for a new one:
without a bound, clients all asking for one long analysis could hold every connection."""


class AnalysisApi:
    def __init__(
        self,
        directory: str | None,
        settings: Callable[[], Config],
        *,
        recent: VerdictLog | None = None,
        header: Callable[[], dict[str, Any]] = dict,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        budget: CpuBudget | None = None,
    ) -> None:
        """`directory`: the recorder's (None: the recorder is off); `settings`: the configuration
        now (a reload changes the limits and thresholds); `recent`: the daemon's verdicts, for short
        ranges; `header`: what a recording's header says of the source; `now`: the daemon's clock
        in Unix time (a simulation's own, at --speed), which relative times count back from."""
        self.directory = directory
        self._settings = settings
        self._recent = recent
        self._header = header
        self._now = now
        self._monotonic = monotonic
        self.budget = budget or CpuBudget(now=monotonic())
        self._cache: collections.OrderedDict[Hashable, tuple[Hashable, Answer]] = collections.OrderedDict()
        self._running: tuple[Hashable, asyncio.Future[Answer]] | None = None
        self._line: collections.OrderedDict[str, float] = collections.OrderedDict()
        """Client addresses the spent budget refused, first refused first, with when their turn
        lapses."""
        self._sharing = 0
        """Requests waiting for the running analysis's answer."""
        self._pool: ThreadPoolExecutor | None = None
        self.analyses = 0
        """Analyses run (not answered from the cache): tests and benchmarks read it."""

    async def answer(self, query: str, client: str = "?") -> Answer:
        """`client`: the asking client's address: the line of clients the spent budget refused
        holds one place per address."""
        cfg = self._settings()
        try:
            asked = _parse(query, self._now(), cfg.analysis_max_range_s)
        except ValueError as e:  # its message says what to change
            return _problem(400, f"{e}")
        if self.directory is None:
            return _problem(404, "the recorder is off (record = off, or simulated GPUs without record_dir)")
        since, until, gpus = asked
        th = cfg.thresholds
        key = (query, tuple(getattr(th, k) for k in th.__slots__))
        fresh = self._fresh(until)
        cached = self._cache.get(key)
        if cached is not None and cached[0] == fresh:
            self._cache.move_to_end(key)
            return cached[1]._replace(headers=(("X-Gpumon-Analysis", "cached"),))
        running = self._running
        if running is not None:
            if running[0] == key and self._sharing < SHARING_MAX:  # the same question: its answer
                self._sharing += 1
                try:
                    return await asyncio.shield(running[1])
                finally:
                    self._sharing -= 1
            return _problem(429, "an analysis is running: one at a time; try again shortly", retry_after_s=1)
        now = self._monotonic()
        if not self.budget.allows(now):
            wait = self.budget.retry_after_s(now)
            share = self.budget.share
            if client in self._line or len(self._line) < IN_LINE:
                self._line[client] = now + wait + TURN_GRACE_S  # its place kept, its turn renewed
            return _problem(
                429,
                f"the analyses' CPU budget ({share:.0%} of a core) is spent: try again in {wait} s",
                retry_after_s=wait,
            )
        first = self._first_in_line(now)
        if first is not None and first != client:
            return _problem(429, "a client refused earlier goes first: try again shortly", retry_after_s=1)
        self._line.pop(client, None)
        done: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._running = (key, done)
        try:
            result = await self._analyze(query, since, until, gpus, cfg)
        except BaseException as e:
            done.set_exception(e)
            done.exception()  # retrieved: a waiter that went away leaves no warning
            raise
        finally:
            self._running = None
        done.set_result(result)
        if result.status == 200:
            self._cache[key] = (fresh, result)
            while len(self._cache) > CACHED_ANSWERS:
                self._cache.popitem(last=False)
        return result

    def _first_in_line(self, now: float) -> str | None:
        """The client whose turn it is, once the budget refilled (those whose turn lapsed dropped)."""
        while self._line:
            key, lapses = next(iter(self._line.items()))
            if lapses >= now:
                return key
            del self._line[key]
        return None

    def _fresh(self, until: float) -> Hashable:
        """What must be unchanged for an answer to stand: the newest tick, for a range that reaches
        the segment being written; the segments, for one that lies in closed ones."""
        assert self.directory is not None
        segments = list_segments(self.directory)
        if segments and until <= segments[-1].start_unix_s:
            return tuple((s.path, s.bytes) for s in segments)
        newest = self._recent.newest_unix_s if self._recent is not None else None
        return newest if newest is not None else tuple((s.path, s.bytes) for s in segments)

    async def _analyze(
        self, query: str, since: float, until: float, gpus: frozenset[int] | None, cfg: Config
    ) -> Answer:
        self.analyses += 1
        if self._recent is not None:
            loop = asyncio.get_running_loop()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, "gpumon-analysis", initializer=_lower_priority)
            # the verdicts as they are now, when `until` ("now" for a range to the present) was
            # read: a tick logged before the analysis thread runs (at nice 19, beside busy cores,
            # that can be several) would make the range look older than the log, and replayed
            view = self._recent.view()
            if view is not None and until <= view.latest.unix_s:
                # a tick was logged after the query read "now" (the sampler runs on, and under load
                # between the two): a range to the present is asked again at a "now" after the view
                with contextlib.suppress(ValueError):  # (an explicit `until` may now precede `since`)
                    since, until, gpus = _parse(query, self._now(), cfg.analysis_max_range_s)
            try:
                found = await loop.run_in_executor(
                    self._pool, self._in_process, view, since, until, gpus, cfg
                )
            except Exception:  # a bug here costs the fast path, not the answer: the replay gives it
                log.exception("analysis: the in-process answer failed; replaying the recording instead")
                found = None
            if found is not None:
                return found
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            return await self._replay(since, until, gpus, cfg)
        finally:
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # one analysis at a time: its own
            used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            self.budget.charge(used, self._monotonic())

    def _in_process(
        self, view: LogView | None, since: float, until: float, gpus: frozenset[int] | None, cfg: Config
    ) -> Answer | None:
        """On the analysis thread: the answer from the daemon's verdicts (None: replay the range)."""
        assert self.directory is not None
        # the analysis code, loaded by the first range asked (a daemon's first sample comes sooner)
        from gpumon.analyze.trace_report import to_json
        from gpumon.serve.recent_range import analyze_recent

        start = time.thread_time()
        try:
            found = None
            if view is not None:
                th, header = cfg.thresholds, self._header()
                found = analyze_recent(view, self.directory, since, until, gpus, th, header)
            if found is None:
                return None
            body = (json.dumps(to_json(found), indent=1) + "\n").encode()
            return Answer(200, body, (("X-Gpumon-Analysis", "in-process"),))
        finally:
            self.budget.charge(time.thread_time() - start, self._monotonic())

    async def _replay(self, since: float, until: float, gpus: frozenset[int] | None, cfg: Config) -> Answer:
        """`gpumon analyze --from` in a niced process of its own, stopped after analysis_timeout_s."""
        assert self.directory is not None
        th = cfg.thresholds
        # coreutils' nice (where setpriority is filtered, it runs it as is). 10, not 19: it yields
        # to every process at the default priority (a tenth of one's weight), yet still moves on a
        # host whose cores are all busy, where 19 (a seventieth) left it to its timeout
        nice = shutil.which("nice")
        args = [nice, "-n", str(REPLAY_NICE)] if nice else []
        args += [sys.executable, "-m", "gpumon", "analyze", "--json", "--jobs", "1", "--from", self.directory]
        args += ["--since", iso_utc(since), "--until", iso_utc(until)]
        args += ["--gpu", ",".join(map(str, sorted(gpus)))] if gpus else []
        args += [f"--threshold={k}={getattr(th, k)}" for k in th.__slots__]
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=_die_with_parent,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), cfg.analysis_timeout_s)
            except TimeoutError:
                await _reap(proc)
                limit_s = cfg.analysis_timeout_s
                return _problem(
                    503,
                    f"the analysis took longer than {limit_s:g} s: ask for a shorter range",
                    retry_after_s=10,
                )
            except asyncio.CancelledError:  # the server is stopping: the analysis goes with it
                await _reap(proc)
                raise
        except OSError as e:
            return _problem(503, f"cannot start the analysis: {e.strerror}", retry_after_s=10)
        if proc.returncode != 0:
            why = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            why = why.removeprefix("gpumon: error: ").removeprefix("gpumon analyze: error: ")
            return _problem(_status(proc.returncode, why), why)
        return Answer(200, out, (("X-Gpumon-Analysis", "replayed"),))


REAP_S = 5.0
"""How long a killed analysis is given to exit and close its pipes."""


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill an analysis and collect it: exited, and its pipes read to their end and closed while
    the loop still runs (left to the garbage collector, they were closed after the loop, which
    printed "Exception ignored ... Event loop is closed" at the daemon's stop)."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.communicate(), REAP_S)


def _parse(query: str, now: float, max_range_s: float) -> tuple[float, float, frozenset[int] | None]:
    """(since, until, GPU indices or None for all); ValueError saying what is wrong."""
    try:
        q = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=10)
    except ValueError:
        raise ValueError("too many query parameters") from None
    unknown = sorted(set(q) - {"since", "until", "gpu"})
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}: since, until and gpu are known")
    for name, values in q.items():
        if len(values) > 1:  # which one was meant is not for the daemon to guess
            raise ValueError(f"{name}: given {len(values)} times; give it once (gpu=0,3 for several GPUs)")
    since = _point("since", q.get("since", ["1h"])[0], now)  # one reading of now: 1d is a day before until
    until = _point("until", q["until"][0], now) if "until" in q else now
    if until <= since:
        raise ValueError("since must come before until")
    gpus = q.get("gpu", [""])[0]
    if gpus and not all(x.strip().isascii() and x.strip().isdigit() for x in gpus.split(",")):
        raise ValueError(f"gpu: expected indices such as 0 or 0,3; got {gpus!r}")
    if until - since > max_range_s:
        raise ValueError(
            f"the range is {until - since:.0f} s, more than {max_range_s:g} s: ask for less, or run "
            "gpumon analyze --from on the host"
        )
    return since, until, frozenset(int(x) for x in gpus.split(",")) if gpus else None


def _lower_priority() -> None:
    """The analysis thread at nice 19 (Linux: a thread's nice is its own): under load the sampler
    and the scrapes come first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


def _status(code: int | None, why: str) -> int:
    """The HTTP status of an analysis that failed with exit `code` saying `why`."""
    if code == EXIT_BAD_TRACE and ("no samples" in why or "no GPU" in why):
        return 404  # nothing found: the range or the GPU asked for holds none
    if code == EXIT_USAGE:
        return 400
    return 500
