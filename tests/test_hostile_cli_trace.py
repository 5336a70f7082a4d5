"""Hostile and clumsy input to the command line, the range reader and the dstat plugin: a huge
--jobs, one noisy kind of warning, a segment header stamped wrong, control characters in an error,
a daemon that refuses the plugin's credentials, and a FIFO named `dstat` in PATH."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from gpumon.analyze.trace_report import analyze_range
from gpumon.cli import main
from gpumon.dstat import install as dstat_install
from gpumon.dstat import pcp as dstat_pcp
from gpumon.trace.range import MAX_WARNINGS_PER_KIND, read_range
from gpumon.trace.reader import WARNINGS_PER_KIND
from gpumon.trace.records import make_header
from tests.hostile import RawServer
from tests.test_dstat import run as run_dstat

STARTED = 1_795_989_600.0
"""2026-11-29T22:00:00Z, the time of segment gpumon-20261129T220000Z.jsonl.gz."""


def header(started: float) -> dict[str, Any]:
    return {**make_header({"kind": "simulated"}, 1.0), "version": 1, "started_unix_s": started}


def tick(t_s: float) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "g", "available": True, "util_ratio": 0.5}
    return {"type": "tick", "t_s": t_s, "gpus": [gpu], "host": None}


def segment(directory: Path, minute: int, started: float | None = None, n: int = 60) -> Path:
    """A recorder segment named after minute `minute` past STARTED (its first tick's time, as the
    recorder names it), with `n` 1 s ticks; its header says `started` (default: the same time)."""
    directory.mkdir(exist_ok=True)
    path = directory / f"gpumon-20261129T22{minute:02d}00Z.jsonl.gz"
    own = STARTED + 60 * minute - 1.0  # the first tick, at t_s 1, is the name's time
    with gzip.open(path, "wb") as f:
        records = [header(own if started is None else started), *(tick(float(i)) for i in range(1, n + 1))]
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's and UsageError's way out
        code = int(e.code or 0)
    return code, capsys.readouterr().err


# -- analyze --jobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["65", "100000", str(10**30)])
def test_a_huge_jobs_is_a_usage_error_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], jobs: str
) -> None:
    """Once clamped only to the GPUs of the range: a trace naming 4,096 GPUs forked 4,096 processes."""
    d = tmp_path / "rec"
    segment(d, 0)
    code, err = run_cli(capsys, "analyze", "--from", str(d), "--jobs", jobs)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--jobs" in lines[0] and "between 1 and 64" in lines[0], err


def test_jobs_within_bounds_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "rec"
    segment(d, 0)
    code, err = run_cli(capsys, "analyze", "--from", str(d), "--jobs", "64")
    assert code == 0, err


# -- the warnings of a range ---------------------------------------------------------------------


def test_one_noisy_kind_of_warning_leaves_room_for_the_others(tmp_path: Path) -> None:
    """200 stray names took all 50 places: the overlap of two segments, the news that costs ticks,
    was never said."""
    d = tmp_path / "rec"
    segment(d, 0)
    segment(d, 1, started=STARTED - 1.0)  # honest about itself: a second daemon's, same minute
    os.rename(d / "gpumon-20261129T220100Z.jsonl.gz", d / "gpumon-20261129T220000Z-1.jsonl.gz")
    for i in range(200):
        (d / f"gpumon-2026{i:04d}T999999Z.jsonl.gz").write_bytes(b"")
    a = analyze_range(str(d), 0.0)
    stray = [w for w in a.warnings if "its name is not a time" in w]
    assert len(stray) == MAX_WARNINGS_PER_KIND, len(stray)
    assert any("segments overlap in time" in w for w in a.warnings), a.warnings[-3:]
    assert any(f"{200 - MAX_WARNINGS_PER_KIND} more warning(s)" in w for w in a.warnings), a.warnings[-3:]
    assert len(a.warnings) <= 2 * MAX_WARNINGS_PER_KIND, len(a.warnings)


def test_a_range_counts_every_warning_its_segments_left_unsaid(tmp_path: Path) -> None:
    """Each segment keeps 5 warnings of a kind and summed up the rest in one line, which the range
    then counted as one warning: 3 segments with 12 repeated ticks each said "8 more" of 36."""
    assert 3 * WARNINGS_PER_KIND > MAX_WARNINGS_PER_KIND  # the range's own cap is the one reached
    d = tmp_path / "rec"
    for minute in range(3):
        path = segment(d, minute)
        own = STARTED + 60 * minute - 1.0
        with gzip.open(path, "wb") as f:
            records = [header(own), *(tick(float(i)) for i in range(1, 61))]
            records += [tick(60.0)] * 12  # 12 repeated t_s, each dropped with a warning
            f.write(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    a = analyze_range(str(d), 0.0)
    repeated = [w for w in a.warnings if "repeated t_s" in w and "more warning" not in w]
    assert len(repeated) == MAX_WARNINGS_PER_KIND, a.warnings
    (more,) = [w for w in a.warnings if "more warning" in w]
    assert f"{3 * 12 - MAX_WARNINGS_PER_KIND} more warning(s) not shown (repeated t_s)" in more, more


def test_a_range_that_ends_inside_a_segment_still_counts_its_unsaid_warnings(tmp_path: Path) -> None:
    """The range's end left the segment's reader suspended, its count not yet made: 12 repeated
    ticks before the end showed 5 warnings and no count of the other 7."""
    d = tmp_path / "rec"
    path = segment(d, 0)
    with gzip.open(path, "wb") as f:
        ticks = [tick(float(i)) for i in range(1, 31)] + [tick(30.0)] * 12
        ticks += [tick(float(i)) for i in range(31, 61)]
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in [header(STARTED - 1.0), *ticks]))
    segment(d, 1)
    span, ticks_read = read_range(str(d), 0.0, until=STARTED + 44.0)
    assert len(list(ticks_read)) == 44  # t_s 1..44 of the first segment (until is not included)
    repeated = [w for w in span.warnings if "repeated t_s" in w]
    assert len(repeated) == WARNINGS_PER_KIND + 1, span.warnings
    assert f"{12 - WARNINGS_PER_KIND} more warning(s) not shown (repeated t_s)" in repeated[-1], repeated


# -- a segment header stamped wrong --------------------------------------------------------------


@pytest.mark.parametrize("off_s", [30.0, 1800.0, -1800.0])
def test_a_header_stamped_wrong_costs_no_other_segment(tmp_path: Path, off_s: float) -> None:
    """A header `off_s` from its file's name: its ticks were placed on the next segments' time,
    and the next segments' ticks passed over as "overlapping" (all of them, for half an hour)."""
    d = tmp_path / "rec"
    segment(d, 0)
    wrong = segment(d, 1, started=STARTED + 60 - 1.0 + off_s)
    segment(d, 2)
    segment(d, 3)
    a = analyze_range(str(d), 0.0)
    assert a.span is not None and a.span.ticks == 240 and a.span.overlapping == 0, a.warnings
    said = [w for w in a.warnings if str(wrong) in w]
    assert len(said) == 1 and "placed by its name" in said[0], a.warnings


