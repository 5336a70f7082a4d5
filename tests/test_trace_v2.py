"""Trace format version 2 (docs/trace-format.md): compact records in one gzip stream, read by every
reader as version 1 is, and converted both ways without loss."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from gpumon.core.errors import TraceError
from gpumon.core.model import HostSample, ProcessCpu, Tick
from gpumon.trace.compact import NAMES, Decoder, Encoder
from gpumon.trace.reader import read_trace
from gpumon.trace.records import tick_to_dict

from .conftest import ROOT, gpumon
from .test_cli import one_line_error


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("v1") / "run.jsonl"
    p = gpumon(
        "record",
        "--simulate",
        "starved-io,healthy,idle",
        "--duration",
        "120",
        "--speed",
        "max",
        "-o",
        str(path),
    )
    assert p.returncode == 0, p.stderr
    return path


def close_enough(a: object, b: object) -> bool:
    """Equal, but for version 2's recording precision (docs/trace-format.md "Precision")."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close_enough(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close_enough(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return abs(a - b) <= max(0.05, abs(a) * 0.005)  # watts to 0.1, shares to 0.001, rates to 3 digits
    return a == b


def test_converting_to_version_3_and_back_keeps_every_record_and_verdict(v1: Path, tmp_path: Path) -> None:
    v2, back = tmp_path / "run.gpt", tmp_path / "back.jsonl"
    p = gpumon("trace", "convert", str(v1), str(v2))
    assert p.returncode == 0 and "version 3" in p.stderr, p.stderr
    assert v2.read_bytes()[:2] == b"\x1f\x8b"
    assert v2.stat().st_size < v1.stat().st_size / 8
    assert gpumon("trace", "convert", str(v2), str(back)).returncode == 0
    a, b = read_trace(str(v1)), read_trace(str(v2))
    assert len(a.ticks) == len(b.ticks) and b.end == a.end and b.header["version"] == 3 and b.warnings == []
    assert all(close_enough(tick_to_dict(x), tick_to_dict(y)) for x, y in zip(a.ticks, b.ticks, strict=True))
    again, back_again = tmp_path / "again.gpt", tmp_path / "again.jsonl"
    assert gpumon("trace", "convert", str(back), str(again)).returncode == 0
    assert gpumon("trace", "convert", str(again), str(back_again)).returncode == 0
    assert back_again.read_text().splitlines()[1:] == back.read_text().splitlines()[1:], "precision is stable"
    verdicts = [json.loads(gpumon("analyze", str(f), "--json").stdout)["gpus"] for f in (v1, v2)]
    assert [[e["label"] for e in g["episodes"]] for g in verdicts[0]] == [
        [e["label"] for e in g["episodes"]] for g in verdicts[1]
    ]


def test_record_writes_version_3_unless_the_name_says_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "run.trace"
    p = gpumon("record", "--simulate", "healthy", "--duration", "5", "--speed", "max", "-o", str(out))
    assert p.returncode == 0 and "(trace format 3)" in p.stderr
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()  # zcat shows JSON Lines
    header = json.loads(lines[0])
    assert header["version"] == 3 and header["names"]["t"] == "dt_us" and "t" in json.loads(lines[1])
    assert json.loads(lines[-1])["type"] == "end"
    forced = tmp_path / "plain.trace"
    p = gpumon(
        "record",
        "--simulate",
        "healthy",
        "--duration",
        "3",
        "--speed",
        "max",
        "--format",
        "1",
        "-o",
        str(forced),
    )
    assert p.returncode == 0 and json.loads(forced.read_text().splitlines()[0])["version"] == 1


def test_either_version_reads_gzipped_or_not(v1: Path, tmp_path: Path) -> None:
    zipped_v1 = tmp_path / "v1.jsonl.gz"
    zipped_v1.write_bytes(gzip.compress(v1.read_bytes()))
    v2 = tmp_path / "v2.gpt"
    assert gpumon("trace", "convert", str(v1), str(v2)).returncode == 0
    plain_v2 = tmp_path / "v2.txt"
    plain_v2.write_bytes(gzip.decompress(v2.read_bytes()))
    for path, same_as in ((zipped_v1, v1), (plain_v2, v2)):
        want = [tick_to_dict(t) for t in read_trace(str(same_as)).ticks]
        assert want and [tick_to_dict(t) for t in read_trace(str(path)).ticks] == want


