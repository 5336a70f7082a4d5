"""GPM (GPU Performance Monitoring, Hopper and newer): two samples in, what the SMs did out.

The NVML module is injected (the real `pynvml`, or none of these functions on a simulator or an
older driver); gpumon.collect.sources.nvml decides where GPM is supported and calls this. A GpmUnit owns
two sample buffers for one GPU or MIG instance and alternates between them: each `read` takes a
sample and returns the metrics between it and the one before. NVML's samples must be more than
100 ms apart ("internal sample refresh rate", nvml.h); a read sooner than that takes nothing.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

from gpumon.core.model import GpmActivity

MIN_APART_S = 0.1
"""nvml.h: two GPM samples closer than this give no metrics."""
_MIB = 1024.0 * 1024.0
_PERCENT = 0.01

# (GPM metric id from nvml.h, GpmActivity field, scale to gpumon's units)
METRICS: tuple[tuple[int, str, float], ...] = (
    (1, "graphics_ratio", _PERCENT),  # NVML_GPM_METRIC_GRAPHICS_UTIL, percent
    (2, "sm_active_ratio", _PERCENT),  # SM_UTIL
    (3, "sm_occupancy_ratio", _PERCENT),  # SM_OCCUPANCY
    (5, "tensor_ratio", _PERCENT),  # ANY_TENSOR_UTIL
    (10, "dram_bw_ratio", _PERCENT),  # DRAM_BW_UTIL
    (13, "fp16_ratio", _PERCENT),  # FP16_UTIL
    (12, "fp32_ratio", _PERCENT),  # FP32_UTIL
    (11, "fp64_ratio", _PERCENT),  # FP64_UTIL
    (21, "pcie_rx_bytes_per_s", _MIB),  # PCIE_RX_PER_SEC, MiB/s
    (20, "pcie_tx_bytes_per_s", _MIB),  # PCIE_TX_PER_SEC
    (60, "nvlink_rx_bytes_per_s", _MIB),  # NVLINK_TOTAL_RX_PER_SEC
    (61, "nvlink_tx_bytes_per_s", _MIB),  # NVLINK_TOTAL_TX_PER_SEC
)
GRAPHICS_ONLY: tuple[tuple[int, str, float], ...] = METRICS[:1]
"""What the steps between ticks ask for: activity, for bursts and gaps."""
_RATIOS = sum(1 for _, name, _ in METRICS if name.endswith("_ratio"))
MAX_BYTES_PER_S = 1e15
"""A PCIe or NVLink rate at or above this (1 PB/s, hundreds of times any link's), or infinite, is a
driver's garbage, not traffic: read as 0, as a NaN is (never +Inf in /metrics, the state API's
JSON or a recording, whose reader refuses it)."""
_MAX_MIB = MAX_BYTES_PER_S / _MIB
"""MAX_BYTES_PER_S in the driver's MiB/s (compared before scaling: one comparison a value)."""
assert tuple(name for _, name, _ in METRICS) == GpmActivity._fields, "METRICS is in GpmActivity's order"

# nvml.h's nvmlGpmMetric_t: {unsigned int metricId; nvmlReturn_t nvmlReturn; double value;
# nvmlGpmMetricInfo_t {char *shortName, *longName, *unit}}: 40 bytes on x86-64 and aarch64.
# Read in one unpack rather than one ctypes proxy per metric and field (benchmarks/nvml_cost.py).
_METRIC = struct.Struct("=Iid24x")
STEPS = 1000
"""GPM's activities are read to 0.1% (3 decimals of a ratio): every rule's line is a whole percent,
the 4th decimal was noise that cost 0.8 MB of a MIG instance's recorded GPU-day, and rounding here,
at the source, keeps what the daemon judges live and what its recording replays the same."""


def activity_of(values: list[float | None]) -> GpmActivity:
    """METRICS' values (in its order) as a GpmActivity, ratios capped at 1, to 3 decimals (as
    round(v, 3), but an integer round: round with ndigits goes through decimal strings, ten times
    slower, and this runs for every GPU every tick)."""
    for i in range(_RATIOS):
        v = values[i]
        if v is not None:
            values[i] = round((v if v < 1.0 else 1.0) * STEPS) / STEPS
    for i in range(_RATIOS, len(values)):
        v = values[i]
        if v is not None and not v < MAX_BYTES_PER_S:  # infinite, or beyond any link: as NaN, 0
            values[i] = 0.0
    return tuple.__new__(GpmActivity, values)  # GpmActivity(*values) without its Python __new__


