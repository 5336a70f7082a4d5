"""A real single-node Slurm (Debian's slurm-wlm, with munge) runs jobs that hold GPUs, with
gpumon's prolog and epilog configured; `gpumon serve` on simulated GPUs must name the job and
user on exactly the GPUs Slurm gave it while it runs, and no job after the epilog. The cluster
is started once for the module: munged, slurmctld and slurmd, on a generated slurm.conf and
gres.conf declaring 4 GPUs (device files stand in for /dev/nvidia0-3)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, free_port

CONTRIB = ROOT / "contrib/slurm"


def need(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if path is None:
        pytest.fail(f"{binary} is missing: scripts/test.sh installs Debian's slurm-wlm and munge")
    return path


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.jobs_dir = tmp / "jobs"
        self.conf = tmp / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen[bytes]] = []

    def run(self, *cmd: str, check: bool = True) -> str:
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert p.returncode == 0, (cmd, p.stdout, p.stderr)
        return p.stdout

    def job_state(self, job: str) -> str:
        return self.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()


def start_munge() -> int | None:
    """munged, started if it is not running: its pid if this started it (to stop it after)."""
    if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode == 0:
        return None  # already running: the machine's own, left alone
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", need("munged")], check=True, capture_output=True)
    deadline = time.monotonic() + 10
    while subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "munged did not start"
        time.sleep(0.2)
    try:
        return int(Path("/run/munge/munged.pid").read_text().strip())
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("slurm")
    c = Cluster(tmp)
    for d in ("state", "spool", "dev", "log", "out"):
        (tmp / d).mkdir()
    for i in range(4):  # slurmd wants character devices: links to /dev/null stand in for the GPUs
        (tmp / "dev" / f"nvidia{i}").symlink_to("/dev/null")
    gpumon = tmp / "gpumon"
    gpumon.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m gpumon "$@"\n')
    gpumon.chmod(0o755)
    for name in ("prolog", "epilog"):
        wrapper = tmp / f"{name}.sh"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"export GPUMON_JOBS_DIR={c.jobs_dir}\n"
            f'export GPUMON_REPORT=1 GPUMON={gpumon} GPUMON_REPORT_ARGS="--url $(cat {tmp}/gpumon-url)"\n'
            f"exec {CONTRIB / f'gpumon-{name}'}\n"
        )
        wrapper.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    ctld, slurmd = free_port(), free_port()
    c.conf.write_text(
        f"""ClusterName=gpumontest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
Prolog={tmp}/prolog.sh
Epilog={tmp}/epilog.sh
PrologFlags=Alloc
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 2} Gres=gpu:4 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    )
    (tmp / "gres.conf").write_text(f"Name=gpu File={tmp}/dev/nvidia[0-3]\n")
    munged = start_munge()
    for daemon in ("slurmctld", "slurmd"):
        c.procs.append(
            subprocess.Popen(
                [need(daemon), "-D", "-f", str(c.conf)],
                env=c.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        deadline = time.monotonic() + 60
        while "idle" not in c.run("sinfo", "-h", "-o", "%t", check=False):
            assert time.monotonic() < deadline, (tmp / "log/slurmctld.log").read_text()[-2000:]
            time.sleep(0.5)
        yield c
    finally:
        for p in c.procs:
            p.terminate()
        for p in c.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if munged is not None:  # started here: no daemon outlives the tests
            with contextlib.suppress(ProcessLookupError):
                os.kill(munged, signal.SIGTERM)


@pytest.fixture(scope="module")
def serve(cluster: Cluster) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (cluster.tmp / "gpumon-url").write_text(url)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "serve",
            "--simulate",
            "healthy",
            "--gpus",
            "4",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), GPUMON_JOBS_DIR=str(cluster.jobs_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            if json.load(urllib.request.urlopen(url + "/api/v1/state", timeout=2)).get("ready"):
                break
        except OSError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def job_infos(url: str) -> list[str]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_job_info{")]


def wait_for(check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def test_a_running_job_is_named_on_exactly_its_gpus_and_gone_after_the_epilog(
    cluster: Cluster, serve: str
) -> None:
    out = cluster.tmp / "out"
    a = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:2", "-o", f"{out}/job-%j.out", "--wrap", "sleep 30"
    ).strip()
    b = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "-o", f"{out}/job-%j.out", "--wrap", "sleep 30"
    ).strip()
    wait_for(lambda: cluster.job_state(a) == "RUNNING" and cluster.job_state(b) == "RUNNING")
    infos = wait_for(lambda: len(job_infos(serve)) == 3 and job_infos(serve))
    gpus_of = {
        j: sorted(ln.split('gpu="')[1].split('"')[0] for ln in infos if f'job_id="{j}"' in ln) for j in (a, b)
    }
    assert len(gpus_of[a]) == 2 and len(gpus_of[b]) == 1 and not set(gpus_of[a]) & set(gpus_of[b])
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert all(f'user="{user}"' in ln and 'scheduler="slurm"' in ln for ln in infos)
    # Slurm's own view of the GPUs agrees with what gpumon shows
    detail = cluster.run("scontrol", "show", "job", "-d", a)
    assert "gpu" in detail.lower()
    state = json.load(urllib.request.urlopen(serve + "/api/v1/state", timeout=5))
    held = {g["index"] for g in state["gpus"] if any(j["job_id"] == a for j in g["jobs"])}
    assert {str(i) for i in held} == set(gpus_of[a])
    cluster.run("scancel", a)
    wait_for(lambda: not any(f'job_id="{a}"' in ln for ln in job_infos(serve)), 60)
    assert any(f'job_id="{b}"' in ln for ln in job_infos(serve)), "the other job is still named"
    cluster.run("scancel", b)
    wait_for(lambda: not job_infos(serve), 60)
    assert not list(cluster.jobs_dir.iterdir()), "the epilog removed what the prolog wrote"


def test_the_epilog_writes_the_report_next_to_the_jobs_output(cluster: Cluster, serve: str) -> None:
    out = cluster.tmp / "out"
    job = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "-o", f"{out}/job-%j.out", "--wrap", "sleep 4"
    ).strip()
    report = out / f"gpumon-{job}-{socket.gethostname().split('.')[0]}.txt"
    wait_for(lambda: report.exists() and report.stat().st_size > 0, 90)
    text = report.read_text()
    assert f"job {job}" in text and "job verdict:" in text, text
