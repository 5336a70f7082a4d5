"""NVML's utilization samples (nvmlDeviceGetSamples): the driver's sub-second history, put on the
sampler's clock."""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gpumon.core.model import UtilPoint

GPU_UTILIZATION_SAMPLES = 1
"""nvmlSamplingType_t NVML_GPU_UTILIZATION_SAMPLES."""
VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""nvmlSample_t's value union, by nvmlValueType_t."""


class SampleClockAligner:
    """Maps NVML sample timestamps (µs on the driver's own clock) onto the sampler's clock.

    The newest buffered sample is never later than the moment we read it, so
    `poll_time - newest_ts` is an upper bound of the clock offset; the smallest bound seen is the
    estimate. It leaks upward by `leak_s` per poll so that drift between the clocks is followed.
    """

    def __init__(self, leak_s: float = 0.0005) -> None:
        self._offset_s: float | None = None
        self._leak_s = leak_s

    def observe(self, poll_t_s: float, newest_ts_us: int, ahead_s: float = math.inf) -> float | None:
        """Take a poll's newest sample into the estimate; the offset after it. None, and nothing
        taken, where that sample is stamped more than `ahead_s` after the poll by the offset so far
        (a driver's glitch: NvmlSource._not_ahead; asked here, where the bound is at hand, as this
        runs for every GPU on every tick)."""
        bound = poll_t_s - newest_ts_us / 1e6
        offset = self._offset_s
        if offset is None or bound < offset + self._leak_s:
            if offset is not None and bound < offset - ahead_s:
                return None
            self._offset_s = bound
            return bound
        offset += self._leak_s
        self._offset_s = offset
        return offset

    def to_sampler_time(self, ts_us: int) -> float:
        return ts_us / 1e6 + self.offset_s

    @property
    def offset_s(self) -> float:
        assert self._offset_s is not None, "observe() first"
        return self._offset_s


