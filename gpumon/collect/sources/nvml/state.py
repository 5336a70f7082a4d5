"""What the NVML source keeps per GPU (and per MIG instance) between ticks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpumon.collect.sources.nvml.gpm_unit import GpmUnit
from gpumon.collect.sources.nvml.samples import SampleClockAligner
from gpumon.core.model import UtilPoint


@dataclass(eq=False)  # state, not a value: equal only to itself
class GpuState:
    """What the NVML source keeps per GPU between ticks: its handle and identity, the driver's last
    sample seen, and which of its calls answer."""

    index: int = -1
    handle: Any = None
    uuid: str = ""
    name: str = ""
    last_seen_ts_us: int = 0
    first_poll: bool = True
    aligner: SampleClockAligner = field(default_factory=SampleClockAligner)
    ahead_polls: int = 0
    """Readings in a row whose new samples were all stamped ahead of now (source._not_ahead)."""
    stale: tuple[int, int] = (0, 0)
    """(last seen timestamp, readings in a row with nothing newer than it): source._stale."""
    below: tuple[int, frozenset[int]] = (0, frozenset())
    """(last seen timestamp, the samples below it in the driver's ring when last looked at):
    samples that go on coming below the last seen mean it is ahead of the driver's clock."""
    replayed: frozenset[int] = frozenset()
    """After a clock stepped back was followed: the ring's samples from before the step (stamped
    above the new ones), left out of every reading until they roll out of the ring."""
    unsupported: set[str] = field(default_factory=set)
    memory_v1: bool = False
    """nvmlDeviceGetMemoryInfo_v2 is missing: fall back to v1 (whose "used" includes reserved)."""
    stuck_since: float | None = None
    """Set while a call on this GPU has not returned (its thread was abandoned)."""
    failing: set[str] = field(default_factory=set)
    """Fields that failed in this tick's reading (their problems stay active)."""
    plain_answered: bool = False
    """Every plain field (source.PLAIN_FIELDS) answered on the last careful reading: the next
    ticks read them on the fast path."""
    rest_answered: bool = False
    """Memory (v2), processes and clock events answered on the last careful reading: the fast
    path reads them too."""
    mig: int | None = None
    """A MIG instance's GPU instance id (this state is then one of its parent's `migs`)."""
    parent: GpuState | None = None
    migs: dict[int, GpuState] = field(default_factory=dict)
    mig_checked_t: float | None = None
    gpm: GpmUnit | None = None
    gpm_checked: bool = False
    pcie_counted: tuple[int, int, float] | None = None
    """The driver's PCIe byte counters at the last reading (tx, rx, seconds): the next reading's
    rates are since then. None where GPM gave the PCIe traffic instead (the counters not read)."""
    activity: GpmUnit | None = None
    """A unit without utilization samples (a MIG instance): GPM's graphics activity sampled
    between ticks too (gpumon.collect.sources.nvml.gpm), each step a point of its activity
    history; the tick's GPM figures cover the whole second since the last tick."""
    pending: deque[UtilPoint] = field(default_factory=lambda: deque(maxlen=64))
    """Activity points sampled since the last tick."""
    clock_bits: int | None = None
    clock_prev_t: float | None = None
    clock_s: dict[str, float] = field(default_factory=dict)
    xid_registered: bool = False
    quiet_since: float | None = None
    """Since when the GPU has had no process, no memory in use and 0% in every tick and sample
    (None: it has one, or is busy): after source.REST_AFTER_S of that it is at rest
    (source._at_rest)."""
    rested_to: float | None = None
    """The last tick read at rest: the driver's samples up to it are not taken again on waking."""
    waking: bool = False
    """Woken from rest, nothing read since: a reading with nothing new looks at the whole ring at
    once (source._stale), as a clock stepped back while at rest (a GPU reset) would hide the job."""

    @property
    def tag(self) -> str:
        """What problem keys name it by: `0`, or `0/3` for GPU 0's MIG instance 3."""
        return str(self.index) if self.mig is None else f"{self.index}/{self.mig}"

    @property
    def where(self) -> str:
        return f"gpu {self.index}" if self.mig is None else f"gpu {self.index} mig {self.mig}"
