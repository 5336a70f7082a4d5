"""A pynvml look-alike over a simulated fleet, so simulated GPUs take the real NVML code path.

Only what `gpumon.collect.sources.nvml` calls is here, with pynvml's names, return shapes, units (mW,
KB/s, percent, µs timestamps) and error codes. Faults can be injected for tests: a GPU lost for a
while, functions that report NOT_SUPPORTED, a driver that is not there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from gpumon.sim.fleet import BOOT_S, Fleet, SimGpu

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_GPU_UTILIZATION_SAMPLES = 1
nvmlMemory_v2 = 0x02000028  # noqa: N816 - pynvml's name
NVML_VALUE_TYPE_UNSIGNED_INT = 1

_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    6: "Not Found",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))


@dataclass
class Faults:
    no_driver: bool = False
    lost: dict[int, tuple[float, float]] = field(default_factory=dict)
    """GPU index -> (from, until) in fleet seconds during which it reports GPU_IS_LOST."""
    unsupported: set[str] = field(default_factory=set)
    """pynvml function names that answer NOT_SUPPORTED."""


class _GpmSample:
    """An opaque GPM sample buffer: which GPU, and when (fleet seconds)."""

    gpu: SimGpu | None = None
    t: float = 0.0


class _MetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t as gpumon.collect.sources.gpm fills and reads it."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]


class GpmMixin:
    """GPM on simulated GPUs whose phase says `gpm` (Hopper): activity from the simulated kernel
    timeline, SM activity the share `sm_fill` of it."""

    fleet: Fleet
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def _check(self, fn: str, gpu: SimGpu | None = None) -> float:
        raise NotImplementedError

    def nvmlGpmQueryDeviceSupport(self, h: SimGpu) -> Any:
        t = self._check("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(h.phase(t).gpm))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._check("nvmlGpmSampleAlloc")
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        self._check("nvmlGpmSampleFree")

    def nvmlGpmSampleGet(self, h: SimGpu, sample: _GpmSample) -> _GpmSample:
        t = self._check("nvmlGpmSampleGet", h)
        if not h.phase(t).gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.gpu, sample.t = h, t
        return sample

    def nvmlGpmMetricsGet(self, get: _MetricsGet) -> _MetricsGet:
        self._check("nvmlGpmMetricsGet")
        a, b = get.sample1, get.sample2
        if a is None or b is None or a.gpu is None or a.gpu is not b.gpu:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = a.gpu
        busy = gpu.busy_share(min(a.t, b.t), max(a.t, b.t)) * 100
        ph = gpu.phase(b.t)
        fill = busy * ph.sm_fill
        # graphics, SM activity, occupancy, tensor, DRAM, FP16, FP32, FP64 (GPM metric ids)
        values = {
            1: busy,
            2: fill,
            3: fill * 0.5,
            5: fill * 0.7,
            10: fill * 0.45,
            13: fill * 0.1,
            12: fill * 0.2,
        }
        values[11] = 0.0
        for m in get.metrics[: get.numMetrics]:
            m.nvmlReturn = NVML_SUCCESS if m.metricId in values else NVML_ERROR_NOT_SUPPORTED
            m.value = values.get(m.metricId, 0.0)
        return get

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimGpu) -> int:
        t = self._check("nvmlDeviceGetCurrentClocksEventReasons", h)
        ph = h.phase(t)
        if ph.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        busy = h.utilization_now(t) > 0
        return ph.clock_events if busy else (0x1 if ph.gpm else 0)


class FakeNvml(GpmMixin):
    NVMLError = NVMLError

    def __init__(self, fleet: Fleet, faults: Faults | None = None) -> None:
        self.fleet = fleet
        self.faults = faults or Faults()
        self.calls: dict[str, int] = {}
        self._initialised = False
        self._pcie: dict[int, tuple[float, float, float]] = {}
        """Per GPU: (sim time, tx bytes, rx bytes) at the last reading of its PCIe counters."""

    def _check(self, fn: str, gpu: SimGpu | None = None) -> float:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self._initialised and fn != "nvmlInit":
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        t = self.fleet.sim_time()
        if gpu is not None:
            window = self.faults.lost.get(gpu.index)
            if window and window[0] <= t < window[1]:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in self.faults.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return t

    # -- pynvml API ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        if self.faults.no_driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self._initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.fleet.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.fleet.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.fleet.gpus[index]
        self._check("nvmlDeviceGetHandleByIndex", gpu)
        return gpu

    def nvmlDeviceGetUUID(self, h: SimGpu) -> str:
        self._check("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetName(self, h: SimGpu) -> str:
        self._check("nvmlDeviceGetName", h)
        return h.model.name

    def _not_on_mig(self, h: SimGpu, t: float) -> None:
        """What NVML does not report for a MIG instance (nvml.h): utilization and its samples;
        power and temperature are the parent's."""
        if h.phase(t).mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, h: SimGpu) -> Any:
        t = self._check("nvmlDeviceGetUtilizationRates", h)
        self._not_on_mig(h, t)
        gpu = h.utilization_now(t)
        return SimpleNamespace(gpu=gpu, memory=round(gpu * 0.4))

    nvmlMemory_v2 = nvmlMemory_v2

    def nvmlDeviceGetMemoryInfo(self, h: SimGpu, version: int | None = None) -> Any:
        t = self._check("nvmlDeviceGetMemoryInfo", h)
        used = h.mem_used_bytes(t)
        total = h.model.mem_total_bytes
        reserved = 512 * 1024 * 1024
        if version:  # v2: "used" leaves out the driver's reserve, as nvidia-smi shows it
            return SimpleNamespace(
                version=version, total=total, reserved=reserved, used=used, free=total - used - reserved
            )
        return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)

    def nvmlDeviceGetPowerUsage(self, h: SimGpu) -> int:
        t = self._check("nvmlDeviceGetPowerUsage", h)
        self._not_on_mig(h, t)
        return int(h.power_w(t) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: SimGpu) -> int:
        self._not_on_mig(h, self._check("nvmlDeviceGetEnforcedPowerLimit", h))
        return int(h.model.power_limit_w * 1000)

    def nvmlDeviceGetTemperature(self, h: SimGpu, sensor: int) -> int:
        t = self._check("nvmlDeviceGetTemperature", h)
        self._not_on_mig(h, t)
        return int(32 + 40 * h.utilization_now(t) / 100)

    def nvmlDeviceGetFieldValues(self, h: SimGpu, field_ids: Any) -> list[Any]:
        """The PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX_BYTES 197, _RX_BYTES 198): the link's
        bytes so far, 2 GB/s to the GPU (the batches) and an eighth of it back while kernels run,
        over the GPU's busy time since the last reading. Any other field: NOT_SUPPORTED in its own
        return, as NVML does."""
        t = self._check("nvmlDeviceGetFieldValues", h)
        last_t, tx, rx = self._pcie.get(h.index, (t, 0.0, 0.0))
        if t > last_t and h.phase(t).has_job:
            kb = h.busy_share(last_t, t) * (t - last_t) * 2_000_000 * 1024
            rx, tx = rx + kb, tx + kb / 8  # rx (host to GPU) carries the batches
        self._pcie[h.index] = (t, tx, rx)
        mig = h.phase(t).mig
        out = []
        for fid in field_ids:
            ok = fid in (197, 198) and not mig
            value = SimpleNamespace(ullVal=int(tx if fid == 197 else rx) if ok else 0)
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                    timestamp=round((BOOT_S + t) * 1e6),
                    value=value,
                )
            )
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: SimGpu) -> list[Any]:
        t = self._check("nvmlDeviceGetComputeRunningProcesses", h)
        if not h.phase(t).has_job:
            return []
        reserved = 512 * 1024 * 1024
        return [
            SimpleNamespace(
                pid=h.pid_at(t),
                usedGpuMemory=max(0, h.mem_used_bytes(t) - reserved),
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        ]

    def nvmlDeviceGetSamples(self, h: SimGpu, sampling_type: int, last_seen_us: int) -> Any:
        t = self._check("nvmlDeviceGetSamples", h)
        self._not_on_mig(h, t)
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        samples = h.samples_since(last_seen_us, t)
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return NVML_VALUE_TYPE_UNSIGNED_INT, [
            SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v)) for ts, v in samples
        ]


def sim_timestamp_us(t_s: float) -> int:
    """The simulated driver clock (µs since a made-up boot) for fleet second t_s."""
    return round((BOOT_S + t_s) * 1e6)
