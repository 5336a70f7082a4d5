"""Job attribution with hostile names and files in its directories: one bad name or file never
takes the others' jobs away, only ASCII digits name a GPU, and no symlink is followed (found by a
hostile-input review)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpumon.collect.sources.jobs import MAX_FILE_BYTES, JobSource, parse_mapping_file
from gpumon.collect.sources.kubelet import KubeletView, PodDevice
from gpumon.core.model import GpuSample
from gpumon.core.problems import Problems


def gpus(n: int) -> list[GpuSample]:
    return [GpuSample(0.0, i, f"GPU-{i}", "x") for i in range(n)]


def job_ids(out: list[GpuSample]) -> list[list[str]]:
    return [[j.job_id for j in g.jobs] for g in out]


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    prolog, dcgm = tmp_path / "jobs", tmp_path / "dcgm"
    prolog.mkdir()
    dcgm.mkdir()
    return prolog, dcgm


def source(prolog: Path, dcgm: Path) -> JobSource:
    return JobSource(Problems(logging.getLogger("test.jobs")), str(prolog), str(dcgm), cgroups=False)


def test_a_superscript_digit_name_in_the_dcgm_dir_takes_no_job_away(tmp_path: Path) -> None:
    """Found: `echo 5 > "$DCGM_DIR/²"`: "²".isdigit() is True, int("²") raised outside any try,
    and every GPU lost its job on every tick, prolog-mapped ones too."""
    prolog, dcgm = dirs(tmp_path)
    (prolog / "gpu1.job77").write_text("gpumon-job v1\njob_id=77\ngpu_index=1\n")
    (dcgm / "0").write_text("5\n")
    (dcgm / "\u00b2").write_text("5\n")
    src = source(prolog, dcgm)
    for t in range(2):
        assert job_ids(src.poll(float(t), gpus(3))) == [["5"], ["77"], []]
    assert all(s.up for s in src.status)


def test_only_ascii_digits_name_a_gpu(tmp_path: Path) -> None:
    """int() reads "٣" (an Arabic-Indic three) as 3, and the file-name pattern's \\d matched it."""
    prolog, dcgm = dirs(tmp_path)
    (prolog / "gpu\u0663.job5").write_text("gpumon-job v1\njob_id=5\n")
    (dcgm / "\u0663").write_text("6\n")
    (dcgm / "\u0661\u0662").write_text("7\n")
    (dcgm / ("9" * 5000)[:200]).write_text("8\n")  # no GPU's, and no trouble
    (dcgm / "2").write_text("9\n")
    assert job_ids(source(prolog, dcgm).poll(0.0, gpus(4))) == [[], [], ["9"], []]
    with pytest.raises(ValueError, match="not a gpumon job file name"):
        parse_mapping_file("gpu\u0663.job5", "gpumon-job v1\njob_id=5\n", None)


def test_a_uid_that_is_not_ascii_digits_loses_the_uid_not_the_job(tmp_path: Path) -> None:
    """`uid=²` passed isdigit() and then int() raised: the whole file was skipped."""
    prolog, dcgm = dirs(tmp_path)
    (prolog / "gpu2.job78").write_text("gpumon-job v1\njob_id=78\ngpu_index=2\nuid=\u00b2\n")
    src = source(prolog, dcgm)
    assert job_ids(src.poll(0.0, gpus(3))) == [[], [], ["78"]]
    job = parse_mapping_file("gpu2.job78", "gpumon-job v1\njob_id=78\nuid=\u00b2\n", None)
    assert job.uid is None and job.gpu_index == 2
    assert src.problems.active() == ()


def test_a_symlink_in_the_dcgm_dir_is_not_followed(tmp_path: Path) -> None:
    """Found: `ln -s /root/secret dc3/0` made the secret's first line GPU 0's job id, in traces
    and /metrics (the prolog dir never followed one; docs/fleet.md says neither does)."""
    prolog, dcgm = dirs(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("topsecret\n")
    os.symlink(secret, dcgm / "0")
    (dcgm / "1").write_text("11\n")
    src = source(prolog, dcgm)
    assert job_ids(src.poll(0.0, gpus(2))) == [[], ["11"]]
    said = src.problems.active()
    assert len(said) == 1 and "not a regular file (a symbolic link)" in said[0], said


@pytest.mark.timeout(20)
def test_a_fifo_or_a_directory_in_the_dcgm_dir_is_skipped_without_blocking(tmp_path: Path) -> None:
    prolog, dcgm = dirs(tmp_path)
    os.mkfifo(dcgm / "0")
    (dcgm / "1").mkdir()
    (dcgm / "2").write_text("22\n")
    src = source(prolog, dcgm)
    assert job_ids(src.poll(0.0, gpus(3))) == [[], [], ["22"]]
    assert len(src.problems.active()) == 2


def test_a_bad_dcgm_file_is_said_until_it_is_good_or_gone(tmp_path: Path) -> None:
    prolog, dcgm = dirs(tmp_path)
    (dcgm / "0").write_bytes(b"\xff\n")
    (dcgm / "1").write_text("1\n" * (MAX_FILE_BYTES // 2 + 1))  # too large: skipped, not cut
    src = source(prolog, dcgm)
    assert job_ids(src.poll(0.0, gpus(2))) == [[], []]
    said = src.problems.active()
    assert len(said) == 2 and "not UTF-8" in said[0] and "too large" in said[1], said
    (dcgm / "0").unlink()
    (dcgm / "1").write_text("12\n")
    assert job_ids(src.poll(1.0, gpus(2))) == [[], ["12"]]
    assert src.problems.active() == ()


def test_a_kubelet_device_id_of_other_digits_takes_no_pod_away() -> None:
    """device_key() says "index" for any str.isdigit() id: int("²") raised in poll."""
    view = KubeletView(
        (
            PodDevice("ns", "bad", "c", "nvidia.com/gpu", "\u00b2"),
            PodDevice("ns", "good", "c", "nvidia.com/gpu", "1"),
        ),
        up=True,
        reason=None,
    )
    kubelet = SimpleNamespace(view=view)
    src = JobSource(Problems(logging.getLogger("test.jobs")), None, cgroups=False, kubelet=kubelet)  # type: ignore[arg-type]
    assert job_ids(src.poll(0.0, gpus(2))) == [[], ["ns/good"]]


def test_a_changed_file_beyond_a_ticks_reads_keeps_its_jobs_until_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More changed files than a tick reads: the ones left for the next tick keep the jobs they
    named (they once lost them for that tick, and attribution flickered: found in review)."""
    from gpumon.collect.sources import jobs

    monkeypatch.setattr(jobs, "MAX_READS_PER_TICK", 2)
    prolog, dcgm = dirs(tmp_path)
    for i in range(4):
        (dcgm / str(i)).write_text(f"{i}0\n")
    src = source(prolog, dcgm)
    src.poll(0.0, gpus(4))  # two files read
    assert job_ids(src.poll(1.0, gpus(4))) == [["00"], ["10"], ["20"], ["30"]]
    for i in range(4):  # all four change at once
        (dcgm / str(i)).write_text(f"{i}1\n")
        os.utime(dcgm / str(i), ns=(10**18 + i, 10**18 + i))
    got = job_ids(src.poll(2.0, gpus(4)))
    assert all(len(ids) == 1 for ids in got), got  # two new, two as last read: none without a job
    assert job_ids(src.poll(3.0, gpus(4))) == [["01"], ["11"], ["21"], ["31"]]