def test_a_header_within_a_second_of_its_name_is_trusted(tmp_path: Path) -> None:
    d = tmp_path / "rec"
    segment(d, 0, started=STARTED - 0.4)  # the name is the first tick's time in whole seconds
    segment(d, 1)
    span, ticks = read_range(str(d), 0.0)
    assert len(list(ticks)) == 120 and not span.warnings, span.warnings
    assert span.first_unix_s == pytest.approx(STARTED + 0.6)


# -- trace convert -------------------------------------------------------------------------------


def test_convert_warnings_say_they_are_gpumon_s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    records = [header(STARTED), tick(1.0), tick(1.0), tick(2.0)]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, err = run_cli(capsys, "trace", "convert", str(src), str(tmp_path / "out.jsonl"))
    assert code == 0, err
    lines = err.strip().splitlines()
    assert any("repeated t_s" in ln for ln in lines), err
    assert all(ln.startswith("gpumon: ") for ln in lines), err
    assert any(ln.startswith("gpumon: warning: ") and "repeated t_s" in ln for ln in lines), err


# -- error lines ---------------------------------------------------------------------------------


def test_an_error_line_carries_no_terminal_escape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file name is the user's, or a directory's: \\x1b]0;...\\x07 retitled the terminal."""
    evil = tmp_path / "t\x1b]0;owned\x07\x1b[2J.jsonl"
    evil.write_text("not json\n")
    code, err = run_cli(capsys, "analyze", str(evil))
    assert code == 4, err
    assert "\x1b" not in err and "\x07" not in err, repr(err)
    assert err.startswith("gpumon: error: ") and err.count("\n") == 1, repr(err)


def test_a_usage_error_line_carries_no_terminal_escape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(capsys, "analyze", "--from", str(tmp_path / "d\x1b[2J\nforged"))
    assert code in (2, 4), err
    assert "\x1b" not in err and err.count("\n") == 1, repr(err)


@pytest.mark.parametrize("where", [["scenarios"], ["analyze"]])
def test_argparses_own_error_lines_carry_no_terminal_escape(
    capsys: pytest.CaptureFixture[str], where: list[str]
) -> None:
    """argparse quotes what it does not know as typed ("unrecognized arguments: ..."): a file name
    from a glob (`gpumon analyze *`) with an escape and a newline forged a line of its own."""
    hostile = "c\x1b[31mRED\ngpumon: forged line"
    code, err = run_cli(capsys, *where, "a", "b", hostile)
    assert code == 2, err
    assert "\x1b" not in err and "unrecognized arguments" in err, repr(err)
    assert not [ln for ln in err.splitlines() if ln.startswith("gpumon: forged")], repr(err)


# -- the dstat plugin and a daemon that refuses its credentials -----------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A HOME with the plugin where dstat and dool look for it (what `install --user` writes)."""
    home = tmp_path / "home"
    for path in dstat_install.targets(False, home):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dstat_install.source())
    return home


