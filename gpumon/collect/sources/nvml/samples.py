"""NVML's utilization samples (nvmlDeviceGetSamples): the driver's sub-second history, put on the
sampler's clock."""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Sequence
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