class _Request:
    """One nvmlGpmMetricsGet_t, built once and reused: pynvml's holds 477 metric slots (19 KB).
    It asks between two of a unit's sample buffers, named by their index in `samples`."""

    def __init__(self, nvml: Any, metrics: Sequence[tuple[int, str, float]], samples: Sequence[Any]) -> None:
        self._nv = nvml
        self._samples = samples
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        get.numMetrics = len(metrics)
        for i, (metric_id, _, _) in enumerate(metrics):
            get.metrics[i].metricId = metric_id
        self._get = get
        self._scales = [scale for _, _, scale in metrics]
        self._raw: Any = None
        # pynvml's structs check every attribute set in Python; ctypes' own setter does not
        self._set: Callable[[Any, str, Any], None] = setattr
        self._pointers: tuple[Any, Any] | None = None
        """sample1 and sample2 seen as plain pointers, set to `_addresses` (no type check per tick)."""
        self._addresses: list[int | None] = []
        if isinstance(get, ctypes.Structure):
            self._set = ctypes.Structure.__setattr__
            if ctypes.sizeof(type(get.metrics[0])) == _METRIC.size:  # read straight from memory
                size = _METRIC.size * len(metrics)
                self._raw = (ctypes.c_char * size).from_address(ctypes.addressof(get.metrics))
            fields = type(get).sample1, type(get).sample2  # ctypes' CField descriptors
            if all(f.size == ctypes.sizeof(ctypes.c_void_p) for f in fields) and all(
                isinstance(x, ctypes._Pointer) for x in samples
            ):
                at = ctypes.addressof(get)
                self._pointers = (
                    ctypes.c_void_p.from_address(at + fields[0].offset),
                    ctypes.c_void_p.from_address(at + fields[1].offset),
                )
                self._addresses = [ctypes.cast(x, ctypes.c_void_p).value for x in samples]
        # The usual answer (every metric given) in two unpacks, its return codes and its values,
        # where the ratios come first and each kind has one scale (as METRICS)
        self._returns = struct.Struct("=" + "4xi32x" * len(metrics))
        self._values = struct.Struct("=" + "8xd24x" * len(metrics))
        is_ratio = [name.endswith("_ratio") for _, name, _ in metrics]
        self._split = sum(is_ratio)
        self._one_scale = (
            all(is_ratio[: self._split])
            and {scale for scale, r in zip(self._scales, is_ratio, strict=True) if r} <= {_PERCENT}
            and {scale for scale, r in zip(self._scales, is_ratio, strict=True) if not r} <= {_MIB}
        )

    def activity(self, older: int, newer: int) -> GpmActivity:
        """METRICS between two samples as a GpmActivity, by activity_of's rules (this runs for every
        GPU on every tick): the usual answer, every metric given, read from the metrics' memory in
        two unpacks (the return codes, then the values) and a pass per kind; one with a metric that
        failed (None there), metric by metric."""
        self._fill(older, newer)
        if self._raw is not None and self._one_scale:
            raw = self._raw.raw
            if not any(self._returns.unpack(raw)):
                values = self._values.unpack(raw)
                split = self._split
                out = [
                    round((x if (x := v * _PERCENT) < 1.0 else 1.0) * STEPS) / STEPS if v > 0 else 0.0
                    for v in values[:split]
                ]
                # not above 0 (NaN too), infinite or absurd (activity_of): 0
                out += [v * _MIB if 0 < v < _MAX_MIB else 0.0 for v in values[split:]]
                return tuple.__new__(GpmActivity, out)  # GpmActivity(*out), without its Python __new__
        return activity_of(self._read())

    def _fill(self, older: int, newer: int) -> None:
        get = self._get
        if self._pointers is not None:
            first, second = self._pointers
            first.value, second.value = self._addresses[older], self._addresses[newer]
        else:
            self._set(get, "sample1", self._samples[older])
            self._set(get, "sample2", self._samples[newer])
        self._nv.nvmlGpmMetricsGet(get)

    def between(self, older: int, newer: int) -> list[float | None]:
        """The metrics between two samples, scaled (see _read)."""
        self._fill(older, newer)
        return self._read()

    def _read(self) -> list[float | None]:
        """The metrics the last call filled in, in gpumon's units: None where the driver failed
        one, 0 where it was not above 0 (NaN too)."""
        if self._raw is not None:
            found = _METRIC.iter_unpack(self._raw.raw)
            return [
                None if ret else (value * scale if value > 0 else 0.0)
                for (_, ret, value), scale in zip(found, self._scales, strict=True)
            ]
        out: list[float | None] = []
        for i, scale in enumerate(self._scales):
            m = self._get.metrics[i]
            out.append(None if m.nvmlReturn != 0 else max(0.0, float(m.value)) * scale)
        return out


