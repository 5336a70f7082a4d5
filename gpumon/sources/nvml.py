"""Read GPUs through NVML (NVIDIA's `pynvml` bindings, PyPI `nvidia-ml-py`).

The module to call is injected: the real `pynvml`, or a look-alike such as the simulator's
(`gpumon.sim.fakenvml`). Only names and error codes are used, so both behave the same here.

Per field: NOT_SUPPORTED or a missing function leaves the field `None` and it is not asked again
for that GPU. Per GPU: GPU_IS_LOST or UNKNOWN marks the GPU unavailable for this tick; its handle
is dropped and fetched again next tick, so a GPU that comes back is picked up. NVML never creates a
CUDA context or allocates GPU memory, so polling does not disturb the job being watched.

Hung calls: with `call_timeout_s`, GPUs are read in a worker thread and the sampler waits at most
that long. A GPU whose call does not return is marked unavailable and skipped, with its worker
parked on it, until the call returns; the other GPUs are read by a fresh worker. Threads stay
bounded (one per stuck GPU, plus one), and so does memory: late answers are dropped.

No driver at start: with `retry_init`, `poll` keeps trying nvmlInit with exponential backoff
(1 s, 2 s, ... 60 s) and reports no GPUs meanwhile, so a daemon started before the driver picks
it up when it appears.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

from gpumon.errors import NoDriverError
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
    memory_v1: bool = False
    """nvmlDeviceGetMemoryInfo_v2 is missing: fall back to v1 (whose "used" includes reserved)."""
    stuck_since: float | None = None
    """Set while a call on this GPU has not returned (see _Worker)."""
    stuck_worker: Any = None


class _Worker:
    """A thread that reads GPUs one after the other, so that a hung call can be abandoned.

    Jobs and results travel on SimpleQueues (one lock hand-off each way per tick)."""

    def __init__(self, on_done: Callable[[_Worker], None]) -> None:
        self._on_done = on_done
        self._jobs: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()
        self.results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self.current: int | None = None
        """The GPU whose calls are in progress (None: none, or the driver-wide count)."""
        threading.Thread(target=self._loop, name="gpumon-nvml", daemon=True).start()

    def run(self, job: Callable[[], Any]) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                result: tuple[bool, Any] = (True, job())
            except Exception as e:  # handed back to the sampler's thread, which raises it there
                result = (False, e)
            self.current = None
            self._on_done(self)
            self.results.put(result)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Samples every GPU NVML reports. `poll(t_s)` never raises for one GPU's failure."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | Any,
        problems: Problems | None = None,
        *,
        call_timeout_s: float | None = None,
        retry_init: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._nvml = nvml
        self._problems = problems or Problems(log)
        self._gpus: dict[int, _GpuState] = {}
        self._open = False
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._timeout_s = call_timeout_s
        self._retry_init = retry_init
        self._next_init_t = 0.0
        self._init_backoff_s = 1.0
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self.workers = 0
        """Worker threads started so far (bounded: one per stuck GPU, plus one)."""
        self._last_count = 0
        self._primary: _Worker | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML; raise NoDriverError with a one-line hint when there is no driver.

        With `retry_init`, a missing driver is not an error: `poll` retries with backoff."""
        try:
            self._nvml.nvmlInit()
        except self._error_type as e:
            code = getattr(e, "value", None)
            self._no_driver(NO_DRIVER_HINT.format(why=_describe(e, code)))
            return
        except OSError as e:  # a library that exists but cannot be loaded
            self._no_driver(NO_DRIVER_HINT.format(why=str(e)))
            return
        self._open = True
        self._init_backoff_s = 1.0
        self._problems.clear("nvml:")

    def _no_driver(self, message: str) -> None:
        if not self._retry_init:
            raise NoDriverError(message)
        self._problems.note(f"nvml: {message}; retrying with backoff")

    @property
    def is_open(self) -> bool:
        return self._open

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
        if not self._open:
            if not self._retry_init or t_s < self._next_init_t:
                return []
            self.open()
            if not self._open:
                self._next_init_t = t_s + self._init_backoff_s
                self._init_backoff_s = min(60.0, self._init_backoff_s * 2)
                return []
        if self._timeout_s is None:
            return self._poll_all(t_s, range(self._count()))
        return self._poll_guarded(t_s)

    def _count(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except self._error_type as e:
            # The whole driver is gone (e.g. unloaded): let the sampler count it as a source failure.
            raise RuntimeError(f"nvmlDeviceGetCount failed: {_describe(e, _code(e))}") from None

    def _poll_all(self, t_s: float, indexes: Any, out: list[GpuSample] | None = None) -> list[GpuSample]:
        samples = out if out is not None else []
        for index in indexes:
            try:
                sample = self._poll_gpu(index, t_s)
            except (_GpuLost, self._error_type) as e:
                sample = self._unavailable(index, t_s, _describe(e, _code(e)))
                state = self._gpus.get(index)
                if state is not None:
                    state.handle = None  # ask for a fresh handle next tick
            samples.append(sample)
        return samples

    def _unavailable(self, index: int, t_s: float, why: str) -> GpuSample:
        self._problems.note(f"gpu {index}: unavailable: {why}")
        state = self._gpus.get(index)
        return GpuSample(
            t_s=t_s,
            index=index,
            uuid=state.uuid if state else "",
            name=state.name if state else "",
            available=False,
            error=why,
        )

    # -- hung calls ------------------------------------------------------------------------------

    def _worker(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.workers += 1
        return _Worker(self._worker_done)

    def _worker_done(self, worker: _Worker) -> None:
        if worker is self._primary:
            return  # the common case: nothing was stuck, nothing to release
        with self._lock:
            for state in self._gpus.values():
                if state.stuck_worker is worker:
                    state.stuck_since = state.stuck_worker = None  # it returned: read it next tick
            self._idle.append(worker)

    def _poll_guarded(self, t_s: float) -> list[GpuSample]:
        """One job per tick: count the GPUs and read those not stuck, under one deadline. A job
        that misses it leaves its worker parked on the GPU it was reading (released when the call
        returns); the GPUs after it go to another worker."""
        assert self._timeout_s is not None
        if self._primary is None:
            self._primary = self._worker()
        done: dict[int, GpuSample] = {}
        todo: list[int] | None = None  # None: not counted yet
        while True:
            out: list[GpuSample] = []
            worker = self._primary
            worker.run(partial(self._job, t_s, todo, out, worker))
            try:
                ok, result = worker.results.get(timeout=self._timeout_s)
            except queue.Empty:
                culprit = worker.current
                self._primary = self._worker()
                for sample in list(out):
                    done[sample.index] = sample
                if culprit is None:  # the driver-wide count hung: nothing can be read
                    raise RuntimeError(
                        f"nvmlDeviceGetCount did not return within {self._timeout_s:g} s"
                    ) from None
                state = self._gpus.setdefault(culprit, _GpuState())
                with self._lock:
                    state.stuck_since, state.stuck_worker = t_s, worker
                done[culprit] = self._unavailable(
                    culprit, t_s, f"an NVML call did not return within {self._timeout_s:g} s"
                )
                todo = [i for i in (todo if todo is not None else range(self._last_count)) if i not in done]
                if not todo:
                    break
                continue
            if not ok:
                raise result
            if not done:
                return result  # the common case: one job read every GPU
            for sample in result:
                done[sample.index] = sample
            break
        return [done[i] for i in sorted(done)]

    def _job(
        self, t_s: float, todo: list[int] | None, out: list[GpuSample], worker: _Worker
    ) -> list[GpuSample]:
        if todo is None:
            todo = list(range(self._count()))
            self._last_count = len(todo)
        for index in todo:
            state = self._gpus.get(index)
            if state is not None and state.stuck_since is not None:
                out.append(
                    self._unavailable(
                        index, t_s, f"an NVML call has not returned for {t_s - state.stuck_since:.0f} s"
                    )
                )
                continue
            worker.current = index
            self._poll_all(t_s, (index,), out)
        return out

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
        mem = self._memory(state)
        power_mw = self._field(state, "power", nv.nvmlDeviceGetPowerUsage, h)
        limit_mw = self._field(state, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
        temp = self._field(state, "temperature", nv.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU)
        rx_kb = self._field(state, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_RX)
        tx_kb = self._field(state, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, _PCIE_TX)
        procs = self._processes(state)
        history = self._history(state, t_s)
        if self._problems.any_active:  # this GPU answered: clear what was wrong with it before
            self._problems.clear(f"gpu {index}:")
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
        self._problems.note(f"gpu {state.uuid} processes: the list kept growing while read; left out")
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
    return pynvml
