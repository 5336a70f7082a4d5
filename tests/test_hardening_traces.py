"""Small traces that would cost large amounts (issue 28, item 5): every input ends in a documented
exit code, in time bounded by the file's size (a version 2 file inflates at most MAX_RATIO times)
and in memory bounded by what is printed (warnings: a few per kind and a count; lines: at most
MAX_LINE_BYTES read; `analyze`'s text report: episodes, not ticks)."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpumon.analyze.trace_report import analyze
from gpumon.cli import main
from gpumon.core.errors import TraceError
from gpumon.trace.gzipped import MAX_RATIO, GzipRecordWriter
from gpumon.trace.reader import WARNINGS_PER_KIND, read_trace
from gpumon.trace.records import MAX_LINE_BYTES, make_header

from .conftest import gpumon
from .memory import peak_bytes

HEADER = json.dumps({**make_header({"kind": "simulated"}, 1.0), "version": 2}).encode() + b"\n"


def gzip_in_one_go(path: Path, parts: Iterable[bytes]) -> int:
    """What a bomb-maker does: everything in one deflate stream, no flushes, level 9."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        for part in parts:
            f.write(z.compress(part))
        f.write(z.flush())
    return path.stat().st_size


def flushed(path: Path, records: Iterable[bytes]) -> int:
    """As gpumon's own writer does: a sync flush after every record."""
    w = GzipRecordWriter(str(path), force=True)
    for r in records:
        w.write(r)
    w.finish()
    return path.stat().st_size


def tick(dt_us: int, util: float = 0.5) -> bytes:
    return (
        json.dumps({"dt_us": dt_us, "gpus": [{"index": 0, "util_ratio": util}], "host": None}).encode()
        + b"\n"
    )


# -- decompression bombs ---------------------------------------------------------------------------

MIB = 1024 * 1024

BOMBS = {
    "zeros in one line": lambda: (HEADER, *(b"\0" * MIB for _ in range(300))),
    "spaces in one line": lambda: (HEADER, *(b" " * MIB for _ in range(300))),
    "empty lines": lambda: (HEADER, *(b"\n" * MIB for _ in range(300))),
    "ignored records": lambda: (HEADER, *(b'{"type":"x"}\n' * 80_000 for _ in range(300))),
    "repeated ticks": lambda: (HEADER, tick(1_000_000), *(tick(0) * 20_000 for _ in range(300))),
    "a huge header": lambda: (HEADER[:-3], *(b" " * MIB for _ in range(300)), b"}\n"),
}


@pytest.mark.parametrize("shape", list(BOMBS))
def test_a_decompression_bomb_is_refused_as_one_in_bounded_time(tmp_path: Path, shape: str) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    size = gzip_in_one_go(bomb, BOMBS[shape]())
    assert size < 1_500_000  # 300 MB inflated, from a few hundred KB
    p = gpumon("analyze", str(bomb), timeout=60)
    assert p.returncode == 4, p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and str(bomb) in line
    # the right reason: the bomb, or what its first megabytes already break (never "header only")
    assert "header only" not in line
    assert f"more than {MAX_RATIO} times" in line or "refused unread" in line or "not valid JSON" in line, (
        line
    )


