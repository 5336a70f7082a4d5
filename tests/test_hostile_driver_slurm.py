"""Hostile and clumsy input on two surfaces: the Slurm prolog and epilog (odd SLURM_* values, a
planted symlink, a prolog killed mid-write), and odd values from the NVML driver (names that are
not UTF-8, infinite GPM rates, XID events with odd data)."""

from __future__ import annotations

import logging
import math
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumon.collect.sources.nvml.gpm_unit import METRICS
from gpumon.collect.sources.nvml.processes import processes_of
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.collect.sources.nvml.state import GpuState
from gpumon.collect.sources.nvml.xid import XidWatcher
from gpumon.core.model import GpuProcess
from gpumon.core.problems import Problems
from tests.fakenvml import driver

from .conftest import ROOT
from .test_gpm_unit import reading
from .test_jobs import EPILOG, PROLOG

# -- the prolog and epilog ---------------------------------------------------------------------------


def script(path: Path, jobs: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(jobs),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        **env,
    }
    return subprocess.run([str(path)], env=full, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_gpu_list_is_never_expanded_as_file_names(tmp_path: Path) -> None:
    """slurmd's working directory holds a file named "3": a list "*" names no GPU 3."""
    cwd = tmp_path / "spool"
    cwd.mkdir()
    (cwd / "3").write_text("")
    p = script(PROLOG, tmp_path / "jobs", cwd, SLURM_JOB_ID="7", SLURM_JOB_GPUS="*")
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "jobs").exists() or not os.listdir(tmp_path / "jobs")


