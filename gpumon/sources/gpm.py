"""GPM (GPU Performance Monitoring, Hopper and newer): two samples in, what the SMs did out.

The NVML module is injected (the real `pynvml`, or none of these functions on a simulator or an
older driver); gpumon.sources.nvml decides where GPM is supported and calls this. A GpmUnit owns
two sample buffers for one GPU or MIG instance and alternates between them: each `read` takes a
sample and returns the metrics between it and the one before. NVML's samples must be more than
100 ms apart ("internal sample refresh rate", nvml.h); a read sooner than that takes nothing.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

from gpumon.model import GpmActivity

MIN_APART_S = 0.1
"""nvml.h: two GPM samples closer than this give no metrics."""
_MIB = 1024.0 * 1024.0

# (GPM metric id from nvml.h, GpmActivity field, scale to gpumon's units)
METRICS: tuple[tuple[int, str, float], ...] = (
    (1, "graphics_ratio", 0.01),  # NVML_GPM_METRIC_GRAPHICS_UTIL, percent
    (2, "sm_active_ratio", 0.01),  # SM_UTIL
    (3, "sm_occupancy_ratio", 0.01),  # SM_OCCUPANCY
    (5, "tensor_ratio", 0.01),  # ANY_TENSOR_UTIL
    (10, "dram_bw_ratio", 0.01),  # DRAM_BW_UTIL
    (13, "fp16_ratio", 0.01),  # FP16_UTIL
    (12, "fp32_ratio", 0.01),  # FP32_UTIL
    (11, "fp64_ratio", 0.01),  # FP64_UTIL
    (21, "pcie_rx_bytes_per_s", _MIB),  # PCIE_RX_PER_SEC, MiB/s
    (20, "pcie_tx_bytes_per_s", _MIB),  # PCIE_TX_PER_SEC
    (60, "nvlink_rx_bytes_per_s", _MIB),  # NVLINK_TOTAL_RX_PER_SEC
    (61, "nvlink_tx_bytes_per_s", _MIB),  # NVLINK_TOTAL_TX_PER_SEC
)
GRAPHICS_ONLY: tuple[tuple[int, str, float], ...] = METRICS[:1]
"""What the fast MIG sampling asks for: activity, for bursts and gaps."""
_RATIOS = sum(1 for _, name, _ in METRICS if name.endswith("_ratio"))
assert tuple(name for _, name, _ in METRICS) == GpmActivity._fields, "METRICS is in GpmActivity's order"

# nvml.h's nvmlGpmMetric_t: {unsigned int metricId; nvmlReturn_t nvmlReturn; double value;
# nvmlGpmMetricInfo_t {char *shortName, *longName, *unit}}: 40 bytes on x86-64 and aarch64.
# Read in one unpack rather than one ctypes proxy per metric and field (benchmarks/nvml_cost.py).
_METRIC = struct.Struct("=Iid24x")


class GpmUnit:
    """GPM sampling of one unit. `take(sample)` fills an NVML sample buffer for it
    (nvmlGpmSampleGet on a device or MIG handle, or nvmlGpmMigSampleGet on the parent)."""

    def __init__(
        self,
        nvml: Any,
        take: Callable[[Any], Any],
        metrics: Sequence[tuple[int, str, float]] = METRICS,
    ) -> None:
        self._nv = nvml
        self._take = take
        self._metrics = tuple(metrics)
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._newest = 0
        self._prev_t: float | None = None
        # One request struct, reused: pynvml's holds 477 metric slots (19 KB) and costs to build.
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        get.numMetrics = len(self._metrics)
        for i, (metric_id, _, _) in enumerate(self._metrics):
            get.metrics[i].metricId = metric_id
        self._get = get
        self._scales = [scale for _, _, scale in self._metrics]
        self._raw: Any = None
        try:  # the real bindings' ctypes struct: its metrics read straight from memory
            if ctypes.sizeof(type(get.metrics[0])) == _METRIC.size:
                n = len(self._metrics)
                self._raw = (ctypes.c_char * (_METRIC.size * n)).from_address(ctypes.addressof(get.metrics))
        except TypeError:  # a look-alike (the simulator's): read its attributes
            self._raw = None

    def read(self, t_s: float) -> list[float | None] | None:
        """Take a sample at `t_s`; the metrics since the previous one (None on the first, and
        when the previous is not yet more than 100 ms old: nothing is taken then)."""
        if self._prev_t is not None and t_s - self._prev_t <= MIN_APART_S:
            return None
        older = self._samples[self._newest]
        newer = self._samples[self._newest ^ 1]
        self._take(newer)
        first = self._prev_t is None
        self._prev_t = t_s
        self._newest ^= 1
        if first:
            return None
        get = self._get
        get.sample1 = older
        get.sample2 = newer
        self._nv.nvmlGpmMetricsGet(get)
        if self._raw is not None:
            found = _METRIC.iter_unpack(self._raw.raw)
            return [
                None if ret else (value * scale if value > 0 else 0.0)
                for (_, ret, value), scale in zip(found, self._scales, strict=True)
            ]
        out: list[float | None] = []
        for i, scale in enumerate(self._scales):
            m = get.metrics[i]
            out.append(None if m.nvmlReturn != 0 else max(0.0, float(m.value)) * scale)
        return out

    def activity(self, t_s: float) -> GpmActivity | None:
        """All of METRICS as a GpmActivity (a unit made with METRICS only)."""
        values = self.read(t_s)
        if values is None:
            return None
        for i in range(_RATIOS):
            v = values[i]
            if v is not None:
                values[i] = round(v if v < 1.0 else 1.0, 4)
        return GpmActivity(*values)

    def free(self) -> None:
        for s in self._samples:
            try:
                self._nv.nvmlGpmSampleFree(s)
            except Exception:  # a driver gone at shutdown: nothing left to free
                pass
        self._samples = []
