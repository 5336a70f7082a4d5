"""Slurm's files against a clumsy or hostile user (issue 28, items 4, 8, 9): a FIFO in the jobs
directory never stops the sampler, a job whose epilog was missed leaves its GPU, 20,000 files cost
a bounded amount per tick, values that are not times or not one line never reach the state API,
a cgroup a user made never names a Slurm job, and the epilog never writes as root into a
directory a user controls."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.collect.sources import jobs as jobs_mod
from gpumon.collect.sources.jobs import (
    LOGGED_FILES,
    MAX_JOBS_PER_GPU,
    MAX_READS_PER_TICK,
    JobSource,
    parse_cgroup,
    parse_mapping_file,
)
from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.core.problems import Problems
from gpumon.serve.daemon import Daemon

from .conftest import ROOT
from .test_jobs import EPILOG, gpus, run_prolog

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def job_file(directory: Path, gpu: int, job: str, **values: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["gpumon-job v1", "scheduler=slurm", f"job_id={job}", f"gpu_index={gpu}", f"boot_id={BOOT}"]
    lines += [f"{k}={v}" for k, v in values.items()]
    path = directory / f"gpu{gpu}.job{job}"
    path.write_text("\n".join(lines) + "\n")
    return path


def source(tmp_path: Path, **kw: object) -> JobSource:
    return JobSource(Problems(logging.getLogger("test.jobs")), str(tmp_path / "jobs"), **kw)  # type: ignore[arg-type]


# -- FIFOs and devices where files belong -----------------------------------------------------------


def test_a_fifo_in_the_jobs_directory_does_not_stop_ticks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = tmp_path / "jobs"
    job_file(jobs, 1, "7", user="ann")
    os.mkfifo(jobs / "gpu0.job42")  # nobody ever writes to it: open() would wait forever
    d = Daemon(
        Config(simulate="healthy", gpus=2, listen="127.0.0.1:0", jobs_dir=str(jobs)), clock=VirtualClock()
    )
    with caplog.at_level(logging.WARNING):
        sampling = threading.Thread(target=d.sampler.run, kwargs={"duration_s": 5}, daemon=True)
        sampling.start()
        sampling.join(30)  # the FIFO's timeline is forever: a sampler that returns did not wait on it
    assert not sampling.is_alive(), "the sampler is stuck opening the FIFO"
    assert d.sampler.ticks == 5
    assert [j["job_id"] for j in d.state()["gpus"][1]["jobs"]] == ["7"], "the good file is read"
    named = [r.getMessage() for r in caplog.records if "gpu0.job42" in r.getMessage()]
    assert len(named) == 1 and "not a regular file (a FIFO)" in named[0], named


def test_a_symlink_in_the_jobs_directory_is_not_followed(tmp_path: Path) -> None:
    elsewhere = job_file(tmp_path / "elsewhere", 0, "5")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "gpu0.job5").symlink_to(elsewhere)
    (g0,) = source(tmp_path, cgroups=False).poll(0.0, gpus(1))
    assert g0.jobs == ()


def test_a_fifo_in_dcgms_mapping_directory_does_not_block(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm"
    dcgm.mkdir()
    os.mkfifo(dcgm / "0")
    (dcgm / "1").write_text("1234\n")
    result: list[object] = []
    t = threading.Thread(
        target=lambda: result.append(source(tmp_path, dcgm_dir=str(dcgm), cgroups=False).poll(0.0, gpus(2))),
        daemon=True,
    )
    t.start()
    t.join(30)
    assert result, "blocked on the FIFO"
    out = result[0]
    assert isinstance(out, list) and [j.job_id for j in out[1].jobs] == ["1234"]


# -- a job whose epilog was missed ------------------------------------------------------------------


def test_a_job_without_its_slurm_cgroup_is_over_and_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cgroups = tmp_path / "cgroup"
    scope = cgroups / "system.slice" / "slurmstepd.scope"
    (scope / "job_43").mkdir(parents=True)  # 43 runs; 42's epilog never ran
    job_file(tmp_path / "jobs", 0, "42", user="old")
    job_file(tmp_path / "jobs", 0, "43", user="new")
    src = source(tmp_path, cgroups=False, cgroup_root=str(cgroups))
    with caplog.at_level(logging.WARNING):
        for t in range(3):
            (g0,) = src.poll(float(t), gpus(1))
    assert [j.job_id for j in g0.jobs] == ["43"]
    over = [r.getMessage() for r in caplog.records if "job 42 is over" in r.getMessage()]
    assert len(over) == 1 and "gpu0.job42" in over[0], over


def test_v1_cgroups_tell_a_finished_job_too(tmp_path: Path) -> None:
    cgroups = tmp_path / "cgroup"
    (cgroups / "freezer" / "slurm" / "uid_1000" / "job_43").mkdir(parents=True)
    job_file(tmp_path / "jobs", 0, "42", uid="1000")
    job_file(tmp_path / "jobs", 1, "43", uid="1000")
    out = source(tmp_path, cgroups=False, cgroup_root=str(cgroups)).poll(0.0, gpus(2))
    assert [[j.job_id for j in g.jobs] for g in out] == [[], ["43"]]


def test_without_slurm_cgroups_a_mapped_job_stays(tmp_path: Path) -> None:
    job_file(tmp_path / "jobs", 0, "42")
    (g0,) = source(tmp_path, cgroups=False, cgroup_root=str(tmp_path / "nothing")).poll(0.0, gpus(1))
    assert [j.job_id for j in g0.jobs] == ["42"]


def test_a_gpu_whose_processes_belong_to_another_job_drops_the_stale_one(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_43/step_0/user/task_0\n")
    job_file(tmp_path / "jobs", 0, "42", user="old")  # the previous job: its epilog never ran
    (g0,) = source(tmp_path, proc=str(proc), cgroup_root=str(tmp_path / "none")).poll(0.0, gpus(1, {0: 4242}))
    assert [(j.job_id, j.via) for j in g0.jobs] == [("43", "cgroup")]


# -- many files, odd values -------------------------------------------------------------------------


def test_twenty_thousand_files_cost_a_bounded_amount_per_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs"
    job_file(jobs, 0, "1")
    for i in range(20_000):  # missed epilogs, or a script gone wrong: each file a job on GPU 1
        (jobs / f"gpu1.job{1000 + i}").write_text(
            f"gpumon-job v1\njob_id={1000 + i}\nwritten_unix_s={i + 1}\n"
        )
    for i in range(200):
        (jobs / f"garbage{i}").write_text("x")
    reads = {"n": 0}
    real = jobs_mod.read_regular

    def counted(*a: object, **kw: object) -> bytes:
        reads["n"] += 1
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs_mod, "read_regular", counted)
    src = source(tmp_path, cgroups=False)
    per_tick = []
    with caplog.at_level(logging.INFO, logger="test.jobs"):
        for t in range(5):
            before = reads["n"]
            out = src.poll(float(t), gpus(2))
            per_tick.append(reads["n"] - before)
    assert max(per_tick) <= MAX_READS_PER_TICK, per_tick
    assert len(out[1].jobs) <= MAX_JOBS_PER_GPU, "series per GPU are bounded"
    assert len(caplog.records) <= LOGGED_FILES + 5, [r.getMessage() for r in caplog.records][:20]
    assert any("more than 4096" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-5", "1e30"])
def test_a_written_time_that_is_not_a_time_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="written_unix_s is not a time"):
        parse_mapping_file("gpu0.job1", f"gpumon-job v1\njob_id=1\nwritten_unix_s={value}\n", None)


def test_no_nan_reaches_the_state_api(tmp_path: Path) -> None:
    job_file(tmp_path / "jobs", 0, "1", written_unix_s="nan")
    job_file(tmp_path / "jobs", 1, "2", written_unix_s="1e400")
    d = Daemon(
        Config(simulate="healthy", gpus=2, listen="127.0.0.1:0", jobs_dir=str(tmp_path / "jobs")),
        clock=VirtualClock(),
    )
    d.sampler.run(duration_s=2)
    json.loads(json.dumps(d.state(), allow_nan=False))  # valid JSON: no NaN, no Infinity


# -- what the prolog writes, and whose cgroups count --------------------------------------------------


def test_the_prolog_writes_one_line_per_value(tmp_path: Path) -> None:
    run_prolog(
        tmp_path / "jobs",
        SLURM_JOB_ID="9",
        SLURM_JOB_USER="eve\nuid=0\ngpu_index=3",
        SLURM_JOB_UID="1000\nboot_id=x",
        SLURM_ARRAY_JOB_ID="1\nuser=root",
        SLURM_JOB_GPUS="0",
    )
    text = (tmp_path / "jobs" / "gpu0.job9").read_text()
    keys = [ln.split("=", 1)[0] for ln in text.splitlines()[1:]]
    assert len(keys) == len(set(keys)), text  # no value made a line of its own
    job = parse_mapping_file("gpu0.job9", text, BOOT)
    assert job.gpu_index == 0 and job.ref.user == "eveuid=0gpu_index=3"


def test_the_prolog_refuses_a_job_id_that_would_name_another_file(tmp_path: Path) -> None:
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="../../etc/x", SLURM_JOB_GPUS="0")
    assert not (tmp_path / "jobs").exists() or not list((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurm/job_777\n",
        "0::/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_777/step_0\n",
        "0::/system.slice/my-slurm.service/job_777\n",
        "4:memory:/user.slice/slurm/uid_1000/job_777/step_0\n",
    ],
)
def test_a_cgroup_a_user_made_never_names_a_slurm_job(text: str) -> None:
    assert parse_cgroup(text) is None


def test_slurms_own_cgroups_still_name_the_job() -> None:
    assert parse_cgroup("0::/system.slice/node7_slurmstepd.scope/job_5/step_0/user/task_0\n") == (
        "5",
        "0",
        None,
    )
    assert parse_cgroup("4:memory:/slurm_node7/uid_1000/job_5/step_0/task_1\n") == ("5", "0", 1000)


# -- the epilog as root ------------------------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the epilog's privilege drop needs root")


@pytest.fixture
def user_dir(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A user's output directory (nobody's), holding a symlink to a root-owned 0600 file, under a
    directory every user may traverse (pytest's own is root's alone)."""
    open_dir = Path(tempfile.mkdtemp(prefix="gpumon-epilog-"))
    open_dir.chmod(0o755)
    try:
        secret = open_dir / "secret"
        secret.write_text("root's\n")
        secret.chmod(0o600)
        home = open_dir / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        fake = open_dir / "gpumon"
        fake.write_text('#!/bin/sh\necho "report of job $3"\n')
        fake.chmod(0o755)
        job_file(tmp_path / "jobs", 0, "77")
        yield home, secret, fake
    finally:
        shutil.rmtree(open_dir)


