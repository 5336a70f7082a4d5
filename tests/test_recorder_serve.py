"""The recorder inside `gpumon serve`: its metrics, what a kill -9 costs, and /api/v1/analysis.
One daemon for the module, simulated at 20x real time, recording into a temporary directory."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.trace.reader import read_trace
from gpumon.trace.segments import list_segments

from .conftest import free_port, start_serve


def get(url: str, timeout: float = 60) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def analysis(url: str, query: str, deadline_s: float = 240) -> tuple[int, bytes, str | None]:
    """GET /api/v1/analysis as a polite client does: a 429 (the CPU budget spent, or another query
    running) is asked again after its Retry-After. A replayed range runs at nice 19, so beside
    CPU-bound work it takes long: the deadline is generous (a scrape never waits for it)."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/analysis?{query}", timeout=deadline_s) as r:
                return r.status, r.read(), r.headers["X-Gpumon-Analysis"]
        except urllib.error.HTTPError as e:
            if e.code != 429 or time.monotonic() > give_up:
                return e.code, e.read(), None
            time.sleep(min(5.0, float(e.headers.get("Retry-After") or 1)))


def wait_state(url: str, ok, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = json.loads(get(url + "/api/v1/state", 5)[1])
            if ok(state):
                return state
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, "the daemon never got there"
        time.sleep(0.2)


def written_s(state: dict) -> float:
    rec = state.get("recorder") or {}
    if rec.get("newest_unix_s") is None or rec.get("oldest_unix_s") is None:
        return 0.0
    return float(rec["newest_unix_s"] - rec["oldest_unix_s"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    directory = tmp_path_factory.mktemp("recordings")
    port = free_port()
    proc = start_serve(
        "--simulate", "starved-cpu,healthy", "--speed", "20", "--record-dir", str(directory), port=port
    )
    url = f"http://127.0.0.1:{port}"
    # 200 ticks written (not only sampled: the recorder writes from its own queue), 1 s apart on the
    # simulated clock, which the recorder stamps from start + t_s
    wait_state(url, lambda s: written_s(s) >= 200)
    yield url, directory
    proc.terminate()
    proc.wait(10)


def iso(unix_s: float) -> str:
    from urllib.parse import quote

    return quote(datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat())


def test_the_recorder_shows_in_metrics_and_state(daemon: tuple[str, Path]) -> None:
    url, directory = daemon
    metrics = get(url + "/metrics")[1].decode()
    assert "gpumon_recorder_up 1.0" in metrics
    for name in ("written_bytes_total", "segments", "disk_bytes", "errors_total", "dropped_ticks_total"):
        assert f"gpumon_recorder_{name}" in metrics
    state = json.loads(get(url + "/api/v1/state")[1])
    rec = state["recorder"]
    assert rec["directory"] == str(directory) and rec["up"] and rec["errors"] == 0
    assert list_segments(str(directory)), "segments on disk"


def test_analysis_over_http_reports_the_starved_gpu(daemon: tuple[str, Path]) -> None:
    url, _ = daemon
    rec = json.loads(get(url + "/api/v1/state")[1])["recorder"]
    since, until = rec["oldest_unix_s"], rec["newest_unix_s"] + 1
    status, body, _ = analysis(url, f"since={iso(since)}&until={iso(until)}")
    assert status == 200, body
    doc = json.loads(body)
    assert [g["verdict"] for g in doc["gpus"]] == ["starved-cpu", "healthy"]
    # the whole recording, to the ticks already handed to the disk (every 5 s of its own time): its
    # 200 s hold fewer ticks than seconds when the simulated 20x clock outruns a loaded machine's
    # sampler (189 ticks, beside CPU hogs), so the span is asserted, not a count
    r = doc["range"]
    assert r["first_unix_s"] <= since + 2 and r["last_unix_s"] >= rec["newest_unix_s"] - 6, (r, rec)
    assert r["ticks"] >= 100, r
    status, body, _ = analysis(url, f"since={iso(since)}&until={iso(until)}&gpu=1")
    assert status == 200 and [g["index"] for g in json.loads(body)["gpus"]] == [1]
    plain = datetime.datetime.fromtimestamp(since, datetime.UTC).isoformat()  # '+' left unescaped
    assert analysis(url, f"since={plain}&until={iso(until)}")[0] == 200


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("since=yesterday", 400, "not a time"),
        ("since=2d&until=now", 400, "not a time"),
        ("since=3d", 400, "more than 86400 s"),
        ("colour=red", 400, "unknown parameter"),
        ("gpu=zero", 400, "gpu"),
        ("since=2000-01-01T00:00&until=2000-01-01T01:00", 404, "no samples between"),
    ],
)
def test_a_bad_analysis_request_is_one_line_of_json(
    daemon: tuple[str, Path], query: str, status: int, says: str
) -> None:
    url, _ = daemon
    got, body, _ = analysis(url, query)
    assert got == status, body
    assert says in json.loads(body)["error"]


def test_scrapes_go_on_while_an_analysis_runs(daemon: tuple[str, Path]) -> None:
    import threading

    url, _ = daemon
    rec = json.loads(get(url + "/api/v1/state")[1])["recorder"]
    # the recording's first minute: older than the daemon's verdict log, so replayed in a process
    # of its own
    query = f"since={iso(rec['oldest_unix_s'])}&until={iso(rec['oldest_unix_s'] + 60)}"
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(analysis(url, query)[0]))
    worker.start()
    scrapes: list[int] = []
    during = 0
    busy = []
    while worker.is_alive():
        scrapes.append(get(url + "/metrics", 5)[0])
        during += worker.is_alive()  # answered, and the analysis still running
        busy.append(get(f"{url}/api/v1/analysis?since=1h")[0])
    worker.join()
    assert results == [200]
    assert scrapes and set(scrapes) == {200} and during >= 1, "a scrape never waits for an analysis"
    assert set(busy) <= {200, 429}, "another query while one runs: 429 (or its own answer after)"