def _v2(records: list[dict]) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    return z.compress("".join(json.dumps(r) + "\n" for r in records).encode()) + z.flush()


HEADER = {"type": "header", "format": "gpumon-trace", "version": 2, "interval_s": 1.0, "source": {}}


@pytest.mark.parametrize(
    ("records", "says"),
    [
        ([HEADER], "no ticks"),
        ([HEADER, {"dt_us": -5, "gpus": [], "host": None}], "dt_us"),
        ([HEADER, {"dt_us": 1.5, "gpus": [], "host": None}], "dt_us"),
        (
            [HEADER, {"dt_us": 1000000, "gpus": [{"index": 0, "util_history": [1, 0.5, 2]}], "host": None}],
            "even length",
        ),
        ([HEADER, {"dt_us": 1000000, "gpus": [{"index": "0"}], "host": None}], "index"),
        ([HEADER, {"dt_us": 1000000, "gpus": []}], "host"),
        (
            [HEADER, {"dt_us": 1000000, "gpus": [], "host": {"processes": [{"pid": 7, "born_us": 1.5}]}}],
            "'born_us' must be whole microseconds",
        ),
        (  # inherited by every tick after it, read again for each
            [
                HEADER,
                {"dt_us": 1000000, "gpus": [], "host": {"processes": [{"pid": k} for k in range(70_000)]}},
            ],
            "70000 processes in one list, more than 65536",
        ),
        (
            [
                HEADER,
                {"dt_us": 1000000, "gpus": [{"index": 0, "processes": [{"pid": 1}] * 4097}], "host": None},
            ],
            "more than 4096",
        ),
    ],
)
def test_a_bad_version_2_record_is_refused_naming_file_record_and_byte(
    tmp_path: Path, records: list[dict], says: str
) -> None:
    path = tmp_path / "bad.gpt"
    path.write_bytes(_v2(records))
    p = gpumon("analyze", str(path))
    assert p.returncode == 4 and "Traceback" not in p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert str(path) in line and says in line, line
    if says != "no ticks":
        assert "record 2 (byte " in line


def test_two_streams_joined_are_refused_at_the_second_header(v1: Path, tmp_path: Path) -> None:
    v2 = tmp_path / "v2.gpt"
    assert gpumon("trace", "convert", str(v1), str(v2)).returncode == 0
    joined = tmp_path / "joined.gpt"
    joined.write_bytes(v2.read_bytes() * 2)
    with pytest.raises(TraceError, match="a second header"):
        read_trace(str(joined))


def test_kill_9_of_record_keeps_every_whole_record(tmp_path: Path) -> None:
    out = tmp_path / "t.gpt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "record",
            "--simulate",
            "starved-cpu",
            "--speed",
            "20",
            "-o",
            str(out),
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    seen = 0
    while time.monotonic() < deadline and seen < 8:
        time.sleep(0.05)
        try:
            seen = zlib.decompressobj(31).decompress(out.read_bytes()).count(b"\n")
        except (OSError, zlib.error):
            seen = 0
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    on_disk = zlib.decompressobj(31).decompress(out.read_bytes()).count(b"\n")
    trace = read_trace(str(out))
    assert len(trace.ticks) >= 7 and len(trace.ticks) == on_disk - 1  # all but the header
    assert trace.end is None and any("without its end" in w for w in trace.warnings)


def test_version_2_is_still_written_on_request_and_reads_as_version_3_does(v1: Path, tmp_path: Path) -> None:
    """For a gpumon from before version 3 (a fleet upgraded node by node): `--to 2` writes field
    names in full, and both read back to the same ticks; version 3 is the smaller."""
    v2, v3 = tmp_path / "run.v2", tmp_path / "run.v3"
    assert gpumon("trace", "convert", str(v1), str(v2), "--to", "2").returncode == 0
    assert gpumon("trace", "convert", str(v1), str(v3)).returncode == 0
    first = gzip.decompress(v2.read_bytes()).decode().splitlines()
    assert json.loads(first[0])["version"] == 2 and "names" not in json.loads(first[0])
    assert "dt_us" in json.loads(first[1])
    a, b = read_trace(str(v2)), read_trace(str(v3))
    assert a.ticks and [tick_to_dict(t) for t in a.ticks] == [tick_to_dict(t) for t in b.ticks]
    assert v3.stat().st_size < v2.stat().st_size * 0.95


