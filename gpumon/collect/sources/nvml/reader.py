"""What every part of the NVML source shares: the bindings, the problems it reports, the calls
that may hang (bracketed for the guard), and one field read under NVML's rules."""

from __future__ import annotations

import logging
from collections.abc import Hashable
from types import ModuleType
from typing import Any

from gpumon.collect.sources.nvml import codes
from gpumon.collect.sources.nvml.processes import ProcessLister, process_lister
from gpumon.collect.sources.nvml.samples import SamplesReader, samples_reader
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.collect.sources.nvml.xid import XidWatcher
from gpumon.core.guard import CallGuard
from gpumon.core.model import GpuProcess
from gpumon.core.problems import Problems

log = logging.getLogger("gpumon.nvml")


_CONTROLS = dict.fromkeys([*range(0x20), 0x7F], None)
"""C0 controls and DEL: never part of a GPU's name or UUID (an escape sequence in a log or a terminal)."""


def device_text(function: Any, handle: Any) -> str:
    """A name or UUID the driver gives (nvmlDeviceGetName, nvmlDeviceGetUUID), as text: bytes that
    are not UTF-8 as U+FFFD, control characters dropped. pynvml decodes strictly, and its
    UnicodeDecodeError is not an NVMLError (it failed every GPU's reading): it carries the bytes."""
    try:
        value = function(handle)
    except UnicodeDecodeError as e:
        value = e.object  # the bytes it could not decode
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text.translate(_CONTROLS)


def nvml_function(nvml: Any, name: str) -> Any:
    """The bindings' function, or None where these bindings (an older pynvml, the simulator)
    lack it."""
    return getattr(nvml, name, None)


class NvmlReader:
    def __init__(self, nvml: ModuleType | Any, problems: Problems | None, guard: CallGuard | None) -> None:
        self._nvml = nvml
        self._problems = problems or Problems(log)
        self._guard = guard
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._mem_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._field_values = nvml_function(nvml, "nvmlDeviceGetFieldValues")
        """The bindings' field-values call (the PCIe byte counters), looked up once; None: absent."""
        self._xid = XidWatcher(nvml, self._problems)
        self._lister: ProcessLister | None = None
        """How a GPU's processes are read (gpumon.collect.sources.nvml.processes): chosen at the
        first reading, once the driver is open (its function pointers are looked up then)."""
        self._sampler: SamplesReader | None = None
        """How a GPU's utilization samples are read (gpumon.collect.sources.nvml.samples), chosen
        as the process list's way is."""

    # -- calls that may hang ------------------------------------------------------------------

    def _enter(self, what: Hashable, allow_s: float | None = None) -> None:
        if self._guard is not None:
            self._guard.enter(what, allow_s)

    def _leave(self) -> None:
        if self._guard is not None:
            self._guard.leave()

    # -- one field -----------------------------------------------------------------------------

    def _field(
        self, state: GpuState, name: str, fn: Any, *args: Any, raise_codes: tuple[int, ...] = ()
    ) -> Any:
        """`fn(*args)`, or None for a field this GPU does not give (not asked again) or that failed
        (its problem noted); a lost GPU raises GpuLost."""
        if name in state.unsupported:
            return None
        if fn is None:  # not in these bindings (an older pynvml, the simulator)
            state.unsupported.add(name)
            return None
        try:
            return fn(*args)
        except self._error_type as e:
            code = codes.code_of(e)
            if code in raise_codes:
                raise
            if code in codes.UNSUPPORTED:
                state.unsupported.add(name)  # stop asking: no log spam for what cannot change
                return None
            codes.raise_if_lost(e)
            state.failing.add(name)
            self._problems.note(f"nvml:gpu {state.tag}:{name}", f"{state.where} {name}: {codes.describe(e)}")
            return None
        except Exception as e:  # pynvml's NVMLLibraryMismatchError is a plain Exception
            if type(e).__name__ == "NVMLLibraryMismatchError":
                state.unsupported.add(name)
                return None
            raise

    def _memory(self, state: GpuState) -> Any:
        """v2 first, as nvidia-smi, gpustat and nvitop do ("used" without the driver's reserve)."""
        nv = self._nvml
        if self._mem_v2 is not None and not state.memory_v1 and "memory" not in state.unsupported:
            try:
                return nv.nvmlDeviceGetMemoryInfo(state.handle, version=self._mem_v2)
            except TypeError:  # a pynvml patched by another library (gpustat does) takes no version
                state.memory_v1 = True
            except self._error_type as e:
                unsupported = (codes.FUNCTION_NOT_FOUND, codes.ARGUMENT_VERSION_MISMATCH, codes.NOT_SUPPORTED)
                if codes.code_of(e) not in unsupported:
                    codes.raise_if_lost(e)
                    raise
                state.memory_v1 = True
        return self._field(state, "memory", nv.nvmlDeviceGetMemoryInfo, state.handle)

    def _list_processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        lister = self._lister
        if lister is None:
            lister = self._lister = process_lister(self._nvml)
        return lister(handle)

    def _read_samples(self, handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, Any]:
        reader = self._sampler
        if reader is None:
            reader = self._sampler = samples_reader(self._nvml)
        return reader(handle, sampling_type, last_seen_us)

    def _processes(self, state: GpuState) -> tuple[GpuProcess, ...] | None:
        """The process list can grow between the driver's calls (INSUFFICIENT_SIZE): ask again."""
        for _ in range(3):
            try:
                procs: tuple[GpuProcess, ...] | None = self._field(
                    state,
                    "processes",
                    self._list_processes,
                    state.handle,
                    raise_codes=(codes.INSUFFICIENT_SIZE,),
                )
                return procs
            except self._error_type as e:
                if codes.code_of(e) != codes.INSUFFICIENT_SIZE:
                    raise
        state.failing.add("processes")
        self._problems.note(
            f"nvml:gpu {state.tag}:processes",
            f"{state.where} processes: the list kept growing while read; left out",
        )
        return None
