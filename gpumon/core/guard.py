"""Calls that may never return, and the threads that make them expendable.

A GPU falling off the bus can hang an NVML call for minutes, and a driver-wide hang takes every
call with it. Python cannot interrupt a thread blocked in C, so gpumon makes the thread
expendable instead: the source brackets each call that may hang with `enter(what)` / `leave()`;
a supervisor (gpumon.collect.pipeline.supervisor) that finds a thread in one call for too long
`abandon`s it, the source is told what hung (`on_hang`) and skips it from then on, and the work
goes on in a fresh thread. When the abandoned call returns, at any later time, `leave()` tells
the source (`on_return`) and raises `Abandoned`, which unwinds that thread without touching
anything else: it never writes a late answer over a newer one.

The bracketing is a dict store and a pop per call, with no lock and no thread hand-off: the
guard costs well under a microsecond per GPU per tick (benchmarks/nvml_cost.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

_get_ident = threading.get_ident


class Abandoned(BaseException):
    """Raised in a thread whose guarded call returned after the thread was replaced. A
    BaseException, so that no `except Exception` on the way (source isolation) swallows it."""


class CallGuard:
    def __init__(
        self,
        on_hang: Callable[[Hashable, float], None] | None = None,
        on_return: Callable[[Hashable], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_hang = on_hang
        """Told (what, since) when a thread is abandoned in a call on `what`."""
        self.on_return = on_return
        """Told `what` when an abandoned call finally returns."""
        self._clock = clock
        self._inflight: dict[int, tuple[Hashable, float, float | None]] = {}
        self._abandoned: dict[int, Hashable] = {}

    def enter(self, what: Hashable, allow_s: float | None = None) -> None:
        """A call on `what` begins; `allow_s`: how long this one may take before it counts as hung
        (default: the supervisor's timeout), for a call known to be slow (nvmlInit)."""
        self._inflight[_get_ident()] = (what, self._clock(), allow_s)

    def leave(self) -> None:
        """End of the call; raises Abandoned in a thread that was replaced meanwhile."""
        ident = _get_ident()
        if self._inflight.pop(ident, None) is None:
            what = self._abandoned.pop(ident, None)
            if self.on_return is not None and what is not None:
                self.on_return(what)
            raise Abandoned()

    def overdue(
        self, now: float, timeout_s: float, threads: set[int] | None = None
    ) -> list[tuple[int, float]]:
        """(thread, since) of the calls older than their allowance, else `timeout_s` (of `threads`
        only, if given)."""
        return [
            (ident, since)
            for ident, (_what, since, allow) in list(self._inflight.items())
            if now - since >= (timeout_s if allow is None else allow)
            and (threads is None or ident in threads)
        ]

    def next_due(self, timeout_s: float, threads: set[int] | None = None) -> float | None:
        """When the first call in progress becomes overdue (None: no call in progress)."""
        dues = [
            since + (timeout_s if allow is None else allow)
            for i, (_w, since, allow) in list(self._inflight.items())
            if threads is None or i in threads
        ]
        return min(dues, default=None)

    def abandon(self, ident: int) -> bool:
        """Give up on the thread `ident`. False when its call returned in the meantime.

        The owner hears `on_hang` before the thread is given up, so that a call returning at that
        very moment (its `leave` then finds itself abandoned) always clears what it set. The pop
        is atomic under the GIL: exactly one of `leave` and `abandon` wins it."""
        entry = self._inflight.get(ident)
        if entry is None:
            return False
        what, since, _allow = entry
        self._abandoned[ident] = what
        if self.on_hang is not None:
            self.on_hang(what, since)
        if self._inflight.pop(ident, None) is None:  # it returned after all: undo
            self._abandoned.pop(ident, None)
            if self.on_return is not None:
                self.on_return(what)
            return False
        return True

    @property
    def stuck_threads(self) -> int:
        """Threads abandoned in a call that has not returned yet."""
        return len(self._abandoned)