def test_a_jobs_directory_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    target.chmod(0o700)
    (tmp_path / "jobs").symlink_to(target)
    p = script(PROLOG, tmp_path / "jobs", tmp_path, SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
    assert p.returncode == 0, p.stderr
    assert os.listdir(target) == [], "nothing written through the symlink"
    assert stat.S_IMODE(target.stat().st_mode) == 0o700, "the symlink's target is not chmod'ed"
    (target / "gpu0.job7").write_text("")
    p = script(EPILOG, tmp_path / "jobs", tmp_path, SLURM_JOB_ID="7")
    assert p.returncode == 0 and os.listdir(target) == ["gpu0.job7"], "the epilog removes nothing there"


def test_the_epilog_removes_what_a_prolog_killed_mid_write_left(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("gpu0.job7", ".gpu0.job7.4242", ".gpu1.mig3.job7.99", "gpu0.job77", ".gpu0.job77.5"):
        (jobs / name).write_text("")
    p = script(EPILOG, jobs, tmp_path, SLURM_JOB_ID="7")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(jobs)) == [".gpu0.job77.5", "gpu0.job77"], "job 77's files stay"


def test_a_huge_gpu_list_writes_a_bounded_number_of_files(tmp_path: Path) -> None:
    gpus = ",".join(str(i) for i in range(400))
    p = script(PROLOG, tmp_path / "jobs", tmp_path, SLURM_JOB_ID="7", SLURM_JOB_GPUS=gpus)
    assert p.returncode == 0, p.stderr
    assert 0 < len(os.listdir(tmp_path / "jobs")) <= 128


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_odd_values_exit_0_and_write_only_plain_names_inside_the_directory(
    tmp_path: Path, shell: str
) -> None:
    jobs = tmp_path / "jobs"
    odd = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_GPUS": "0,\u0661,1\n2,../3,,-1,٣,4" + "9" * 5000,
        "SLURM_JOB_USER": "al\nice\x1b[2J\u00e9",
        "SLURM_JOB_UID": "--help",
    }
    full = {"PATH": os.environ["PATH"], "GPUMON_JOBS_DIR": str(jobs), "GPUMON_NVIDIA_SMI": "/nonexistent"}
    p = subprocess.run(
        [shell, str(PROLOG)], env={**full, **odd}, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert os.listdir(jobs) == ["gpu0.job7"], "no name out of the odd ones: -1, non-ASCII digits, ../3"
    text = (jobs / "gpu0.job7").read_text()
    assert "user=alice\u00e9\n" in text.replace("[2J", "") and "\x1b" not in text


# -- the driver's odd values --------------------------------------------------------------------------


def test_a_gpu_name_and_uuid_that_are_not_utf8_keep_every_gpu_read(tmp_path: Path) -> None:
    """pynvml decodes a name strictly: its UnicodeDecodeError is no NVMLError, and every GPU of
    the host went unread on every tick. Now: U+FFFD for the odd bytes, no escape sequences."""
    driver.build()
    config = tmp_path / "fakenvml.conf"
    lines = ["epoch_us 0", "loop 0"]
    for i in range(2):
        lines.append(f"gpu {i} 85899345920 700000 GPU-{i}\udcff\x1b[31m H100 \udcff\udcfe\x1b[2J")
        lines += [f"s {i} {t * 100_000} 50" for t in range(60)]
    config.write_bytes("\n".join(lines).encode(errors="surrogateescape") + b"\n")
    code = """
        import os, pynvml
        from gpumon.collect.sources.nvml.source import NvmlSource
        src = NvmlSource(pynvml); src.open()
        for t in (1, 2):
            os.environ["FAKENVML_NOW_US"] = str(t * 1_000_000)
            for g in src.poll(float(t)):
                print(ascii((g.name, g.uuid, g.util_ratio, g.error)))
    """
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=dict(driver.environment(config), PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    rows = [eval(line) for line in p.stdout.splitlines()]
    assert len(rows) == 4
    for name, uuid, util, error in rows:
        assert (
            name == "H100 \ufffd\ufffd[2J" and uuid.endswith("\ufffd[31m") and util == 0.5 and error is None
        )


@pytest.mark.parametrize("value", [math.inf, 1e300, 2e9])
def test_an_infinite_or_absurd_gpm_rate_reads_as_0_as_nan_does(value: float) -> None:
    """+Inf PCIe/NVLink bytes reached the state API (json's Infinity, no JSON) and recordings (a
    record the trace reader refuses). Both ways of reading (every metric given, one failed)."""
    for failing in (None, 0):
        answers = [(0, 50.0)] * len(METRICS)
        answers[8] = (0, value)  # PCIe rx, MiB/s
        if failing is not None:
            answers[failing] = (3, 0.0)
        got = reading(answers)
        assert got.pcie_rx_bytes_per_s == 0.0 and got.pcie_tx_bytes_per_s == 50.0 * 1024 * 1024
        assert got.sm_active_ratio == 0.5


def fake_xid_nvml() -> Any:
    return SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlEventSetCreate=lambda: object(),
        nvmlDeviceRegisterEvents=lambda handle, kinds, event_set: None,
        nvmlEventSetFree=lambda event_set: None,
    )


def test_xid_events_with_odd_data_make_bounded_counts() -> None:
    w = XidWatcher(fake_xid_nvml(), Problems(logging.getLogger("test.xid")), wall_clock=lambda: 5.0)
    gpu = object()
    assert w.register(0, gpu)
    for code in range(10_000):  # a driver whose eventData is garbage: each event a new "code"
        w.record(gpu, code * 7919 + 2**63, gpu_instance=code)
    w.record(object(), 79)  # a device never registered: not counted, no traceback
    total = sum(len(per) for per in w._counts.values())
    assert total <= 64 * 65, "bounded, whatever the event data and instance ids"
    counts, last = w.seen(0, None)
    assert 0 < len(counts) <= 64 and last is not None
    w.record(gpu, 79)
    assert w.seen(0, None)[1] == (79, 5.0), "the last XID is still told"


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class SamplingDriver:
    """nvmlDeviceGetSamples on one GPU: a sample every 1/6 s on the driver's clock (1000 s ahead
    of the sampler's), its ring the last 2 s, and `odd` samples stamped as the test says."""

    NVMLError = NvmlError

    def __init__(self) -> None:
        self.now_s = 0.0
        self.odd: list[int] = []

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, last_seen: int) -> tuple[int, list[Any]]:
        stamps = [round((1000 + self.now_s - k / 6) * 1e6) for k in range(12)] + self.odd
        found = [
            SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=50))
            for ts in sorted(stamps)
            if ts > last_seen
        ]
        if not found:
            raise NvmlError(6)  # NOT_FOUND: nothing newer than last seen
        return 1, found


