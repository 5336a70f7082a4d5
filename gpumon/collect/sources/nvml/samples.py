"""NVML's utilization samples (nvmlDeviceGetSamples): the driver's sub-second history, put on the
sampler's clock."""

from __future__ import annotations

from collections.abc import Iterable
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


def fresh_pairs(value_type: int, raw: Iterable[Any], last_seen_us: int) -> list[tuple[int, int]]:
    """(timestamp µs, percent) of the samples strictly newer than the last seen, oldest first
    (drivers differ in order). Each struct field is read once: pynvml's structures make every
    attribute access costly."""
    value_field = VALUE_FIELDS[value_type] if 0 <= value_type < len(VALUE_FIELDS) else "uiVal"
    pairs = [(s.timeStamp, getattr(s.sampleValue, value_field)) for s in raw]
    return sorted(p for p in pairs if p[0] > last_seen_us)


def to_points(fresh: list[tuple[int, int]], offset_s: float) -> list[UtilPoint]:
    return [
        UtilPoint(round(ts / 1e6 + offset_s, 6), min(1.0, max(0.0, value / 100.0))) for ts, value in fresh
    ]
