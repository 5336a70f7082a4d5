"""Job attribution: the prolog's files, dcgm-exporter's layout and the processes' cgroups, each
parsed from fixtures; bad files skipped with one line each; two jobs on one GPU; and the job
reaching /metrics (one info series per GPU and job), the state API and traces."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpumon.collect.sources.jobs import JobSource, parse_cgroup, parse_mapping_file
from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.core.model import GpuProcess, GpuSample, JobRef
from gpumon.core.problems import Problems
from gpumon.serve.daemon import Daemon

from .conftest import ROOT

PROLOG = ROOT / "contrib/slurm/gpumon-prolog"
EPILOG = ROOT / "contrib/slurm/gpumon-epilog"


def run_prolog(jobs_dir: Path, **env: str) -> None:
    full = {
        "PATH": os.environ["PATH"],
        "GPUMON_JOBS_DIR": str(jobs_dir),
        "GPUMON_NVIDIA_SMI": "/nonexistent",
        **env,
    }
    p = subprocess.run([str(PROLOG)], env=full, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def gpus(n: int, pids: dict[int, int] | None = None) -> list[GpuSample]:
    return [
        GpuSample(
            0.0,
            i,
            f"GPU-{i}",
            "x",
            processes=(GpuProcess((pids or {}).get(i, 0), None),) if pids and i in pids else (),
        )
        for i in range(n)
    ]


PLAIN_4242 = JobRef("slurm", "4242", "alice", None, "prolog")


def plain(j: JobRef) -> JobRef:
    return j._replace(started_unix_s=None)


def source(tmp_path: Path, **kw: object) -> JobSource:
    return JobSource(Problems(logging.getLogger("test.jobs")), str(tmp_path / "jobs"), **kw)  # type: ignore[arg-type]


def test_the_prolog_writes_a_file_per_gpu_that_the_source_reads(tmp_path: Path) -> None:
    run_prolog(
        tmp_path / "jobs",
        SLURM_JOB_ID="4242",
        SLURM_JOB_USER="alice",
        SLURM_JOB_UID="1000",
        SLURM_JOB_GPUS="1,3",
    )
    assert sorted(os.listdir(tmp_path / "jobs")) == ["gpu1.job4242", "gpu3.job4242"]
    out = source(tmp_path, cgroups=False).poll(0.0, gpus(4))
    assert [[plain(j) for j in g.jobs] for g in out] == [[], [PLAIN_4242], [], [PLAIN_4242]]
    assert abs((out[1].jobs[0].started_unix_s or 0) - time.time()) < 60, "when the job began, for reports"


def test_the_prolog_falls_back_to_cuda_visible_devices_and_names_array_tasks(tmp_path: Path) -> None:
    run_prolog(
        tmp_path / "jobs",
        SLURM_JOB_ID="77",
        SLURM_ARRAY_JOB_ID="70",
        SLURM_ARRAY_TASK_ID="7",
        SLURM_JOB_USER="bob",
        CUDA_VISIBLE_DEVICES="0",
    )
    (g0,) = source(tmp_path, cgroups=False).poll(0.0, gpus(1))
    assert [plain(j) for j in g0.jobs] == [JobRef("slurm", "70_7", "bob", None, "prolog")]


def test_the_epilog_removes_exactly_its_own_job(tmp_path: Path) -> None:
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="1", SLURM_JOB_USER="a", SLURM_JOB_GPUS="0")
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="2", SLURM_JOB_USER="b", SLURM_JOB_GPUS="1")
    p = subprocess.run(
        [str(EPILOG)],
        env={"PATH": os.environ["PATH"], "GPUMON_JOBS_DIR": str(tmp_path / "jobs"), "SLURM_JOB_ID": "1"},
        capture_output=True,
        timeout=30,
    )
    assert p.returncode == 0 and sorted(os.listdir(tmp_path / "jobs")) == ["gpu1.job2"]


def test_the_prolog_never_fails_even_without_gpus_or_a_writable_dir(tmp_path: Path) -> None:
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="5")  # no GPUs: nothing to write
    assert not (tmp_path / "jobs").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    run_prolog(blocker / "jobs", SLURM_JOB_ID="5", SLURM_JOB_GPUS="0")  # cannot create it: still exit 0


def test_a_shared_gpu_reports_both_jobs(tmp_path: Path) -> None:
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="10", SLURM_JOB_USER="a", SLURM_JOB_GPUS="0")
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="11", SLURM_JOB_USER="b", SLURM_JOB_GPUS="0")
    (g0,) = source(tmp_path, cgroups=False).poll(0.0, gpus(1))
    assert sorted(j.job_id for j in g0.jobs) == ["10", "11"]


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("gpu0.job1", b"", "empty"),
        ("gpu0.job1", b"\x00\xff garbage", "not UTF-8"),
        ("gpu0.job1", b"hello\n", "first line must be 'gpumon-job v1'"),
        ("gpu0.job1", b"gpumon-job v1\njob_id=2\n", "does not match its name"),
        ("gpu0.job1", b"gpumon-job v1\njob_id=1\nboot_id=not-this-boot\n", "stale"),
        ("gpu0.job1", b"gpumon-job v1\n" + b"x" * 5000, "too large"),
        ("notes.txt", b"anything", "not a gpumon job file name"),
    ],
)
def test_bad_files_are_skipped_with_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, content: bytes, needle: str
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / name).write_bytes(content)
    run_prolog(jobs, SLURM_JOB_ID="9", SLURM_JOB_USER="c", SLURM_JOB_GPUS="1")
    src = source(tmp_path, cgroups=False)
    with caplog.at_level(logging.WARNING, logger="test.jobs"):
        for t in range(5):
            out = src.poll(float(t), gpus(2))
    assert out[0].jobs == () and out[1].jobs[0].job_id == "9", "the good file is still read"
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1 and needle in lines[0], lines


def test_dcgm_exporters_layout_is_read(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm"
    dcgm.mkdir()
    (dcgm / "0").write_text("1234\n")
    (dcgm / "2").write_text("88\n99\n")
    out = source(tmp_path, dcgm_dir=str(dcgm), cgroups=False).poll(0.0, gpus(3))
    assert [[j.job_id for j in g.jobs] for g in out] == [["1234"], [], ["88", "99"]]
    assert out[0].jobs[0].via == "dcgm-mapping"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n", ("123", "0", None)),
        ("0::/system.slice/slurmstepd.scope/job_55/step_batch/user/task_0\n", ("55", "batch", None)),
        (
            "12:cpuset:/slurm/uid_1000/job_987/step_2\n11:memory:/slurm/uid_1000/job_987/step_2\n",
            ("987", "2", 1000),
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope\n", None),
    ],
)
def test_cgroup_paths_name_the_slurm_job(
    text: str, expected: tuple[str, str | None, int | None] | None
) -> None:
    assert parse_cgroup(text) == expected


def test_the_cgroup_fallback_needs_no_prolog(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0\n")
    out = source(tmp_path, proc=str(proc)).poll(0.0, gpus(2, {1: 4242}))
    assert out[0].jobs == ()
    (job,) = out[1].jobs
    assert (job.job_id, job.step, job.via) == ("31337", "0", "cgroup") and job.user


def test_parse_mapping_file_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not a key=value line"):
        parse_mapping_file("gpu0.job1", "gpumon-job v1\njob_id=1\nwhat is this\n", None)


# -- exposure ------------------------------------------------------------------------------------------


def test_one_info_series_per_gpu_and_job_and_the_job_in_state_and_traces(tmp_path: Path) -> None:
    from .test_serve import sample

    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="500", SLURM_JOB_USER="dana", SLURM_JOB_GPUS="0,2")
    d = Daemon(
        Config(simulate="healthy", gpus=4, listen="127.0.0.1:0", jobs_dir=str(tmp_path / "jobs")),
        clock=VirtualClock(),
    )
    d.sampler.run(duration_s=3)
    text = d.render_metrics("")[0].decode()
    infos = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_job_info{")]
    assert len(infos) == 2 and all('job_id="500"' in ln and 'user="dana"' in ln for ln in infos)
    assert sample(text, "gpumon_gpu_job_info", gpu="2", job_id="500") == 1
    assert sample(text, "gpumon_attribution_up", source="slurm") == 1
    state = d.state()
    first, second = (g["jobs"] for g in state["gpus"][:2])
    assert second == [] and len(first) == 1 and first[0]["job_id"] == "500" and first[0]["user"] == "dana"
    assert first[0]["via"] == "prolog" and first[0]["started_unix_s"] > 0
    from gpumon.trace.records import tick_from_dict, tick_to_dict

    tick = d.sampler.last_tick
    assert tick is not None
    again = tick_from_dict(json.loads(json.dumps(tick_to_dict(tick))))
    assert again.gpus[0].jobs == tick.gpus[0].jobs and again.gpus[1].jobs == ()


# -- MIG: instances named by their UUIDs (issue 25.5) ---------------------------------------------------

NVIDIA_SMI_L = """\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0)
  MIG 3g.40gb     Device  0: (UUID: MIG-aaaa)
  MIG 2g.20gb     Device  1: (UUID: MIG-bbbb)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-1)
