"""The simulated fleet: scenario statistics match their definitions, NVML's semantics hold, host
signals agree with the scenario, and runs are deterministic and bounded."""

from __future__ import annotations

import statistics

import pytest

from gpumon.collect.sources.host import HostSource
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.core.clock import VirtualClock
from gpumon.core.errors import UsageError
from gpumon.sim.fakehost import FakeHost
from gpumon.sim.fakenvml import FakeNvml
from gpumon.sim.fleet import BUFFER_SAMPLES, Fleet
from gpumon.sim.scenarios import SCENARIOS, SWITCH_S, parse_scenarios


def run_fleet(names: str, seconds: int, period: float = 1 / 6, seed: int = 3, gpus: int | None = None):
    clock = VirtualClock()
    fleet = Fleet(parse_scenarios(names), gpus, seed, clock, period)
    nvml = NvmlSource(FakeNvml(fleet))
    nvml.open()
    host = HostSource(FakeHost(fleet))
    host.poll(0.0)
    ticks = []
    for _ in range(seconds):
        clock.advance(1.0)
        gpus_ = nvml.poll(clock.now())
        h = host.poll(clock.now(), [p.pid for g in gpus_ for p in g.processes])
        ticks.append((gpus_, h))
    return fleet, ticks


def history(ticks, gpu: int) -> list[float]:
    return [p.util_ratio for gpus, _ in ticks for p in gpus[gpu].util_history]


@pytest.mark.parametrize("name", ["healthy", "starved-cpu", "starved-io"])
def test_duty_cycle_matches_the_step_definition(name: str) -> None:
    phase = SCENARIOS[name].phases[0][1]
    mean_gap = phase.wait_s * (1 - phase.long_gap_p) + sum(phase.long_gap_s) / 2 * phase.long_gap_p
    expected = phase.compute_s / (phase.compute_s + mean_gap)
    _, ticks = run_fleet(name, 120)
    assert statistics.mean(history(ticks, 0)) == pytest.approx(expected, abs=0.04)


@pytest.mark.parametrize(
    "name,duty", [("idle", 0.0), ("stalled", 0.0), ("sync-stall", 1.0), ("underutilized", 0.35)]
)
def test_smooth_scenarios_hold_their_duty_without_gaps(name: str, duty: float) -> None:
    _, ticks = run_fleet(name, 30)
    values = history(ticks, 0)
    assert statistics.mean(values) == pytest.approx(duty, abs=0.02)
    assert max(values) - min(values) <= 0.08, "gap-free: no sample drops to idle or spikes"


def test_sample_period_decides_whether_bursts_are_visible() -> None:
    """NVML averages over its period: 60 ms bursts show at 1/6 s and read flat at 1 s."""
    _, fine = run_fleet("starved-cpu", 60, period=1 / 6)
    _, coarse = run_fleet("starved-cpu", 60, period=1.0)
    fine_v, coarse_v = history(fine, 0), history(coarse, 0)
    assert len(fine_v) == pytest.approx(6 * 60, abs=7) and len(coarse_v) == pytest.approx(60, abs=2)
    assert min(fine_v) == 0.0 and max(fine_v) >= 0.3
    assert statistics.pstdev(coarse_v) < statistics.pstdev(fine_v) / 2
    assert statistics.mean(coarse_v) == pytest.approx(statistics.mean(fine_v), abs=0.03)


def test_utilization_values_are_whole_percents_like_nvml() -> None:
    _, ticks = run_fleet("starved-io", 10)
    assert all(round(v * 100) == pytest.approx(v * 100) for v in history(ticks, 0))


def test_buffer_keeps_the_newest_samples_and_answers_not_found_when_nothing_is_new() -> None:
    clock = VirtualClock()
    fleet = Fleet(parse_scenarios("healthy"), None, 0, clock)
    nv = FakeNvml(fleet)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    clock.advance(100.0)
    _kind, everything = nv.nvmlDeviceGetSamples(h, 1, 0)
    assert len(everything) == BUFFER_SAMPLES
    ts = [s.timeStamp for s in everything]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlDeviceGetSamples(h, 1, ts[-1])
    assert e.value.value == 6  # NOT_FOUND
    clock.advance(0.5)
    _, newer = nv.nvmlDeviceGetSamples(h, 1, ts[-1])
    assert len(newer) == 3 and all(s.timeStamp > ts[-1] for s in newer)


def test_utilization_rates_is_the_last_full_period() -> None:
    clock = VirtualClock()
    fleet = Fleet(parse_scenarios("starved-cpu"), None, 0, clock)
    nv = FakeNvml(fleet)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    for _ in range(20):
        clock.advance(0.37)
        _, s = nv.nvmlDeviceGetSamples(h, 1, 0)
        assert nv.nvmlDeviceGetUtilizationRates(h).gpu == s[-1].sampleValue.uiVal


