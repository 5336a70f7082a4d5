"""The detector's words: the state of a GPU, the cause of a starved or underutilized one, and the
label that joins them (`starved-cpu`), as every outlet shows it (docs/detector.md, docs/metrics.md).

StrEnums: each member is its own string, so JSON, Prometheus labels and comparisons with text
read from a trace or a state API work unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class State(StrEnum):
    UNKNOWN = "unknown"
    """Not enough samples to judge, or the GPU is unavailable."""
    IDLE = "idle"
    """No process on the GPU, nothing running."""
    HEALTHY = "healthy"
    """Kernels run most of the time (fed)."""
    STARVED = "starved"
    """Bursts and gaps: the GPU waits for its input (cause: cpu, io or host)."""
    STALLED = "stalled"
    """A process holds the GPU and nothing runs."""
    SYNC_STALL = "sync-stall"
    """Busy-looking at low power: kernels spin in a collective, waiting for another rank."""
    UNDERUTILIZED = "underutilized"
    """Steady low use without gaps, or (GPM) kernels too small for the GPU."""
    STARTING = "starting"
    """A job opened the GPU recently (within starting_grace_s, or starting_busy_s while its processes
    work on the host) and has run no kernel yet: imports, data indexing, compilation, a checkpoint
    loading. Not a hang, and not waste to alert on."""
    MIG = "mig"
    """A GPU in MIG mode: its work runs in its instances, each judged on its own; the parent has
    no verdict of its own."""


class Cause(StrEnum):
    CPU = "cpu"
    IO = "io"
    HOST = "host"
    SMALL_KERNELS = "small-kernels"
    """`underutilized` only (GPM): busy, but most SMs idle while kernels run."""


STARVATION_CAUSES = (Cause.CPU, Cause.IO, Cause.HOST)
"""Causes of starvation (gpumon_gpu_starvation_cause)."""
WASTEFUL = frozenset({State.STARVED, State.STALLED, State.SYNC_STALL, State.UNDERUTILIZED})
"""States whose time counts as wasted GPU time."""


def state_label(state: str, cause: str | None) -> str:
    """`starved-cpu`, `healthy`, ...: a state with its cause, as scenarios, episodes and the state
    API name them. The one place this label is built."""
    return f"{state}-{cause}" if cause else str(state)


def main_label(seconds_by_label: Mapping[str, float]) -> str:
    """The label with the most time, ignoring `unknown` when anything else was seen: what a report
    calls a GPU's verdict over a range."""
    known = {k: v for k, v in seconds_by_label.items() if k != State.UNKNOWN and v > 0}
    pool = known or dict(seconds_by_label)
    return max(pool, key=lambda k: pool[k]) if pool else State.UNKNOWN
