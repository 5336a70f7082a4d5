"""XID errors: NVML's critical-error events, counted per GPU (and MIG instance) and code.

One thread per process waits on one NVML event set (nvmlEventSetWait_v2) with a timeout, so a
stop is obeyed within `wait_ms` (shutdown stays under 2 s). Counts only grow while gpumon runs:
a Prometheus counter, not a gauge that sticks at the last code (dcgm-exporter #190). The event
carries the device handle, mapped back to the GPU index it was registered under, with no NVML
call: a GPU that falls off the bus reports XID 79 and is lost at the same moment.

Logging is bounded apart from counting: a failing GPU can raise thousands of XIDs a second (an XID
storm), and a line each flooded the journal. A GPU's first XID of each code is logged at once; the
rest are summed per GPU and code into one line a minute at most (SUMMARY_S), with their counts.
Every event is still counted for the metrics.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon.collect.sources.nvml.codes import TIMEOUT, code_of
from gpumon.core.model import XidCount
from gpumon.core.problems import Problems
from gpumon.core.threads import named_thread

log = logging.getLogger("gpumon.xid")

XID_CRITICAL_ERROR = 0x8
"""nvmlEventTypeXidCriticalError (nvml.h)."""
NO_INSTANCE = 0xFFFFFFFF
"""gpuInstanceId of an event not attributable to one MIG instance."""
MAX_INSTANCE = 64
"""A gpuInstanceId at or above this (other than NO_INSTANCE) is no MIG instance's (an H100 has 7):
counted for the whole GPU, so that a driver's odd ids make no unbounded count of units."""
MAX_CODES = 64
"""Distinct XID codes counted per GPU or instance (NVIDIA's list has about 150, a GPU sees a few):
a driver giving odd event data makes no unbounded count of codes, nor of /metrics series."""
SUMMARY_S = 60.0
"""After a GPU's first XID of a code (logged at once), its further XIDs are logged as one line with
their counts, at most once this often per GPU: an XID storm does not flood the journal."""
SUMMARY_CODES = 8
"""Codes a summary line names, the most frequent first (the rest summed as "other codes")."""
OTHER_CODES = -1
"""Where a summary sums the codes beyond MAX_CODES (XID codes are never negative)."""
UNREGISTERED = -1
"""The "GPU" whose lines tell of events on a device gpumon did not register (not counted)."""
DEFAULT_WAIT_MS = 1000
"""One wake-up a second while no event comes (the driver sleeps in the kernel meanwhile); a stop is
obeyed within it, and stop() waits 1.5 s."""

Key = tuple[int, int | None]
"""(GPU index, MIG GPU instance id or None)."""


