"""Plain frozen samples passed up the chain. Base units are in the field names.

Times (`t_s`) are seconds on the sampler's monotonic clock; in a trace they count from the start
of the recording. A field the hardware does not report is `None`, never NaN or zero.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

# Every record here is a NamedTuple rather than a frozen dataclass (and so are most of gpumon's
# other immutable records, docs/benchmarks.md "First sample"): built for every GPU on every tick, a
# frozen dataclass of 17 fields costs 3 µs to build against 0.6 µs (benchmarks/nvml_cost.py), and
# defining one costs 0.4-1.5 ms at import (its methods are compiled from generated source) against
# 0.05 ms: 38 of them were a fifth of `gpumon serve`'s start. Both are immutable; change them
# with `._replace(...)`.


class UtilPoint(NamedTuple):
    """One driver utilization sample: the share of its sample period in which a kernel ran."""

    t_s: float
    util_ratio: float


class GpuProcess(NamedTuple):
    pid: int
    gpu_mem_bytes: int | None


class JobRef(NamedTuple):
    """A job (Slurm) or pod (Kubernetes) that holds a GPU, and how gpumon knows it."""

    scheduler: str
    """`slurm` or `kubernetes`."""
    job_id: str
    """Slurm: the job id (an array task as `ARRAYJOB_TASK`); Kubernetes: `namespace/pod`."""
    user: str | None = None
    step: str | None = None
    """Slurm: the job step of the GPU's process, when a cgroup says it."""
    via: str = ""
    """Where it came from: `prolog`, `dcgm-mapping`, `cgroup`, `pod-resources`."""
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    started_unix_s: float | None = None
    """When the job began on this GPU, where known (the prolog writes it)."""


class GpmActivity(NamedTuple):
    """GPM (GPU Performance Monitoring, Hopper and newer) over the last interval: what the SMs did.

    Ratios are 0-1 shares of the interval (or of the SMs, warps, bandwidth); rates in bytes/s.
    A metric the driver does not give for this unit is None."""

    graphics_ratio: float | None = None
    """Share of time any compute or graphics work was active (GPM's GRAPHICS_UTIL)."""
    sm_active_ratio: float | None = None
    """Share of SMs busy, averaged over the interval (SM_UTIL)."""
    sm_occupancy_ratio: float | None = None
    """Active warps against the theoretical maximum (SM_OCCUPANCY)."""
    tensor_ratio: float | None = None
    """Share of time the SMs ran any tensor-core instructions (ANY_TENSOR_UTIL)."""
    dram_bw_ratio: float | None = None
    """DRAM bandwidth used against the maximum (DRAM_BW_UTIL)."""
    fp16_ratio: float | None = None
    fp32_ratio: float | None = None
    fp64_ratio: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None


CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
"""nvmlClocksEventReason bits (nvml.h) and the names gpumon uses for them."""
HELD_BY_POWER = 0x4 | 0x80
HELD_BY_THERMAL = 0x20 | 0x40
HELD_BY_SLOWDOWN = 0x8


@functools.cache
def clock_reasons(bits: int) -> tuple[str, ...]:
    """The named reasons in a bitmask (unknown bits as `other`)."""
    names = tuple(name for bit, name in CLOCK_EVENT_REASONS.items() if bits & bit)
    known = sum(CLOCK_EVENT_REASONS)
    return names + (("other",) if bits & ~known else ())


class XidCount(NamedTuple):
    xid: int
    seen: int


MAX_GPU_PROCESSES = 4096
"""The most processes one GPU's sample lists: a GPU takes some tens of contexts (hundreds with MPS).
The NVML source reads no more, and a trace reader refuses a longer list."""
MAX_HOST_PROCESSES = 16 * MAX_GPU_PROCESSES
"""The most processes the host's sample lists (those of 16 full GPUs): the host source follows no
more, and a trace reader refuses a longer list."""


