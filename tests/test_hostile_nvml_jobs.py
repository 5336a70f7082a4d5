"""A hostile driver and hostile job names, second pass: an XID storm does not flood the journal
(every event still counted), a GPU's sub-second history goes on after a sample stamped ahead on its
first reading or after the driver's clock goes back (a GPU reset), the Slurm scripts and the daemon
take only Slurm's job ids, and a job file names only a GPU index from 0 to 4095."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumon.collect.sources.jobs import MAX_GPU_INDEX, JobSource, parse_mapping_file
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.collect.sources.nvml.xid import SUMMARY_S, XidWatcher
from gpumon.core.model import GpuSample
from gpumon.core.problems import Problems

from .test_hostile_driver_slurm import NvmlError, SamplingDriver, fake_xid_nvml
from .test_jobs import EPILOG, PROLOG

# -- XID storms ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def xid_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpumon.xid"]


def test_an_xid_storm_logs_each_code_once_then_one_line_a_minute_and_counts_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing GPU raised thousands of XIDs a second, each a warning line: the journal flooded."""
    clock = Clock()
    w = XidWatcher(
        fake_xid_nvml(), Problems(logging.getLogger("test.xid")), wall_clock=lambda: 5.0, clock=clock
    )
    gpu, other = object(), object()
    assert w.register(0, gpu) and w.register(1, other)
    with caplog.at_level(logging.INFO, logger="gpumon.xid"):
        for k in range(6000):  # a minute's storm on GPU 0, one XID 48 among them; one XID on GPU 1
            clock.t = k / 100
            w.record(gpu, 48 if k == 3000 else 79)
        w.record(other, 79)
        first = xid_lines(caplog)
        assert first == [
            "gpu 0: XID 79 (further XIDs on gpu 0: one line a minute at most, with their counts)",
            "gpu 0: XID 48 (further XIDs on gpu 0: one line a minute at most, with their counts)",
            "gpu 1: XID 79 (further XIDs on gpu 1: one line a minute at most, with their counts)",
        ], first
        clock.t = SUMMARY_S  # the minute is up: the next event carries the summary
        w.record(gpu, 79)
        assert xid_lines(caplog)[3:] == ["gpu 0: 5999 more XIDs since its last line: XID 79 x5999"]
        for _ in range(500):  # the storm goes on, then stops
            w.record(gpu, 79)
        clock.t = SUMMARY_S + 30
        w.flush_summaries()
        assert len(xid_lines(caplog)) == 4, "not before a minute has passed"
        clock.t = 2 * SUMMARY_S + 1
        w.flush_summaries()  # the event thread looks once a second, events or not
        assert xid_lines(caplog)[4:] == ["gpu 0: 500 more XIDs since its last line: XID 79 x500"]
    assert w.seen(0, None) == (((48, 1), (79, 6500)), (79, 5.0)), "every event counted for /metrics"
    assert w.seen(1, None)[0] == ((79, 1),)