def test_version_3_names_no_field_twice_and_no_short_name_is_a_field() -> None:
    """A short name that is also some field's full name would be read as the wrong field."""
    from gpumon.core.model import GpmActivity, GpuSample, HostSample, ProcessCpu
    from gpumon.trace.compact import NAMES
    from gpumon.trace.records import gpu_to_dict, host_to_dict

    assert len(set(NAMES.values())) == len(NAMES)
    gpu = gpu_to_dict(GpuSample(0.0, 0, "GPU-0", "x", mig=1, gpm=GpmActivity(*[0.5] * 10), clock_events=0))
    proc = ProcessCpu(1, "p", 0.5, 0.5, 0.5, 1, 0.0)
    host = host_to_dict(HostSample(0.0, 8, 0.5, 0.5, 0.0, 1.0, 0.0, (proc,)))
    fields = {"dt_us", "gpus", "host", "source_errors", *gpu, *gpu["gpm"], *host, *host["processes"][0]}
    fields |= {"gpu_mem_bytes", "pid", "error", "jobs", "xids", "last_xid", "clock_event_s"}
    fields |= {"disk_busy_ratio", "runnable"}
    fields |= {"busiest_demand_ratio", "runq_wait_ratio", "blkio_wait_ratio", "age_s"}
    assert not fields & set(NAMES), fields & set(NAMES)
    assert fields <= set(NAMES.values()), fields - set(NAMES.values())


@pytest.mark.parametrize(
    ("names", "says"),
    [
        ("t=dt_us", "header field 'names' must be an object"),
        ({"t": "dt_us", "x": "dt_us"}, "two short names to one field"),
        ({"t": 5}, "must name a field in at most 64 characters"),
        ({"": "dt_us"}, "must name a field in at most 64 characters"),
        ({f"k{i}": f"f{i}" for i in range(300)}, "more than 256"),
    ],
)
def test_a_version_3_header_whose_names_are_not_a_table_is_refused(
    tmp_path: Path, names: object, says: str
) -> None:
    path = tmp_path / "bad.trace"
    path.write_bytes(_v2([{**HEADER, "version": 3, "names": names}, {"t": 1000000, "g": [], "h": None}]))
    p = gpumon("analyze", str(path))
    said = one_line_error(p)
    assert p.returncode == 4 and said.startswith(f"gpumon: error: {path}: record 1 (byte 0): "), p.stderr
    assert says in p.stderr


def test_a_version_3_field_not_in_the_header_table_is_read_by_its_full_name(tmp_path: Path) -> None:
    """A name the table lacks (a field a later gpumon adds, in full) is read as it is."""
    path = tmp_path / "partial.trace"
    names = {"t": "dt_us", "g": "gpus"}
    gpu = {"index": 0, "uuid": "GPU-0", "name": "x", "available": True, "util_ratio": 0.5}
    tick = {"t": 1000000, "g": [gpu], "host": None}
    path.write_bytes(_v2([{**HEADER, "version": 3, "names": names}, tick]))
    (read,) = read_trace(str(path)).ticks
    assert read.t_s == 1.0 and read.gpus[0].util_ratio == 0.5


@pytest.mark.parametrize("version", [1, 3])
def test_a_tick_that_comes_as_the_file_closes_is_dropped_not_written_after_the_end(
    tmp_path: Path, version: int
) -> None:
    """`record` closes its file on SIGTERM while the sampling thread may still be taking a tick: at
    full speed the last line was often a tick after the end record, or the end record counted one
    tick fewer than were written (found by a hostile-input pass). The end record is now written at
    the last tick written, and a tick after it is dropped."""
    from gpumon.core.model import Tick
    from gpumon.trace.records import make_header
    from gpumon.trace.writer import open_writer

    path = tmp_path / ("t.jsonl" if version == 1 else "t.jsonl.gz")
    w = open_writer(str(path), make_header({"kind": "simulated"}, 1.0), version)
    for t in (1.0, 2.0, 3.0):
        w.write_tick(Tick(t, (), None))
    w.finish("interrupted")
    w.write_tick(Tick(4.0, (), None))  # the sampling thread's tick, after the stop
    w.finish("interrupted")  # (a second close changes nothing)
    trace = read_trace(str(path))
    assert [t.t_s for t in trace.ticks] == [1.0, 2.0, 3.0] and not trace.warnings
    assert trace.end is not None and trace.end["ticks"] == 3 and trace.end["t_s"] == 3.0


