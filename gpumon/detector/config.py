"""The detector's thresholds, with the reason for each default (docs/detector.md says more)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class Thresholds:
    window_s: float = 8.0
    """Seconds of sub-second history each verdict looks at: long enough to hold several steps of a
    slow job (and an I/O gap of a second or more), short enough to flag a change within 10 s."""
    host_window_s: float = 3.0
    """Host signals (CPU of the job's processes, iowait, reads) are averaged over the last few
    seconds only, so a change of cause shows quickly."""
    confirm_s: float = 3.0
    """A new state must be seen this long before it is reported: a steady workload never flaps."""

    fed_duty: float = 0.80
    """Duty cycle (share of time a kernel ran) at or above which a GPU counts as fed. TensorFlow's
    profiler calls a step "highly input-bound" from 20% input time, i.e. below 80% compute."""
    hysteresis: float = 0.05
    """A healthy GPU is left below fed_duty - hysteresis and re-entered at fed_duty + hysteresis."""
    stalled_duty: float = 0.02
    """Below this duty with a process holding the GPU: nothing runs (a hang)."""
    gap_util: float = 0.05
    """A driver sample at or below this is an idle gap."""
    burst_low_util: float = 0.25
    bursty_spread: float = 0.20
    """A quarter of the window has bursts and gaps when its samples dip to burst_low_util or below
    and swing by bursty_spread or more (max - min). The dip need not reach zero: gaps shorter than
    the driver's sample period never read empty. Steady low use stays within a few percent, and a
    healthy job with long steps swings high (70-100%), not low. (SageMaker's LowGPUUtilization
    calls p95 > 70% with p5 < 10% "fluctuations"; this asks the same of each part of the window.)"""
    bursty_quarters: int = 2
    """Bursts and gaps must recur: in at least this many of the window's four quarters. A workload
    that changes (busy, then idle) mixes only the quarter where it changed."""

    sync_min_duty: float = 0.90
    sync_max_power_ratio: float = 0.30
    """Busy-looking (>= 90%) at no more than 30% of the power limit: kernels that spin (NCCL waits)
    rather than compute. Training at 90% duty draws well over half the limit on data-center GPUs."""

    pinned_core: float = 0.90
    """A process (or loader worker) using this much of one core is saturated: under the GIL one
    feeder thread pins one core while the machine as a whole looks half idle."""
    host_cpu_busy: float = 0.90
    """All cores this busy: the host has no CPU left for the input pipeline."""
    iowait_high: float = 0.15
    """Host iowait share suggesting storage-bound input (used when per-process reads are hidden;
    proc(5) warns iowait is unreliable on many cores, hence the read-rate check below)."""
    read_bytes_high: float = 50e6
    """Storage reads by the job's processes (bytes/s) that point at storage on their own."""
    read_bytes_with_gaps: float = 10e6
    """Lower reads that point at storage when the GPU also waits in recurring gaps: a job pulling
    from a slow or network filesystem at 20 MB/s starves its GPU as surely (the Keras bench's
    starved-io reads at ~40 MB/s). Steady, gap-free use with such reads stays underutilized."""

    min_points: int = 4
    """Fewer driver samples than this in the window: not enough to judge (state unknown)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"detector threshold {f.name} must be a number >= 0, got {value!r}")
        if not 0 < self.fed_duty <= 1:
            raise ValueError(f"detector threshold fed_duty must be in (0, 1], got {self.fed_duty}")
        if self.window_s <= 0 or self.confirm_s < 0:
            raise ValueError("detector thresholds window_s must be > 0 and confirm_s >= 0")


DEFAULT_THRESHOLDS = Thresholds()
