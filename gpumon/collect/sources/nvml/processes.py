"""A GPU's compute processes, as GpuProcess values.

With the real pynvml, nvmlDeviceGetComputeRunningProcesses_v3 is called on pynvml's own function
pointer into one buffer of pynvml's own struct that lives as long as the source, and the entries
are unpacked at once: pynvml's wrapper calls the driver twice (once for the count) and turns each
entry into an object through a dict of its fields, ~10 us of Python per GPU per tick for the one or
two processes a GPU runs, as much as the rest of a GPU's plain fields together
(benchmarks/nvml_cost.py). Elsewhere (the simulator's look-alike, a pynvml without the function
pointer or the struct), the wrapper.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gpumon.collect.sources.nvml import codes
from gpumon.core.model import MAX_GPU_PROCESSES, GpuProcess

FUNCTION = "nvmlDeviceGetComputeRunningProcesses_v3"
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
"""NVML_VALUE_NOT_AVAILABLE as an unsigned long long: the driver does not report the memory."""
FIRST_ENTRIES = 16
"""The buffer's first size, in entries: one call answers a GPU with up to this many contexts."""
MAX_ENTRIES = MAX_GPU_PROCESSES
"""The most entries one GPU's list is read with: a driver that claims more (a GPU takes some tens
of contexts, MPS clients included) is refused, not given a buffer of its count's size."""

ProcessLister = Callable[[Any], tuple[GpuProcess, ...]]
"""handle -> the GPU's processes; raises the bindings' NVMLError as their calls do."""


def process_lister(nvml: Any) -> ProcessLister:
    """The cheapest way these bindings give a GPU's processes (see the module's docstring)."""
    direct = _Direct.of(nvml)
    if direct is not None:
        return direct
    wrapper = nvml.nvmlDeviceGetComputeRunningProcesses
    return lambda handle: processes_of(wrapper(handle))


class _Buffer:
    """One thread's buffer and count: a thread abandoned in a call that hangs (the pipeline's
    supervisor starts another) may still be written to by the driver when its call returns, and
    never into the buffer its successor reads."""

    def __init__(self, entry: type[ctypes.Structure], entries: int) -> None:
        self.array: ctypes.Array[Any] = (entry * entries)()
        self.address = ctypes.addressof(self.array)
        self.count = ctypes.c_uint(0)
        self.count_ref = ctypes.byref(self.count)


class _Direct:
    """nvmlDeviceGetComputeRunningProcesses_v3 into a buffer kept between calls, one per thread."""

    def __init__(
        self, fn: Any, entry: type[ctypes.Structure], unpack: struct.Struct, error: Callable[[int], Exception]
    ) -> None:
        self._fn = fn
        self._entry = entry
        self._size = ctypes.sizeof(entry)
        self._unpack = unpack
        self._error = error
        self._local = threading.local()

    @classmethod
    def of(cls, nvml: Any) -> _Direct | None:
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        entry = getattr(nvml, "c_nvmlProcessInfo_v3_t", None)
        error = getattr(nvml, "NVMLError", None)
        if pointer is None or error is None or not isinstance(entry, type):
            return None
        unpack = _layout(entry) if issubclass(entry, ctypes.Structure) else None
        if unpack is None:
            return None
        try:
            fn = pointer(FUNCTION)
        except Exception:  # a driver without it (before R470), or not initialized: the wrapper says
            return None
        return cls(fn, entry, unpack, error)

    def __call__(self, handle: Any) -> tuple[GpuProcess, ...]:
        local = self._local
        buf: _Buffer | None = getattr(local, "buffer", None)
        if buf is None:
            buf = local.buffer = _Buffer(self._entry, FIRST_ENTRIES)
        for _ in range(2):  # a list that grew between the calls: once more with room for it
            room = len(buf.array)
            buf.count.value = room
            ret = self._fn(handle, buf.count_ref, buf.array)
            n = buf.count.value
            if ret == codes.SUCCESS:
                if n == 0:
                    return ()
                if n > room:  # a driver that says it wrote more than it was given room for
                    raise self._error(codes.UNKNOWN)
                raw = ctypes.string_at(buf.address, n * self._size)
                return _from_pairs(self._unpack.iter_unpack(raw))
            if ret != codes.INSUFFICIENT_SIZE:
                raise self._error(ret)
            if n > MAX_ENTRIES:
                raise self._error(codes.INSUFFICIENT_SIZE)
            buf = local.buffer = _Buffer(self._entry, min(MAX_ENTRIES, max(n * 2 + 5, room)))
        raise self._error(codes.INSUFFICIENT_SIZE)


def _layout(entry: type[ctypes.Structure]) -> struct.Struct | None:
    """A struct.Struct reading (pid, usedGpuMemory) from one entry of `entry`'s layout, by the
    offsets ctypes gives its fields; None where they are not the unsigned int and unsigned long
    long nvml.h says (then the wrapper is used)."""
    fields = dict(getattr(entry, "_fields_", ()))
    if fields.get("pid") is not ctypes.c_uint or fields.get("usedGpuMemory") is not ctypes.c_ulonglong:
        return None
    pid = entry.pid.offset
    mem = entry.usedGpuMemory.offset
    size = ctypes.sizeof(entry)
    if not (pid + 4 <= mem and mem + 8 <= size):
        return None
    return struct.Struct(f"={pid}xI{mem - pid - 4}xQ{size - mem - 8}x")


def _from_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[GpuProcess, ...]:
    new = tuple.__new__  # GpuProcess(...) without its Python __new__: once per process per tick
    out = [new(GpuProcess, (pid, None if mem == NOT_AVAILABLE else mem)) for pid, mem in pairs]
    return _distinct(out)


def processes_of(procs: Any) -> tuple[GpuProcess, ...]:
    """NVML's process entries as GpuProcess values (memory None where not reported). A pid NVML
    lists twice (a context on each of two MIG instances, say) is one process, its memory summed:
    gpumon_gpu_processes counts processes, not entries."""
    if not procs:
        return ()
    new = tuple.__new__  # GpuProcess(...) without its Python __new__: once per process per tick
    out = []
    for p in procs:
        mem = getattr(p, "usedGpuMemory", None)
        out.append(new(GpuProcess, (int(p.pid), None if mem is None else int(mem))))
    return _distinct(out)


def _distinct(out: list[GpuProcess]) -> tuple[GpuProcess, ...]:
    n = len(out)
    if n > 1 and (out[0][0] == out[1][0] if n == 2 else len(set(map(_pid, out))) < n):
        return _merged(out)
    return tuple(out)


_pid = operator.itemgetter(0)


def _merged(entries: list[GpuProcess]) -> tuple[GpuProcess, ...]:
    """One GpuProcess per pid, in the order first listed, the memory of its entries summed."""
    out: dict[int, GpuProcess] = {}
    for pid, mem in entries:
        if pid in out:
            before = out[pid].gpu_mem_bytes
            mem = before if mem is None else mem if before is None else mem + before
        out[pid] = GpuProcess(pid, mem)
    return tuple(out.values())
