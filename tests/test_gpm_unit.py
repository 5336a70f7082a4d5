"""GPM's metrics as gpumon reads them from pynvml's own nvmlGpmMetricsGet_t: a metric the driver
fails is None, the others read as when every metric answers (the two ways of reading agree)."""

from __future__ import annotations

import ctypes
import math
import random
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpumon.collect.sources.nvml.gpm_unit import METRICS, _Request, activity_of
from gpumon.core.model import GpmActivity

IDS = [metric_id for metric_id, _, _ in METRICS]


def reading(answers: list[tuple[int, float]], older: int = 0, newer: int = 1) -> GpmActivity:
    """What gpumon reads when the driver answers each of METRICS with (return code, value), asked
    between two of a unit's three sample buffers (stand-ins: pointers never followed)."""
    buffers = [ctypes.cast(ctypes.c_void_p(0x1000 * (k + 1)), pynvml.c_nvmlGpmSample_t) for k in range(3)]

    def metrics_get(get: Any) -> Any:
        assert [get.metrics[i].metricId for i in range(get.numMetrics)] == IDS
        asked = [ctypes.cast(p, ctypes.c_void_p).value for p in (get.sample1, get.sample2)]
        assert asked == [0x1000 * (older + 1), 0x1000 * (newer + 1)], "the older sample first"
        for i, (ret, value) in enumerate(answers):
            get.metrics[i].nvmlReturn, get.metrics[i].value = ret, value
        return get

    nvml = SimpleNamespace(
        c_nvmlGpmMetricsGet_t=pynvml.c_nvmlGpmMetricsGet_t,
        NVML_GPM_METRICS_GET_VERSION=pynvml.NVML_GPM_METRICS_GET_VERSION,
        nvmlGpmMetricsGet=metrics_get,
    )
    return _Request(nvml, METRICS, buffers).activity(older, newer)


def expected(answers: list[tuple[int, float]]) -> GpmActivity:
    """activity_of's rules: None where the driver failed, nothing below 0, ratios capped at 1."""
    return activity_of(
        [
            None if ret else (value * scale if value > 0 else 0.0)
            for (ret, value), (_, _, scale) in zip(answers, METRICS)
        ]
    )


EDGES = [0.0, -3.0, 100.0, 100.04, 250.0, 99.95, 0.05, 0.0499, 12.3456, 1e-9, 2.5e4, math.inf, math.nan]


@pytest.mark.parametrize("failing", [None, 0, 3, 8, 11])
def test_a_failed_metric_is_none_and_the_others_read_alike(failing: int | None) -> None:
    rng = random.Random(failing)
    for _ in range(200):
        answers = [(0, rng.choice(EDGES) if rng.random() < 0.3 else rng.uniform(0, 120)) for _ in METRICS]
        if failing is not None:
            answers[failing] = (rng.choice([3, 15, 999]), rng.uniform(0, 100))  # NOT_SUPPORTED, ...
        got = reading(answers, *rng.sample(range(3), 2))
        assert got == expected(answers), answers
        assert (got[failing] is None) if failing is not None else None not in got
        ratios = [v for v, (_, name, _) in zip(got, METRICS) if name.endswith("_ratio") and v is not None]
        assert all(0.0 <= v <= 1.0 and round(v, 3) == v for v in ratios)


def test_a_metric_over_100_percent_is_capped_and_bytes_are_scaled_from_mib() -> None:
    answers = [(0, 100.6), *[(0, 50.0)] * 7, (0, 2.0), (0, 0.5), (0, -1.0), (0, 0.0)]
    got = reading(answers)
    assert got.graphics_ratio == 1.0 and got.sm_active_ratio == 0.5
    assert got.pcie_rx_bytes_per_s == 2 * 1024 * 1024 and got.pcie_tx_bytes_per_s == 512 * 1024
    assert got.nvlink_rx_bytes_per_s == 0.0 == got.nvlink_tx_bytes_per_s
