"""Trace files: round trip, recovery of a killed recording, and refusals that name file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.collect.sampler import Sampler
from gpumon.collect.sources.host import HostSource
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.collect.sources.replay import ReplayHost, ReplaySource
from gpumon.core.clock import VirtualClock
from gpumon.core.errors import OutputError, TraceError
from gpumon.sim.fakehost import FakeHost
from gpumon.sim.fakenvml import FakeNvml
from gpumon.sim.fleet import Fleet
from gpumon.sim.scenarios import parse_scenarios
from gpumon.trace.reader import read_trace
from gpumon.trace.records import make_header, tick_to_dict
from gpumon.trace.writer import TraceWriter


def record(path: Path, seconds: int = 20, scenarios: str = "starved-io,healthy,idle") -> list[dict]:
    clock = VirtualClock()
    fleet = Fleet(parse_scenarios(scenarios), None, 1, clock)
    nvml = NvmlSource(FakeNvml(fleet))
    nvml.open()
    writer = TraceWriter(str(path), make_header({"kind": "simulated"}, 1.0))
    seen: list[dict] = []
    sampler = Sampler(
        nvml,
        HostSource(FakeHost(fleet)),
        clock,
        on_tick=[writer.write_tick, lambda t: seen.append(tick_to_dict(t))],
    )
    sampler.run(duration_s=seconds)
    writer.close(clock.now(), "duration")
    return seen


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    written = record(path)
    trace = read_trace(str(path))
    assert trace.warnings == []
    assert trace.header["format"] == "gpumon-trace" and trace.header["version"] == 1
    assert trace.end is not None and trace.end["ticks"] == 20
    assert [tick_to_dict(t) for t in trace.ticks] == written
    assert trace.gpu_count == 3 and trace.duration_s == pytest.approx(19.0)
    assert any(g.util_history for g in trace.ticks[5].gpus)
    assert trace.ticks[5].host is not None and trace.ticks[5].host.processes


def test_killed_recording_keeps_every_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path)
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    cut = b"".join(lines[:11]) + lines[11][: len(lines[11]) // 2]  # killed mid-write of tick 11
    path.write_bytes(cut)
    trace = read_trace(str(path))
    assert len(trace.ticks) == 10
    assert any("partial last line" in w for w in trace.warnings)
    assert any("did not stop cleanly" in w for w in trace.warnings)


def test_replay_gives_back_the_recorded_ticks_restamped(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, seconds=10)
    trace = read_trace(str(path))
    clock = VirtualClock(500.0)
    replay = ReplaySource(trace)
    got = []
    s = Sampler(replay, ReplayHost(replay), clock, on_tick=[got.append])
    s.run(exhausted=lambda: replay.exhausted)
    assert len(got) == 10
    for orig, new in zip(trace.ticks, got):
        shift = new.t_s - orig.t_s
        assert shift == pytest.approx(got[0].t_s - trace.ticks[0].t_s)
        assert [g.util_ratio for g in new.gpus] == [g.util_ratio for g in orig.gpus]
        assert [len(g.util_history) for g in new.gpus] == [len(g.util_history) for g in orig.gpus]
        assert new.host is not None and new.host.cpu_ratio == orig.host.cpu_ratio


def test_replay_at_a_slower_cadence_keeps_all_sub_second_history(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(path, seconds=12)
    trace = read_trace(str(path))
    replay = ReplaySource(trace)
    got = []
    Sampler(replay, ReplayHost(replay), VirtualClock(), interval_s=3.0, on_tick=[got.append]).run(
        exhausted=lambda: replay.exhausted
    )
    total = sum(len(t.gpus[0].util_history) for t in trace.ticks)
    assert sum(len(t.gpus[0].util_history) for t in got) == total
    assert len(got) == 5  # the first tick, then 11 more recorded seconds in threes
    assert got[-1].gpus[0].util_ratio == trace.ticks[-1].gpus[0].util_ratio


def test_writer_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("precious\n")
    with pytest.raises(OutputError, match="already exists"):
        TraceWriter(str(path), make_header({}, 1.0))
    assert path.read_text() == "precious\n"
    TraceWriter(str(path), make_header({}, 1.0), force=True).close(None, "duration")
    assert path.read_text().startswith('{"type":"header"')


def _write(tmp_path: Path, *lines: str | dict) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


HEADER = {"type": "header", "format": "gpumon-trace", "version": 1, "interval_s": 1.0}
GPU = {"index": 0, "uuid": "GPU-x", "name": "n", "util_ratio": 0.5}


def tick(t: float, **extra) -> dict:
    return {"type": "tick", "t_s": t, "gpus": [dict(GPU, **extra)], "host": None}


def _many_gpus(t: float, n: int) -> dict:
    """A tick naming `n` GPUs that no tick before named."""
    gpus = [dict(GPU, index=i, uuid=f"GPU-{t:g}-{i}") for i in range(n)]
    return {"type": "tick", "t_s": t, "gpus": gpus, "host": None}


@pytest.mark.parametrize(
    "lines,line,reason",
    [
        ([], None, "empty file"),
        (["hello"], 1, "not valid JSON"),
        ([{"type": "tick"}], 1, "not a gpumon trace"),
        ([dict(HEADER, version=4)], 1, "newer than this gpumon reads"),
        ([HEADER, tick(1), "{oops", tick(3)], 3, "not valid JSON"),
        ([HEADER, tick(1), tick(0.5)], 3, "goes back in time"),
        ([HEADER, tick(1, util_ratio="high")], 2, "'util_ratio' must be a number"),
        ([HEADER, {"type": "tick", "gpus": []}], 2, "missing field 't_s'"),
        ([HEADER, tick(1, util_history=[[1.0]])], 2, "util_history entries"),
        ([HEADER, tick(1), HEADER], 3, "second header"),
        ([HEADER, [1, 2]], 2, "must be a JSON object"),
        # every GPU named is followed through the analysis: 20 ticks of 10,000 new GPUs each took
        # 1.6 GB (found by a hostile-input pass)
        (
            [HEADER, *(_many_gpus(t, 2000) for t in (1, 2, 3))],
            4,
            "more than 4096 GPUs in one trace",
        ),
    ],
)
def test_bad_traces_are_refused_with_file_line_and_reason(tmp_path: Path, lines, line, reason) -> None:
    path = _write(tmp_path, *lines) if lines else str(tmp_path / "empty")
    if not lines:
        Path(path).write_text("")
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert e.value.line == line and reason in e.value.reason
    assert str(e.value).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nothere\.jsonl: cannot open"):
        read_trace(str(tmp_path / "nothere.jsonl"))


def test_tolerated_oddities_are_documented_behaviour(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        HEADER,
        tick(1),
        tick(1),  # repeated timestamp: dropped with a warning
        {"type": "tick", "t_s": 2, "gpus": [{"index": 0}], "future_field": 1},  # missing fields
        {"type": "annotation", "text": "a future record type"},  # ignored
        {"type": "tick", "t_s": 3, "gpus": []},  # a GPU vanished
    )
    trace = read_trace(path)
    assert [t.t_s for t in trace.ticks] == [1, 2, 3]
    assert trace.ticks[1].gpus[0].util_ratio is None and trace.ticks[1].gpus[0].uuid == ""
    assert trace.ticks[2].gpus == ()
    assert any("repeated t_s" in w and ":3:" in w for w in trace.warnings)


def test_the_busiest_disks_utilization_is_kept_and_absent_in_older_traces() -> None:
    """Added within version 1: written where the host gave it, None when a trace has none."""
    from gpumon.core.model import HostSample, Tick
    from gpumon.trace.records import tick_from_dict

    host = HostSample(
        t_s=3.0,
        cpu_count=4,
        cpu_ratio=0.5,
        busiest_core_ratio=0.9,
        iowait_ratio=0.1,
        load1=2.0,
        disk_read_bytes_per_s=4e7,
        disk_busy_ratio=0.42,
    )
    d = tick_to_dict(Tick(3.0, (), host))
    back = tick_from_dict(d).host
    assert back is not None and back.disk_busy_ratio == 0.42
    del d["host"]["disk_busy_ratio"]
    older = tick_from_dict(d).host
    assert older is not None and older.disk_busy_ratio is None


def test_the_hosts_runnable_threads_are_kept_and_absent_in_older_traces(tmp_path: Path) -> None:
    """Added 2026-12-03 (/proc/loadavg's running count): written where the host gave it, in both
    trace versions; None in a trace without it; a count that is not a whole number is refused."""
    from gpumon.core.model import HostSample, Tick
    from gpumon.trace.records import BadRecord, make_header, tick_from_dict
    from gpumon.trace.writer import open_writer

    host = HostSample(3.0, 4, 0.5, 0.9, 0.1, 2.0, 4e7, runnable=5)
    d = tick_to_dict(Tick(3.0, (), host))
    assert d["host"]["runnable"] == 5
    back = tick_from_dict(d).host
    assert back is not None and back.runnable == 5
    del d["host"]["runnable"]
    older = tick_from_dict(d).host
    assert older is not None and older.runnable is None
    with pytest.raises(BadRecord, match="runnable"):
        tick_from_dict({**d, "host": {**d["host"], "runnable": 2.5}})
    for version in (1, 3):
        path = tmp_path / ("t.jsonl" if version == 1 else "t.jsonl.gz")
        w = open_writer(str(path), make_header({"kind": "simulated"}, 1.0), version)
        w.write_tick(Tick(3.0, (), host))
        w.finish("done")
        (tick,) = read_trace(str(path)).ticks
        assert tick.host is not None and tick.host.runnable == 5, version
