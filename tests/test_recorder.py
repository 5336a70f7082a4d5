"""The daemon's flight recorder (gpumon.trace.recorder): segments, retention, a full or unwritable disk,
and `gpumon analyze --from` over what it wrote. Time is injected: a virtual clock drives a
simulated fleet, and the recorder's wall clock starts at a fixed instant."""

from __future__ import annotations

import datetime
import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gpumon.analyze.trace_report import analyze_range
from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.collect.pipeline.sources import simulated
from gpumon.core.clock import VirtualClock
from gpumon.core.errors import OutputError, TraceError
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.sim.fleet import Fleet
from gpumon.sim.scenarios import parse_scenarios
from gpumon.trace.reader import read_trace
from gpumon.trace.recorder import Recorder
from gpumon.trace.records import tick_to_dict
from gpumon.trace.segments import list_segments, segment_start
from gpumon.trace.writer import TraceWriterV2

from .conftest import gpumon
from .memory import peak_bytes

EPOCH = datetime.datetime(2026, 11, 29, 22, 0, 0, tzinfo=datetime.UTC).timestamp()
"""The recorder's wall clock at the simulation's time 0: 22:00 UTC, 'last night'."""


def simulated_pipeline(scenarios: str) -> Pipeline:
    """A simulated fleet's pipeline on a virtual clock (one GPU per scenario)."""
    clock = VirtualClock()
    problems = Problems(logging.getLogger("test"))
    fleet = Fleet(parse_scenarios(scenarios), None, 0, clock)
    return Pipeline(
        SourceSpec("simulated", scenarios=tuple(scenarios.split(","))),
        clock,
        sources=simulated(fleet, {"kind": "simulated", "scenarios": scenarios.split(",")}, problems),
        problems=problems,
        attribution=None,
    )


def run(
    directory: Path,
    seconds: float,
    scenarios: str = "starved-cpu,healthy",
    *,
    keep: list[Tick] | None = None,
    **recorder_kw: Any,
) -> Recorder:
    """A simulated fleet sampled for `seconds` on a virtual clock, recorded into `directory`."""
    pipeline = simulated_pipeline(scenarios)
    description = {"kind": "simulated", "scenarios": scenarios.split(","), "gpus": len(scenarios.split(","))}
    rec = Recorder(str(directory), description, 1.0, lambda: EPOCH, block=True, **recorder_kw)
    rec.start()
    pipeline.on_tick(rec.submit)
    if keep is not None:
        pipeline.on_tick(keep.append)
    pipeline.run(seconds)
    rec.close()
    pipeline.close()
    return rec


