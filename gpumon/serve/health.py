"""Health: /healthz and the systemd watchdog's judgement of whether the daemon's data is fresh.

A daemon whose newest sample is old, or whose NVML gives no fresh data, says so on /healthz (503).
A hung driver (fresh data stopped) also stops the watchdog pings, so systemd restarts the service:
a new process is the only way out of a hung driver call. A driver absent since start does not
(the daemon retries it with backoff; a restart would not bring one).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.collect.sampler import SourceStats
from gpumon.core.model import Tick
from gpumon.serve.snapshot import Snapshot


@dataclass(eq=False)  # state, not a value: equal only to itself
class NvmlFreshness:
    """When NVML last gave a fresh reading: what /healthz and the watchdog pings go by."""

    real_gpus: bool
    """Only real GPUs (NVML) are judged; simulated and replayed ones are always fresh."""
    started_t: float
    fresh_t: float | None = None
    """The last tick with a successful reading and a GPU answering (or none installed)."""

    def observe(self, tick: Tick, stats: SourceStats | None) -> None:
        """After each tick: was NVML's reading fresh?"""
        if (
            stats is not None
            and stats.last_success
            and (not tick.gpus or any(g.available for g in tick.gpus))
        ):
            self.fresh_t = tick.t_s

    def trouble(self, now: float, stale_s: float, stats: SourceStats | None) -> tuple[str | None, str]:
        """("stale", why): none for `stale_s` after there had been some, or a driver-wide call
        hangs: /healthz fails and the watchdog pings stop. ("absent", why): none since start, for
        `stale_s`: /healthz fails, the pings go on. (None, ""): fine."""
        if not self.real_gpus:
            return None, ""
        why = (stats.last_error if stats is not None else None) or "no GPU answered"
        if self.fresh_t is not None:
            age = now - self.fresh_t
            if age >= stale_s:
                return "stale", f"no fresh NVML data for {age:.0f} s (limit {stale_s:g} s): {why}"
            return None, ""
        if now - self.started_t >= stale_s:
            return "absent", f"no NVML data since start: {why}"
        return None, ""


def health(
    snap: Snapshot | None, now: float, interval_s: float, trouble: tuple[str | None, str]
) -> tuple[bool, str]:
    """What /healthz answers: (ok, one line)."""
    if snap is None:
        return False, "starting: no sample yet"
    age = now - snap.t_s
    limit = 3 * interval_s + 5
    if age > limit:
        return False, f"stale: the newest sample is {age:.0f} s old (limit {limit:g} s)"
    if trouble[0] is not None:
        return False, f"nvml: {trouble[1]}"
    return True, f"ok: {len(snap.tick.gpus)} GPU(s), newest sample {age:.1f} s old"
