"""The flight recorder and `analyze --from` against a clumsy or hostile user (issue 28): one bad
segment never costs the others, a stray file named like a segment never stops the recorder, a
directory removed while recording pauses it (said once) until it is back, FIFOs where segments
belong never hang a reader, and a recording stamped ahead of the wall clock is read whole."""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpumon.analyze.trace_report import analyze_range
from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.collect.pipeline.sources import simulated
from gpumon.core.clock import VirtualClock
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.sim.fleet import Fleet
from gpumon.sim.scenarios import parse_scenarios
from gpumon.trace.reader import read_trace
from gpumon.trace.recorder import RETRY_S, Recorder
from gpumon.trace.segments import list_segments
from gpumon.trace.writer import TraceWriterV2

from .conftest import gpumon
from .test_recorder import EPOCH, run

SECONDS = 239
"""Four one-minute segments: 22:00:01-22:00:59, 22:01, 22:02, 22:03."""


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rec")
    run(d, SECONDS, segment_s=60)
    assert len(list_segments(str(d))) == 4
    return d


@pytest.fixture
def copy(recording: Path, tmp_path: Path) -> Path:
    d = tmp_path / "rec"
    shutil.copytree(recording, d)
    return d


def segments(d: Path) -> list[Path]:
    return [Path(s.path) for s in list_segments(str(d))]


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:10])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _bitflip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 6):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))


def _not_gzip(p: Path) -> None:
    p.write_bytes(b"this is not what gpumon wrote\n" * 10)


def _concatenated(p: Path) -> None:
    p.write_bytes(p.read_bytes() * 2)  # two segments joined: a second header inside


def _symlink(p: Path) -> None:
    target = p.with_name("elsewhere.gz")
    p.rename(target)
    p.symlink_to(target)


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


