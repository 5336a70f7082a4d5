"""The drive file read as hostile input: a bad byte, a FIFO, /dev/zero, a line with no end, a
backlog, a replaced file, a pid or a time that is no such thing. Each is skipped or refused, said
once, and the lines after it are read as before (found by a hostile-input review)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gpumon.core.clock import VirtualClock
from gpumon.core.problems import Problems
from gpumon.sim import driven
from gpumon.sim.driven import MAX_LINE_BYTES, DrivenFleet, DrivenGpu


def fleet_at(path: Path) -> tuple[DrivenFleet, Problems]:
    problems = Problems(logging.getLogger("test.drive"))
    return DrivenFleet(str(path), VirtualClock(0.0), 1 / 6, problems), problems


def step(fleet: DrivenFleet, a: float, b: float, rank: int | None = None) -> bytes:
    """A step line from fleet time `a` to `b` (the file holds CLOCK_MONOTONIC times)."""
    t0 = fleet._t0_mono
    return f"{t0 + a:.6f} {t0 + b:.6f}{'' if rank is None else f' {rank}'}\n".encode()


def gpu0(fleet: DrivenFleet) -> DrivenGpu:
    gpu = fleet.gpus[0]
    assert isinstance(gpu, DrivenGpu)
    return gpu


HEADER = f"# gpumon-drive v1 pid={os.getpid()}\n".encode()


def test_a_line_that_is_not_utf8_is_skipped_and_the_next_ones_are_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found: one \\xff byte raised UnicodeDecodeError on every tick (the offset never moved past
    it): the GPU source failed for the rest of the run."""
    path = tmp_path / "drive"
    path.write_bytes(HEADER)
    fleet, _ = fleet_at(path)
    assert gpu0(fleet).pid == os.getpid()
    with path.open("ab") as f:
        f.write(step(fleet, 1.0, 1.5) + b"\xff\xfe bad\n" + b"\xff\n" + step(fleet, 2.0, 2.5))
    with caplog.at_level(logging.WARNING, logger="gpumon.drive"):
        assert gpu0(fleet).busy_share(1.0, 3.0) == pytest.approx(0.5)
        with path.open("ab") as f:
            f.write(step(fleet, 3.0, 3.5))
        assert gpu0(fleet).busy_share(1.0, 4.0) == pytest.approx(0.5)
    assert fleet.skipped["not UTF-8 text"] == 2
    said = [r.getMessage() for r in caplog.records if "UTF-8" in r.getMessage()]
    assert len(said) == 1, said


@pytest.mark.timeout(20)
def test_a_fifo_in_place_of_the_drive_file_never_blocks_and_a_file_after_it_is_read(
    tmp_path: Path,
) -> None:
    """Found: `rm FILE; mkfifo FILE` while recording hung the sampler in open()."""
    path = tmp_path / "drive"
    path.write_bytes(HEADER)
    fleet, problems = fleet_at(path)
    assert len(fleet.gpus) == 1
    path.unlink()
    os.mkfifo(path)
    assert len(fleet.gpus) == 1 and len(fleet.gpus) == 1  # read twice: said once
    assert [m for m in problems.active() if "not a regular file (a FIFO)" in m], problems.active()
    path.unlink()
    path.write_bytes(f"# gpumon-drive v2 pid={os.getpid()} rank=1\n".encode() + step(fleet, 1.0, 2.0, 1))
    gpus = fleet.gpus  # a new file: read from its start
    assert len(gpus) == 2 and gpus[1].busy_share(1.0, 3.0) == pytest.approx(0.5)
    assert problems.active() == ()


def test_a_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    """Found: the drive file replaced by a symlink to /dev/zero grew the recorder to 4.7 GB in 10 s."""
    path = tmp_path / "drive"
    os.symlink("/dev/zero", path)
    fleet, problems = fleet_at(path)
    assert len(fleet.gpus) == 1 and fleet._offset == 0
    assert [m for m in problems.active() if "character device" in m], problems.active()


def test_a_line_with_no_end_is_never_buffered_whole_and_reading_resyncs_at_its_newline(
    tmp_path: Path,
) -> None:
    """Found: 300 MB with no newline were kept whole as the unfinished line (RSS 638 MB)."""
    path = tmp_path / "drive"
    path.write_bytes(HEADER)
    fleet, _ = fleet_at(path)
    with path.open("ab") as f:
        f.write(b"x" * (3 * MAX_LINE_BYTES))
    fleet.refresh()
    assert len(fleet._partial) <= MAX_LINE_BYTES
    with path.open("ab") as f:
        f.write(b"1.0 2.0 " * MAX_LINE_BYTES)  # still the same line: dropped too
    fleet.refresh()
    assert len(fleet._partial) <= MAX_LINE_BYTES
    with path.open("ab") as f:
        f.write(b"\n" + step(fleet, 1.0, 1.5) + b"y" * (MAX_LINE_BYTES + 1) + b"\n" + step(fleet, 2.0, 2.5))
    assert gpu0(fleet).busy_share(1.0, 3.0) == pytest.approx(0.5)
    assert fleet.skipped[f"longer than {MAX_LINE_BYTES} bytes"] == 2