class GpmUnit:
    """GPM sampling of one unit. `take(sample)` fills an NVML sample buffer for it
    (nvmlGpmSampleGet on a device or MIG handle, or nvmlGpmMigSampleGet on the parent).

    Each tick (`tick`) takes a sample and gives METRICS since the previous tick's. A `fast` unit
    also takes samples between ticks (`step`), each giving graphics activity since the one
    before: a third buffer keeps the previous tick's sample while the steps go on."""

    def __init__(self, nvml: Any, take: Callable[[Any], Any], *, fast: bool = False) -> None:
        self._nv = nvml
        self._take = take
        self._samples = [nvml.nvmlGpmSampleAlloc() for _ in range(3 if fast else 2)]
        self._anchor: int | None = None
        """The buffer holding the previous tick's sample."""
        self._last: int | None = None
        """The buffer holding the newest sample (tick or step)."""
        self._last_t = 0.0
        self._full = _Request(nvml, METRICS, self._samples)
        self._quick = _Request(nvml, GRAPHICS_ONLY, self._samples) if fast else None

    def _sample(self, t_s: float) -> int | None:
        if self._last is not None and t_s - self._last_t <= MIN_APART_S:
            return None  # too soon after the last: NVML would give nothing
        anchor, last = self._anchor, self._last
        if last is None:
            free = 0
        elif anchor is None or anchor == last:
            free = (last + 1) % len(self._samples)
        else:  # three buffers: the one that is neither
            free = 3 - anchor - last
        self._take(self._samples[free])
        return free

    def step(self, t_s: float) -> float | None:
        """Between ticks (fast units): graphics activity since the newest sample, 0-1 (to STEPS)."""
        new = self._sample(t_s)
        if new is None or self._quick is None:
            return None
        last, self._last, self._last_t = self._last, new, t_s
        if last is None:
            return None
        value = self._quick.between(last, new)[0]
        return None if value is None else round(min(1.0, value) * STEPS) / STEPS

    def tick(self, t_s: float) -> tuple[float | None, GpmActivity | None]:
        """At a tick: (graphics activity since the newest sample (fast units), METRICS since the
        previous tick's sample). None where there is no earlier sample."""
        new = self._sample(t_s)
        if new is None:
            return None, None
        quick = full = None
        if self._quick is not None and self._last is not None:
            value = self._quick.between(self._last, new)[0]
            quick = None if value is None else round(min(1.0, value) * STEPS) / STEPS
        if self._anchor is not None:
            full = self._full.activity(self._anchor, new)
        self._anchor = new
        self._last, self._last_t = new, t_s
        return quick, full

    def activity(self, t_s: float) -> GpmActivity | None:
        """METRICS since the previous tick, as a GpmActivity: `tick` without the graphics activity
        of a fast unit (every GPU, every tick: no pair of figures built to drop one)."""
        if self._quick is not None:
            return self.tick(t_s)[1]
        last = self._last
        new = self._sample(t_s)
        if new is None:
            return None
        # as `tick`: the metrics first, so that after a failed call the next covers both ticks
        found = None if last is None else self._full.activity(last, new)
        self._anchor = self._last = new
        self._last_t = t_s
        return found

    def free(self) -> None:
        for s in self._samples:
            try:
                self._nv.nvmlGpmSampleFree(s)
            except Exception:  # a driver gone at shutdown: nothing left to free
                pass
        self._samples = []