@pytest.mark.parametrize("tail", [b"junk\n", b"\x00\x01not gzip", b"x" * 200_000])
def test_bytes_appended_after_a_whole_trace_leave_its_records_read(
    v1: Path, tmp_path: Path, tail: bytes
) -> None:
    """`echo junk >> trace.gz` made `analyze` refuse the whole trace (corrupt compressed data), while
    `analyze --from` read the same segment and warned (found by a hostile-input pass): every record
    before the stream's end stands, with a warning."""
    whole = tmp_path / "t.jsonl.gz"
    assert gpumon("trace", "convert", str(v1), str(whole)).returncode == 0
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(whole.read_bytes() + tail)
    want = [tick_to_dict(t) for t in read_trace(str(whole)).ticks]
    got = read_trace(str(damaged))
    assert [tick_to_dict(t) for t in got.ticks] == want and got.end is not None
    assert any("follows the end of the compressed stream" in w for w in got.warnings), got.warnings


def test_a_second_trace_joined_to_a_first_is_still_refused(v1: Path, tmp_path: Path) -> None:
    whole = tmp_path / "t.jsonl.gz"
    assert gpumon("trace", "convert", str(v1), str(whole)).returncode == 0
    joined = tmp_path / "joined.jsonl.gz"
    joined.write_bytes(whole.read_bytes() * 2)
    with pytest.raises(TraceError, match="second header"):
        read_trace(str(joined))


def test_the_files_close_waits_for_a_tick_being_written_from_another_thread(tmp_path: Path) -> None:
    """The sampling thread is inside a tick's write as the main thread closes the file: the end
    record comes after that tick, and counts it (review: the test above runs on one thread)."""
    import threading

    from gpumon.core.model import Tick
    from gpumon.trace.records import make_header
    from gpumon.trace.writer import open_writer

    path = tmp_path / "t.jsonl.gz"
    w = open_writer(str(path), make_header({"kind": "simulated"}, 1.0), 3)
    w.write_tick(Tick(1.0, (), None))
    inside, release = threading.Event(), threading.Event()
    real = w._write

    def slow(record: dict, *, sync: bool = True) -> None:
        if record.get("type") != "end":
            inside.set()
            assert release.wait(10)
        real(record, sync=sync)

    w._write = slow  # type: ignore[method-assign]
    sampler = threading.Thread(target=w.write_tick, args=(Tick(2.0, (), None),))
    sampler.start()
    assert inside.wait(10)
    closer = threading.Thread(target=w.finish, args=("interrupted",))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "the close waits for the tick being written"
    release.set()
    sampler.join(10)
    closer.join(10)
    trace = read_trace(str(path))
    assert [t.t_s for t in trace.ticks] == [1.0, 2.0]
    assert trace.end is not None and trace.end["ticks"] == 2 and trace.end["t_s"] == 2.0


def _aging_ticks(n: int, ages: bool) -> list[Tick]:
    """A job's process on the host, its age growing with ticks a live daemon's jitter apart."""
    rng = random.Random(7)
    ticks, t = [], 50.0
    for k in range(n):
        t += 1.0 + rng.uniform(-0.004, 0.004)
        procs = tuple(
            ProcessCpu(pid, "python", 1.0 + 0.01 * (k % 7), 0.5, 0.2, 3, None, age_s=round(a0 + t - 50.0, 1))
            if ages
            else ProcessCpu(pid, "python", 1.0 + 0.01 * (k % 7), 0.5, 0.2, 3, None)
            for pid, a0 in ((4242, 3.21), (4343, 1234.567))
        )
        ticks.append(Tick(t, (), HostSample(t, 8, 0.2, 0.5, 0.0, 1.0, 0.0, procs)))
    return ticks


