"""GPM (GPU Performance Monitoring, Hopper and newer): two samples in, what the SMs did out.

The NVML module is injected (the real `pynvml`, or none of these functions on a simulator or an
older driver); gpumon.sources.nvml decides where GPM is supported and calls this. A GpmUnit owns
two sample buffers for one GPU or MIG instance and alternates between them: each `read` takes a
sample and returns the metrics between it and the one before. NVML's samples must be more than
100 ms apart ("internal sample refresh rate", nvml.h); a read sooner than that takes nothing.
"""

from __future__ import annotations

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
        out: list[float | None] = []
        for i, (_, _, scale) in enumerate(self._metrics):
            m = get.metrics[i]
            out.append(None if m.nvmlReturn != 0 else max(0.0, float(m.value)) * scale)
        return out

    def activity(self, t_s: float) -> GpmActivity | None:
        values = self.read(t_s)
        if values is None:
            return None
        fields = {name: v for (_, name, _), v in zip(self._metrics, values, strict=True)}
        for name, v in fields.items():
            if v is not None and name.endswith("_ratio"):
                fields[name] = round(min(1.0, v), 4)
        return GpmActivity(**fields)

    def free(self) -> None:
        for s in self._samples:
            try:
                self._nv.nvmlGpmSampleFree(s)
            except Exception:  # a driver gone at shutdown: nothing left to free
                pass
        self._samples = []
