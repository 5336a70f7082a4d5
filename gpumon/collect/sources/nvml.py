"""Read GPUs through NVML (NVIDIA's `pynvml` bindings, PyPI `nvidia-ml-py`).

The module to call is injected: the real `pynvml`, or a look-alike such as the simulator's
(`gpumon.sim.fakenvml`). Only names and error codes are used, so both behave the same here.

Per field: NOT_SUPPORTED or a missing function leaves the field `None` and it is not asked again
for that GPU. Per GPU: GPU_IS_LOST or UNKNOWN marks the GPU unavailable for this tick; its handle
is dropped and fetched again next tick, so a GPU that comes back is picked up. NVML never creates a
CUDA context or allocates GPU memory, so polling does not disturb the job being watched.

Hung calls: with a CallGuard (gpumon.core.guard), every call that may hang is bracketed, per GPU and
for the driver-wide ones (init, count). The sampling thread reads NVML itself, with no hand-off;
when a supervisor finds it stuck in one GPU's call, it abandons the thread, that GPU is marked
unavailable and skipped until the call returns, and a fresh thread goes on with the others. A
driver-wide call that hangs makes the whole source fail fast (no NVML call at all) until it
returns, so threads stay bounded: one per stuck GPU, one for a stuck driver, plus one.

Hopper and MIG (docs/detector.md, "GPM and MIG"): where nvmlGpmQueryDeviceSupport says so, each
tick takes a GPM sample per GPU and per MIG instance (gpumon.collect.sources.gpm). A GPU in MIG mode is
read as its parent (power, temperature, clocks: what only the parent reports) plus one unit per MIG
instance (memory, processes, GPM), each a GpuSample with `mig` set. NVML gives a MIG instance no
utilization, so its activity history comes from GPM sampled MIG_GPM_HZ times a second, for the
detector's bursts and gaps (as for any GPU with GPM but without utilization samples): the sampler
calls `sample_fast` between ticks (`fast_period_s`), on its own clock and thread, so these calls
are supervised like the tick's. XID errors come from an event
thread (gpumon.collect.sources.xid). Clock-event reasons are read every tick and their seconds summed.

No driver at start: with `retry_init`, `poll` keeps trying nvmlInit with exponential backoff
(1 s, 2 s, ... 60 s) and reports no GPUs meanwhile, so a daemon started before the driver picks
it up when it appears.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpumon.collect.sources.gpm import GpmUnit
from gpumon.collect.sources.xid import XidWatcher
from gpumon.core.errors import NoDriverError
from gpumon.core.guard import CallGuard
from gpumon.core.model import DeviceInfo, GpmActivity, GpuProcess, GpuSample, UtilPoint, clock_reasons
from gpumon.core.problems import Problems

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
MIG_GPM_HZ = 5.0
"""How often GPM is sampled on MIG instances for their activity history (docs/detector.md)."""
MIG_RESCAN_S = 30.0
"""How often a MIG-enabled GPU's instances are listed again (they change only when reconfigured)."""
_CLOCK_GAP_CAP_S = 5.0
"""Seconds one tick may add to a clock-event reason (a stalled sampler does not inflate them)."""
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
    mig: int | None = None
    """A MIG instance's GPU instance id (this state is then one of its parent's `migs`)."""
    parent: _GpuState | None = None
    migs: dict[int, _GpuState] = field(default_factory=dict)
    mig_checked_t: float | None = None
    gpm: GpmUnit | None = None
    gpm_checked: bool = False
    fast: GpmUnit | None = None
    """MIG (no utilization samples): GPM sampled MIG_GPM_HZ times a second, each step a point of
    the activity history; the tick's GPM figures cover the whole second since the last tick."""

    pending: deque[UtilPoint] = field(default_factory=lambda: deque(maxlen=64))
    clock_bits: int | None = None
    clock_prev_t: float | None = None
    clock_s: dict[str, float] = field(default_factory=dict)
    xid_registered: bool = False

    @property
    def tag(self) -> str:
        """What problem keys name it by: `0`, or `0/3` for GPU 0's MIG instance 3."""
        return str(self.index) if self.mig is None else f"{self.index}/{self.mig}"

    @property
    def where(self) -> str:
        return f"gpu {self.index}" if self.mig is None else f"gpu {self.index} mig {self.mig}"


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
        gpm: bool = True,
    ) -> None:
        """`gpm=False`: never read GPM (benchmarks compare; a site whose profilers, Nsight or
        DCGM profiling, must have the counters to themselves)."""
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
        self._xid = XidWatcher(nvml, self._problems)
        self._gpm_on = gpm
        self._clock_fn = _fn(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
        self._throttle_fn = _fn(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
        self._fast_units: list[_GpuState] = []
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
        self._xid.stop()
        if self._open and self._driver_stuck_since is None:
            for state in self._gpus.values():
                for unit in (state, *state.migs.values()):
                    for g in (unit.gpm, unit.fast):
                        if g is not None:
                            g.free()
                    unit.gpm = unit.fast = None
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
            units: list[GpuSample] = []
            try:
                sample = self._poll_gpu(index, t_s)
                state = self._gpus[index]
                if state.migs:
                    units = self._poll_migs(state, t_s)
            except (_GpuLost, self._error_type) as e:
                why = _describe(e, _code(e))
                sample = self._unavailable(index, t_s, why)
                state = self._gpus.get(index)
                if state is not None:
                    state.handle = None  # ask for a fresh handle next tick
                    state.mig_checked_t = None
                    units = [self._unavailable_unit(m, t_s, why) for _, m in sorted(state.migs.items())]
            finally:
                self._leave()
            samples.append(sample)
            samples.extend(units)
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
        xids, last_xid = self._xid.seen(index, None)  # a GPU falling off the bus says XID 79 as it goes
        return GpuSample(
            t_s=t_s,
            index=index,
            uuid=state.uuid if state else "",
            name=state.name if state else "",
            available=False,
            error=why,
            xids=xids,
            last_xid=last_xid,
        )

    def _unavailable_unit(self, m: _GpuState, t_s: float, why: str) -> GpuSample:
        xids, last_xid = self._xid.seen(m.index, m.mig)
        return GpuSample(
            t_s=t_s,
            index=m.index,
            uuid=m.uuid,
            name=m.name,
            available=False,
            error=why,
            mig=m.mig,
            xids=xids,
            last_xid=last_xid,
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
            if not state.xid_registered:
                state.xid_registered = True
                if self._xid.register(index, handle):
                    self._xid.start()
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
        gpm = self._gpm_activity(state, t_s) if not state.gpm_checked or state.gpm is not None else None
        if state.fast is not None:  # no utilization samples here: GPM's activity instead
            history, gpm = self._drain(state, t_s)
        clock_bits = self._clock_events(state, t_s)
        if "mig" not in state.unsupported:
            self._scan_migs(state, t_s)
        xids, last_xid = self._xid.seen(index, None)
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
            None,  # error
            (),  # jobs
            None,  # unattributed
            None,  # mig
            gpm,
            clock_bits,
            tuple(state.clock_s.items()) if state.clock_s else (),
            xids,
            last_xid,
        )

    # -- MIG -----------------------------------------------------------------------------------

    def _scan_migs(self, parent: _GpuState, t_s: float) -> None:
        """List a MIG-enabled GPU's instances (again every MIG_RESCAN_S, or after a failure)."""
        if parent.mig_checked_t is not None and t_s - parent.mig_checked_t < MIG_RESCAN_S:
            return
        parent.mig_checked_t = t_s
        nv = self._nvml
        mode = self._field(parent, "mig", _fn(nv, "nvmlDeviceGetMigMode"), parent.handle)
        found: dict[int, _GpuState] = {}
        if mode is not None and int(mode[0]) == 1:
            slots = self._field(parent, "mig", _fn(nv, "nvmlDeviceGetMaxMigDeviceCount"), parent.handle) or 0
            for slot in range(int(slots)):
                try:
                    handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
                except self._error_type as e:
                    if _code(e) in (_NOT_FOUND, 2):  # an empty slot
                        continue
                    if _code(e) in _LOST_CODES:
                        raise _GpuLost(_describe(e, _code(e))) from None
                    raise
                gi = int(nv.nvmlDeviceGetGpuInstanceId(handle))
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                unit = parent.migs.get(gi)
                if unit is None or unit.uuid != uuid:
                    name = _text(nv.nvmlDeviceGetName(handle))
                    unit = _GpuState(parent.index, handle, uuid, name, mig=gi, parent=parent)
                unit.handle = handle
                found[gi] = unit
        for gi, gone in parent.migs.items():
            if found.get(gi) is not gone:
                self._forget_unit(gone)
        parent.migs = found

    def _forget_unit(self, unit: _GpuState) -> None:
        if unit in self._fast_units:
            self._fast_units = [u for u in self._fast_units if u is not unit]
        for g in (unit.gpm, unit.fast):
            if g is not None:
                g.free()
        unit.gpm = unit.fast = None

    def _poll_migs(self, parent: _GpuState, t_s: float) -> list[GpuSample]:
        out = []
        for _, unit in sorted(parent.migs.items()):
            try:
                out.append(self._poll_mig(parent, unit, t_s))
            except self._error_type as e:  # this instance only (destroyed under us): list again
                parent.mig_checked_t = None
                out.append(self._unavailable_unit(unit, t_s, _describe(e, _code(e))))
        return out

    def _poll_mig(self, parent: _GpuState, unit: _GpuState, t_s: float) -> GpuSample:
        if unit.failing:
            unit.failing.clear()
        mem = self._memory(unit)
        procs = self._processes(unit)
        if not unit.gpm_checked:
            self._gpm_activity(unit, t_s)  # where supported, sets up its sampling (`fast`)
        history: tuple[UtilPoint, ...] = ()
        gpm = None
        if unit.fast is not None:
            history, gpm = self._drain(unit, t_s)
        xids, last_xid = self._xid.seen(parent.index, unit.mig)
        if self._problems.any_active:
            self._problems.clear_prefix(
                f"nvml:gpu {unit.tag}:", keep={f"nvml:gpu {unit.tag}:{f}" for f in unit.failing}
            )
        return GpuSample(
            t_s=t_s,
            index=parent.index,
            uuid=unit.uuid,
            name=unit.name,
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            processes=tuple(
                GpuProcess(int(p.pid), _opt_int(getattr(p, "usedGpuMemory", None))) for p in procs
            )
            if procs
            else (),
            util_history=history,
            mig=unit.mig,
            gpm=gpm,
            xids=xids,
            last_xid=last_xid,
        )

    @property
    def fast_period_s(self) -> float | None:
        """How often the sampler should call `sample_fast` between ticks; None: no need."""
        return 1.0 / MIG_GPM_HZ if self._fast_units else None

    def sample_fast(self, t_s: float) -> None:
        """One step of GPM activity sampling on the units NVML gives no utilization samples (MIG
        instances): MIG_GPM_HZ a second with the tick's own. Each call is guarded per GPU."""
        for unit in self._fast_units:
            parent = unit.parent or unit
            if unit.fast is None or unit.handle is None or parent.stuck_since is not None:
                continue
            self._enter(parent.index)
            try:
                self._fast_read(unit, t_s)
            finally:
                self._leave()

    def _fast_read(self, unit: _GpuState, t_s: float) -> None:
        """Between ticks: a failure is left to the tick's own read to report."""
        if unit.fast is None:
            return
        try:
            value = unit.fast.step(t_s)
        except self._error_type:
            return
        if value is not None:
            unit.pending.append(UtilPoint(round(t_s, 6), value))

    def _drain(self, unit: _GpuState, t_s: float) -> tuple[tuple[UtilPoint, ...], GpmActivity | None]:
        """At a tick: the activity history since the last (the steps, and one now), and the GPM
        figures over the whole second."""
        activity = None
        if unit.fast is not None:
            try:
                value, activity = unit.fast.tick(t_s)
                if value is not None:
                    unit.pending.append(UtilPoint(round(t_s, 6), value))
            except self._error_type as e:
                self._gpm_failed(unit, e)
        points = []
        while unit.pending:
            points.append(unit.pending.popleft())
        return tuple(points), activity

    # -- GPM and clock events ------------------------------------------------------------------

    def _gpm_activity(self, state: _GpuState, t_s: float) -> GpmActivity | None:
        nv = self._nvml
        if state.gpm is None:
            if state.gpm_checked:
                return None
            state.gpm_checked = True
            if not self._gpm_on:
                return None
            support = self._field(state, "gpm", _fn(nv, "nvmlGpmQueryDeviceSupport"), state.handle)
            if support is None or not int(support.isSupportedDevice):
                state.unsupported.add("gpm")
                return None
            parent = state.parent
            take: Callable[[Any], Any]
            if parent is not None and state.mig is not None:
                gi = state.mig

                def take(sample: Any) -> Any:
                    assert parent is not None
                    return nv.nvmlGpmMigSampleGet(parent.handle, gi, sample)
            else:

                def take(sample: Any) -> Any:
                    return nv.nvmlGpmSampleGet(state.handle, sample)

            if state.mig is not None or "samples" in state.unsupported:  # no utilization samples
                state.fast = GpmUnit(nv, take, fast=True)  # sampled between ticks too: _drain reads it
                self._fast_units = [*self._fast_units, state]
                return None
            state.gpm = GpmUnit(nv, take)
        try:
            return state.gpm.activity(t_s)
        except self._error_type as e:
            self._gpm_failed(state, e)
            return None

    def _gpm_failed(self, state: _GpuState, e: BaseException) -> None:
        code = _code(e)
        if code in _UNSUPPORTED_CODES:
            state.unsupported.add("gpm")
            self._forget_unit(state)
            return
        if code in _LOST_CODES:
            raise _GpuLost(_describe(e, code)) from None
        state.failing.add("gpm")
        self._problems.note(f"nvml:gpu {state.tag}:gpm", f"{state.where} gpm: {_describe(e, code)}")

    def _clock_events(self, state: _GpuState, t_s: float) -> int | None:
        """The reasons now; the time since the last tick is charged to the reasons seen then."""
        bits = self._field(state, "clock_events", self._clock_fn, state.handle)
        if bits is None and "clock_events" in state.unsupported:  # drivers before 535: the old name
            bits = self._field(state, "throttle_reasons", self._throttle_fn, state.handle)
        prev_t, prev_bits = state.clock_prev_t, state.clock_bits
        state.clock_prev_t, state.clock_bits = t_s, None if bits is None else int(bits)
        if prev_t is not None and prev_bits is not None and t_s > prev_t:
            dt = min(t_s - prev_t, _CLOCK_GAP_CAP_S)
            for reason in clock_reasons(prev_bits):
                state.clock_s[reason] = round(state.clock_s.get(reason, 0.0) + dt, 6)
        return state.clock_bits

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
            f"nvml:gpu {state.tag}:processes",
            f"{state.where} processes: the list kept growing while read; left out",
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
        if fn is None:  # not in these bindings (an older pynvml, the simulator)
            state.unsupported.add(name)
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
            self._problems.note(f"nvml:gpu {state.tag}:{name}", f"{state.where} {name}: {_describe(e, code)}")
            return None
        except Exception as e:  # pynvml's NVMLLibraryMismatchError is a plain Exception
            if type(e).__name__ == "NVMLLibraryMismatchError":
                state.unsupported.add(name)
                return None
            raise


def _fn(nvml: Any, name: str) -> Any:
    return getattr(nvml, name, None)


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
        from gpumon.core.errors import MissingDependency

        raise MissingDependency(
            "NVIDIA's Python bindings are missing: pip install nvidia-ml-py (imported as pynvml)"
        ) from None
    return pynvml  # type: ignore[no-any-return]  # untyped: seen as Any
