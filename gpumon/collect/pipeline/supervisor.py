"""Run work that may block forever on expendable threads (see gpumon.core.guard).

`Supervisor.call(fn)` runs `fn` on a worker thread and returns what it returns. While it runs,
the supervisor (the calling thread) watches the guard: a worker stuck in one guarded call for
longer than the deadline is abandoned, and `fn` is called again on a fresh thread, which skips
what hung (the source knows, from the guard) and goes on. The supervisor wakes once per
deadline while nothing is late, so watching costs nothing measurable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from gpumon.core.guard import Abandoned, CallGuard
from gpumon.core.threads import named_thread

log = logging.getLogger("gpumon.supervisor")

T = TypeVar("T")


class Supervisor:
    def __init__(
        self,
        guard: CallGuard,
        timeout_s: float,
        name: str = "gpumon-sampler",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = guard
        self.timeout_s = timeout_s
        self.name = name
        self._clock = clock
        self.replaced = 0
        """Workers abandoned so far (each one left blocked in a call)."""

    def call(self, fn: Callable[[], T], stop: threading.Event | None = None) -> T:
        """`fn()` on a supervised thread; re-run on a fresh one whenever a worker is abandoned.
        Exceptions from `fn` are raised here. With `stop` set, returns (raising StopSupervision)
        without waiting for a worker that is stuck."""
        while True:
            worker, done, box = self._start(fn)
            if self._watch(worker, done, stop):
                if not box:
                    raise StopSupervision()
                ok, value = box[0]
                if ok:
                    return value  # type: ignore[return-value]
                raise value  # type: ignore[misc]
            self.replaced += 1

    def _start(
        self, fn: Callable[[], T]
    ) -> tuple[threading.Thread, threading.Event, list[tuple[bool, object]]]:
        done = threading.Event()
        box: list[tuple[bool, object]] = []

        def work() -> None:
            try:
                box.append((True, fn()))
            except Abandoned:
                return  # replaced: end quietly, the fresh thread has taken over
            except BaseException as e:  # handed to the supervising thread, raised there
                box.append((False, e))
            done.set()

        worker = named_thread(work, self.name)
        worker.start()
        return worker, done, box

    def _watch(self, worker: threading.Thread, done: threading.Event, stop: threading.Event | None) -> bool:
        """True when the worker finished (or stop was set); False when it was abandoned."""
        ident = worker.ident
        assert ident is not None
        mine = {ident}
        while True:
            due = self.guard.next_due(self.timeout_s, mine)
            now = self._clock()
            # (at least once per timeout: a stop is seen while a slow call runs its allowance)
            wait = self.timeout_s if due is None else min(self.timeout_s, max(0.0, due - now))
            if done.wait(wait):  # a stop ends the worker's loop, which sets `done`
                return True
            if stop is not None and stop.is_set():
                return True
            for thread, since in self.guard.overdue(self._clock(), self.timeout_s, mine):
                if self.guard.abandon(thread):
                    log.info(
                        "an NVML call has not returned for %.1f s: its thread is left behind and "
                        "sampling goes on in a fresh one",
                        self._clock() - since,
                    )
                    return False


class StopSupervision(Exception):
    """`stop` was set while the worker was still running (perhaps stuck)."""