def test_a_backlog_is_read_a_bounded_amount_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driven, "MAX_READ_BYTES", 64)
    path = tmp_path / "drive"
    path.write_bytes(b"")
    fleet, _ = fleet_at(path)
    path.write_bytes(HEADER + b"".join(step(fleet, i, i + 0.5) for i in range(40)))
    fleet.refresh()
    assert fleet._offset == 64
    for _ in range(path.stat().st_size // 64 + 1):
        fleet.refresh()
    assert fleet._offset == path.stat().st_size
    assert gpu0(fleet).busy_share(0.0, 40.0) == pytest.approx(0.5)


@pytest.mark.parametrize("read_bytes", [1, 7, 1 << 20])
def test_good_lines_read_the_same_whatever_the_reads_cut_them_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_bytes: int
) -> None:
    monkeypatch.setattr(driven, "MAX_READ_BYTES", read_bytes)
    path = tmp_path / "drive"
    path.write_bytes(b"")
    fleet, _ = fleet_at(path)
    text = (
        b"# gpumon-drive v2 ranks=2\n"
        + f"# gpumon-drive v2 pid={os.getpid()} rank=1\n".encode()
        + step(fleet, 0.0, 0.8, 1)[:-1]
        + b" sync\n# switch 3\n"
        + step(fleet, 0.8, 1.0, 1)
        + f"{fleet._t0_mono + 2:.6f} - 1\n".encode()
    )
    path.write_bytes(text)
    for _ in range(len(text) // read_bytes + 2):
        fleet.refresh()
    gpus = fleet.gpus
    assert len(gpus) == 2 and gpus[1].pid == os.getpid() and not gpus[0].phase(0.0).has_job
    spinning = gpus[1]
    assert isinstance(spinning, DrivenGpu)
    assert spinning.busy_share(0.0, 1.0) == pytest.approx(1.0)
    assert spinning._sync_share(0.0, 1.0) == pytest.approx(0.8)
    assert spinning.busy_share(2.0, 3.0) == pytest.approx(1.0)  # begun, not yet ended
    assert not fleet.skipped


def test_a_replaced_or_shortened_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "drive"
    path.write_bytes(b"# gpumon-drive v1 pid=1\n" + b"# a note that makes this file long\n" * 10)
    fleet, _ = fleet_at(path)
    assert gpu0(fleet).pid == 1
    new = tmp_path / "drive.new"
    new.write_bytes(HEADER + step(fleet, 1.0, 1.5))
    os.replace(new, path)  # another file, shorter than what was read of the first
    assert gpu0(fleet).pid == os.getpid() and gpu0(fleet).busy_share(1.0, 2.0) == pytest.approx(0.5)
    path.write_bytes(b"# gpumon-drive v1 pid=2\n")  # the same file, cut shorter and rewritten
    assert gpu0(fleet).pid == 2


@pytest.mark.parametrize(
    "line",
    [
        "# gpumon-drive v1 pid=" + "9" * 30,  # os.kill cannot take it: phase() raised OverflowError
        "# gpumon-drive v1 pid=99999999999",
        "# gpumon-drive v2 pid=1 rank=" + "9" * 4000,
        "1 inf",  # a step that never ends: the GPU busy for good, no later step taken
        "nan -",  # an interval begun at no time: busy for good
        "1 2 \u00b2",  # a rank int() refuses
        "1 2 \u0661",  # a rank int() reads as 1 (an Arabic-Indic one): no rank's
        "\u0661 2",  # a start float() reads as 1
    ],
)
def test_a_pid_or_time_that_is_no_such_thing_is_skipped(tmp_path: Path, line: str) -> None:
    path = tmp_path / "drive"
    path.write_bytes(HEADER)
    fleet, _ = fleet_at(path)
    with path.open("ab") as f:
        f.write(line.encode() + b"\n" + step(fleet, 5.0, 5.5))
    gpu = gpu0(fleet)
    assert gpu.pid == os.getpid() and gpu.phase(1.0).has_job and gpu.power_w(1.0) > 0
    assert gpu.busy_share(0.0, 4.0) == 0.0 and gpu.busy_share(5.0, 6.0) == pytest.approx(0.5)
    assert fleet.skipped["not a drive line"] == 1


def test_a_drive_file_that_cannot_be_read_is_among_the_pipelines_problems(tmp_path: Path) -> None:
    """What the state API and /metrics say is wrong (the pipeline's problems), not only the log."""
    from gpumon.collect.pipeline import Pipeline, SourceSpec

    path = tmp_path / "drive.txt"
    os.mkfifo(path)
    problems = Problems(logging.getLogger("test"))
    clock = VirtualClock()
    spec = SourceSpec("driven", file=str(path))
    pipeline = Pipeline(spec, clock, problems=problems, attribution=None)
    try:
        pipeline.run(3)
        assert any("not a regular file (a FIFO)" in p for p in problems.active()), problems.active()
    finally:
        pipeline.close()
