"""Time sources. Everything that waits or stamps takes a Clock, so tests drive time directly."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Wait; a real clock wakes early when `stop` is set (so a stop is obeyed at once)."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic` and `time.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        if seconds > 0:
            if stop is not None:
                stop.wait(seconds)
            else:
                time.sleep(seconds)


class VirtualClock:
    """A clock that only moves when told to; `sleep` advances it instantly.

    Used by tests, and to record or replay faster than real time (`--speed max`).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        if seconds > 0:
            self._t += seconds

    def advance(self, seconds: float) -> None:
        self._t += seconds


class ScaledClock:
    """Real time sped up by `factor` (replay at 10x: one real second is ten trace seconds)."""

    def __init__(self, factor: float, base: Clock | None = None) -> None:
        if factor <= 0:
            raise ValueError("speed factor must be > 0")
        self._factor = factor
        self._base = base or MonotonicClock()
        self._t0 = self._base.now()

    def now(self) -> float:
        return (self._base.now() - self._t0) * self._factor

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        self._base.sleep(seconds / self._factor, stop)


class SinceStart:
    """Seconds since this clock was made: traces count time from the start of the recording."""

    def __init__(self, base: Clock) -> None:
        self._base = base
        self._t0 = base.now()

    def now(self) -> float:
        return self._base.now() - self._t0

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        self._base.sleep(seconds, stop)
