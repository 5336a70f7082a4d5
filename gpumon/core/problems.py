"""Failures by cause: logged once when they start and once when they clear, counted always.

A monitoring loop that logs every failure every second buries the one line that matters. Each
problem has a stable key (`nvml:gpu 3:power`, `sampler:host`) and a message for people; the key
says which problem it is, so a message that changes (a count of seconds, an errno) neither logs
again nor grows memory. The first part of the key, before the colon, is the source it belongs to:
the exporter counts problems per source, and the state API lists the active ones.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter


class Problems:
    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._active: dict[str, str] = {}
        """key -> the message logged when it started."""
        self._repeats: Counter[str] = Counter()
        """Occurrences of each active problem (dropped when it clears)."""
        self.totals: Counter[str] = Counter()
        """Occurrences per source since start: the gpumon_source_problems_total counter."""

    def note(self, key: str, message: str, level: int = logging.WARNING) -> None:
        """`key` happened (again); `message` is logged only the first time until it clears."""
        with self._lock:
            self._repeats[key] += 1
            self.totals[key.split(":", 1)[0]] += 1
            if key in self._active:
                return
            self._active[key] = message
        self._log.log(level, "%s (logged once; counting repeats)", message)

    def clear(self, key: str) -> None:
        """The problem `key` is over: log that once."""
        if key in self._active:
            self._clear([key])

    def clear_prefix(self, prefix: str, keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Every active problem under `prefix` is over, except those in `keep` (still failing)."""
        if not self._active:
            return
        with self._lock:
            gone = [k for k in self._active if k.startswith(prefix) and k not in keep]
        if gone:
            self._clear(gone)

    def _clear(self, keys: list[str]) -> None:
        with self._lock:
            done = [(k, self._active.pop(k), self._repeats.pop(k, 0)) for k in keys if k in self._active]
        for _key, message, n in sorted(done):
            self._log.info("recovered after %d failures: %s", n, message)

    @property
    def any_active(self) -> bool:
        return bool(self._active)

    def active(self) -> tuple[str, ...]:
        """The messages of the problems going on now, ordered by key."""
        with self._lock:
            return tuple(self._active[k] for k in sorted(self._active))

    def active_keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._active)

    def active_by_source(self) -> Counter[str]:
        with self._lock:
            return Counter(k.split(":", 1)[0] for k in self._active)
