"""Read GPUs through NVML (NVIDIA's `pynvml` bindings, PyPI `nvidia-ml-py`).

The module to call is injected: the real `pynvml`, or a look-alike such as the simulator's
(`gpumon.sim.fakenvml`). Only names and error codes are used, so both behave the same here.

Per field: NOT_SUPPORTED or a missing function leaves the field `None` and it is not asked again
for that GPU. Per GPU: GPU_IS_LOST or UNKNOWN marks the GPU unavailable for this tick; its handle
is dropped and fetched again next tick, so a GPU that comes back is picked up. NVML never creates a
CUDA context or allocates GPU memory, so polling does not disturb the job being watched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpumon.errors import NoDriverError
from gpumon.model import DeviceInfo, GpuProcess, GpuSample, UtilPoint
from gpumon.problems import Problems

log = logging.getLogger("gpumon.nvml")

# NVML return codes (nvml.h); the module's own constants are used when it has them.
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_UNKNOWN = 999
_UNSUPPORTED_CODES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
_LOST_CODES = frozenset({_GPU_IS_LOST, _UNKNOWN})
_GPU_UTILIZATION_SAMPLES = 1
_TEMPERATURE_GPU = 0
_PCIE_TX, _PCIE_RX = 0, 1
# nvmlSample_t's value union, by nvmlValueType_t
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

NO_DRIVER_HINT = (
    "cannot load NVIDIA's NVML library libnvidia-ml.so.1 ({why}); install the NVIDIA driver, "
    "or try gpumon with simulated GPUs: --simulate healthy"
)


class _GpuLost(Exception):
    pass


class SampleClockAligner:
    """Maps NVML sample timestamps (µs on the driver's own clock) onto the sampler's clock.

    The newest buffered sample is never later than the moment we read it, so
    `poll_time - newest_ts` is an upper bound of the clock offset; the smallest bound seen is the
    estimate. It leaks upward by `leak_s` per poll so that drift between the clocks is followed.
    """

    def __init__(self, leak_s: float = 0.0005) -> None:
        self._offset_s: float | None = None
        self._leak_s = leak_s

    def observe(self, poll_t_s: float, newest_ts_us: int) -> None:
        bound = poll_t_s - newest_ts_us / 1e6
        if self._offset_s is None or bound < self._offset_s + self._leak_s:
            self._offset_s = bound
        else:
            self._offset_s += self._leak_s

    def to_sampler_time(self, ts_us: int) -> float:
        assert self._offset_s is not None, "observe() first"
        return ts_us / 1e6 + self._offset_s


@dataclass
class _GpuState:
    handle: Any = None
    uuid: str = ""
    name: str = ""
    last_seen_ts_us: int = 0
    first_poll: bool = True
    aligner: SampleClockAligner = field(default_factory=SampleClockAligner)
    unsupported: set[str] = field(default_factory=set)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Samples every GPU NVML reports. `poll(t_s)` never raises for one GPU's failure."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any, problems: Problems | None = None) -> None:
        self._nvml = nvml
        self._problems = problems or Problems(log)
        self._gpus: dict[int, _GpuState] = {}
        self._open = False
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML; raise NoDriverError with a one-line hint when there is no driver."""
        try:
            self._nvml.nvmlInit()
        except self._error_type as e:
            code = getattr(e, "value", None)
            raise NoDriverError(NO_DRIVER_HINT.format(why=_describe(e, code))) from None
        except OSError as e:  # a library that exists but cannot be loaded
            raise NoDriverError(NO_DRIVER_HINT.format(why=str(e))) from None
        self._open = True

    def close(self) -> None:
        if self._open:
            try:
                self._nvml.nvmlShutdown()
            except self._error_type:
                pass
            self._open = False

    # -- reading -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        out = []
        for index in range(self._nvml.nvmlDeviceGetCount()):
            try:
                state = self._state(index)
                mem = self._field(state, "memory", self._nvml.nvmlDeviceGetMemoryInfo, state.handle)
            except (_GpuLost, self._error_type) as e:
                self._problems.note(f"gpu {index}: unavailable: {_describe(e, _code(e))}")
                out.append(DeviceInfo(index, self._gpus.get(index, _GpuState()).uuid, "", None))
                continue
            out.append(DeviceInfo(index, state.uuid, state.name, _int(mem, "total")))
        return out

    def poll(self, t_s: float) -> list[GpuSample]:
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._error_type as e:
            # The whole driver is gone (e.g. unloaded): let the sampler count it as a source failure.
            raise RuntimeError(f"nvmlDeviceGetCount failed: {_describe(e, _code(e))}") from None
        samples = []
        for index in range(count):
            try:
                samples.append(self._poll_gpu(index, t_s))
            except (_GpuLost, self._error_type) as e:
                why = _describe(e, _code(e))
                self._problems.note(f"gpu {index}: unavailable: {why}")
                state = self._gpus.get(index)
                if state is not None:
                    state.handle = None  # ask for a fresh handle next tick
                samples.append(
                    GpuSample(
                        t_s=t_s,
                        index=index,
                        uuid=state.uuid if state else "",
                        name=state.name if state else "",
                        available=False,
                        error=why,
                    )
                )
        return samples

    def _state(self, index: int) -> _GpuState:
        state = self._gpus.setdefault(index, _GpuState())
        if state.handle is None:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
                name = _text(self._nvml.nvmlDeviceGetName(handle))
            except self._error_type as e:
                if _code(e) in _LOST_CODES:
                    raise _GpuLost(_describe(e, _code(e))) from None
                raise
            state.handle, state.uuid, state.name = handle, uuid, name
        return state

    def _poll_gpu(self, index: int, t_s: float) -> GpuSample:
        nv = self._nvml
        state = self._state(index)
        h = state.handle
        util = self._field(state, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._field(state, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        power_mw = self._field(state, "power", nv.nvmlDeviceGetPowerUsage, h)
        limit_mw = self._field(state, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        temp = self._field(state, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        rx_kb = self._field(state, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX)
        tx_kb = self._field(state, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX)
        procs = self._field(state, "processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
        history = self._history(state, t_s)
        self._problems.clear(f"gpu {index}:")
        return GpuSample(
            t_s=t_s,
            index=index,
            uuid=state.uuid,
            name=state.name,
            util_ratio=_pct(util, "gpu"),
            mem_util_ratio=_pct(util, "memory"),
            mem_used_bytes=_int(mem, "used"),
            mem_total_bytes=_int(mem, "total"),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            pcie_rx_bytes_per_s=rx_kb * 1024.0 if rx_kb is not None else None,
            pcie_tx_bytes_per_s=tx_kb * 1024.0 if tx_kb is not None else None,
            processes=tuple(
                GpuProcess(pid=int(p.pid), gpu_mem_bytes=_opt_int(getattr(p, "usedGpuMemory", None)))
                for p in (procs or ())
            ),
            util_history=history,
        )

    def _history(self, state: _GpuState, t_s: float) -> tuple[UtilPoint, ...]:
        if "samples" in state.unsupported:
            return ()
        try:
            value_type, raw = self._nvml.nvmlDeviceGetSamples(
                state.handle, _GPU_UTILIZATION_SAMPLES, state.last_seen_ts_us
            )
        except self._error_type as e:
            code = _code(e)
            if code == _NOT_FOUND:  # nothing newer than last seen: an idle or quiet GPU
                return ()
            if code in _UNSUPPORTED_CODES:
                state.unsupported.add("samples")
                return ()
            if code in _LOST_CODES:
                raise _GpuLost(_describe(e, code)) from None
            self._problems.note(f"gpu {state.uuid or '?'} samples: {_describe(e, code)}")
            return ()
        # Only samples strictly newer than the last seen, oldest first (drivers differ in order).
        fresh = sorted((s for s in raw if s.timeStamp > state.last_seen_ts_us), key=lambda s: s.timeStamp)
        if not fresh:
            return ()
        value_field = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
        state.aligner.observe(t_s, fresh[-1].timeStamp)
        state.last_seen_ts_us = fresh[-1].timeStamp
        points = [
            UtilPoint(
                round(state.aligner.to_sampler_time(s.timeStamp), 6),
                min(1.0, max(0.0, float(getattr(s.sampleValue, value_field)) / 100.0)),
            )
            for s in fresh
        ]
        if state.first_poll:
            # The buffer's history from before we started: keep only the last second of it.
            state.first_poll = False
            points = [p for p in points if p.t_s > t_s - 1.0]
        return tuple(points)

    def _field(self, state: _GpuState, name: str, fn: Any, *args: Any) -> Any:
        if name in state.unsupported:
            return None
        try:
            return fn(*args)
        except self._error_type as e:
            code = _code(e)
            if code in _UNSUPPORTED_CODES:
                state.unsupported.add(name)  # stop asking: no log spam for what cannot change
                return None
            if code in _LOST_CODES:
                raise _GpuLost(_describe(e, code)) from None
            self._problems.note(f"gpu {state.uuid} {name}: {_describe(e, code)}")
            return None
        except Exception as e:  # pynvml's NVMLLibraryMismatchError is a plain Exception
            if type(e).__name__ == "NVMLLibraryMismatchError":
                state.unsupported.add(name)
                return None
            raise


def _code(e: BaseException) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


def _describe(e: BaseException, code: int | None) -> str:
    text = str(e) or type(e).__name__
    return f"{text} (NVML error {code})" if code is not None else text


def _pct(obj: Any, attr: str) -> float | None:
    if obj is None:
        return None
    return min(1.0, max(0.0, float(getattr(obj, attr)) / 100.0))


def _int(obj: Any, attr: str) -> int | None:
    return None if obj is None else int(getattr(obj, attr))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def load_pynvml() -> ModuleType:
    """Import the real bindings (kept out of module scope so simulated runs never load them)."""
    import pynvml

    return pynvml