DAMAGE = {
    "truncated to 10 bytes": _truncate,
    "empty": _empty,
    "bit-flipped": _bitflip,
    "not gzip": _not_gzip,
    "concatenated": _concatenated,
    "a symlink": _symlink,
    "a FIFO": _fifo,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_bad_middle_segment_is_skipped_named_and_the_later_ones_read(copy: Path, damage: str) -> None:
    bad = segments(copy)[1]
    DAMAGE[damage](bad)
    p = gpumon("analyze", "--from", str(copy), "--json", "--jobs", "1", timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    # the segments after the bad one are read: the range reaches the recording's end
    assert doc["range"]["last_unix_s"] >= EPOCH + SECONDS - 1, doc["range"]
    assert doc["range"]["ticks"] >= SECONDS - 60, doc["range"]
    assert any(str(bad) in w for w in doc["warnings"]), doc["warnings"]
    text = gpumon("analyze", "--from", str(copy), "--jobs", "1")
    # on standard error, beside the report: `analyze > report.txt` once hid them in the file
    assert text.returncode == 0 and f"gpumon: warning: {bad}" in text.stderr, text.stdout + text.stderr
    assert "warning" not in text.stdout


def test_a_bad_first_segment_does_not_fail_the_range(copy: Path) -> None:
    first = segments(copy)[0]
    _truncate(first)
    a = analyze_range(str(copy), EPOCH)
    assert a.span is not None and a.span.ticks == SECONDS - 59, a.span.ticks  # all but the first minute
    assert a.span.skipped_segments == 1 and any(str(first) in w for w in a.warnings)


def test_every_segment_bad_says_so_naming_one(copy: Path) -> None:
    for s in segments(copy):
        _not_gzip(s)
    p = gpumon("analyze", "--from", str(copy))
    assert p.returncode == 4, p.stderr
    assert "4 segment(s) could not be read" in p.stderr and "not valid JSON" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_segment_damaged_midway_keeps_its_ticks_before_the_damage(copy: Path) -> None:
    seg = segments(copy)[1]
    data = bytearray(seg.read_bytes())
    data[len(data) * 2 // 3 : len(data) * 2 // 3 + 8] = b"\xff" * 8
    seg.write_bytes(bytes(data))
    a = analyze_range(str(copy), EPOCH)
    assert a.span is not None and SECONDS - 60 < a.span.ticks < SECONDS
    assert any(str(seg) in w and "the rest skipped" in w for w in a.warnings), a.warnings


def test_a_stray_file_named_like_a_segment_is_skipped_with_a_warning(copy: Path) -> None:
    stray = copy / "gpumon-20261399T999999Z.jsonl.gz"
    stray.write_bytes(b"not a segment")
    p = gpumon("analyze", "--from", str(copy), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["range"]["ticks"] == SECONDS
    assert any(str(stray) in w for w in doc["warnings"]), doc["warnings"]


def test_a_stray_file_named_like_a_segment_never_stops_the_recorder(tmp_path: Path) -> None:
    (tmp_path / "gpumon-20261399T999999Z.jsonl.gz").write_bytes(b"not a segment")
    os.mkfifo(tmp_path / "gpumon-20261129T215000Z.jsonl.gz")  # a FIFO, old enough to be deleted
    rec = run(tmp_path, 300, segment_s=60, max_age_s=60)
    stats = rec.stats()
    assert stats.up and stats.errors == 0 and stats.dropped_ticks == 0, stats
    assert (tmp_path / "gpumon-20261399T999999Z.jsonl.gz").exists(), "a foreign file is never deleted"
    assert (tmp_path / "gpumon-20261129T215000Z.jsonl.gz").exists()


def test_a_bug_in_the_recorder_pauses_it_and_it_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = {"n": 0}

    def flaky(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return TraceWriterV2(path, header, origin_s=origin)

    with caplog.at_level(logging.INFO, logger="gpumon"):
        rec = run(tmp_path, 120, open_writer=flaky)
    stats = rec.stats()
    assert stats.up, stats
    assert stats.dropped_ticks == RETRY_S, "the ticks until the retry are not recorded"
    assert len([r for r in caplog.records if "internal error" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "resumed" in r.getMessage()]) == 1
    assert sum(len(read_trace(s.path).ticks) for s in list_segments(str(tmp_path))) == 120 - RETRY_S


def test_a_removed_directory_pauses_recording_says_so_once_and_resumes_when_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "rec"
    clock = VirtualClock()
    problems = Problems(logging.getLogger("test"))
    fleet = Fleet(parse_scenarios("healthy"), None, 0, clock)
    pipeline = Pipeline(
        SourceSpec("simulated", scenarios=("healthy",)),
        clock,
        sources=simulated(fleet, {"kind": "simulated"}, problems),
        problems=problems,
        attribution=None,
    )
    rec = Recorder(str(directory), {"kind": "simulated"}, 1.0, lambda: EPOCH, block=True)
    rec.start()
    pipeline.on_tick(rec.submit)
    seen: list[Any] = []

    def act(tick: Tick) -> None:
        seen.append(tick.t_s)
        if len(seen) == 100:
            rec.flush()
            shutil.rmtree(directory)  # an admin cleans up (segment_s is an hour: no rotation soon)
        if len(seen) == 150:
            rec.flush()
            seen.append(rec.stats())
            directory.mkdir()  # ...and it is back

    pipeline.on_tick(act)
    with caplog.at_level(logging.INFO, logger="gpumon"):
        pipeline.run(300)
        rec.close()
    pipeline.close()
    during = next(x for x in seen if not isinstance(x, float))
    assert not during.up and "removed" in (during.paused_reason or ""), during
    paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
    assert len(paused) == 1 and str(directory) in paused[0], paused
    assert len([r for r in caplog.records if "resumed" in r.getMessage()]) == 1
    assert rec.stats().up
    # recording goes on in the directory that came back, within a retry period
    ticks = sum(len(read_trace(s.path).ticks) for s in list_segments(str(directory)))
    assert 300 - 150 - RETRY_S <= ticks <= 150, ticks


def test_a_fifo_named_like_a_segment_does_not_hang_a_range_read(copy: Path) -> None:
    os.mkfifo(copy / "gpumon-20261129T220230Z.jsonl.gz")  # inside the range, between two segments
    p = gpumon("analyze", "--from", str(copy), "--json", timeout=30)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["range"]["ticks"] == SECONDS
    assert any("FIFO" in w for w in doc["warnings"]), doc["warnings"]


def test_a_fifo_or_device_as_the_trace_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        p = gpumon("analyze", path, timeout=30)
        assert p.returncode == 4 and "not a regular file" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_warnings_of_a_range_are_bounded(copy: Path) -> None:
    for i in range(200):
        (copy / f"gpumon-2026{i:04d}T999999Z.jsonl.gz").write_bytes(b"")
    a = analyze_range(str(copy), EPOCH)
    assert len(a.warnings) <= 51 and "more warning(s) not shown" in a.warnings[-1], a.warnings[-3:]


# -- issue 27, item 4: a recording made faster than real time ------------------------------------


@pytest.fixture(scope="module")
def fast_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fast")
    p = gpumon(
        "serve", "--simulate", "starved-cpu,healthy", "--speed", "max", "--duration", "3600",
        "--record-dir", str(d), "--listen", "127.0.0.1:0", timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return d


def test_a_recording_made_at_speed_max_is_analyzed_whole(fast_recording: Path) -> None:
    p = gpumon("analyze", "--from", str(fast_recording), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["range"]["ticks"] == 3600, doc["range"]
    assert doc["range"]["until_unix_s"] is None, "no --until: to the recording's end"


def test_a_range_that_ends_before_a_recording_stamped_ahead_says_why(fast_recording: Path) -> None:
    p = gpumon("analyze", "--from", str(fast_recording), "--until", "0s")
    assert p.returncode == 0, p.stderr
    warning = [ln for ln in p.stderr.splitlines() if ln.startswith("gpumon: warning:")]
    assert any("after now" in w and "leave out --until" in w for w in warning), p.stderr


def test_a_segment_named_in_the_future_of_a_real_recording_is_read(tmp_path: Path) -> None:
    """Segments must not rely on the wall clock to be read: a directory whose newest segment
    starts after now (a clock stepped back) is read to its end by default."""
    run(tmp_path, 120, segment_s=60)
    later = EPOCH + 10 * 365 * 86400.0
    name = datetime.datetime.fromtimestamp(later, datetime.UTC).strftime("gpumon-%Y%m%dT%H%M%SZ.jsonl.gz")
    shutil.copy(segments(tmp_path)[0], tmp_path / name)
    a = analyze_range(str(tmp_path), EPOCH)
    assert a.span is not None and a.span.segments[-1].endswith(name)