def epilog(tmp_path: Path, home: Path, fake: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(tmp_path / "jobs"),
        "SLURM_JOB_ID": "77",
        "GPUMON_REPORT": "1",
        "GPUMON": str(fake),
        "SLURM_JOB_STDOUT": str(home / "job.out"),
        **env,
    }
    return subprocess.run([str(EPILOG)], env=full, capture_output=True, text=True, timeout=30)


def target(home: Path) -> Path:
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    return home / f"gpumon-77-{host}.txt"


@root_only
@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_JOB_UID": "65534", "GPUMON_SETPRIV": "/nonexistent/setpriv"},  # no setpriv
        {"SLURM_JOB_UID": ""},  # no uid
        {"SLURM_JOB_UID": "65534; id"},  # not a number
        {"SLURM_JOB_UID": "65534"},  # dropped to the user: the link points where the user may not write
    ],
    ids=["no-setpriv", "empty-uid", "odd-uid", "as-the-user"],
)
def test_the_epilog_never_writes_through_a_users_symlink_as_root(
    tmp_path: Path, user_dir: tuple[Path, Path, Path], env: dict[str, str]
) -> None:
    home, secret, fake = user_dir
    target(home).symlink_to(secret)
    p = epilog(tmp_path, home, fake, **env)
    assert p.returncode == 0, p.stderr
    assert secret.read_text() == "root's\n", "root's file was written through the user's symlink"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not list((tmp_path / "jobs").iterdir()), "the mapping is removed all the same"


@root_only
def test_the_epilog_writes_the_report_as_the_jobs_user(
    tmp_path: Path, user_dir: tuple[Path, Path, Path]
) -> None:
    home, _, fake = user_dir
    p = epilog(tmp_path, home, fake, SLURM_JOB_UID="65534")
    assert p.returncode == 0, p.stderr
    report = target(home)
    assert report.read_text() == "report of job 77\n"
    assert report.stat().st_uid == 65534, "written as the job's user, not as root"


def test_the_contrib_scripts_are_posix_sh() -> None:
    for name in ("gpumon-prolog", "gpumon-epilog"):
        p = subprocess.run(["sh", "-n", str(ROOT / "contrib/slurm" / name)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
