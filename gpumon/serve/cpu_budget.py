"""How much CPU the analysis API may spend: a bucket of CPU seconds that fills at `share` of a core
and holds at most `burst_s`. An analysis starts only while the bucket holds some; what it used
(measured, not estimated) is taken out when it ends, so one long analysis can leave the bucket in
debt, and the next waits until it is repaid. Over any stretch of T seconds the analyses use at most
burst_s + share x T, plus the one that overdrew. No clock of its own: `now` comes with each call.
"""

from __future__ import annotations

import math

ANALYSIS_CPU_SHARE = 0.05
"""Of one core, averaged: with the burst, at most 10% over any minute (3 s + 3 s of 60)."""
ANALYSIS_BURST_CPU_S = 3.0


class CpuBudget:
    def __init__(
        self, share: float = ANALYSIS_CPU_SHARE, burst_s: float = ANALYSIS_BURST_CPU_S, now: float = 0.0
    ) -> None:
        self.share = share
        self.burst_s = burst_s
        self._left = burst_s
        self._at = now

    def left(self, now: float) -> float:
        """CPU seconds in the bucket now (negative: in debt)."""
        self._left = min(self.burst_s, self._left + max(0.0, now - self._at) * self.share)
        self._at = max(self._at, now)
        return self._left

    def allows(self, now: float) -> bool:
        return self.left(now) > 0.0

    def charge(self, cpu_s: float, now: float) -> None:
        self.left(now)
        self._left -= max(0.0, cpu_s)

    def retry_after_s(self, now: float) -> int:
        """Whole seconds until the bucket holds some again (at least 1)."""
        left = self.left(now)
        return max(1, math.ceil(-left / self.share)) if left <= 0 else 1