def test_an_xid_on_each_mig_instance_is_said_at_once_and_a_stop_says_what_is_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pace is per GPU, the first of a code per instance: XID 43 on mig 1 then on mig 2 of one
    GPU came out a minute late and without its instance; a stop left the last minute unsaid."""
    clock = Clock()
    w = XidWatcher(fake_xid_nvml(), Problems(logging.getLogger("test.xid")), clock=clock)
    gpu = object()
    assert w.register(0, gpu)
    with caplog.at_level(logging.INFO, logger="gpumon.xid"):
        w.record(gpu, 43, gpu_instance=1)
        w.record(gpu, 43, gpu_instance=2)
        assert xid_lines(caplog) == [
            "gpu 0 mig 1: XID 43 (further XIDs on gpu 0: one line a minute at most, with their counts)",
            "gpu 0 mig 2: XID 43 (further XIDs on gpu 0: one line a minute at most, with their counts)",
        ]
        for _ in range(3):
            w.record(gpu, 43, gpu_instance=2)
        w.record(gpu, 43, gpu_instance=1)
        clock.t = 10.0  # well within the minute: the daemon stops
        w.stop()
        assert xid_lines(caplog)[2:] == [
            "gpu 0: 4 more XIDs since its last line: XID 43 on mig 2 x3, XID 43 on mig 1 x1"
        ]


def test_a_storm_of_odd_codes_and_unregistered_devices_logs_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    w = XidWatcher(fake_xid_nvml(), Problems(logging.getLogger("test.xid")), clock=clock)
    gpu = object()
    assert w.register(0, gpu)
    with caplog.at_level(logging.INFO, logger="gpumon.xid"):
        for code in range(10_000):  # garbage event data: each event a new "code"
            w.record(gpu, code * 7919, gpu_instance=code)
            w.record(object(), 79)  # a device never registered: not counted
        assert len(xid_lines(caplog)) == 64 + 1, "the first 64 codes of the GPU, and one of the rest"
        clock.t = SUMMARY_S
        w.flush_summaries()
        lines = xid_lines(caplog)[65:]
    assert len(lines) == 2 and all(len(line) < 300 for line in lines), lines
    assert sum("gpu 0: 9936 more XIDs" in line and "other codes x9928" in line for line in lines) == 1
    assert (
        sum("9999 more XIDs on devices gpumon did not register (not counted)" in line for line in lines) == 1
    )


def test_the_event_thread_logs_the_summary_of_a_storm_that_stopped(caplog: pytest.LogCaptureFixture) -> None:
    """No next event would carry it: the thread's timed-out waits do."""
    clock = Clock()
    handle = object()

    event = SimpleNamespace(eventType=0x8, eventData=79, gpuInstanceId=0xFFFFFFFF, device=handle)
    script: list[Any] = [event] * 100 + [NvmlError(10)] * 3  # 10: TIMEOUT

    class Nvml:
        NVMLError = NvmlError

        def nvmlEventSetCreate(self) -> object:
            return "set"

        def nvmlDeviceRegisterEvents(self, h: object, types: int, s: object) -> None:
            pass

        def nvmlEventSetWait_v2(self, s: object, timeout_ms: int) -> object:
            step = script.pop(0)
            if isinstance(step, Exception):
                clock.t += SUMMARY_S / 2  # the waits time out: time passes
                if not script:
                    watcher._stop.set()
                raise step
            return step

    watcher = XidWatcher(Nvml(), Problems(logging.getLogger("test.xid")), clock=clock, retry_s=0.0)
    assert watcher.register(2, handle)
    with caplog.at_level(logging.INFO, logger="gpumon.xid"):
        watcher._run()
    assert xid_lines(caplog)[1:] == ["gpu 2: 99 more XIDs since its last line: XID 79 x99"]
    assert watcher.seen(2, None)[0] == ((79, 100),)


# -- sub-second history: a last seen ahead of the driver's clock ----------------------------------


class CountingDriver(SamplingDriver):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, last_seen: int) -> tuple[int, list[Any]]:
        self.calls += 1
        return super().nvmlDeviceGetSamples(handle, kind, last_seen)


def history_source() -> tuple[CountingDriver, NvmlSource, GpuState]:
    nv = CountingDriver()
    return nv, NvmlSource(nv, Problems(logging.getLogger("test.samples"))), GpuState(0, handle=object())


def on_time(tick: int, points: list[float]) -> bool:
    """Points of the second before the tick, on the sampler's clock (the driver's is 1000 s on)."""
    return bool(points) and all(tick - 1.5 < t <= tick + 0.01 for t in points)


@pytest.mark.parametrize("ahead_s", [3600.0, 2.0**40])
def test_a_sample_stamped_ahead_on_the_first_poll_does_not_stop_the_history(ahead_s: float) -> None:
    """The first reading has no offset to judge its newest by: the glitch became "last seen", the
    driver had nothing newer, and the GPU's history stopped for good."""
    nv, src, state = history_source()
    nv.odd = [round((1000 + 1 + ahead_s) * 1e6)]  # in the ring from the start, and kept there
    got = []
    for tick in range(1, 16):
        nv.now_s = float(tick)
        points = [p.t_s for p in src._history(state, float(tick))]
        assert all(t <= tick + 1.0 for t in points), "nothing placed ahead of now"
        got.append(points)
    assert all(on_time(tick, ts) for tick, ts in zip(range(5, 16), got[4:])), got


@pytest.mark.parametrize("back_s", [900.0, 999.0])
def test_a_driver_clock_that_goes_back_is_followed_within_a_few_polls(back_s: float) -> None:
    """A GPU reset restarts the driver's clock: every later sample is older than the last seen."""
    nv, src, state = history_source()
    got = []
    for tick in range(1, 16):
        nv.now_s = float(tick) - (back_s if tick >= 4 else 0.0)
        got.append([p.t_s for p in src._history(state, float(tick))])
    assert all(on_time(tick, ts) for tick, ts in zip(range(7, 16), got[6:])), got
    history = [t for ts in got for t in ts]
    assert len(history) == len(set(history)), "no point told twice"