def iso(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat()


def test_segments_are_aligned_standalone_traces_that_together_hold_every_tick(tmp_path: Path) -> None:
    ticks: list[Tick] = []
    rec = run(tmp_path, 330, segment_s=60, keep=ticks)
    segments = list_segments(str(tmp_path))
    starts = [s.start_unix_s for s in segments]
    assert len(segments) == 6  # 22:00:01-22:00:59, then one per minute to 22:05:30
    assert all(s % 60 == 0 for s in starts[1:]), "segments after the first start on the minute"
    total = 0
    for seg in segments:
        trace = read_trace(seg.path)  # each one alone is a whole trace, ended cleanly
        assert trace.warnings == [] and trace.end is not None and trace.header["version"] == 3
        started = trace.header["started_unix_s"]
        assert all(seg.start_unix_s <= started + t.t_s < seg.start_unix_s + 61 for t in trace.ticks)
        total += len(trace.ticks)
    assert total == len(ticks) == 330
    stats = rec.stats()
    assert stats.up and stats.segments == 6 and stats.errors == 0 and stats.dropped_ticks == 0
    assert stats.disk_bytes == sum(s.bytes for s in segments)
    # read back as one range, the ticks are the ones sampled (moved onto the range's clock)
    span_a = analyze_range(str(tmp_path), EPOCH, EPOCH + 400)
    assert span_a.span is not None and span_a.span.ticks == 330 and len(span_a.span.segments) == 6


def test_a_recording_across_an_upgrade_reads_as_one_range(tmp_path: Path) -> None:
    """A daemon upgraded mid-recording leaves version 2 segments before version 3 ones (trace
    format 3 came with issue 29): a range over both reads every tick, each file by its own header."""
    made: list[int] = []

    def writer(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        made.append(2 if len(made) < 3 else 3)
        return TraceWriterV2(path, header, origin_s=origin, sync_every_s=5.0, version=made[-1])

    run(tmp_path, 330, segment_s=60, open_writer=writer)
    versions = [read_trace(seg.path).header["version"] for seg in list_segments(str(tmp_path))]
    assert versions == [2, 2, 2, 3, 3, 3]
    whole = analyze_range(str(tmp_path), EPOCH, EPOCH + 400)
    assert whole.span is not None and whole.span.ticks == 330 and whole.warnings == []
    assert [g.index for g in whole.gpus] == [0, 1]


def test_retention_deletes_the_oldest_segments_by_age(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not gpumon's")
    rec = run(tmp_path, 600, segment_s=60, max_age_s=180)
    segments = list_segments(str(tmp_path))
    newest = EPOCH + 600
    # a segment goes once all its samples are older than 3 minutes (it ends where the next begins),
    # and not before
    assert segments[1].start_unix_s >= newest - 180 >= segments[0].start_unix_s
    assert len(segments) == 5
    assert (tmp_path / "notes.txt").exists(), "only files named as segments are deleted"
    assert rec.stats().segments == len(segments)
    assert rec.stats().oldest_unix_s == segments[0].start_unix_s


def test_retention_keeps_the_segments_under_the_size_limit(tmp_path: Path) -> None:
    rec = run(tmp_path, 1200, segment_s=60, max_bytes=50_000)  # (the setting's least is 1 MB)
    written = rec.stats().bytes_written
    on_disk = sum(s.bytes for s in list_segments(str(tmp_path)))
    assert written > 100_000 and 50_000 >= on_disk > 40_000, (written, on_disk)
    assert rec.stats().disk_bytes == on_disk


class _FlakyDisk:
    """Opens real segment writers whose writes fail with ENOSPC while `full` is set."""

    def __init__(self) -> None:
        self.full = threading.Event()

    def __call__(self, path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        if self.full.is_set():
            raise OutputError(f"{path}: cannot create: {os.strerror(errno.ENOSPC)}")
        writer = TraceWriterV2(path, header, origin_s=origin)
        real = writer.write_tick

        def write_tick(tick: Tick) -> None:
            if self.full.is_set():
                writer._out._file.failed = True  # what a failed write leaves behind
                raise OutputError(f"{path}: cannot write: {os.strerror(errno.ENOSPC)}")
            real(tick)

        writer.write_tick = write_tick  # type: ignore[method-assign]
        return writer


def test_a_full_disk_pauses_recording_says_so_once_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = _FlakyDisk()
    pipeline = simulated_pipeline("healthy")
    rec = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, block=True, open_writer=disk)
    rec.start()
    pipeline.on_tick(rec.submit)
    seen: list[float] = []

    def switch(tick: Tick) -> None:
        seen.append(tick.t_s)
        if len(seen) == 100:
            rec.flush()
            disk.full.set()  # the disk fills after 100 ticks...
        if len(seen) == 200:
            rec.flush()
            assert not rec.stats().up and "No space left" in (rec.stats().paused_reason or "")
            disk.full.clear()  # ...and has room again 100 s later

    pipeline.on_tick(switch)
    with caplog.at_level(logging.INFO, logger="gpumon"):
        pipeline.run(300)
        rec.close()
    pipeline.close()
    stats = rec.stats()
    assert stats.up and stats.errors >= 1
    paused = [r for r in caplog.records if "paused" in r.getMessage()]
    resumed = [r for r in caplog.records if "resumed" in r.getMessage()]
    assert len(paused) == 1 and "No space left on device" in paused[0].getMessage()
    assert len(resumed) == 1
    segments = list_segments(str(tmp_path))
    kept = [read_trace(s.path) for s in segments]
    ticks = sum(len(t.ticks) for t in kept)
    # everything before the disk filled is kept; after room returns, recording goes on within the
    # retry period (30 s); nothing written before is lost
    assert len(kept[0].ticks) == 100
    assert 300 - 100 - 100 - 31 <= ticks - 100 <= 100
    assert stats.dropped_ticks == 300 - ticks


def test_a_slow_disk_never_holds_up_the_sampler(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        release.wait(10)  # the disk hangs on open
        return TraceWriterV2(path, header, origin_s=origin)

    rec = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, queue_ticks=5, open_writer=stuck)
    rec.start()
    tick = Tick(t_s=1.0, gpus=(), host=None)
    for i in range(50):  # returns at once every time, though nothing is written
        rec.submit(Tick(t_s=1.0 + i, gpus=(), host=None))
    assert rec.stats().dropped_ticks >= 50 - 5 - 1
    release.set()
    rec.close()
    assert tick.t_s == 1.0


def test_an_unwritable_directory_is_a_paused_recorder_not_a_dead_daemon(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = run(blocker / "recordings", 40)  # a file where a directory should be
    stats = rec.stats()
    assert not stats.up and stats.errors >= 1 and "Not a directory" in (stats.paused_reason or "")
    assert stats.dropped_ticks == 40


def test_analyze_from_a_range_reports_the_starved_gpu_in_wall_clock_time(tmp_path: Path) -> None:
    run(tmp_path, 900, segment_s=300)
    p = gpumon("analyze", "--from", str(tmp_path), "--since", iso(EPOCH + 300), "--until", iso(EPOCH + 600))
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert "2 GPU(s)" in first and "from 1 segment(s)" in first and "300 ticks" in first
    assert "verdict: STARVED-CPU" in p.stdout and "verdict: HEALTHY" in p.stdout
    assert "11-29 22:05:" in p.stdout, "episode times are wall-clock times"
    p = gpumon("analyze", "--from", str(tmp_path), "--until", iso(EPOCH + 901), "--gpu", "1", "--json")
    assert p.returncode == 0, p.stderr
    import json

    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == [1] and doc["gpus"][0]["verdict"] == "healthy"
    assert doc["range"]["segments"] == 4 and doc["range"]["ticks"] == 900
    assert doc["gpus"][0]["verdicts"] == [], "a range keeps no per-tick verdicts"
    assert doc["gpus"][0]["episodes"][0]["start_unix_s"] >= EPOCH


def test_analyze_from_says_what_is_there_when_the_range_is_empty(tmp_path: Path) -> None:
    run(tmp_path, 120, segment_s=60)
    p = gpumon("analyze", "--from", str(tmp_path), "--since", iso(EPOCH - 7200), "--until", iso(EPOCH - 3600))
    assert p.returncode == 4 and "no samples between" in p.stderr and "spans" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    for args, flag in (
        (["analyze", str(tmp_path / "x"), "--from", str(tmp_path)], "not both"),
        (["analyze", "x.jsonl", "--since", "1h"], "--from"),
        (["analyze", "--from", str(tmp_path), "--since", "yesterday"], "--since"),
        (["analyze", "--from", str(tmp_path / "nope")], "no such directory"),
        (["analyze", "--from", str(next(tmp_path.glob("gpumon-*")))], "not a directory (a file)"),
    ):
        p = gpumon(*args)
        assert p.returncode in (2, 4) and flag in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_analysis_of_a_longer_range_takes_no_more_memory(tmp_path: Path) -> None:
    run(tmp_path, 4 * 3600, "starved-cpu", segment_s=600)

    def peak(hours: float) -> int:
        return peak_bytes(lambda: analyze_range(str(tmp_path), EPOCH, EPOCH + hours * 3600))

    short, long = peak(1), peak(4)
    assert long < 1.3 * short, (short, long)


def test_segment_names_round_trip() -> None:
    from gpumon.trace.segments import segment_name

    for t in (EPOCH, EPOCH + 3599, 0.0):
        assert segment_start(segment_name(t)) == float(int(t))
    assert segment_start(segment_name(EPOCH, 2)) == EPOCH
    assert segment_start("gpumon-2026.jsonl.gz") is None and segment_start("notes.txt") is None


def test_a_torn_segment_reads_up_to_its_last_whole_record(tmp_path: Path) -> None:
    ticks: list[Tick] = []
    run(tmp_path, 120, segment_s=3600, keep=ticks)
    (seg,) = list_segments(str(tmp_path))
    data = Path(seg.path).read_bytes()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 9, len(data) - 1):
        torn = tmp_path / f"torn-{cut}.jsonl.gz"
        torn.write_bytes(data[:cut])
        trace = read_trace(str(torn))
        assert 0 < len(trace.ticks) <= 120
        assert any("without its end" in w for w in trace.warnings), trace.warnings
        want = [tick_to_dict(t) for t in read_trace(seg.path).ticks[: len(trace.ticks)]]
        assert [tick_to_dict(t) for t in trace.ticks] == want


def test_a_corrupt_segment_names_the_file_and_byte(tmp_path: Path) -> None:
    run(tmp_path, 120, segment_s=3600)
    (seg,) = list_segments(str(tmp_path))
    data = bytearray(Path(seg.path).read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8] = b"\xff" * 8
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError) as e:
        read_trace(str(bad))
    assert str(bad) in str(e.value) and "byte " in str(e.value)


def test_sharing_a_range_among_processes_changes_nothing(tmp_path: Path) -> None:
    import json

    from gpumon.analyze.trace_report import to_json

    run(tmp_path, 300, "starved-cpu,healthy,starved-io", segment_s=120)
    alone = to_json(analyze_range(str(tmp_path), EPOCH, EPOCH + 400, jobs=1))
    shared = to_json(analyze_range(str(tmp_path), EPOCH, EPOCH + 400, jobs=2))
    assert json.dumps(alone, sort_keys=True) == json.dumps(shared, sort_keys=True)
    assert [g["index"] for g in shared["gpus"]] == [0, 1, 2]


def test_a_tick_is_on_disk_and_read_by_analyze_from_within_5_s_of_tick_time(tmp_path: Path) -> None:
    """The recorder hands ticks to the OS every 5 s of their own time (SYNC_EVERY_S), not every
    tick: what is older than that is decodable on disk while the segment is still being written."""
    header = {"type": "header", "format": "gpumon-trace", "hostname": "h", "started_unix_s": EPOCH}
    header |= {"gpumon_version": "0", "interval_s": 1.0, "source": {"kind": "simulated"}}
    writer = TraceWriterV2(str(tmp_path / "gpumon-20261129T220000Z.jsonl.gz"), header, sync_every_s=5.0)
    ticks = [Tick(t_s=float(t), gpus=(), host=None) for t in range(1, 13)]
    on_disk = []
    for tick in ticks:
        writer.write_tick(tick)
        on_disk.append(len(read_trace(writer.path).ticks))
    # the first tick at once; then every 5 s of tick time, each sync taking the ticks before it
    assert on_disk == [1, 1, 1, 1, 1, 6, 6, 6, 6, 6, 11, 11]
    assert all(n >= i + 1 - 5 for i, n in enumerate(on_disk)), "never more than 5 s of ticks held back"
    writer.sync()
    assert len(read_trace(writer.path).ticks) == 12
    writer.close(writer.last_t_s, "duration")
    assert read_trace(writer.path).end is not None


def test_flush_puts_every_submitted_tick_where_analyze_from_reads_it(tmp_path: Path) -> None:
    rec = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, block=True)
    rec.start()
    for t in range(1, 4):
        rec.submit(Tick(t_s=float(t), gpus=(), host=None))
    rec.flush()
    (seg,) = list_segments(str(tmp_path))
    assert len(read_trace(seg.path).ticks) == 3, "a segment still open reads to its last tick"
    rec.close()


def test_a_segment_synced_after_every_tick_by_the_previous_recorder_still_reads(tmp_path: Path) -> None:
    header = {"type": "header", "format": "gpumon-trace", "hostname": "h", "started_unix_s": EPOCH}
    header |= {"gpumon_version": "0", "interval_s": 1.0, "source": {"kind": "simulated"}}
    old = TraceWriterV2(str(tmp_path / "gpumon-20261129T220000Z.jsonl.gz"), header)  # sync_every_s=0
    new = TraceWriterV2(str(tmp_path / "gpumon-20261129T230000Z.jsonl.gz"), header, sync_every_s=5.0)
    for w in (old, new):
        for t in range(1, 31):
            w.write_tick(Tick(t_s=float(t), gpus=(), host=None))
        w.close(w.last_t_s, "duration")
    assert [len(read_trace(w.path).ticks) for w in (old, new)] == [30, 30]
    assert os.path.getsize(new.path) < os.path.getsize(old.path)


def test_held_until_the_first_sample_is_out_then_every_tick_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's recorder takes no tick (and opens no segment) until it is released (the first
    sample published): the first segment's opening never competes with the first sample. The
    ticks that came meanwhile wait in the queue and are all written after it, at once (not at the
    recorder's next SYNC_EVERY_S)."""
    import gpumon.trace.recorder as recorder

    monkeypatch.setattr(recorder, "SYNC_EVERY_S", 3600.0)
    opened = threading.Event()

    def watched(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        opened.set()
        return TraceWriterV2(path, header, origin_s=origin)

    pipeline = simulated_pipeline("starved-cpu")
    rec = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, open_writer=watched, held=True)
    rec.start()
    pipeline.on_tick(rec.submit)
    pipeline.run(5)
    assert not opened.wait(0.5), "a segment was opened before the first sample was out"
    rec.release()
    assert opened.wait(30), "released, the recorder did not take the ticks queued meanwhile"
    rec.flush()
    rec.close()
    pipeline.close()
    (segment,) = list_segments(str(tmp_path))
    assert [round(t.t_s) for t in read_trace(segment.path).ticks] == [1, 2, 3, 4, 5]


def test_a_stop_before_the_first_sample_does_not_wait_for_it(tmp_path: Path) -> None:
    """A daemon stopped while its driver still opens (no sample, the recorder still held) stops at
    once: the recorder's thread ends without waiting out its hold."""
    rec = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, held=True)
    rec.start()
    thread = rec._thread
    assert thread is not None
    rec.close(timeout_s=0.5)
    assert not thread.is_alive()
    assert list_segments(str(tmp_path)) == []