SAMPLE_BYTES = 16
"""sizeof(nvmlSample_t): unsigned long long timeStamp, then the 8-byte nvmlValue_t union."""
_UNPACK = {
    k: struct.Struct(f"=Q{code}{'x' * (8 - struct.calcsize('=' + code))}")
    for k, code in enumerate(
        ("d", "I", "Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "I", "Q", "q", "i", "H")
    )
}
"""nvmlSample_t unpacked at once, by nvmlValueType_t (the union's member, as VALUE_FIELDS)."""


def fresh_pairs(value_type: int, raw: Sequence[Any], last_seen_us: int) -> list[tuple[int, int]]:
    """(timestamp µs, percent) of the samples strictly newer than the last seen, oldest first
    (drivers differ in order)."""
    pairs = _unpacked(value_type, raw)
    if pairs is None:  # not pynvml's ctypes array (the simulator's look-alike): field by field
        value_field = VALUE_FIELDS[value_type] if 0 <= value_type < len(VALUE_FIELDS) else "uiVal"
        pairs = [(s.timeStamp, getattr(s.sampleValue, value_field)) for s in raw]
    pairs.sort()  # already in order, the usual case: one pass
    if pairs and pairs[0][0] <= last_seen_us:
        return [p for p in pairs if p[0] > last_seen_us]
    return pairs


def _unpacked(value_type: int, raw: Sequence[Any]) -> list[tuple[int, int]] | None:
    """The samples read from the array's memory in one pass. pynvml hands back a slice of its
    ctypes array: structures side by side in one buffer, whose every attribute read goes through
    pynvml's Python-level __getattribute__ (about half of the source's cost per GPU when read
    field by field). None where the samples are not such an array."""
    if not raw:
        return []
    first = raw[0]
    unpack = _UNPACK.get(value_type)
    if unpack is None or not isinstance(first, ctypes.Structure) or ctypes.sizeof(first) != SAMPLE_BYTES:
        return None
    base = ctypes.addressof(first)
    if ctypes.addressof(raw[-1]) != base + SAMPLE_BYTES * (len(raw) - 1):
        return None  # not one array
    return list(unpack.iter_unpack(ctypes.string_at(base, SAMPLE_BYTES * len(raw))))


def to_points(fresh: list[tuple[int, int]], offset_s: float) -> list[UtilPoint]:
    """A percent the driver gives (0-100) as a ratio, on the sampler's clock to the microsecond."""
    offset_us = offset_s * 1e6
    new = tuple.__new__  # UtilPoint's own __new__ is a Python function: this builds the same tuple
    return [
        new(UtilPoint, (round(ts + offset_us) / 1e6, v / 100.0 if 0 <= v <= 100 else float(v > 0)))
        for ts, v in fresh
    ]


SAMPLES_ROOM = 128
"""Samples one direct call has room for: a tick's ~6 new ones, or a whole ring (the driver keeps
~120 at 1/6 s). A call that fills it may have left some out: the wrapper reads it again."""

SamplesReader = Callable[[Any, int, int], tuple[int, Sequence[Any]]]
"""(handle, sampling type, last seen µs) -> (value type, samples), as pynvml's
nvmlDeviceGetSamples; raises the bindings' NVMLError as it does."""


def samples_reader(nvml: Any) -> SamplesReader:
    """The cheapest way these bindings read a GPU's samples: one driver call into a buffer kept
    between ticks (DirectSamples), or pynvml's wrapper."""
    direct = DirectSamples.of(nvml)
    return direct if direct is not None else nvml.nvmlDeviceGetSamples


class DirectSamples:
    """nvmlDeviceGetSamples called once per reading, into a buffer of SAMPLES_ROOM samples that
    lives as long as the source (one per thread, as the process list's). pynvml's wrapper calls the
    driver twice (the count, then the samples into a new array); nvml.h says the call fills as many
    as the buffer holds and sets the count to those. On an H200 a call cost 1.4-2.6 ms of CPU, and
    one call instead of the wrapper's two saved nothing there (1.39 vs 1.41 ms: the cost is the
    answer with samples; docs/gpu-check.md): what it keeps is no array allocated a tick."""

    def __init__(
        self, fn: Any, sample: type[ctypes.Structure], error: Callable[[int], Exception], wrapper: Any
    ):
        self._fn = fn
        self._sample = sample
        self._error = error
        self._wrapper = wrapper
        self._local = threading.local()

    @classmethod
    def of(cls, nvml: Any) -> DirectSamples | None:
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        sample = getattr(nvml, "c_nvmlSample_t", None)
        error = getattr(nvml, "NVMLError", None)
        wrapper = getattr(nvml, "nvmlDeviceGetSamples", None)
        if pointer is None or error is None or wrapper is None or not isinstance(sample, type):
            return None
        if not issubclass(sample, ctypes.Structure) or ctypes.sizeof(sample) != SAMPLE_BYTES:
            return None
        try:
            fn = pointer("nvmlDeviceGetSamples")
        except Exception:  # not in this driver, or not initialized: the wrapper says so when called
            return None
        return cls(fn, sample, error, wrapper)

    def __call__(self, handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, Sequence[Any]]:
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None:
            array = (self._sample * SAMPLES_ROOM)()
            value_type, count = ctypes.c_uint(0), ctypes.c_uint(0)
            buf = local.buf = (array, value_type, count, ctypes.byref(value_type), ctypes.byref(count))
        array, value_type, count, value_type_ref, count_ref = buf
        count.value = SAMPLES_ROOM
        ret = self._fn(
            handle,
            ctypes.c_uint(sampling_type),
            ctypes.c_ulonglong(last_seen_us),
            value_type_ref,
            count_ref,
            array,
        )
        if ret:
            raise self._error(ret)
        n = count.value
        if n >= SAMPLES_ROOM:  # full: there may be more than it held; the wrapper sizes its array
            result: tuple[int, Sequence[Any]] = self._wrapper(handle, sampling_type, last_seen_us)
            return result
        return value_type.value, array[0:n]