class RingDriver:
    """A driver's ring as a real one keeps it: the last `size` samples in the order they came (a
    sample every 1/6 s on its clock), whatever their stamps: one stepped back stays behind the
    older ones, stamped above it, until they roll out."""

    NVMLError = NvmlError

    def __init__(self, size: int) -> None:
        self.size, self.clock_s, self.ring = size, 1000.0, []  # type: list[int]

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds * 6)):
            self.clock_s += 1 / 6
            self.ring = [*self.ring, round(self.clock_s * 1e6)][-self.size :]

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, last_seen: int) -> tuple[int, list[Any]]:
        found = [
            SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=50))
            for ts in sorted(self.ring)
            if ts > last_seen
        ]
        if not found:
            raise NvmlError(6)
        return 1, found


@pytest.mark.parametrize("ring", [120, 600])
def test_a_system_clock_stepped_back_is_followed_though_the_ring_keeps_its_older_samples(ring: int) -> None:
    """NVML stamps samples with the CPU's clock: an NTP step or a VM's resume sets it back by 500 s,
    and a real ring keeps the samples from before it, stamped above the new ones. History resumed
    only once they had rolled out of the ring (23 polls for 20 s of ring, 2 minutes for 100 s)."""
    nv = RingDriver(ring)
    src, state = NvmlSource(nv, Problems(logging.getLogger("test.samples"))), GpuState(0, handle=object())
    nv.run(30)
    got = []
    for tick in range(1, 40):
        if tick == 20:
            nv.clock_s -= 500
        nv.run(1.0)
        got.append([p.t_s for p in src._history(state, float(tick))])
    assert all(on_time(tick, ts) for tick, ts in zip(range(26, 40), got[25:])), got[19:]
    history = [t for ts in got for t in ts]
    assert len(history) == len(set(history)), "no point told twice"


def test_after_a_clock_stepped_back_an_idle_spell_replays_nothing_from_before_it() -> None:
    """Once the stepped-back clock was followed, the ring's older samples (stamped above the new
    ones) still came back from each reading: dropped as ahead of now while the GPU was busy, but
    an idle spell took them for a jump of the driver's clock, realigned to them and told ~300 of
    them again, placed over the last 49 s, every idle spell until they rolled out."""
    nv = RingDriver(600)
    src, state = NvmlSource(nv, Problems(logging.getLogger("test.samples"))), GpuState(0, handle=object())
    nv.run(30)
    told: list[float] = []
    for tick in range(1, 80):
        if tick == 20:
            nv.clock_s -= 500
        busy = tick < 20 or (tick - 20) % 15 < 5  # after the step: 5 s busy, 10 s idle
        if busy:
            nv.run(1.0)
        else:
            nv.clock_s += 1.0  # the driver's clock goes on; no sample while idle
        points = [p.t_s for p in src._history(state, float(tick))]
        assert all(tick - 1.5 < t <= tick + 0.01 for t in points), (tick, min(points), len(points))
        told += points
        if busy and tick >= 40:
            assert points, f"tick {tick}: a busy second without its history"
    assert len(told) == len(set(told)), "no point told twice"


def test_an_idle_gpu_is_not_replayed_and_costs_few_calls_more() -> None:
    """The driver's ring stops moving (NOT_FOUND on every reading): its whole ring is read now and
    then, found unchanged, and nothing is told again; a busy GPU costs no call more."""
    nv, src, state = history_source()
    for tick in range(1, 11):
        nv.now_s = float(tick)
        src._history(state, float(tick))
    assert nv.calls == 10, "one call a tick while samples come"
    for tick in range(11, 111):  # the ring stops (its clock with it)
        assert src._history(state, float(tick)) == ()
    assert nv.calls - 10 <= 100 + 8, nv.calls
    nv.now_s = 111.0  # and goes on: its ring's 2 s taken at once, as before
    points = [p.t_s for p in src._history(state, 111.0)]
    assert len(points) == 12 and all(109 < t <= 111.01 for t in points), points


# -- Slurm job ids and GPU indices in the scripts and the daemon ------------------------------------