def test_a_bombs_inflation_stops_at_the_ratio(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    size = gzip_in_one_go(bomb, BOMBS["repeated ticks"]())
    with pytest.raises(TraceError) as e:
        read_trace(str(bomb))
    assert f"more than {MAX_RATIO} times" in str(e.value)
    byte = int(str(e.value).split("byte ")[1].split(":")[0])
    assert byte <= size, "refused before the end of the compressed file"


def test_gpumons_own_segments_and_a_regzipped_trace_are_not_bombs(tmp_path: Path) -> None:
    own = tmp_path / "own.jsonl.gz"
    flushed(own, [HEADER, *(tick(1_000_000, (i % 7) / 10) for i in range(20_000))])
    assert len(read_trace(str(own)).ticks) == 20_000
    again = tmp_path / "again.jsonl.gz"  # zcat | gzip -9 of an idle GPU: about 64 times smaller
    gzip_in_one_go(again, [HEADER, *(tick(50_000, 0.0) for _ in range(20_000))])
    assert len(read_trace(str(again)).ticks) == 20_000


# -- lines and warnings ----------------------------------------------------------------------------


def test_a_gigabyte_line_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:
        f.write(json.dumps({**make_header({"kind": "simulated"}, 1.0), "version": 1}).encode() + b"\n")
        f.truncate(2**30)  # a sparse gigabyte of NULs: no disk used

    def read() -> None:
        with pytest.raises(TraceError) as e:
            read_trace(str(huge))
        assert f"more than {MAX_LINE_BYTES} bytes" in str(e.value) and ":2:" in str(e.value)

    assert peak_bytes(read) < 3 * MAX_LINE_BYTES  # not the gigabyte: the line's allowed length


def test_warnings_are_a_few_per_kind_and_a_count(tmp_path: Path) -> None:
    trace = tmp_path / "repeats.jsonl.gz"
    flushed(trace, [HEADER, tick(1_000_000), *(tick(0) for _ in range(50_000))])
    t = read_trace(str(trace))
    repeated = [w for w in t.warnings if "repeated t_s" in w]
    assert len(repeated) == WARNINGS_PER_KIND + 1, t.warnings
    assert f"{50_000 - WARNINGS_PER_KIND} more warning(s)" in repeated[-1]


def test_ignored_records_are_ignored_only_so_many_in_a_row(tmp_path: Path) -> None:
    trace = tmp_path / "ignored.jsonl.gz"
    flushed(
        trace, [HEADER, tick(1_000_000), *(b'{"type":"future"}\n' for _ in range(20_000)), tick(1_000_000)]
    )
    with pytest.raises(TraceError) as e:
        read_trace(str(trace))
    assert "records in a row of a type this gpumon does not know" in str(e.value)
    fine = tmp_path / "some.jsonl.gz"  # a newer gpumon's few extra records: read past
    flushed(fine, [HEADER, tick(1_000_000), b'{"type":"future"}\n', tick(1_000_000)])
    assert len(read_trace(str(fine)).ticks) == 2


def test_a_5000_digit_number_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "digits.jsonl"
    header = json.dumps({**make_header({"kind": "simulated"}, 1.0), "version": 1})
    trace.write_text(header + "\n" + '{"type":"tick","t_s":' + "9" * 5000 + ',"gpus":[],"host":null}\n')
    code = main(["analyze", str(trace)])
    err = capsys.readouterr().err
    assert code == 4 and f"{trace}:2" in err and "5000 digits" in err and "internal error" not in err, err


# -- analyze's memory grows with what it prints, not with the ticks --------------------------------


def test_the_text_report_takes_no_more_memory_for_ten_times_the_ticks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def trace(n: int) -> Path:
        # one steady state: the episodes (what the report prints) do not grow with the ticks
        path = tmp_path / f"t{n}.jsonl.gz"
        flushed(path, [HEADER, *(tick(1_000_000, 0.3 + (i % 5) / 100) for i in range(n))])
        return path

    short, long = trace(800), trace(8_000)
    peak_short = peak_bytes(lambda: main(["analyze", str(short)]))
    peak_long = peak_bytes(lambda: main(["analyze", str(long)]))
    capsys.readouterr()
    # (not exactly equal: garbage in reference cycles waits for the collector a little longer in a
    # longer run; reading whole, ten times the ticks took ten times the memory)
    assert peak_long < 2 * peak_short, (peak_short, peak_long)
    # and --json keeps one small row per window, far less than the samples
    medium = trace(3_000)
    rows = peak_bytes(lambda: analyze(str(medium), keep="rows"))
    whole = peak_bytes(lambda: analyze(str(medium), keep="all"))
    assert rows < whole / 2, (rows, whole)


def test_json_rows_are_the_verdicts_the_whole_analysis_lists(tmp_path: Path) -> None:
    from gpumon.analyze.trace_report import to_json

    path = tmp_path / "t.jsonl.gz"
    flushed(path, [HEADER, *(tick(1_000_000, 0.9 if (i // 60) % 2 else 0.2) for i in range(600))])
    whole, rows = to_json(analyze(str(path))), to_json(analyze(str(path), keep="rows"))
    assert json.dumps(whole, sort_keys=True) == json.dumps(rows, sort_keys=True)
    assert os.path.getsize(path) > 0