"""


def mig_node() -> list[GpuSample]:
    """GPU 0 in MIG mode (the parent and its two instances, as NVML lists them), GPU 1 whole."""
    return [
        GpuSample(0.0, 0, "GPU-0", "x"),
        GpuSample(0.0, 0, "MIG-aaaa", "x", mig=1),
        GpuSample(0.0, 0, "MIG-bbbb", "x", mig=2),
        GpuSample(0.0, 1, "GPU-1", "x"),
    ]


def fake_nvidia_smi(tmp_path: Path) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\ncat <<'END'\n{NVIDIA_SMI_L}END\n")
    path.chmod(0o755)
    return str(path)


def jobs_by_unit(out: list[GpuSample]) -> dict[str, list[str]]:
    return {g.uuid: [j.job_id for j in g.jobs] for g in out}


def test_a_mig_jobs_prolog_names_exactly_its_instance(tmp_path: Path) -> None:
    """Slurm gives a MIG instance as a GPU of its own: CUDA_VISIBLE_DEVICES holds its UUID, and
    SLURM_JOB_GPUS Slurm's own number for it (here 5), which is no NVML index. The job is named on
    its instance only: not on the parent, not on the sibling, not on a GPU numbered 5."""
    smi = fake_nvidia_smi(tmp_path)
    run_prolog(
        tmp_path / "jobs",
        SLURM_JOB_ID="42",
        SLURM_JOB_USER="alice",
        SLURM_JOB_GPUS="5",
        CUDA_VISIBLE_DEVICES="MIG-bbbb",
        GPUMON_NVIDIA_SMI=smi,
    )
    assert os.listdir(tmp_path / "jobs") == ["gpu0.mig1.job42"]
    text = (tmp_path / "jobs" / "gpu0.mig1.job42").read_text()
    assert "gpu_uuid=MIG-bbbb" in text and "gpu_index=0" in text
    whole = {"SLURM_JOB_USER": "bob", "CUDA_VISIBLE_DEVICES": "GPU-1", "GPUMON_NVIDIA_SMI": smi}
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="43", **whole)
    out = source(tmp_path, cgroups=False).poll(0.0, mig_node())
    assert jobs_by_unit(out) == {"GPU-0": [], "MIG-aaaa": [], "MIG-bbbb": ["42"], "GPU-1": ["43"]}
    p = subprocess.run(
        [str(EPILOG)],
        env={"PATH": os.environ["PATH"], "GPUMON_JOBS_DIR": str(tmp_path / "jobs"), "SLURM_JOB_ID": "42"},
        capture_output=True,
        timeout=30,
    )
    assert p.returncode == 0 and os.listdir(tmp_path / "jobs") == ["gpu1.job43"]


def test_a_mig_uuid_that_nvidia_smi_does_not_list_writes_nothing(tmp_path: Path) -> None:
    """A UUID with no GPU index to name the file by is not written (a wrong index would name the
    wrong GPU); the prolog still exits 0."""
    run_prolog(
        tmp_path / "jobs",
        SLURM_JOB_ID="44",
        CUDA_VISIBLE_DEVICES="MIG-cccc,MIG-bbbb",
        GPUMON_NVIDIA_SMI=fake_nvidia_smi(tmp_path),
    )
    assert os.listdir(tmp_path / "jobs") == ["gpu0.mig1.job44"]
    run_prolog(tmp_path / "nosmi", SLURM_JOB_ID="45", CUDA_VISIBLE_DEVICES="MIG-bbbb")  # no nvidia-smi at all
    assert not (tmp_path / "nosmi").exists() or os.listdir(tmp_path / "nosmi") == []


def test_a_mig_file_without_its_instances_uuid_is_skipped_with_its_reason() -> None:
    with pytest.raises(ValueError, match="needs its gpu_uuid=MIG-"):
        parse_mapping_file("gpu0.mig1.job7", "gpumon-job v1\njob_id=7\ngpu_uuid=GPU-0\n", None)
    job = parse_mapping_file("gpu0.mig1.job7", "gpumon-job v1\njob_id=7\ngpu_uuid=MIG-bbbb\n", None)
    assert (job.gpu_index, job.gpu_uuid, job.job_id) == (0, "MIG-bbbb", "7")


def test_the_kubelets_mig_devices_name_their_instances(tmp_path: Path) -> None:
    """The kubelet lists a MIG slice by its UUID (nvidia.com/mig-3g.40gb): the pod is named on that
    instance, and neither on the parent GPU nor on the other instance."""
    from gpumon.collect.sources.kubelet import KubeletView, PodDevice

    class Kubelet:
        view = KubeletView(
            (PodDevice("ml", "trainer-0", "main", "nvidia.com/mig-3g.40gb", "MIG-aaaa"),), True, None
        )

    out = JobSource(
        Problems(logging.getLogger("test.jobs")),
        None,
        cgroups=False,
        kubelet=Kubelet(),  # type: ignore[arg-type]
    ).poll(0.0, mig_node())
    assert {g.uuid: [j.job_id for j in g.jobs] for g in out} == {
        "GPU-0": [],
        "MIG-aaaa": ["ml/trainer-0"],
        "MIG-bbbb": [],
        "GPU-1": [],
    }