def run(path: Path, jobs: Path, **env: str) -> None:
    full = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(jobs),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        **env,
    }
    p = subprocess.run([str(path)], env=full, cwd=jobs.parent, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def gpus(n: int) -> list[GpuSample]:
    return [GpuSample(0.0, i, f"GPU-{i}", "x") for i in range(n)]


@pytest.mark.parametrize("job", [".", "..", "1.5", "7.", "abc", "1-2", "-1", "+1", "_1", "1e3", " 1"])
def test_the_scripts_take_no_job_id_but_slurms(tmp_path: Path, job: str) -> None:
    """A `.` was in the scripts' character set: `..` named gpu0.job.., read by the daemon as a job."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "gpu0.job7").write_text("gpumon-job v1\njob_id=7\ngpu_index=0\n")
    (jobs / ".gpu0.job7.5.99").write_text("")  # what a prolog killed mid-write left (pid 99)
    run(PROLOG, jobs, SLURM_JOB_ID=job, SLURM_JOB_GPUS="0")
    assert sorted(os.listdir(jobs)) == [".gpu0.job7.5.99", "gpu0.job7"], "nothing written"
    run(EPILOG, jobs, SLURM_JOB_ID=job)
    assert sorted(os.listdir(jobs)) == [".gpu0.job7.5.99", "gpu0.job7"], "nothing removed"


@pytest.mark.parametrize(("job", "shown"), [("42", "42"), ("70_7", "70_7"), ("70+1", "70+1")])
def test_slurm_s_own_job_ids_are_written_read_and_removed(tmp_path: Path, job: str, shown: str) -> None:
    jobs = tmp_path / "jobs"
    run(PROLOG, jobs, SLURM_JOB_ID=job, SLURM_JOB_GPUS="1")
    assert os.listdir(jobs) == [f"gpu1.job{job}"]
    src = JobSource(Problems(logging.getLogger("test.jobs")), str(jobs), cgroups=False)
    assert [[j.job_id for j in g.jobs] for g in src.poll(0.0, gpus(2))] == [[], [shown]]
    run(EPILOG, jobs, SLURM_JOB_ID=job)
    assert os.listdir(jobs) == []


@pytest.mark.parametrize("name", ["gpu0.job..", "gpu0.job.", "gpu0.job1.5", "gpu0.jobabc", "gpu0.job-1"])
def test_the_daemon_takes_no_job_id_but_slurms(name: str) -> None:
    job = name.split(".job", 1)[1]
    with pytest.raises(ValueError, match="not a gpumon job file name"):
        parse_mapping_file(name, f"gpumon-job v1\njob_id={job}\ngpu_index=0\n", None)


def test_a_gpu_index_beyond_4095_is_skipped_with_one_warning_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200-digit index (and 99999, which no GPU has) named a GPU on the daemon's side."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    bad = [f"gpu{MAX_GPU_INDEX + 1}.job5", "gpu99999.job6", f"gpu{'9' * 200}.job7", "gpu0000004.job8"]
    for name in bad:
        index, job = name[3:].split(".job")
        (jobs / name).write_text(f"gpumon-job v1\njob_id={job}\ngpu_index={index}\n")
    (jobs / "gpu1.job9").write_text("gpumon-job v1\njob_id=9\ngpu_index=1\n")
    (jobs / f"gpu{MAX_GPU_INDEX}.job10").write_text(f"gpumon-job v1\njob_id=10\ngpu_index={MAX_GPU_INDEX}\n")
    src = JobSource(Problems(logging.getLogger("test.jobs")), str(jobs), cgroups=False)
    fleet = [*gpus(2), GpuSample(0.0, MAX_GPU_INDEX, "GPU-x", "x")]
    with caplog.at_level(logging.INFO, logger="test.jobs"):
        for t in range(3):
            out = src.poll(float(t), fleet)
    assert [[j.job_id for j in g.jobs] for g in out] == [[], ["9"], ["10"]]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for name in bad:
        assert sum(name in m for m in warned) == 1, (name, warned)
    assert all("0 to 4095" in m for m in warned), warned
    with pytest.raises(ValueError, match="not a GPU's"):
        parse_mapping_file("gpu4096.job1", "gpumon-job v1\njob_id=1\n", None)


def test_the_prolog_writes_no_file_for_an_index_beyond_4095(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run(PROLOG, jobs, SLURM_JOB_ID="5", SLURM_JOB_GPUS=f"4096,{'9' * 200},1,4095,99999999999999999999")
    assert sorted(os.listdir(jobs)) == ["gpu1.job5", "gpu4095.job5"]
