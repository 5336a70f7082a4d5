"""Read GPUs through NVML (NVIDIA's `pynvml` bindings, PyPI `nvidia-ml-py`): the only module of
gpumon that loads them.

The module to call is injected: the real `pynvml`, or a look-alike such as the simulator's
(`gpumon.sim.fakenvml`). Only names and error codes are used, so both behave the same here. NVML
never creates a CUDA context or allocates GPU memory, so polling does not disturb the job watched.

Per field and per GPU, NVML's codes are read as gpumon.collect.sources.nvml.codes says: a field
the GPU does not support is left out and not asked again; a lost GPU is marked unavailable for the
tick, its handle dropped and fetched again next tick, so a GPU that comes back is picked up.

Hung calls: with a CallGuard (gpumon.core.guard), every call that may hang is bracketed, per GPU
and for the driver-wide ones (init, count). The sampling thread reads NVML itself, with no
hand-off; when a supervisor finds it stuck in one GPU's call, it abandons the thread, that GPU is
marked unavailable and skipped until the call returns, and a fresh thread goes on with the others.
A driver-wide call that hangs makes the whole source fail fast (no NVML call at all) until it
returns, so threads stay bounded: one per stuck GPU, one for a stuck driver, plus one.

Beside each GPU's utilization, memory, power and processes: MIG instances (.mig), GPM activity
(.gpm), clock-event reasons (.clocks) and XID errors (.xid, from an event thread).

No driver at start: with `retry_init`, `poll` keeps trying nvmlInit with exponential backoff
(1 s, 2 s, ... 60 s) and reports no GPUs meanwhile, so a daemon started before the driver picks
it up when it appears.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import ModuleType
from typing import Any

from gpumon.collect.sources.nvml import codes
from gpumon.collect.sources.nvml.clocks import ClockReading
from gpumon.collect.sources.nvml.mig import MigReading
from gpumon.collect.sources.nvml.reader import device_text, nvml_function
from gpumon.collect.sources.nvml.samples import (
    GPU_UTILIZATION_SAMPLES,
    SampleClockAligner,
    fresh_pairs,
    to_points,
)
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.core.errors import MissingDependency, NoDriverError
from gpumon.core.guard import CallGuard
from gpumon.core.model import DeviceInfo, GpuSample, UtilPoint
from gpumon.core.problems import Problems

TEMPERATURE_GPU = 0
PCIE_COUNT_TX_BYTES, PCIE_COUNT_RX_BYTES = 197, 198
"""nvml.h's NVML_FI_DEV_PCIE_COUNT_TX_BYTES and _RX_BYTES: the link's bytes so far, read in one
nvmlDeviceGetFieldValues call (0.3 ms on an H200). Never nvmlDeviceGetPcieThroughput: it measures
the link over 20 ms inside the driver, and on an H200 each call blocked 21 ms (docs/gpu-check.md)."""
PCIE_FIELDS = (PCIE_COUNT_TX_BYTES, PCIE_COUNT_RX_BYTES)
PCIE_MAX_BYTES_PER_S = 1e12
"""Above any PCIe link (a x16 Gen 6 moves ~128 GB/s each way): a counter that jumped is no rate."""
PLAIN_FIELDS = frozenset({"utilization", "power", "power_limit", "temperature"})
"""Fields read with one call each and no rule of their own: one try covers them all."""
AHEAD_S = 1.0
"""A utilization sample stamped more than this after the poll (on the sampler's clock) is ahead of
now: a driver's glitch (see NvmlSource._not_ahead)."""
AHEAD_POLLS = 3
"""Readings in a row with only samples ahead of now before the driver's clock is taken to have
jumped (and followed)."""
STALE_PROBE_MAX_POLLS = 60
"""A GPU whose readings have nothing newer than the last seen sample has the driver's whole ring
read once after AHEAD_POLLS such readings, then after twice as many, and so on up to once every
this many (see NvmlSource._stale): an idle GPU costs few calls more."""
REST_AFTER_S = 30.0
"""A GPU with no process, no memory in use and 0% in every tick and sample for this long is at
rest: its samples and PCIe counters are not read until a process, memory or any utilization shows
(NvmlSource._at_rest)."""
REST_MAX_USED_BYTES = 64 * 2**20
"""A GPU using more memory than this is never at rest: every CUDA context holds hundreds of MB (an
idle H200 read 0-3 MiB in use). A driver whose "used" counts its reserve (memory v1) never rests."""
DRIVER = "driver"
INIT_ALLOW_S = 60.0
"""How long nvmlInit may take before its thread is given up: without persistence mode the driver
sets its GPUs up at the first open, which takes seconds on a multi-GPU host (NVIDIA's Driver
Persistence guide); the other calls are held to nvml_call_timeout_s."""
"""What a driver-wide call (init, count) is guarded as."""


_number = object.__getattribute__
"""A number field of one of pynvml's structures, read without their Python-level __getattribute__
(it only turns bytes into str; a read through it costs three times as much: benchmarks/nvml_cost.py)."""
_UNREAD: Any = object()
"""Not read on the fast path (the careful one reads it)."""
_new_tuple = tuple.__new__
assert GpuSample._fields == (  # the order _poll_gpu builds a sample in (tests run with asserts)
    "t_s",
    "index",
    "uuid",
    "name",
    "available",
    "util_ratio",
    "mem_util_ratio",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "temp_c",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "processes",
    "util_history",
    "error",
    "jobs",
    "unattributed",
    "mig",
    "gpm",
    "clock_events",
    "clock_event_s",
    "xids",
    "last_xid",
), "GpuSample's fields moved: NvmlSource._poll_gpu builds it positionally"


def _ratio(percent: int) -> float:
    return percent / 100.0 if 0 <= percent <= 100 else (1.0 if percent > 100 else 0.0)


class NvmlSource(MigReading, ClockReading):
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
        super().__init__(nvml, problems, guard)
        self._gpus: dict[int, GpuState] = {}
        self._open = False
        self._retry_init = retry_init
        self._next_init_t = 0.0
        self._init_backoff_s = 1.0
        self._driver_stuck_since: float | None = None
        self._init_error = "NVML not initialised yet"
        self._gpm_on = gpm
        self._activity_units = []
        self._clock_fn = nvml_function(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
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
            self._enter(DRIVER, INIT_ALLOW_S)  # slow, not hung, where the driver sets its GPUs up
            try:
                self._nvml.nvmlInit()
            finally:
                self._leave()
        except self._error_type as e:
            self._no_driver(codes.init_failure(e))
            return
        except OSError as e:  # a library that exists but cannot be loaded
            self._no_driver(codes.NO_DRIVER_HINT.format(why=str(e)))
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
                    self._forget_unit(unit)
            try:
                self._nvml.nvmlShutdown()
            except self._error_type:
                pass
            self._open = False

    # -- hung calls ------------------------------------------------------------------------------

    def _hung(self, what: Hashable, since: float) -> None:
        """The guard gave up on a thread stuck in a call on `what` (a GPU index, or the driver)."""
        if what == DRIVER:
            self._driver_stuck_since = since
            self._problems.note(
                "nvml:driver", "nvml: a driver-wide NVML call does not return: NVML is not read until it does"
            )
        elif isinstance(what, int):
            self._gpus.setdefault(what, GpuState(what)).stuck_since = since

    def _returned(self, what: Hashable) -> None:
        """A call given up on has returned: read that GPU (or the driver) again from the next tick."""
        if what == DRIVER:
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
            except (codes.GpuLost, self._error_type) as e:
                self._problems.note(f"nvml:gpu {index}:unavailable", f"gpu {index}: unavailable: {_why(e)}")
                out.append(DeviceInfo(index, self._gpus.get(index, GpuState()).uuid, "", None))
                continue
            out.append(DeviceInfo(index, state.uuid, state.name, None if mem is None else int(mem.total)))
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
            except (codes.GpuLost, self._error_type) as e:
                why = _why(e)
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
        self._enter(DRIVER)
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._error_type as e:
            # The whole driver is gone (e.g. unloaded): let the sampler count it as a source failure.
            raise RuntimeError(f"nvmlDeviceGetCount failed: {codes.describe(e)}") from None
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

    def _state(self, index: int) -> GpuState:
        state = self._gpus.get(index)
        if state is None:
            state = self._gpus[index] = GpuState(index)
        if state.handle is None:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = device_text(self._nvml.nvmlDeviceGetUUID, handle)
                name = device_text(self._nvml.nvmlDeviceGetName, handle)
            except self._error_type as e:
                codes.raise_if_lost(e)
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
        util = power_mw = limit_mw = temp = None
        mem = procs = bits = _UNREAD
        read = False
        if state.plain_answered and not state.failing:
            # The usual tick: every plain field has answered before, so all are read without a
            # wrapper per call (this runs for every GPU on every tick: benchmarks/nvml_cost.py);
            # so are memory, processes and clock events where they answered on the last tick.
            # Any error: the careful path below.
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                power_mw = nv.nvmlDeviceGetPowerUsage(h)
                limit_mw = nv.nvmlDeviceGetEnforcedPowerLimit(h)
                temp = nv.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU)
                if state.rest_answered:
                    mem = nv.nvmlDeviceGetMemoryInfo(h, version=self._mem_v2)
                    procs = self._list_processes(h)
                    bits = self._clock_fn(h)
                read = True
            except (self._error_type, TypeError):  # TypeError: a pynvml patched since (gpustat's)
                mem = procs = bits = _UNREAD
                read = False
        if not read:  # field by field, under NVML's rules (gpumon.collect.sources.nvml.codes)
            util = self._field(state, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
            power_mw = self._field(state, "power", nv.nvmlDeviceGetPowerUsage, h)
            limit_mw = self._field(state, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
            temp = self._field(state, "temperature", nv.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU)
            state.plain_answered = not state.failing and state.unsupported.isdisjoint(PLAIN_FIELDS)
        if mem is _UNREAD:
            mem = self._memory(state)
            procs = self._processes(state)
            bits = self._clock_read(state)
            state.rest_answered = (
                self._mem_v2 is not None
                and not state.memory_v1
                and self._clock_fn is not None
                and None not in (mem, procs, bits)
                and not state.failing
            )
        resting = self._at_rest(state, t_s, util, procs, mem)
        if resting:
            history: tuple[UtilPoint, ...] = (UtilPoint(t_s, 0.0),)
        else:
            history = self._history(state, t_s)
            if state.quiet_since is not None and any(p.util_ratio for p in history):
                state.quiet_since = None  # a kernel ran within the second, whatever the tick read
        gpm = self._gpm_activity(state, t_s) if not state.gpm_checked or state.gpm is not None else None
        if state.activity is not None:  # no utilization samples here: GPM's activity instead
            history, gpm = self._drain(state, t_s)
        rx: float | None
        tx: float | None
        if gpm is not None and gpm.pcie_rx_bytes_per_s is not None and gpm.pcie_tx_bytes_per_s is not None:
            rx, tx = gpm.pcie_rx_bytes_per_s, gpm.pcie_tx_bytes_per_s  # the counters: not asked
            state.pcie_counted = None
        elif resting:  # no process, no DMA: and the next reading after it starts from a baseline
            rx = tx = state.pcie_counted = None
        else:
            rx, tx = self._pcie_rates(state, t_s)
        clock_bits = self._clock_events(state, t_s, bits)
        if "mig" not in state.unsupported:
            self._scan_migs(state, t_s)
        xids, last_xid = self._xid.seen(index, None)
        if self._problems.any_active:  # this GPU answered: what failed before and not now is over
            self._problems.clear_prefix(
                f"nvml:gpu {index}:", keep={f"nvml:gpu {index}:{f}" for f in state.failing}
            )
        # positionally, in GpuSample's field order (its keyword __new__ is a Python function, and
        # this runs for every GPU on every tick; the assertion by _new_tuple holds the order)
        return _new_tuple(
            GpuSample,
            (
                t_s,
                index,
                state.uuid,
                state.name,
                True,  # available
                None if util is None else _ratio(_number(util, "gpu")),
                None if util is None else _ratio(_number(util, "memory")),
                None if mem is None else int(_number(mem, "used")),
                None if mem is None else int(_number(mem, "total")),
                None if power_mw is None else power_mw / 1000.0,
                None if limit_mw is None else limit_mw / 1000.0,
                None if temp is None else float(temp),
                rx,
                tx,
                procs or (),
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
            ),
        )

    def _at_rest(self, state: GpuState, t_s: float, util: Any, procs: Any, mem: Any) -> bool:
        """No process on the GPU, no memory in use and 0% utilization, at every tick and in every
        sample read, for REST_AFTER_S: its utilization samples and PCIe counters are not read (on
        an H200 nvmlDeviceGetSamples cost 1.4 ms of CPU a call, nvmlDeviceGetFieldValues 0.3 ms:
        most of an idle daemon's second there, and what nvitop-exporter does not pay;
        docs/gpu-check.md). Its utilization reading stands for the second instead: one point of
        0%, as a GPU sampled once a second reads. A process listed, memory in use (any CUDA
        context holds some: a job whose processes the driver does not list) or any utilization,
        and the samples are read again at once, from the last seen: the ring still holds the
        seconds since, and those up to the last tick at rest are left out (its point stood for
        them)."""
        if (
            procs is None
            or procs is _UNREAD
            or len(procs)
            or util is None
            or _number(util, "gpu")
            or mem is None
            or mem is _UNREAD
            or _number(mem, "used") > REST_MAX_USED_BYTES
            or state.migs
            or state.activity is not None
            or "samples" in state.unsupported
        ):
            if state.rested_to is not None and state.quiet_since is not None:
                state.waking = True  # the first reading probes the ring (a clock stepped back)
            state.quiet_since = None
            return False
        if state.quiet_since is None:
            state.quiet_since = t_s
        if t_s - state.quiet_since < REST_AFTER_S:
            return False
        state.rested_to = t_s
        return True

    def _pcie_rates(self, state: GpuState, t_s: float) -> tuple[float | None, float | None]:
        """PCIe traffic where GPM gives none: (rx, tx) bytes a second since the last reading of the
        driver's byte counters; None on the first reading, after a counter went back, or where the
        driver has no such counters (not asked again)."""
        counts = self._pcie_counts if self._field_values is not None else None  # None: unsupported
        now = self._field(state, "pcie", counts, state.handle, t_s)
        before, state.pcie_counted = state.pcie_counted, now
        if now is None or before is None:
            return None, None
        tx, rx, stamp_s = now
        dt = stamp_s - before[2]
        if dt <= 0 or tx < before[0] or rx < before[1]:
            return None, None
        rx_rate, tx_rate = (rx - before[1]) / dt, (tx - before[0]) / dt
        if max(rx_rate, tx_rate) > PCIE_MAX_BYTES_PER_S:
            return None, None
        return rx_rate, tx_rate

    def _pcie_counts(self, handle: Any, t_s: float) -> tuple[int, int, float]:
        """The link's bytes so far, (tx, rx, when): the driver's timestamp where it gives one (the
        counters' own time), else the tick's. A field the driver refuses raises its code."""
        tx, rx = self._field_values(handle, PCIE_FIELDS)
        for v in (tx, rx):
            if v.nvmlReturn:
                raise self._error_type(v.nvmlReturn)
        stamp_us = tx.timestamp
        return int(tx.value.ullVal), int(rx.value.ullVal), stamp_us / 1e6 if stamp_us > 0 else t_s

    def _history(self, state: GpuState, t_s: float) -> tuple[UtilPoint, ...]:
        """The driver's utilization samples since the last tick's, on the sampler's clock."""
        if "samples" in state.unsupported:
            return ()
        try:
            value_type, raw = self._read_samples(state.handle, GPU_UTILIZATION_SAMPLES, state.last_seen_ts_us)
        except self._error_type as e:
            code = codes.code_of(e)
            if code == codes.NOT_FOUND:  # nothing newer than last seen: an idle or quiet GPU
                return self._stale(state, t_s)
            if code in codes.UNSUPPORTED:
                state.unsupported.add("samples")
                return ()
            codes.raise_if_lost(e)
            state.failing.add("samples")
            self._problems.note(
                f"nvml:gpu {state.index}:samples", f"gpu {state.index} samples: {codes.describe(e)}"
            )
            return ()
        fresh = fresh_pairs(value_type, raw, state.last_seen_ts_us)
        if state.replayed:  # a clock stepped back was followed: its older samples, still in the ring
            kept = [p for p in fresh if p[0] not in state.replayed]
            if len(kept) == len(fresh):
                state.replayed = frozenset()  # rolled out of it
            fresh = kept
        if not fresh:
            return self._stale(state, t_s)
        newest = fresh[-1][0]
        offset = state.aligner.observe(t_s, newest, AHEAD_S)
        if offset is None:  # stamped ahead of now (the first poll has no offset to judge by)
            fresh = self._not_ahead(state, fresh, t_s)
            if not fresh:
                return ()
            newest = fresh[-1][0]
            state.aligner.observe(t_s, newest)
            offset = state.aligner.offset_s
        elif state.ahead_polls:
            state.ahead_polls = 0
        state.last_seen_ts_us = newest
        points = to_points(fresh, offset)
        if state.rested_to is not None:  # waking: the samples up to the last tick at rest stood for
            rested, state.rested_to, state.waking = state.rested_to, None, False
            points = [p for p in points if p.t_s > rested]
        if state.first_poll:
            # The buffer's history from before we started: keep only the last second of it.
            state.first_poll = False
            points = [p for p in points if p.t_s > t_s - 1.0]
            # No offset judged the newest sample: where it was stamped ahead, what follows it in
            # the ring tells (_stale)
            state.below = (newest, frozenset(ts for ts, _ in fresh if ts < newest))
        return tuple(points)

    def _stale(self, state: GpuState, t_s: float) -> tuple[UtilPoint, ...]:
        """A reading with nothing newer than the last seen sample: an idle GPU, or a last seen
        ahead of the driver's clock, which would hide every later sample for good: the driver's
        clock went back (a GPU reset), or the first reading's newest was stamped ahead (there was
        no offset yet to judge it by). After AHEAD_POLLS such readings in a row (then twice as
        many, and so on: STALE_PROBE_MAX_POLLS), the driver's whole ring is read once; where its
        samples go on below the last seen, they are followed from now, on a fresh clock offset."""
        last = state.last_seen_ts_us
        if not last:
            return ()
        since, n = state.stale
        n = n + 1 if since == last else 1
        state.stale = (last, n)
        k, r = divmod(n, AHEAD_POLLS)
        waking, state.waking = state.waking, False  # at rest the ring was not looked at: look now
        if not waking and (r or (k & (k - 1) if n < STALE_PROBE_MAX_POLLS else n % STALE_PROBE_MAX_POLLS)):
            return ()
        try:
            value_type, raw = self._read_samples(state.handle, GPU_UTILIZATION_SAMPLES, 0)
        except self._error_type:
            return ()  # an empty ring (NOT_FOUND), or a failure that the next reading tells
        ring = fresh_pairs(value_type, raw, 0)
        if not ring or ring[-1][0] > last:
            return ()  # newer samples after all: the next reading takes them
        kept = [p for p in ring if p[0] < last]
        if ring[-1][0] == last:  # the last seen is still there: are samples coming below it?
            seen_last, seen = state.below
            state.below = (last, frozenset(ts for ts, _ in kept))
            if seen_last != last:
                return ()  # the first look: the next one tells
            # those that came since the last look: a clock stepped back (NTP, a VM's resume) keeps
            # the ring's older samples, stamped above the new ones, until they roll out of it
            kept = [p for p in kept if p[0] not in seen]
            if not kept:
                return ()  # nothing came since: an idle GPU
        # the driver's clock is below the last seen: follow it from now
        newest = kept[-1][0]
        state.aligner = SampleClockAligner()
        offset = state.aligner.observe(t_s, newest)
        assert offset is not None
        state.last_seen_ts_us = newest
        # the ring's samples stamped above the newest followed are from before the step: told once
        # already, they are never read as new (an idle spell realigned to them, replaying them)
        state.replayed = frozenset(ts for ts, _ in ring if ts > newest)
        state.stale, state.below = (0, 0), (0, frozenset())
        state.ahead_polls = 0
        state.first_poll = False
        return tuple(p for p in to_points(kept, offset) if p.t_s > t_s - 1.0)

    def _not_ahead(self, state: GpuState, fresh: list[tuple[int, int]], t_s: float) -> list[tuple[int, int]]:
        """Samples stamped after now (by the clocks' offset so far): one glitch of a driver would
        be "last seen" and hide every later sample, and move the offset with it. They are left out
        (the last seen stays the newest sample before now); only where nothing else comes for
        AHEAD_POLLS readings has the driver's clock itself jumped, and it is followed."""
        limit_us = (t_s + AHEAD_S - state.aligner.offset_s) * 1e6
        kept = [p for p in fresh if p[0] <= limit_us]
        if kept:
            state.ahead_polls = 0
            return kept
        state.ahead_polls += 1
        if state.ahead_polls < AHEAD_POLLS:
            return []
        state.ahead_polls = 0
        state.aligner = SampleClockAligner()  # the driver's clock jumped: align to it afresh
        return fresh


def _why(e: BaseException) -> str:
    """A GPU's reading failed: GpuLost already carries its description."""
    return str(e) if isinstance(e, codes.GpuLost) else codes.describe(e)


def load_pynvml() -> ModuleType:
    """Import the real bindings (kept out of module scope so simulated runs never load them)."""
    try:
        # here, not at the top: the NVIDIA bindings: real GPUs only (a simulated run never loads them)
        import pynvml
    except ImportError:
        raise MissingDependency(
            "NVIDIA's Python bindings are missing: pip install nvidia-ml-py (imported as pynvml)"
        ) from None
    return pynvml  # type: ignore[no-any-return]  # untyped: seen as Any