def _answering(status: bytes) -> RawServer:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    return RawServer(answer)


@pytest.mark.parametrize("which", ["dstat", "dool"])
@pytest.mark.parametrize("status", [b"401 Unauthorized", b"403 Forbidden"])
@pytest.mark.parametrize("creds", [False, True])
def test_a_daemon_that_refuses_the_credentials_is_not_said_to_be_down(
    home: Path, which: str, status: bytes, creds: bool
) -> None:
    server = _answering(status)
    try:
        url = server.url.replace("//", "//u:secret@") if creds else server.url
        env = {"GPUMON_URL": url, "GPUMON_BASIC_AUTH": ""}
        p = run_dstat(which, ["--gpu", "1", "1"], home, env, timeout=60)
    finally:
        server.close()
    assert p.returncode == 8, (p.stdout, p.stderr)
    said = [ln for ln in p.stderr.splitlines() if f"{which}_gpu" in ln]
    assert len(said) == 1, p.stderr
    line = said[0]
    assert "did not answer" not in line and "refused" in line and status[:3].decode() in line, line
    assert "GPUMON_BASIC_AUTH" in line and "secret" not in p.stderr, line
    assert "Traceback" not in p.stderr


# -- which dstat ---------------------------------------------------------------------------------


@pytest.mark.timeout(20)  # before the fix: forever, in open() on the FIFO
def test_a_fifo_named_dstat_in_path_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    fifo = first / "dstat"
    os.mkfifo(fifo)
    fifo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{first}:{second}")
    assert dstat_pcp.which_dstat() is None
    link = second / "dstat"
    link.symlink_to(fifo)  # a symlink to a FIFO is no more a program
    assert dstat_pcp.which_dstat() is None
    link.unlink()
    real = second / "dstat"
    real.write_text("#!/usr/bin/env pmpython\nfrom pcp import pmapi, pmconfig\n")
    real.chmod(0o755)
    assert dstat_pcp.which_dstat() == "pcp"
    real.chmod(0o644)  # not executable: not the `dstat` a shell would run
    assert dstat_pcp.which_dstat() is None


@pytest.mark.timeout(20)  # before the fix: forever, reading the FIFO to see whether it was gpumon's
def test_a_fifo_where_the_dstat_wrapper_goes_is_left_alone(tmp_path: Path) -> None:
    found = shutil.which("dstat", path=dstat_pcp.CLEAN_PATH)
    if found is None or "pcp" not in os.path.basename(os.path.realpath(found)):
        pytest.skip("pcp-dstat is not this machine's dstat: no wrapper is written")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    os.mkfifo(bin_ / "dstat")
    conf = {"PCP_PYTHON_PROG": "/usr/bin/python3"}
    written, note = dstat_pcp._write_wrapper(conf, bin_, dstat_pcp.Installed())
    assert written is None and "not gpumon's: left alone" in note, note
