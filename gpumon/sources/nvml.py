"""Read GPUs through NVML (NVIDIA's `pynvml` bindings, PyPI `nvidia-ml-py`).

The module to call is injected: the real `pynvml`, or a look-alike such as the simulator's
(`gpumon.sim.fakenvml`). Only names and error codes are used, so both behave the same here.

Per field: NOT_SUPPORTED or a missing function leaves the field `None` and it is not asked again
for that GPU. Per GPU: GPU_IS_LOST or UNKNOWN marks the GPU unavailable for this tick; its handle
is dropped and fetched again next tick, so a GPU that comes back is picked up. NVML never creates a
CUDA context or allocates GPU memory, so polling does not disturb the job being watched.

Hung calls: with a CallGuard (gpumon.guard), every call that may hang is bracketed, per GPU and
for the driver-wide ones (init, count). The sampling thread reads NVML itself, with no hand-off;
when a supervisor finds it stuck in one GPU's call, it abandons the thread, that GPU is marked
unavailable and skipped until the call returns, and a fresh thread goes on with the others. A
driver-wide call that hangs makes the whole source fail fast (no NVML call at all) until it
returns, so threads stay bounded: one per stuck GPU, one for a stuck driver, plus one.

No driver at start: with `retry_init`, `poll` keeps trying nvmlInit with exponential backoff
(1 s, 2 s, ... 60 s) and reports no GPUs meanwhile, so a daemon started before the driver picks
it up when it appears.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpumon.errors import NoDriverError
from gpumon.guard import CallGuard
from gpumon.model import DeviceInfo, GpuProcess, GpuSample, UtilPoint
from gpumon.problems import Problems

log = logging.getLogger("gpumon.nvml")

# NVML return codes (nvml.h); the module's own constants are used when it has them.
_NOT_SUPPORTED = 3
_NOT_FOUND = 6
_INSUFFICIENT_SIZE = 7
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_ARGUMENT_VERSION_MISMATCH = 25
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
        return ts_us / 1e6 + self.offset_s

    @property
    def offset_s(self) -> float:
        assert self._offset_s is not None, "observe() first"
        return self._offset_s


@dataclass
class _GpuState:
    index: int = -1
    handle: Any = None
    uuid: str = ""
    name: str = ""
    last_seen_ts_us: int = 0
    first_poll: bool = True
    aligner: SampleClockAligner = field(default_factory=SampleClockAligner)
    unsupported: set[str] = field(default_factory=set)
    memory_v1: bool = False
    """nvmlDeviceGetMemoryInfo_v2 is missing: fall back to v1 (whose "used" includes reserved)."""
    stuck_since: float | None = None
    """Set while a call on this GPU has not returned (its thread was abandoned)."""
    failing: set[str] = field(default_factory=set)
    """Fields that failed in this tick's reading (their problems stay active)."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_DRIVER = "driver"
"""What a driver-wide call (init, count) is guarded as."""


