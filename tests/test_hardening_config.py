"""Configuration from special files, flags a user mistypes, and the analysis API's refusals (issue
28, items 4 and 12): every input ends in a documented exit code or HTTP status, at once."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpumon.config.settings import Config
from gpumon.serve.analysis_api import AnalysisApi

from .conftest import ROOT, free_port, gpumon
from .test_recorder import EPOCH, iso, run

EXIT_CONFIG = 7


# -- config files that are not files -----------------------------------------------------------------


def test_check_config_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "gpumon.toml"
    os.mkfifo(fifo)  # nobody writes to it: reading would wait forever
    p = gpumon("serve", "--check-config", "--config", str(fifo), timeout=30)
    assert p.returncode == EXIT_CONFIG and "a FIFO, not a config file" in p.stderr, p.stderr


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_the_config_is_refused_before_it_is_read(path: str) -> None:
    p = gpumon("serve", "--check-config", "--config", path, timeout=30)
    assert p.returncode == EXIT_CONFIG and "character device" in p.stderr, p.stderr


def test_a_huge_config_file_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # a sparse gigabyte
    p = gpumon("serve", "--check-config", "--config", str(big), timeout=30)
    assert p.returncode == EXIT_CONFIG and "larger than 1024 KiB" in p.stderr, p.stderr


def test_a_sighup_after_the_config_became_a_fifo_keeps_serving_and_sigterm_stops(tmp_path: Path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text('simulate = "healthy"\n')
    log = tmp_path / "log"
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 30
        while "serving on" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        cfg.unlink()
        os.mkfifo(cfg)
        proc.send_signal(signal.SIGHUP)
        while "reload failed" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "a FIFO, not a config file" in log.read_text()


# -- flags ----------------------------------------------------------------------------------------


def test_record_off_is_the_record_setting_not_a_directory_named_off(tmp_path: Path) -> None:
    p = gpumon(
        "serve", "--simulate", "healthy", "--record", "off", "--speed", "max", "--duration", "3",
        "--listen", "127.0.0.1:0", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "off").exists() and "recording every sample" not in p.stderr
    p = gpumon("serve", "--simulate", "healthy", "--record-d", "x", "--check-config", cwd=tmp_path)
    assert p.returncode == 2 and "--record-d" in p.stderr, "no flag is taken by a prefix of its name"


@pytest.mark.parametrize(
    "listen,needle",
    [
        ("1.2.3.4.5:9877", "not an IPv4 address"),
        ("[zz]:9877", "not an IPv6 address"),
        ("::1:9877", "in brackets"),
        ("exa_mple.com:9877", "not an address or a host name"),
        ("203.0.113.7:9877", "not an address of this machine"),
    ],
)
def test_check_config_refuses_what_the_start_refuses(listen: str, needle: str) -> None:
    p = gpumon("serve", "--check-config", "--simulate", "healthy", "--listen", listen)
    assert p.returncode in (2, EXIT_CONFIG) and needle in p.stderr.strip().splitlines()[-1], p.stderr
    assert "Traceback" not in p.stderr


def test_check_config_refuses_a_jobs_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "jobs"
    f.write_text("")
    p = gpumon("serve", "--check-config", "--simulate", "healthy", env={"GPUMON_JOBS_DIR": str(f)})
    assert p.returncode == EXIT_CONFIG and "not a directory" in p.stderr, p.stderr


# -- the analysis API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rec")
    run(d, 120, segment_s=60)
    return d


def ask(api: AnalysisApi, query: str) -> tuple[int, dict[str, object]]:
    status, body, _ = asyncio.run(api.answer(query))
    return status, json.loads(body)


def test_the_analysis_api_refuses_since_after_until_with_400(recording: Path) -> None:
    api = AnalysisApi(str(recording), lambda: Config())
    status, doc = ask(api, f"since={iso(EPOCH + 100)}&until={iso(EPOCH + 50)}")
    assert status == 400 and "before until" in str(doc["error"]), doc


@pytest.mark.parametrize(
    ("query", "names"),
    [
        # a range near year 1 or 9999: the replay's start a window earlier, or the date in UTC, was
        # no date Python can write (a traceback and no answer at all, found by a hostile-input pass)
        ("since=9999-12-31T12:00-01:00&until=9999-12-31T23:59-01:00", "since"),
        ("since=0001-01-01T00:00%2B01:00&until=0001-01-01T12:00%2B01:00", "since"),
        ("since=9999-12-31T23:00Z&until=9999-12-31T23:59:59.999999Z", "since"),
        ("since=0001-01-01T00:00Z&until=0001-01-01T01:00Z", "since"),
        ("since=2026-12-01T00:00Z&until=9999-12-31T23:59:59.999999Z", "until"),
        ("since=%C2%B2m", "since"),  # a superscript two is a digit to str.isdigit
        ("since=10m&gpu=%C2%B2", "gpu"),
        ("since=10m&since=5m", "since"),  # which one was meant is not for the daemon to guess
        ("since=5m&gpu=0&gpu=1", "gpu"),
    ],
)
def test_the_analysis_api_refuses_a_bad_parameter_with_400_naming_it(
    recording: Path, query: str, names: str
) -> None:
    for directory in (str(recording), None):  # the recorder on, and off: the query is wrong either way
        api = AnalysisApi(directory, lambda: Config())
        status, doc = ask(api, query)
        assert status == 400 and str(doc["error"]).startswith(f"{names}:"), (query, doc)


def test_the_running_analysis_shares_its_answer_with_a_bounded_number_of_requests(
    recording: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests waiting on the running analysis are being served, so none of their connections is
    closed to make room for a new client: without a bound, clients asking for one long analysis
    could hold every connection (found by a hostile-input pass)."""
    from gpumon.serve import analysis_api

    api = AnalysisApi(str(recording), lambda: Config())
    release = asyncio.Event()

    async def held(*args: object) -> analysis_api.Answer:
        await release.wait()
        return analysis_api.Answer(200, b"{}")

    monkeypatch.setattr(api, "_analyze", held)
    query = f"since={iso(EPOCH)}&until={iso(EPOCH + 200)}"

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(api.answer(query))
        while api._running is None:
            await asyncio.sleep(0)
        sharing = [asyncio.ensure_future(api.answer(query)) for _ in range(analysis_api.SHARING_MAX)]
        await asyncio.sleep(0)
        over = await api.answer(query)  # one more: turned away at once, not held
        release.set()
        return [over.status, (await first).status, *[(await t).status for t in sharing]]

    statuses = asyncio.run(scenario())
    assert statuses[0] == 429
    assert statuses[1:] == [200] * (1 + analysis_api.SHARING_MAX)