class GpuSample(NamedTuple):
    t_s: float
    index: int  # type: ignore[assignment]  # the GPU's index, not tuple.index
    uuid: str
    name: str
    available: bool = True
    """False when the GPU is lost or failing; the other fields are then None/empty."""
    util_ratio: float | None = None
    mem_util_ratio: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    util_history: tuple[UtilPoint, ...] = ()
    """Driver samples newer than the previous tick's (nvmlDeviceGetSamples), oldest first."""
    error: str | None = None
    """Why the GPU is unavailable, when it is."""
    jobs: tuple[JobRef, ...] = ()
    """The jobs holding this GPU (two for a shared or MPS GPU), from the job attribution."""
    unattributed: str | None = None
    """Why no job is named, where a scheduler is in use (docs/kubernetes.md lists the reasons)."""
    mig: int | None = None
    """On a MIG instance: its GPU instance id (`index` is then the parent GPU's, `uuid` the MIG-...
    UUID). None on a whole GPU."""
    gpm: GpmActivity | None = None
    """GPM activity since the previous tick, where the GPU supports GPM (Hopper and newer)."""
    clock_events: int | None = None
    """The clock-event reasons now (nvmlClocksEventReasons bitmask, CLOCK_EVENT_REASONS)."""
    clock_event_s: tuple[tuple[str, float], ...] = ()
    """Seconds spent in each clock-event reason since gpumon started (reason, seconds)."""
    xids: tuple[XidCount, ...] = ()
    """XID errors seen since gpumon started, per code (the event thread's count)."""
    last_xid: tuple[int, float] | None = None
    """The last XID: (code, Unix time it was seen)."""


class AttributionStatus(NamedTuple):
    """How one attribution source fared this tick (gpumon_attribution_up)."""

    source: str
    up: bool
    reason: str | None = None


class ProcessCpu(NamedTuple):
    """CPU use of one GPU process and its descendants (data-loader workers) over the last tick.

    Ratios count cores: 1.0 is one core fully busy, so a process tree can exceed 1.0.
    """

    pid: int
    name: str
    cpu_ratio: float
    """The process itself."""
    children_cpu_ratio: float
    """All descendants together."""
    busiest_child_cpu_ratio: float
    children: int
    read_bytes_per_s: float | None = None
    """Storage reads of the process tree, when the OS lets us see them."""
    busiest_demand_ratio: float | None = None
    """The most CPU any one process of the tree wanted: its on-CPU time plus its time runnable
    but waiting for a CPU (the run queue, /proc/PID/schedstat), in cores. A loader that gets 0.6
    of a core on a saturated host and waits for the rest wants 1.0: CPU-bound, though never
    pinned. None where the kernel does not say (not Linux, hidden processes)."""
    runq_wait_ratio: float | None = None
    """The whole tree's time waiting for a CPU, per second (cores' worth)."""
    blkio_wait_ratio: float | None = None
    """The whole tree's time waiting for block I/O, per second (/proc/PID/stat delayacct_blkio_ticks);
    None unless the kernel counts it (sysctl kernel.task_delayacct=1, or the delayacct boot flag)."""
    age_s: float | None = None
    """Seconds since the process started (its own start time), where the host says."""


class HostSample(NamedTuple):
    t_s: float
    cpu_count: int
    cpu_ratio: float
    """All cores together, 0-1."""
    busiest_core_ratio: float
    iowait_ratio: float | None
    load1: float
    disk_read_bytes_per_s: float | None
    processes: tuple[ProcessCpu, ...] = ()
    disk_busy_ratio: float | None = None
    """The busiest whole disk's share of time doing I/O (/proc/diskstats io_ticks: iostat's %util),
    0-1; None where the host does not say."""
    runnable: int | None = None
    """Threads runnable on the host at the reading (/proc/loadavg's running count, the reading
    thread itself included); None where the host does not say."""


class DeviceInfo(NamedTuple):
    """What `gpumon devices` lists."""

    index: int  # type: ignore[assignment]  # the GPU's index, not tuple.index
    uuid: str
    name: str
    mem_total_bytes: int | None


class Tick(NamedTuple):
    """Everything one sampler tick saw. `host` is None when the host source failed."""

    t_s: float
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    source_errors: tuple[str, ...] = ()
    attribution: tuple[AttributionStatus, ...] = ()
