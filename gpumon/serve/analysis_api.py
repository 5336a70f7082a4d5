"""/api/v1/analysis?since=TIME&until=TIME&gpu=N,M: `gpumon analyze --from` over the flight
recorder's directory, as JSON.

One at a time (429 while one runs), the range at most analysis_max_range_s, in its own niced
process stopped after analysis_timeout_s: an analysis never holds up the sampler or a scrape, and
never takes the daemon's memory with it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from gpumon.config.settings import Config
from gpumon.core.timepoints import iso_utc, time_point

Answer = tuple[int, bytes]


def _problem(status: int, why: str) -> Answer:
    return status, json.dumps({"error": why}).encode()


def _when(text: str) -> float:
    # a '+' left unescaped in a query is a space: 14:00+01:00 arrives as "14:00 01:00"
    return time_point(re.sub(r"(T\d\d:\d\d(?::\d\d(?:\.\d+)?)?) (\d\d:?\d\d)$", r"\1+\2", text))


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
        try:
            since = _when(q.get("since", ["1h"])[-1])
            until = _when(q["until"][-1]) if "until" in q else time.time()
        except ValueError as e:  # its message names the value
            return _problem(400, f"{e}")
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
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), cfg.analysis_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                limit_s = cfg.analysis_timeout_s
                return _problem(503, f"the analysis took longer than {limit_s:g} s: ask for a shorter range")
        except OSError as e:
            return _problem(503, f"cannot start the analysis: {e.strerror}")
        finally:
            self._running = False
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return _problem(404 if "no samples" in why[0] else 500, why[0].removeprefix("gpumon: error: "))
        return 200, out
