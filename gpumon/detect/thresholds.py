"""The detector's thresholds, with the reason for each default (docs/detector.md says more)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


def _limit(default: Any, low: float, high: float) -> Any:
    """A threshold's default and the range it may be set to (checked by __post_init__)."""
    return field(default=default, metadata={"low": low, "high": high})


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The detector's thresholds; each is checked against its range when made."""

    window_s: float = _limit(8.0, 2.0, 600.0)
    """Seconds of sub-second history each verdict looks at: long enough to hold several steps of a
    slow job (and an I/O gap of a second or more), short enough to flag a change within 10 s."""
    host_window_s: float = _limit(3.0, 0.5, 600.0)
    """Host signals (CPU of the job's processes, iowait, reads) are averaged over the last few
    seconds only, so a change of cause shows quickly."""
    confirm_s: float = _limit(3.0, 0.0, 600.0)
    """A new state must be seen this long before it is reported: a steady workload never flaps."""

    fed_duty: float = _limit(0.80, 0.01, 1.0)
    """Duty cycle (share of time a kernel ran) at or above which a GPU counts as fed. TensorFlow's
    profiler calls a step "highly input-bound" from 20% input time, i.e. below 80% compute."""
    hysteresis: float = _limit(0.05, 0.0, 0.5)
    """A healthy GPU is left below fed_duty - hysteresis and re-entered at fed_duty + hysteresis."""
    stalled_duty: float = _limit(0.02, 0.0, 1.0)
    """Below this duty with a process holding the GPU: nothing runs (a hang)."""
    gap_util: float = _limit(0.05, 0.0, 1.0)
    """A driver sample at or below this is an idle gap."""
    burst_low_util: float = _limit(0.25, 0.0, 1.0)
    bursty_spread: float = _limit(0.20, 0.0, 1.0)
    """A quarter of the window has bursts and gaps when its samples dip to burst_low_util or below
    and swing by bursty_spread or more (max - min). The dip need not reach zero: gaps shorter than
    the driver's sample period never read empty. Steady low use stays within a few percent, and a
    healthy job with long steps swings high (70-100%), not low. (SageMaker's LowGPUUtilization
    calls p95 > 70% with p5 < 10% "fluctuations"; this asks the same of each part of the window.)"""
    bursty_quarters: int = _limit(2, 1, 4)
    """Bursts and gaps must recur: in at least this many of the window's four quarters. A workload
    that changes (busy, then idle) mixes only the quarter where it changed."""

    sync_min_duty: float = _limit(0.90, 0.0, 1.0)
    sync_max_power_ratio: float = _limit(0.30, 0.0, 1.0)
    """Busy-looking (>= 90%) at no more than 30% of the power limit: kernels that spin (NCCL waits)
    rather than compute. Training at 90% duty draws well over half the limit on data-center GPUs."""
    sync_peer_gaps: float = _limit(0.50, 0.05, 1.0)
    """Busy-looking (>= sync_min_duty) while another GPU of the same job is starved with at least
    this share of gaps: in synchronous data parallelism the others wait that share of each step in
    the collective (the bench's truth calls a rank waiting 50% or more sync-stall)."""
    sync_peer_power_margin: float = _limit(0.10, 0.0, 1.0)
    """...and drawing no more than the starved GPU's power plus this share of the limit: a rank
    that computed all the time would draw what a fed GPU draws, well above a starved one's."""

    pinned_core: float = _limit(0.90, 0.01, 64.0)
    """A process (or loader worker) using this much of one core is saturated: under the GIL one
    feeder thread pins one core while the machine as a whole looks half idle."""
    host_cpu_busy: float = _limit(0.90, 0.01, 1.0)
    """All cores this busy: the host has no CPU left for the input pipeline."""
    iowait_high: float = _limit(0.15, 0.0, 1.0)
    """Host iowait share suggesting storage-bound input (used when per-process reads are hidden;
    proc(5) warns iowait is unreliable on many cores, hence the read-rate check below)."""
    read_bytes_high: float = _limit(50e6, 0.0, 1e12)
    """Storage reads by the job's processes (bytes/s) that point at storage on their own."""
    read_bytes_with_gaps: float = _limit(10e6, 0.0, 1e12)
    """Lower reads that point at storage when the GPU also waits in recurring gaps: a job pulling
    from a slow or network filesystem at 20 MB/s starves its GPU as surely (the Keras bench's
    starved-io reads at ~40 MB/s). Steady, gap-free use with such reads stays underutilized."""

    blkio_wait_high: float = _limit(0.3, 0.0, 1000.0)
    """The job's processes together waiting this long for block I/O per second (delayacct, where
    the kernel counts it) point at storage, unless they wait for a CPU longer still."""

    small_kernels_sm: float = _limit(0.50, 0.0, 1.0)
    """GPM only: a GPU kept busy (fed) whose kernels fill less than this share of its SMs while
    they run (SM activity / graphics activity) is `underutilized`, cause `small-kernels`: NVML's
    utilization reads it busy, yet most SMs wait (a small batch, launch-bound steps). NVIDIA's DCGM
    guide calls SM activity under 0.5 ineffective use of the GPU. Left with hysteresis."""

    starting_grace_s: float = _limit(120.0, 0.0, 3600.0)
    """A job whose processes opened the GPU less than this long ago and that has run no kernel yet
    is `starting`, not `stalled`: imports, dataset indexing, torch.compile and checkpoint loading
    take seconds to minutes before the first kernel. Past it, a job that still runs nothing is
    stalled. The job's age is its oldest GPU process's (from the host), or, where the host cannot
    see them, since gpumon first saw them on the GPU."""

    starting_busy_s: float = _limit(1200.0, 0.0, 86400.0)
    """A job past `starting_grace_s` that has still run no kernel, but whose processes work on the
    host (one of its processes saturating a core, `pinned_core`, or wanting one on a core it shares,
    or the job reading storage at `read_bytes_with_gaps` or more, within the last STARTING_QUIET_S),
    stays `starting` up to this long after it started: a dataset tokenized after the GPU was opened,
    a checkpoint loaded from network storage, a model compiled. A hang is quiet on the host; a job
    that never gets to its first kernel is judged as any other past this (stalled, or starved where
    its loader works)."""

    min_points: int = _limit(4, 1, 10000)
    """Fewer driver samples than this in the window: not enough to judge (state unknown)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = int if f.type in ("int", int) else float
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if kind is int and ok:
                ok = float(value).is_integer()
            if not ok or not f.metadata["low"] <= value <= f.metadata["high"]:
                raise ValueError(
                    f"detector threshold {f.name} must be {'a whole number' if kind is int else 'a number'} "
                    f"between {f.metadata['low']:g} and {f.metadata['high']:g}, got {value!r}"
                )


def threshold_limits() -> dict[str, tuple[type, float, float]]:
    """Each threshold's type and allowed range, from the definitions above."""
    return {
        f.name: (int if f.type in ("int", int) else float, f.metadata["low"], f.metadata["high"])
        for f in fields(Thresholds)
    }


DEFAULT_THRESHOLDS = Thresholds()