def test_a_host_processs_age_is_recorded_as_its_birth_and_read_back_to_the_same_tenth() -> None:
    """An age grows every tick, and a gzip stream cannot guess the next one: it was 6% of a
    GPU-day. A version 2 or 3 record gives the birth (`born_us`), which stays the same number."""
    for names in (None, NAMES):
        enc, dec = Encoder(49.0, short_names=names is not None), Decoder(names)
        ticks = _aging_ticks(1200, ages=True)
        records = [json.loads(json.dumps(enc.encode(t))) for t in ticks]
        for tick, rec in zip(ticks, records, strict=True):
            got = dec.decode(rec)["host"]["processes"]
            assert [p["age_s"] for p in got] == [p.age_s for p in tick.host.processes]  # type: ignore[union-attr]
            assert all("born_us" not in p for p in got)
        kept = [json.dumps(r) for r in records]
        assert not any('"age_s"' in r or '"age"' in r for r in kept), "no age written where a birth gives it"

    def gzipped(ticks: list[Tick]) -> int:
        enc, z = Encoder(49.0, short_names=True), zlib.compressobj(9, zlib.DEFLATED, 31)
        body = b"".join(json.dumps(enc.encode(t), separators=(",", ":")).encode() + b"\n" for t in ticks)
        return len(z.compress(body) + z.flush())

    with_ages, without = gzipped(_aging_ticks(3600, ages=True)), gzipped(_aging_ticks(3600, ages=False))
    # written as ages: 5,251 bytes more (1.5 bytes a tick); as births: 704
    assert with_ages - without < 3600 * 2 / 4, f"two aging processes' hour: {with_ages} vs {without} bytes"


@pytest.mark.parametrize(
    ("ticks", "as_age"),
    [
        ([(1.0, float("inf"))], True),  # no birth gives it
        ([(1.0, -0.0)], True),  # 0.0 and -0.0 are two JSON values: a birth gives back 0.0
        ([(0.2, -0.1), (0.26, 0.0)], False),
        ([(9.99e10, -1e9)], True),  # its birth beyond what a reader takes (|born_us| <= 1e17)
    ],
)
def test_an_age_comes_back_as_sampled_even_where_no_birth_gives_it(
    ticks: list[tuple[float, float]], as_age: bool
) -> None:
    enc, dec = Encoder(0.0), Decoder()
    for t, age in ticks:
        proc = ProcessCpu(9, "python", 0.1, 0.0, 0.0, 0, None, age_s=age)
        rec = json.loads(
            json.dumps(enc.encode(Tick(t, (), HostSample(t, 8, 0.1, 0.1, 0.0, 0.0, 0.0, (proc,)))))
        )
        written = rec["host"]["processes"][0]
        assert ("age_s" in written) is as_age and ("born_us" in written) is not as_age, written
        back = dec.decode(rec)["host"]["processes"][0]["age_s"]
        assert repr(back) == repr(age), (t, age, back)


def test_a_version_1_trace_that_starts_before_zero_is_not_converted_into_a_file_none_can_read(
    tmp_path: Path,
) -> None:
    """Version 1 reads a negative t_s; version 3 counts from its start on, and wrote a negative
    dt_us that every reader then refused (found by a helper's fuzzing)."""
    v1 = tmp_path / "early.jsonl"
    gpu = {"index": 0, "uuid": "GPU-0", "name": "n", "available": True, "util_ratio": 0.0, "util_history": []}
    ticks = [{"type": "tick", "t_s": t, "gpus": [gpu], "host": None} for t in (-5.0, -4.0, -3.0)]
    header = {**HEADER, "version": 1}
    v1.write_text("".join(json.dumps(r) + "\n" for r in [header, *ticks]))
    out = tmp_path / "early.gpt"
    p = gpumon("trace", "convert", str(v1), str(out))
    assert p.returncode == 5, p.stderr
    line = one_line_error(p)
    assert str(out) in line and "t_s -5" in line and ".jsonl" in line, line
    assert read_trace(str(out)).ticks == [], "what it holds still reads: its header"
    kept = tmp_path / "kept.jsonl"
    assert gpumon("trace", "convert", str(v1), str(kept)).returncode == 0
    assert [t.t_s for t in read_trace(str(kept)).ticks] == [-5.0, -4.0, -3.0]