def test_a_recent_range_is_answered_in_process(daemon: tuple[str, Path]) -> None:
    url, _ = daemon
    status, body, how = analysis(url, "since=60s")
    assert status == 200 and how in ("in-process", "cached"), (status, how)
    doc = json.loads(body)
    assert [g["verdict"] for g in doc["gpus"]] == ["starved-cpu", "healthy"]
    assert 59 <= doc["range"]["ticks"] <= 60  # 60 s of the daemon's clock (simulated, at 20x)


def test_kill_9_loses_at_most_the_last_5_seconds(tmp_path: Path) -> None:
    port = free_port()
    proc = start_serve("--simulate", "healthy", "--interval", "0.2", "--record-dir", str(tmp_path), port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        state = wait_state(url, lambda s: s.get("ticks", 0) >= 40)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # two where the run crossed a segment's boundary on the wall clock (a fresh-machine run at 21:00)
    segments = list_segments(str(tmp_path))
    assert 1 <= len(segments) <= 2, segments
    traces = [read_trace(seg.path) for seg in segments]
    trace = traces[-1]
    assert trace.end is None and any("without its end" in w for w in trace.warnings)
    # the recorder hands its ticks to the OS every 5 s (SYNC_EVERY_S): 25 at 0.2 s, and the one in hand
    assert sum(len(t.ticks) for t in traces) >= state["ticks"] - 26, "at most 5 s of ticks lost"


def test_simulated_gpus_are_not_recorded_unless_asked(tmp_path: Path) -> None:
    port = free_port()
    proc = start_serve("--simulate", "healthy", port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        state = wait_state(url, lambda s: s.get("ticks", 0) >= 2)
        assert state["recorder"] is None
        assert "gpumon_recorder_up" not in get(url + "/metrics")[1].decode()
        status, body = get(url + "/api/v1/analysis")
        assert status == 404 and "recorder is off" in json.loads(body)["error"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_runs_for_its_duration_and_ends_its_segment_cleanly(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "serve",
            "--simulate",
            "starved-cpu",
            "--speed",
            "max",
            "--duration",
            "7200",
            "--record-dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    assert p.returncode == 0, p.stderr
    segments = list_segments(str(tmp_path))
    assert 2 <= len(segments) <= 3
    traces = [read_trace(s.path) for s in segments]
    assert all(t.end is not None for t in traces) and traces[-1].end["reason"] == "stopped"
    assert sum(len(t.ticks) for t in traces) == 7200