class NvmlSource:
    """Samples every GPU NVML reports. `poll(t_s)` never raises for one GPU's failure."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | Any,
        problems: Problems | None = None,
        *,
        guard: CallGuard | None = None,
        retry_init: bool = False,
    ) -> None:
        self._nvml = nvml
        self._problems = problems or Problems(log)
        self._gpus: dict[int, _GpuState] = {}
        self._open = False
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._retry_init = retry_init
        self._next_init_t = 0.0
        self._init_backoff_s = 1.0
        self._guard = guard
        self._driver_stuck_since: float | None = None
        self._init_error = "NVML not initialised yet"
        if guard is not None:
            guard.on_hang = self._hung
            guard.on_return = self._returned

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML; raise NoDriverError with a one-line hint when there is no driver.

        With `retry_init`, a missing driver is not an error: `poll` retries with backoff."""
        if self._driver_stuck_since is not None:
            self._no_driver("an earlier driver-wide NVML call (nvmlInit) has not returned")
            return
        try:
            self._enter(_DRIVER)
            try:
                self._nvml.nvmlInit()
            finally:
                self._leave()
        except self._error_type as e:
            self._no_driver(_init_failure(e, _code(e)))
            return
        except OSError as e:  # a library that exists but cannot be loaded
            self._no_driver(NO_DRIVER_HINT.format(why=str(e)))
            return
        self._open = True
        self._init_backoff_s = 1.0
        self._problems.clear("nvml:driver")

    def _no_driver(self, message: str) -> None:
        if not self._retry_init:
            raise NoDriverError(message)
        self._init_error = message  # poll reports it as the source's failure (source down)

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        if self._open and self._driver_stuck_since is None:
            try:
                self._nvml.nvmlShutdown()
            except self._error_type:
                pass
            self._open = False

    # -- hung calls ------------------------------------------------------------------------------

    def _enter(self, what: Hashable) -> None:
        if self._guard is not None:
            self._guard.enter(what)

    def _leave(self) -> None:
        if self._guard is not None:
            self._guard.leave()

    def _hung(self, what: Hashable, since: float) -> None:
        """The guard gave up on a thread stuck in a call on `what` (a GPU index, or the driver)."""
        if what == _DRIVER:
            self._driver_stuck_since = since
            self._problems.note(
                "nvml:driver", "nvml: a driver-wide NVML call does not return: NVML is not read until it does"
            )
        elif isinstance(what, int):
            self._gpus.setdefault(what, _GpuState(what)).stuck_since = since

    def _returned(self, what: Hashable) -> None:
        """A call given up on has returned: read that GPU (or the driver) again from the next tick."""
        if what == _DRIVER:
            self._driver_stuck_since = None
        elif isinstance(what, int) and what in self._gpus:
            state = self._gpus[what]
            state.stuck_since = None
            state.handle = None

    def _check_driver_not_stuck(self, call: str) -> None:
        if self._driver_stuck_since is not None:
            raise RuntimeError(f"{call} not attempted: an earlier driver-wide NVML call has not returned")

    # -- reading -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        out = []
        for index in range(self._count()):
            try:
                state = self._state(index)
                mem = self._field(state, "memory", self._nvml.nvmlDeviceGetMemoryInfo, state.handle)
            except (_GpuLost, self._error_type) as e:
                self._problems.note(
                    f"nvml:gpu {index}:unavailable", f"gpu {index}: unavailable: {_describe(e, _code(e))}"
                )
                out.append(DeviceInfo(index, self._gpus.get(index, _GpuState()).uuid, "", None))
                continue
            out.append(DeviceInfo(index, state.uuid, state.name, _int(mem, "total")))
        return out

    def poll(self, t_s: float) -> list[GpuSample]:
        if not self._open:
            if not self._retry_init:
                return []
            if t_s >= self._next_init_t:
                self.open()
            if not self._open:
                if t_s >= self._next_init_t:
                    self._next_init_t = t_s + self._init_backoff_s
                    self._init_backoff_s = min(60.0, self._init_backoff_s * 2)
                # a missing driver is the source failing (gpumon_source_up 0), not "0 GPUs, all fine"
                raise NoDriverError(f"{self._init_error}; retrying with backoff (up to 60 s)")
        samples: list[GpuSample] = []
        for index in range(self._count()):
            state = self._gpus.get(index)
            if state is not None and state.stuck_since is not None:
                samples.append(self._unavailable(index, t_s, "an NVML call on this GPU does not return"))
                continue
            self._enter(index)
            try:
                sample = self._poll_gpu(index, t_s)
            except (_GpuLost, self._error_type) as e:
                sample = self._unavailable(index, t_s, _describe(e, _code(e)))
                state = self._gpus.get(index)
                if state is not None:
                    state.handle = None  # ask for a fresh handle next tick
            finally:
                self._leave()
            samples.append(sample)
        return samples

    def _count(self) -> int:
        self._check_driver_not_stuck("nvmlDeviceGetCount")
        self._enter(_DRIVER)
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._error_type as e:
            # The whole driver is gone (e.g. unloaded): let the sampler count it as a source failure.
            raise RuntimeError(f"nvmlDeviceGetCount failed: {_describe(e, _code(e))}") from None
        finally:
            self._leave()
        if self._problems.any_active:
            self._problems.clear("nvml:driver")
        return count

    def _unavailable(self, index: int, t_s: float, why: str) -> GpuSample:
        self._problems.note(f"nvml:gpu {index}:unavailable", f"gpu {index}: unavailable: {why}")
        state = self._gpus.get(index)
        return GpuSample(
            t_s=t_s,
            index=index,
            uuid=state.uuid if state else "",
            name=state.name if state else "",
            available=False,
            error=why,
        )

    def _state(self, index: int) -> _GpuState:
        state = self._gpus.get(index)
        if state is None:
            state = self._gpus[index] = _GpuState(index)
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
        if state.failing:
            state.failing.clear()
        util = self._field(state, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._memory(state)
        power_mw = self._field(state, "power", nv.nvmlDeviceGetPowerUsage, h)
        limit_mw = self._field(state, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        temp = self._field(state, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        rx_kb = self._field(state, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX)
        tx_kb = self._field(state, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX)
        procs = self._processes(state)
        history = self._history(state, t_s)
        if self._problems.any_active:  # this GPU answered: what failed before and not now is over
            self._problems.clear_prefix(
                f"nvml:gpu {index}:", keep={f"nvml:gpu {index}:{f}" for f in state.failing}
            )
        # Positional and inline: this runs for every GPU on every tick (benchmarks/nvml_cost.py).
        return GpuSample(
            t_s,
            index,
            state.uuid,
            state.name,
            True,
            None if util is None else _ratio(util.gpu),
            None if util is None else _ratio(util.memory),
            None if mem is None else int(mem.used),
            None if mem is None else int(mem.total),
            None if power_mw is None else power_mw / 1000.0,
            None if limit_mw is None else limit_mw / 1000.0,
            None if temp is None else float(temp),
            None if rx_kb is None else rx_kb * 1024.0,
            None if tx_kb is None else tx_kb * 1024.0,
            tuple(GpuProcess(int(p.pid), _opt_int(getattr(p, "usedGpuMemory", None))) for p in procs)
            if procs
            else (),
            history,
        )

    def _memory(self, state: _GpuState) -> Any:
        """v2 first, as nvidia-smi, gpustat and nvitop do ("used" without the driver's reserve)."""
        nv = self._nvml
        if self._mem_v2 is not None and not state.memory_v1 and "memory" not in state.unsupported:
            try:
                return nv.nvmlDeviceGetMemoryInfo(state.handle, version=self._mem_v2)
            except TypeError:  # a pynvml patched by another library (gpustat does) takes no version
                state.memory_v1 = True
            except self._error_type as e:
                if _code(e) not in (_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH, _NOT_SUPPORTED):
                    if _code(e) in _LOST_CODES:
                        raise _GpuLost(_describe(e, _code(e))) from None
                    raise
                state.memory_v1 = True
        return self._field(state, "memory", nv.nvmlDeviceGetMemoryInfo, state.handle)

    def _processes(self, state: _GpuState) -> Any:
        """The process list can grow between pynvml's two calls (INSUFFICIENT_SIZE): ask again."""
        for _ in range(3):
            try:
                return self._field(
                    state,
                    "processes",
                    self._nvml.nvmlDeviceGetComputeRunningProcesses,
                    state.handle,
                    raise_codes=(_INSUFFICIENT_SIZE,),
                )
            except self._error_type as e:
                if _code(e) != _INSUFFICIENT_SIZE:
                    raise
        state.failing.add("processes")
        self._problems.note(
            f"nvml:gpu {state.index}:processes",
            f"gpu {state.index} processes: the list kept growing while read; left out",
        )
        return None

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
            state.failing.add("samples")
            self._problems.note(
                f"nvml:gpu {state.index}:samples", f"gpu {state.index} samples: {_describe(e, code)}"
            )
            return ()
        # Only samples strictly newer than the last seen, oldest first (drivers differ in order).
        # Each struct field is read once: pynvml's structures make every attribute access costly.
        value_field = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
        last = state.last_seen_ts_us
        pairs = [(s.timeStamp, getattr(s.sampleValue, value_field)) for s in raw]
        fresh = sorted(p for p in pairs if p[0] > last)
        if not fresh:
            return ()
        newest = fresh[-1][0]
        state.aligner.observe(t_s, newest)
        state.last_seen_ts_us = newest
        offset = state.aligner.offset_s
        points = [
            UtilPoint(round(ts / 1e6 + offset, 6), min(1.0, max(0.0, value / 100.0))) for ts, value in fresh
        ]
        if state.first_poll:
            # The buffer's history from before we started: keep only the last second of it.
            state.first_poll = False
            points = [p for p in points if p.t_s > t_s - 1.0]
        return tuple(points)

    def _field(
        self, state: _GpuState, name: str, fn: Any, *args: Any, raise_codes: tuple[int, ...] = ()
    ) -> Any:
        if name in state.unsupported:
            return None
        try:
            return fn(*args)
        except self._error_type as e:
            code = _code(e)
            if code in raise_codes:
                raise
            if code in _UNSUPPORTED_CODES:
                state.unsupported.add(name)  # stop asking: no log spam for what cannot change
                return None
            if code in _LOST_CODES:
                raise _GpuLost(_describe(e, code)) from None
            state.failing.add(name)
            self._problems.note(
                f"nvml:gpu {state.index}:{name}", f"gpu {state.index} {name}: {_describe(e, code)}"
            )
            return None
        except Exception as e:  # pynvml's NVMLLibraryMismatchError is a plain Exception
            if type(e).__name__ == "NVMLLibraryMismatchError":
                state.unsupported.add(name)
                return None
            raise


def _code(e: BaseException) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


_NO_PERMISSION = 4


def _init_failure(e: BaseException, code: int | None) -> str:
    """What nvmlInit's failure means to the user: only a missing library calls for a driver."""
    if code == _NO_PERMISSION:
        return (
            f"NVML refused access ({_describe(e, code)}): the driver is there, but this user may not "
            "open /dev/nvidiactl and /dev/nvidia*; run gpumon as a user who may (as the systemd unit "
            "does), not as a user without access"
        )
    if code == _DRIVER_NOT_LOADED:
        return (
            f"libnvidia-ml.so.1 is there but the NVIDIA kernel driver is not loaded ({_describe(e, code)}): "
            "check `nvidia-smi` and `lsmod | grep nvidia`; or try gpumon with simulated GPUs: "
            "--simulate healthy"
        )
    return NO_DRIVER_HINT.format(why=_describe(e, code))


def _describe(e: BaseException, code: int | None) -> str:
    text = str(e) or type(e).__name__
    return f"{text} (NVML error {code})" if code is not None else text


def _ratio(percent: int) -> float:
    return percent / 100.0 if 0 <= percent <= 100 else (1.0 if percent > 100 else 0.0)


def _int(obj: Any, attr: str) -> int | None:
    return None if obj is None else int(getattr(obj, attr))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def load_pynvml() -> ModuleType:
    """Import the real bindings (kept out of module scope so simulated runs never load them)."""
    try:
        import pynvml
    except ImportError:
        from gpumon.errors import MissingDependency

        raise MissingDependency(
            "NVIDIA's Python bindings are missing: pip install nvidia-ml-py (imported as pynvml)"
        ) from None
    return pynvml  # type: ignore[no-any-return]  # untyped: seen as Any
