"""The second NVML stand-in (tests/nvml2/standin2.c), read through the real pynvml and through
gpumon's own NVML source, in one child process that loads it (LD_LIBRARY_PATH).

The child (tests/nvml2/probe.py) records what it saw as JSON; the tests here judge it. Timeline
time is held and moved with NVML2_NOW_US, so every figure is deterministic; only the event wait
runs on the real clock.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.nvml2.build import build, environment

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
T0_US = 1_700_000_000_000_000
RING = 120
"""Samples the stand-in's driver keeps per GPU."""

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the NVML stand-in")


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    build()
    done = subprocess.run(
        [sys.executable, "-m", "tests.nvml2.probe"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=environment(GPUS, NVML2_NOW_US=str(T0_US), PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_build_is_cached_and_atomic() -> None:
    first = build()
    mtime = first.stat().st_mtime_ns
    assert build() == first and first.stat().st_mtime_ns == mtime, "rebuilt although up to date"
    assert not [p for p in first.parent.iterdir() if p.name.endswith(".tmp")], "temporary files left"


def test_devices(seen: dict[str, Any]) -> None:
    assert seen["count"] == GPUS
    assert seen["indices"] == list(range(GPUS))
    assert len(set(seen["uuids"])) == GPUS and all(u.startswith("GPU-") for u in seen["uuids"])
    assert all("H100" in name for name in seen["names"])
    assert seen["capability"] == [9, 0]
    assert seen["mig_mode"] == [0, 0]
    assert seen["after_shutdown"] == 1  # NVML_ERROR_UNINITIALIZED


def test_samples_only_newer_and_six_a_second(seen: dict[str, Any]) -> None:
    s = seen["samples"]
    assert s["type"] == 1  # NVML_VALUE_TYPE_UNSIGNED_INT
    ring = s["ring"]
    assert len(ring) == RING
    stamps = [ts for ts, _ in ring]
    assert stamps == sorted(stamps) and stamps[-1] <= T0_US
    assert all(0 <= v <= 100 for _, v in ring)
    assert s["again"] == 6  # NVML_ERROR_NOT_FOUND: nothing newer than the last seen
    fresh = s["fresh"]
    assert all(ts > s["last"] for ts, _ in fresh)
    assert all(ts <= T0_US + 10_000_000 for ts, _ in fresh)
    assert 59 <= len(fresh) <= 61, "about 6 samples per second of timeline time"
    assert s["after_1000_s"] == RING, "never more than the ring holds"
    means = [sum(v) / len(v) for v in s["per_gpu"]]
    assert all(m > 80 for m in means[:4]), means  # fed
    assert all(20 < m < 60 for m in means[4:7]), means  # starved, bursty
    assert min(min(v) for v in s["per_gpu"][4:7]) < 10 and max(max(v) for v in s["per_gpu"][4:7]) > 80
    assert means[7] == 0  # idle


def test_processes_and_memory(seen: dict[str, Any]) -> None:
    procs = seen["processes"]
    for k in range(GPUS - 1):
        assert 1 <= len(procs[k]) <= 2 and procs[k][0][0] == 100000 + k
        assert all(gi == 0xFFFFFFFF for _, _, gi in procs[k])
    assert procs[GPUS - 1] == []
    for k, mem in enumerate(seen["memory"]):
        version, total, reserved, free, used = mem["v2"]
        assert version == 0x02000028
        assert reserved + free + used == total
        assert used == sum(m for _, m, _ in procs[k])
        assert mem["v1"] == [total, free, used + reserved]
    assert seen["memory_bad_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    for util, mem_util, power_mw, limit_mw, temp, tx, rx, _ in seen["plain"]:
        assert 0 <= mem_util <= util <= 100
        assert 0 < power_mw <= limit_mw == 700_000
        assert 20 <= temp <= 90 and 0 <= tx <= rx


def test_gpm_metrics_in_range(seen: dict[str, Any]) -> None:
    assert seen["gpm_supported"] == 1
    assert seen["gpm_mig"] == 3  # NVML_ERROR_NOT_SUPPORTED: MIG is off
    for k, metrics in enumerate(seen["gpm"]):
        assert all(ret == 0 and 0.0 <= value <= 100.0 for _, ret, value in metrics), (k, metrics)
        graphics = metrics[0][2]
        assert (graphics > 0) == (k % 8 != 7), (k, graphics)


def test_event_wait_blocks_without_cpu(seen: dict[str, Any]) -> None:
    wait = seen["wait"]
    assert wait["code"] == 10  # NVML_ERROR_TIMEOUT
    assert 0.19 <= wait["wall_s"] < 1.0
    assert wait["cpu_s"] < 0.020, "a wait must sleep, not poll"
    assert seen["thread_errors"] == []


def test_gpumon_nvml_source_reads_it(seen: dict[str, Any]) -> None:
    first, second = seen["gpumon"]["first"], seen["gpumon"]["second"]
    assert [g["index"] for g in first] == list(range(GPUS))
    assert [g["uuid"] for g in first] == seen["uuids"]
    for tick in (first, second):
        assert all(g["available"] and g["error"] is None for g in tick), tick
        assert all(5 <= len(g["history"]) <= 7 for g in tick), [len(g["history"]) for g in tick]
        assert [len(g["procs"]) > 0 for g in tick] == [k % 8 != 7 for k in range(GPUS)]
    assert all(g["gpm"] is None for g in first)  # GPM needs two samples
    for g in second:
        assert g["gpm"] is not None
        ratios = [v for name, v in g["gpm"].items() if name.endswith("_ratio") and v is not None]
        assert ratios and all(0.0 <= v <= 1.0 for v in ratios)
    newest_first = max(t for t, _ in first[0]["history"])
    assert all(t > newest_first for t, _ in second[0]["history"]), "the second tick repeats no sample"