@pytest.mark.parametrize("ahead_s", [3600.0, 2.0**40])
def test_a_sample_stamped_far_ahead_does_not_hide_every_later_one(ahead_s: float) -> None:
    """It became "last seen": the driver had nothing newer, and the GPU's history stopped."""
    nv = SamplingDriver()
    src = NvmlSource(nv, Problems(logging.getLogger("test.samples")))
    state = GpuState(0, handle=object())
    got = []
    for tick in range(1, 12):
        nv.now_s = float(tick)
        if tick == 3:
            nv.odd = [round((1000 + tick + ahead_s) * 1e6)]  # one glitch, kept in the ring
        points = src._history(state, float(tick))
        assert all(p.t_s <= tick + 1.0 for p in points), "nothing placed ahead of now"
        got.append(len(points))
    assert all(n > 0 for n in got[3:]), got


def test_a_driver_clock_that_jumps_ahead_is_followed() -> None:
    nv = SamplingDriver()
    src = NvmlSource(nv, Problems(logging.getLogger("test.samples")))
    state = GpuState(0, handle=object())
    got = []
    for tick in range(1, 15):
        nv.now_s = float(tick) + (5000.0 if tick >= 4 else 0.0)  # e.g. a reset: its clock moved on
        got.append([p.t_s for p in src._history(state, float(tick))])
    assert all(got[-4:]) and all(
        tick - 1.5 < t <= tick + 0.01 for tick, ts in zip(range(11, 15), got[-4:]) for t in ts
    )


def test_a_pid_listed_twice_is_one_process_with_its_memory_summed() -> None:
    """gpumon_gpu_processes and the state API's "processes" counted entries, not processes."""
    entry = SimpleNamespace
    procs = [entry(pid=5, usedGpuMemory=1), entry(pid=0, usedGpuMemory=None), entry(pid=5, usedGpuMemory=2)]
    procs += [entry(pid=5, usedGpuMemory=None), entry(pid=0, usedGpuMemory=7)]
    assert processes_of(procs) == (GpuProcess(5, 3), GpuProcess(0, 7))
    many = processes_of([entry(pid=i % 3000, usedGpuMemory=1) for i in range(6000)])
    assert len(many) == 3000 and {p.gpu_mem_bytes for p in many} == {2}


def test_the_prolog_never_writes_through_a_symlink_planted_at_its_temporary_file(tmp_path: Path) -> None:
    """A jobs directory others can write to (a misconfigured GPUMON_JOBS_DIR): the temporary file's
    name is known (its pid), and a symlink there had root truncate and chmod 644 its target."""
    jobs, secret = tmp_path / "jobs", tmp_path / "shadow"
    jobs.mkdir()
    secret.write_text("root:secret\n")
    secret.chmod(0o600)
    plant = 'ln -s "$1" "$2/.gpu0.job7.$$" && exec "$3"'  # the shell's pid is the prolog's: exec
    env = {"PATH": os.environ["PATH"], "GPUMON_JOBS_DIR": str(jobs), "GPUMON_NVIDIA_SMI": "/nonexistent"}
    p = subprocess.run(
        ["sh", "-c", plant, "sh", str(secret), str(jobs), str(PROLOG)],
        env={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert secret.read_text() == "root:secret\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert os.listdir(jobs) == ["gpu0.job7"] and not (jobs / "gpu0.job7").is_symlink()