def test_in_real_time_the_thread_writes_what_queued_in_one_go_losing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorder in real time wakes every SYNC_EVERY_S (not for every tick: woken per tick, it took
    a fifth of an idle daemon's CPU), or at once when its queue is half full, for a flush or a
    stop; every tick submitted is written, in order."""
    import gpumon.trace.recorder as recorder

    monkeypatch.setattr(recorder, "SYNC_EVERY_S", 3600.0)  # never woken by the clock in this test
    opened = threading.Event()

    def watched(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        opened.set()
        return TraceWriterV2(path, header, origin_s=origin)

    source = {"kind": "simulated"}
    rec = Recorder(str(tmp_path), source, 1.0, lambda: EPOCH, queue_ticks=8, open_writer=watched)
    rec.start()
    for t in range(1, 4):
        rec.submit(Tick(t_s=float(t), gpus=(), host=None))
    assert not opened.wait(0.5), "woken for a tick, with the queue far from full"
    rec.submit(Tick(t_s=4.0, gpus=(), host=None))  # half of the queue's 8
    assert opened.wait(30), "a half-full queue did not wake the recorder"
    for t in range(5, 8):
        rec.submit(Tick(t_s=float(t), gpus=(), host=None))
    rec.close()
    assert rec.stats().dropped_ticks == 0
    (segment,) = list_segments(str(tmp_path))
    assert [round(t.t_s) for t in read_trace(segment.path).ticks] == [1, 2, 3, 4, 5, 6, 7]


def test_a_simulation_that_stops_ticking_has_its_last_ticks_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At full speed (`block`) the thread is woken for every tick; when none comes for
    SYNC_EVERY_S (a replay that ended, a stalled simulation) the ticks written so far reach the OS,
    decodable, without waiting for the daemon to stop."""
    import time

    import gpumon.trace.recorder as recorder

    def writer(path: str, header: dict[str, Any], origin: float) -> TraceWriterV2:
        return TraceWriterV2(path, header, origin_s=origin, sync_every_s=5.0)  # 5 s of tick time

    monkeypatch.setattr(recorder, "SYNC_EVERY_S", 0.05)  # the thread's wait: 5 s would do, slower
    source = {"kind": "simulated"}
    rec = Recorder(str(tmp_path), source, 1.0, lambda: EPOCH, block=True, open_writer=writer)
    rec.start()
    for t in (1.0, 2.0, 3.0):  # the writer syncs the first at once, the next only 5 s of ticks on
        rec.submit(Tick(t_s=t, gpus=(), host=None))
    on_disk: list[float] = []
    deadline = time.monotonic() + 30
    while len(on_disk) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        segments = list_segments(str(tmp_path))
        on_disk = [t.t_s for t in read_trace(segments[0].path).ticks] if segments else []
    assert on_disk == [1.0, 2.0, 3.0]
    rec.close()


def test_a_second_daemon_on_the_same_directory_waits_for_the_first_to_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two daemons recording into one directory wrote segments side by side, and `analyze --from`
    skipped one's ticks as out of order (found by a hostile-input pass): the second pauses, says
    who records there, and takes over once the first stops (its retry, RETRY_S later)."""
    from gpumon.trace.recorder import RETRY_S

    first = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, block=True)
    second = Recorder(str(tmp_path), {"kind": "simulated"}, 1.0, lambda: EPOCH, block=True)
    first.start()
    second.start()
    pipeline = simulated_pipeline("healthy")
    ticks: list[Tick] = []
    pipeline.on_tick(ticks.append)
    pipeline.run(60)
    pipeline.close()
    with caplog.at_level(logging.INFO, logger="gpumon"):
        for t in ticks[:20]:
            first.submit(t)
        first.flush()  # the first records (and holds the directory)
        for t in ticks[:20]:
            second.submit(t)
        second.flush()
        stopped = second.stats()
        first.close()  # the first daemon stops: its lock goes with it
        for t in ticks[20:]:
            second.submit(t)
        second.close()
    assert not stopped.up and f"pid {os.getpid()}" in (stopped.paused_reason or "")
    assert "another gpumon records here" in (stopped.paused_reason or "")
    kept = [read_trace(s.path) for s in list_segments(str(tmp_path))]
    assert [len(k.ticks) for k in kept[:1]] == [20], "the first's segment, whole"
    taken_over = sum(len(k.ticks) for k in kept[1:])
    assert 60 - 20 - RETRY_S - 1 <= taken_over <= 60 - 20, "the second records from its next retry"
    assert any("resumed" in r.getMessage() for r in caplog.records)
