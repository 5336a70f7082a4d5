"""Count failures and log each cause once, not once per tick.

A monitoring loop that logs every failure every second buries the one line that matters; this
logs the first occurrence of each cause, counts the rest, and logs once more when it clears.
"""

from __future__ import annotations

import logging
from collections import Counter


class Problems:
    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.counts: Counter[str] = Counter()
        """Failures seen per cause since start (exported later as counters)."""
        self._active: set[str] = set()

    def note(self, cause: str, level: int = logging.WARNING) -> None:
        self.counts[cause] += 1
        if cause not in self._active:
            self._active.add(cause)
            self._log.log(level, "%s (logged once; counting repeats)", cause)

    def clear(self, cause_prefix: str) -> None:
        """The thing named by `cause_prefix` works again: log that once."""
        gone = {c for c in self._active if c.startswith(cause_prefix)}
        for cause in sorted(gone):
            self._log.info("recovered after %d failures: %s", self.counts[cause], cause)
        self._active -= gone

    @property
    def any_active(self) -> bool:
        return bool(self._active)

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)