def test_the_analysis_api_answers_404_for_a_gpu_the_range_lacks(recording: Path) -> None:
    api = AnalysisApi(str(recording), lambda: Config())
    status, doc = ask(api, f"since={iso(EPOCH)}&until={iso(EPOCH + 200)}&gpu=7")
    assert status == 404 and "no GPU 7" in str(doc["error"]), doc


def test_the_analysis_api_takes_a_day_when_a_day_is_the_limit(recording: Path) -> None:
    api = AnalysisApi(str(recording), lambda: Config())
    status, doc = ask(api, "since=1d")
    assert status != 400, doc  # (404: nothing recorded in the last day, here)


def test_the_analysis_process_ends_when_the_server_stops(
    recording: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pid"
    slow = tmp_path / "python"
    slow.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")  # an analysis that takes long
    slow.chmod(0o755)
    from gpumon.serve import analysis_api

    monkeypatch.setattr(analysis_api.sys, "executable", str(slow))

    async def scenario() -> None:
        api = AnalysisApi(str(recording), lambda: Config())
        task = asyncio.ensure_future(api.answer(f"since={iso(EPOCH)}&until={iso(EPOCH + 200)}"))
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.05)
        task.cancel()  # what the server's stop does to every request in flight
        with pytest.raises(asyncio.CancelledError):
            await task

    left: list[object] = []  # what a transport freed after the loop closed complains of
    monkeypatch.setattr(sys, "unraisablehook", left.append)
    asyncio.run(scenario())
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10  # sleep 60 is the orphan's own timeline
    while _alive(pid):
        assert time.monotonic() < deadline, "the analysis outlived the server"
        time.sleep(0.05)
    for t in threading.enumerate():  # asyncio's child watcher, if it still waits for the process
        if t.name.startswith("waitpid-"):
            t.join(10)
    gc.collect()  # the server's objects are gone with its loop
    # an analysis killed but not collected left its pipes to be closed after the loop: the daemon
    # printed "Exception ignored ... Event loop is closed" at its stop
    assert not left, [f"{u.exc_value!r} in {u.object!r}" for u in left]  # type: ignore[attr-defined]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_analyze_forks_no_more_processes_than_gpus(recording: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpumon.analyze import trace_report

    asked: list[int] = []
    real = trace_report.ProcessPoolExecutor

    def counting(n: int, **kw: object) -> object:
        asked.append(n)
        return real(n, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(trace_report, "ProcessPoolExecutor", counting)
    a = trace_report.analyze_range(str(recording), EPOCH, jobs=200)
    assert len(a.gpus) == 2 and asked == [2], asked


def test_a_setting_that_changes_only_on_restart_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    """A reload that sets interval_s = 5 is warned of (it takes a restart); a later reload of a
    file without it warned again of a change that never was (found by a hostile-input pass): what
    runs keeps the values it started with."""
    from gpumon.serve.daemon import Daemon

    started = Config(simulate="healthy")
    files = [Config(simulate="healthy", interval_s=5.0), Config(simulate="healthy")]
    d = Daemon(started, reload=lambda: files.pop(0))
    try:
        with caplog.at_level(logging.WARNING, logger="gpumon"):
            d.reload()
            d.reload()
    finally:
        d.pipeline.close()
    warned = [r.getMessage() for r in caplog.records if "only on restart" in r.getMessage()]
    assert warned == ["reload: interval_s: takes effect only on restart"], warned
    assert d.cfg.interval_s == 1.0, "the interval it runs at"