def test_same_seed_same_run_other_seed_other_run() -> None:
    _, a = run_fleet("starved-io,healthy", 20, seed=7)
    _, b = run_fleet("starved-io,healthy", 20, seed=7)
    _, c = run_fleet("starved-io,healthy", 20, seed=8)
    assert history(a, 0) == history(b, 0)
    assert [h.cpu_ratio for _, h in a] == [h.cpu_ratio for _, h in b]
    assert history(a, 0) != history(c, 0)
    assert a[0][0][0].uuid != c[0][0][0].uuid


def _proc(ticks, gpu_pid: int):
    return [p for _, h in ticks[2:] for p in h.processes if p.pid == gpu_pid]


def test_starved_cpu_job_pins_its_feeders() -> None:
    fleet, ticks = run_fleet("starved-cpu,healthy", 20)
    starved, fed = _proc(ticks, fleet.gpus[0].pid), _proc(ticks, fleet.gpus[1].pid)
    assert min(p.busiest_child_cpu_ratio for p in starved) >= 0.9
    assert max(p.busiest_child_cpu_ratio for p in fed) < 0.5
    assert min(h.busiest_core_ratio for _, h in ticks[2:]) >= 0.9
    assert max(h.iowait_ratio for _, h in ticks[2:]) < 0.05


def test_starved_io_shows_iowait_and_disk_reads_with_a_quiet_cpu() -> None:
    fleet, ticks = run_fleet("starved-io", 20)
    hosts = [h for _, h in ticks[2:]]
    assert min(h.iowait_ratio for h in hosts) >= 0.2
    assert min(h.disk_read_bytes_per_s for h in hosts) >= 200e6
    procs = _proc(ticks, fleet.gpus[0].pid)
    assert min(p.read_bytes_per_s for p in procs) >= 200e6
    assert max(p.busiest_child_cpu_ratio for p in procs) < 0.3


def test_sync_stall_reads_busy_at_idle_level_power() -> None:
    _, ticks = run_fleet("sync-stall,healthy", 10)
    stall, healthy = ticks[-1][0][0], ticks[-1][0][1]
    assert stall.util_ratio >= 0.95 and healthy.util_ratio >= 0.8
    assert stall.power_w / stall.power_limit_w <= 0.2
    assert healthy.power_w / healthy.power_limit_w >= 0.6


def test_idle_has_no_job_and_stalled_holds_memory_with_nothing_running() -> None:
    fleet, ticks = run_fleet("idle,stalled", 10)
    idle, stalled = ticks[-1][0]
    assert idle.processes == () and idle.mem_used_bytes < 1 * 2**30
    assert len(stalled.processes) == 1 and stalled.mem_used_bytes > 10 * 2**30
    assert max(history(ticks, 1)) == 0.0
    assert _proc(ticks, fleet.gpus[1].pid)[-1].cpu_ratio < 0.05


def test_healthy_then_starved_changes_at_the_switch() -> None:
    _, ticks = run_fleet("healthy-then-starved", int(SWITCH_S) + 30)
    before = history(ticks[: int(SWITCH_S) - 2], 0)
    after = history(ticks[int(SWITCH_S) + 2 :], 0)
    assert statistics.mean(before) > 0.9 and statistics.mean(after) < 0.35


def test_scenarios_cycle_over_the_gpus() -> None:
    fleet = Fleet(parse_scenarios("starved-cpu,healthy"), 5, 0, VirtualClock())
    assert fleet.scenario_names == ["starved-cpu", "healthy", "starved-cpu", "healthy", "starved-cpu"]


@pytest.mark.parametrize("text", ["", "healthy,", "nope", "healthy,,idle"])
def test_bad_scenario_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_scenarios(text)


def test_fleet_rejects_fewer_gpus_than_scenarios_and_periods_outside_nvmls_range() -> None:
    with pytest.raises(UsageError, match="--gpus"):
        Fleet(parse_scenarios("healthy,idle"), 1, 0, VirtualClock())
    with pytest.raises(UsageError, match="--sample-period"):
        Fleet(parse_scenarios("healthy"), 1, 0, VirtualClock(), sample_period_s=0.1)


def test_memory_stays_bounded_over_a_long_run() -> None:
    clock = VirtualClock()
    fleet = Fleet(parse_scenarios("healthy"), None, 0, clock)
    nvml = NvmlSource(FakeNvml(fleet))
    nvml.open()
    for _ in range(3000):
        clock.advance(1.0)
        nvml.poll(clock.now())
    gpu = fleet.gpus[0]
    assert len(gpu._starts) < 4000 and len(gpu._cache) <= 4 * BUFFER_SAMPLES
