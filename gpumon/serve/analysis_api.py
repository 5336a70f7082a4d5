"""/api/v1/analysis?since=TIME&until=TIME&gpu=N,M: `gpumon analyze --from` over the flight
recorder's directory, as JSON.

One at a time (429 while one runs), the range at most analysis_max_range_s, in its own niced
process stopped after analysis_timeout_s: an analysis never holds up the sampler or a scrape, and
never takes the daemon's memory with it. The process dies with the daemon (PR_SET_PDEATHSIG, and
killed when the server stops), so a SIGTERM leaves no analysis running. Statuses: 400 for a query
that cannot be right (unknown parameter, since after until, a range too long), 404 for one that
finds nothing (no samples, no such GPU), 429/503 to try again later, 500 only for a failure of
gpumon's own.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from gpumon.config.settings import Config
from gpumon.core.errors import EXIT_BAD_TRACE, EXIT_USAGE
from gpumon.core.timepoints import iso_utc, time_point

Answer = tuple[int, bytes]


def _problem(status: int, why: str) -> Answer:
    return status, json.dumps({"error": why}).encode()


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


class AnalysisApi:
    def __init__(self, directory: str | None, settings: Callable[[], Config]) -> None:
        """`directory`: the recorder's (None: the recorder is off); `settings`: the configuration
        now (a reload changes the limits and thresholds)."""
        self.directory = directory
        self._settings = settings
        self._running = False

    async def answer(self, query: str) -> Answer:
        if self.directory is None:
            return _problem(404, "the recorder is off (record = off, or simulated GPUs without record_dir)")
        if self._running:
            return _problem(429, "an analysis is running: one at a time; try again shortly")
        cfg = self._settings()
        try:
            q = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=10)
        except ValueError:
            return _problem(400, "too many query parameters")
        unknown = sorted(set(q) - {"since", "until", "gpu"})
        if unknown:
            return _problem(400, f"unknown parameter {unknown[0]!r}: since, until and gpu are known")
        now = time.time()  # one reading: since=1d is exactly a day before until=now
        try:
            since = _when(q.get("since", ["1h"])[-1], now)
            until = _when(q["until"][-1], now) if "until" in q else now
        except ValueError as e:  # its message names the value
            return _problem(400, f"{e}")
        if until <= since:
            return _problem(400, "since must come before until")
        gpus = q.get("gpu", [""])[-1]
        if gpus and not all(x.strip().isdigit() for x in gpus.split(",")):
            return _problem(400, f"gpu: expected indices such as 0 or 0,3; got {gpus!r}")
        limit = cfg.analysis_max_range_s
        if until - since > limit:
            return _problem(
                400,
                f"the range is {until - since:.0f} s, more than {limit:g} s: ask for less, or run "
                "gpumon analyze --from on the host",
            )
        th = cfg.thresholds
        nice = shutil.which("nice")  # coreutils' (where setpriority is filtered, it runs it as is)
        args = [nice, "-n", "19"] if nice else []
        args += [sys.executable, "-m", "gpumon", "analyze", "--json", "--jobs", "1", "--from", self.directory]
        args += ["--since", iso_utc(since), "--until", iso_utc(until)]
        args += ["--gpu", gpus] if gpus else []
        args += [f"--threshold={k}={getattr(th, k)}" for k in th.__slots__]
        self._running = True
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
                proc.kill()
                await proc.wait()
                limit_s = cfg.analysis_timeout_s
                return _problem(503, f"the analysis took longer than {limit_s:g} s: ask for a shorter range")
            except asyncio.CancelledError:  # the server is stopping: the analysis goes with it
                proc.kill()
                raise
        except OSError as e:
            return _problem(503, f"cannot start the analysis: {e.strerror}")
        finally:
            self._running = False
        if proc.returncode != 0:
            why = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            why = why.removeprefix("gpumon: error: ").removeprefix("gpumon analyze: error: ")
            return _problem(_status(proc.returncode, why), why)
        return 200, out


def _status(code: int | None, why: str) -> int:
    """The HTTP status of an analysis that failed with exit `code` saying `why`."""
    if code == EXIT_BAD_TRACE and ("no samples" in why or "no GPU" in why):
        return 404  # nothing found: the range or the GPU asked for holds none
    if code == EXIT_USAGE:
        return 400
    return 500