def handle_key(handle: Any) -> int:
    """A handle's identity: its address for a ctypes pointer (the driver's own), else the object."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    def __init__(
        self,
        nvml: Any,
        problems: Problems,
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        wall_clock: Callable[[], float] = time.time,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`wall_clock` stamps the last XID (Unix time, for /metrics); `clock` paces the log lines."""
        self._nv = nvml
        self._problems = problems
        self._wait_ms = wait_ms
        self._wall = wall_clock
        self._retry_s = retry_s
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._set: Any = None
        self._indices: dict[int, int] = {}
        self._lock = threading.Lock()
        self._counts: dict[Key, dict[int, int]] = {}
        self._last: dict[Key, tuple[int, float]] = {}
        self._clock = clock
        self._told: dict[int, set[tuple[int | None, int]]] = {}
        """Per GPU, the (MIG instance, code) pairs whose first XID was logged (MAX_CODES at most)."""
        self._untold: dict[int, dict[tuple[int | None, int], int]] = {}
        """Per GPU, the XIDs by (instance, code) since its last line (beyond MAX_CODES pairs: all
        summed as (None, OTHER_CODES))."""
        self._next_line: dict[int, float] = {}
        """Per GPU, when its next summary line may be logged (by `clock`)."""
        self._next_flush = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.supported = True

    def register(self, index: int, handle: Any) -> bool:
        """Watch GPU `index` (its handle as NVML gave it); False where it has no XID events."""
        if not self.supported:
            return False
        nv = self._nv
        try:
            if self._set is None:
                if not hasattr(nv, "nvmlEventSetCreate"):
                    self.supported = False
                    return False
                self._set = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(handle, XID_CRITICAL_ERROR, self._set)
        except self._error_type as e:
            log.info("gpu %d: no XID events (%s)", index, e)
            return False
        self._indices[handle_key(handle)] = index
        return True

    def start(self) -> None:
        if self._set is None or self._thread is not None:
            return
        self._thread = named_thread(self._run, "gpumon-xid")
        self._thread.start()

    def _run(self) -> None:
        nv = self._nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except self._error_type as e:
                if code_of(e) != TIMEOUT:  # TIMEOUT: nothing happened within the wait
                    self._problems.note("nvml:xid", f"nvml: waiting for XID events failed: {e}")
                    self._stop.wait(self._retry_s)  # do not spin on a failing driver
                    continue
                data = None
            if self._problems.any_active:  # waiting works (again)
                self._problems.clear("nvml:xid")
            if data is not None and int(data.eventType) & XID_CRITICAL_ERROR:
                self.record(data.device, int(data.eventData), int(data.gpuInstanceId))
            if self._untold:  # a storm that has stopped still gets its last line
                self.flush_summaries()

    def record(self, device: Any, xid: int, gpu_instance: int = NO_INSTANCE) -> None:
        index = self._indices.get(handle_key(device))
        now = self._clock()
        if index is None:  # not counted; its lines are paced like a GPU's
            with self._lock:
                first, summary = self._pace(UNREGISTERED, None, xid, now)
            if first:
                log.warning("XID %d on a device gpumon did not register; not counted", xid)
            if summary:
                log.warning("%s", summary)
            return
        key: Key = (index, gpu_instance if 0 <= gpu_instance < MAX_INSTANCE else None)
        with self._lock:
            per = self._counts.setdefault(key, {})
            if xid in per or len(per) < MAX_CODES:
                per[xid] = per.get(xid, 0) + 1
            self._last[key] = (xid, self._wall())
            first, summary = self._pace(index, key[1], xid, now)
        if first:
            where = f"gpu {index}" + (f" mig {key[1]}" if key[1] is not None else "")
            log.warning(
                "%s: XID %d (further XIDs on gpu %d: one line a minute at most, with their counts)",
                where,
                xid,
                index,
            )
        if summary:
            log.warning("%s", summary)

    def _pace(self, index: int, mig: int | None, xid: int, now: float) -> tuple[bool, str | None]:
        """Whether this XID is the first of its code on the GPU or MIG instance (logged at once: 64
        of them a GPU at most), and the GPU's summary line that is due with it. Under the lock."""
        told = self._told.setdefault(index, set())
        if (mig, xid) not in told and len(told) < MAX_CODES:
            told.add((mig, xid))
            self._next_line.setdefault(index, now + SUMMARY_S)
            return True, None
        untold = self._untold.setdefault(index, {})
        code = (mig, xid) if (mig, xid) in untold or len(untold) < MAX_CODES else (None, OTHER_CODES)
        untold[code] = untold.get(code, 0) + 1
        return False, self._summary(index, now) if now >= self._next_line.get(index, now) else None

    def _summary(self, index: int, now: float) -> str | None:
        """The GPU's line for the XIDs since its last one (None: none), and the next one's time."""
        untold = self._untold.pop(index, None)
        if not untold:
            return None
        self._next_line[index] = now + SUMMARY_S
        total = sum(untold.values())
        other = untold.pop((None, OTHER_CODES), 0)
        ranked = sorted(
            untold.items(), key=lambda cn: (-cn[1], cn[0][1], -1 if cn[0][0] is None else cn[0][0])
        )
        other += sum(n for _, n in ranked[SUMMARY_CODES:])
        named = [
            f"XID {code} x{n}" if mig is None else f"XID {code} on mig {mig} x{n}"
            for (mig, code), n in ranked[:SUMMARY_CODES]
        ]
        by_code = ", ".join([*named, f"other codes x{other}"] if other else named)
        if index == UNREGISTERED:
            return f"{total} more XIDs on devices gpumon did not register (not counted): {by_code}"
        return f"gpu {index}: {total} more XIDs since its last line: {by_code}"

    def flush_summaries(self, every: bool = False) -> None:
        """Log the summaries that are due (a storm that stopped has no next event to carry its
        line); looked at once a second at most. `every`: all of them, due or not (a stop)."""
        now = self._clock()
        if now < self._next_flush and not every:
            return
        self._next_flush = now + 1.0
        with self._lock:
            lines = [
                line
                for index in [i for i in self._untold if every or now >= self._next_line.get(i, now)]
                if (line := self._summary(index, now))
            ]
        for line in lines:
            log.warning("%s", line)

    def seen(self, index: int, mig: int | None) -> tuple[tuple[XidCount, ...], tuple[int, float] | None]:
        if not self._counts:  # every GPU on every tick asks: the usual answer without the lock
            return (), None
        with self._lock:
            per = self._counts.get((index, mig))
            counts = tuple(XidCount(x, n) for x, n in sorted(per.items())) if per else ()
            return counts, self._last.get((index, mig))

    def stop(self, timeout_s: float = 1.5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # a driver call that does not return: leave it, never hang
                return
            self._thread = None
        self.flush_summaries(every=True)  # the last minute's XIDs are said before gpumon stops
        if self._set is not None:
            try:
                self._nv.nvmlEventSetFree(self._set)
            except self._error_type:
                pass
            self._set = None
