"""The second NVML stand-in (tests/nvml2/standin2.c), read through the real pynvml and through
gpumon's own NVML source, in one child process that loads it (LD_LIBRARY_PATH).

The child (tests/nvml2/probe.py) records what it saw as JSON; the tests here judge it. Timeline
time is held and moved with NVML2_NOW_US, and XID events scripted with NVML2_XIDS, so every figure
is deterministic; only event-wait timeouts, and one event due 300 ms ahead on the real clock, take
real time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.nvml2.build import MAX_GPUS, build, environment

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
        env=environment(GPUS, now_us=T0_US, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_build_is_cached_and_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a directory of its own: on a fresh clone another worker's first build (benchmarks.nvml_cost's
    tests) may have its temporary file in the shared one at that moment (a fresh-machine run failed
    so, 2026-12-04)."""
    from tests.nvml2 import build as builder

    monkeypatch.setattr(builder, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(builder, "LIBRARY", tmp_path / "libnvidia-ml.so.1")
    first = builder.build()
    assert first.parent == tmp_path
    mtime = first.stat().st_mtime_ns
    assert builder.build() == first and first.stat().st_mtime_ns == mtime, "rebuilt although up to date"
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


def test_environment_loads_n_gpus_on_the_real_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVML2_NOW_US", "5")  # inherited frozen time must not leak into a benchmark
    env = environment(16, xids=[(3, 79, 10), (0, 48, 20)])
    assert env["NVML2_GPUS"] == "16" and "NVML2_NOW_US" not in env
    assert env["NVML2_XIDS"] == "3:79@10,0:48@20"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(build().parent)
    assert environment(8, now_us=7)["NVML2_NOW_US"] == "7"
    with pytest.raises(ValueError):
        environment(MAX_GPUS + 1)
    code = "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "16", done.stderr


def test_event_wait_times_out_asleep(seen: dict[str, Any]) -> None:
    wait = seen["events"]["timeout"]
    assert wait["code"] == 10  # NVML_ERROR_TIMEOUT: the event at the set's creation is not its own
    assert wait["wall_s"] >= 0.199, "returned before its timeout"
    assert wait["cpu_s"] < 0.020, "a wait must sleep, not poll"
    assert seen["thread_errors"] == []


def test_event_wait_returns_scripted_xids_in_order(seen: dict[str, Any]) -> None:
    ev = seen["events"]
    none = 0xFFFFFFFF
    # (GPU index, nvmlEventTypeXidCriticalError, XID, no MIG instance): unregistered GPU 1,
    # a malformed entry and a GPU that does not exist are skipped; equal times go in list order
    assert ev["due"] == [[5, 8, 48, none], [2, 8, 79, none]]
    assert ev["not_yet"] == 10, "an event due later is not delivered early"
    assert ev["later"] == [6, 8, 13, none]
    assert ev["drained"] == 10, "each event once"


def test_event_wait_on_the_real_clock_sleeps_until_the_event(seen: dict[str, Any]) -> None:
    live = seen["events"]["live"]
    assert live["event"] == [3, 8, 79, 0xFFFFFFFF]
    assert live["early_us"] <= 0, "returned before the event was due"
    assert live["cpu_s"] < 0.020, "a wait must sleep until the event, not poll"


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


def test_gpumon_reads_the_stand_ins_values(seen: dict[str, Any]) -> None:
    """What gpumon reports at the second tick is what the stand-in says, read directly."""
    for g, direct in zip(seen["gpumon"]["second"], seen["gpumon"]["direct"], strict=True):
        assert [v for _, v in g["history"]] == [v / 100 for v in direct["newest"]]
        assert g["procs"] == direct["procs"]
        assert g["mem_used"] == direct["mem_used"]
        assert g["power_w"] == direct["power_mw"] / 1000
        # gpumon reads GPM to 0.1% (gpm_unit.STEPS): within half a step of the driver's value
        assert g["gpm"]["graphics_ratio"] == pytest.approx(direct["graphics_pct"] / 100, abs=5e-4)


def test_gpumon_counts_a_scripted_xid(seen: dict[str, Any]) -> None:
    ticks = seen["gpumon"]
    assert ticks["xid_recorded"], "gpumon's XID thread never got the event"
    assert all(g["xids"] == [] for g in ticks["first"])
    assert [g["xids"] for g in ticks["second"]] == [[[79, 1]] if k == 3 else [] for k in range(GPUS)]
    assert ticks["second"][3]["last_xid"] == 79


def test_gpumon_with_gpm_off_reads_no_gpm(seen: dict[str, Any]) -> None:
    for tick in seen["gpumon"]["gpm_off"]:
        assert all(g["available"] and g["gpm"] is None for g in tick)
        assert all(5 <= len(g["history"]) <= 7 for g in tick)
