"""The daemon's clients and the in-job hooks against a daemon and a user that misbehave (a
hostile-input pass): `dstat --gpu`'s plugin (run in this process, as dstat runs it: exec'd), the
pcp-dstat installer, and the training-log hooks. Each test failed before its fix."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpumon.integrations as hooks
from gpumon.cli import main as gpumon_main
from gpumon.core import fetch
from gpumon.dstat import install as dstat_install
from gpumon.dstat import pcp as dstat_pcp
from gpumon.integrations import Watch

from .conftest import gpumon
from .hostile import RawServer

ME = os.getpid()
ESCAPES = ("\x1b", "\x07", "\x9b")


# -- helpers -----------------------------------------------------------------------------------------


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(answer: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        made.append(RawServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def request_of(conn: socket.socket) -> bytes:
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def trickle(data: bytes, every_s: float = 0.05) -> Callable[[socket.socket, threading.Event], None]:
    """Sends `data` a byte at a time, never silent long enough for a per-read timeout."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        for byte in data:
            if stop.wait(every_s):
                return
            conn.sendall(bytes([byte]))

    return answer


def finishes(fn: Callable[[], Any], within_s: float = 15.0) -> tuple[bool, Any]:
    """Runs `fn` in a thread: (whether it returned within a generous bound, what it returned)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(within_s)
    return (not t.is_alive(), out[0] if out else None)


def plugin() -> Any:
    """`dstat_plugin` as dstat 0.7.4 makes it: the file exec'd, its base class dstat's."""

    class Dstat:
        pass

    namespace: dict[str, Any] = {"dstat": Dstat, "__name__": "dstat_gpu"}
    exec(compile(dstat_install.source(), "dstat_gpu.py", "exec"), namespace)
    p = namespace["dstat_plugin"]()
    p.namespace = namespace
    return p


def gpu(index: int, label: str, start: float, **kw: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "label": label,
        "pids": [ME],
        "evidence": {"duty_cycle": 0.4},
        "episodes": [{"label": label, "start_unix_s": start, "end_unix_s": None}],
        **kw,
    }


def fake_daemon(monkeypatch: pytest.MonkeyPatch, state: Callable[[], dict[str, Any]]) -> list[int]:
    asked = [0]

    def get(url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
        asked[0] += 1
        return json.dumps(state()).encode()

    monkeypatch.setattr(hooks, "get", get)
    return asked


def wait_until(check: Callable[[], bool], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- the training-log hooks --------------------------------------------------------------------------


def test_a_daemons_escape_sequences_never_reach_the_training_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label and an advice line with escapes (clear the screen, retitle the window) were written
    to the training job's stderr as they came."""
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", framework="torch", log=lines.append)
    t0 = w._started_unix
    advice = {"ready": True, "kind": "cpu", "line": "\x1b]0;pwned\x07 \x1b[31mbuy\u009b2J\nmore"}
    fake_daemon(
        monkeypatch,
        lambda: {"time_unix_s": t0 + 20, "gpus": [gpu(0, "starved-\x1b[2Jcpu", t0 + 1, advice=advice)]},
    )
    w._poll()
    assert len(lines) == 1 and "what a fix buys" in lines[0], lines
    assert not any(e in line for line in lines for e in ESCAPES) and "\n" not in lines[0], lines


def test_an_http_reason_with_escapes_never_reaches_the_training_log(
    raw_server: Callable[..., RawServer],
) -> None:
    """The real `get`: a daemon's HTTP reason phrase is in the "no daemon" line."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        request_of(conn)
        conn.sendall(b"HTTP/1.0 500 \x1b[2J\x1b]0;pwned\x07\r\nContent-Length: 0\r\n\r\n")

    server = raw_server(answer)
    lines: list[str] = []
    Watch(f"http://127.0.0.1:{server.port}", log=lines.append, timeout_s=5)._poll()
    assert len(lines) == 1 and "HTTP 500" in lines[0], lines
    assert not any(e in lines[0] for e in ESCAPES), lines


def test_an_episode_that_starts_at_nan_is_not_said_at_every_question(monkeypatch: pytest.MonkeyPatch) -> None:
    """An episode starting at NaN (Python's JSON takes it) was a new episode at each question: the
    same "stalled for nan s" line every 5 s for the whole run."""
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix
    fake_daemon(monkeypatch, lambda: {"time_unix_s": t0 + 20, "gpus": [gpu(0, "stalled", float("nan"))]})
    for _ in range(5):
        w._poll()
    assert len(lines) <= 1 and not any("nan" in line or "inf" in line for line in lines), lines


def test_a_daemon_clock_of_nan_is_not_the_runs_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix
    fake_daemon(monkeypatch, lambda: {"time_unix_s": float("nan"), "gpus": [gpu(0, "stalled", t0 + 1)]})
    for _ in range(3):
        w._poll()
    assert len(lines) == 1 and "stalled for" in lines[0] and "nan" not in lines[0], lines


def test_a_watch_started_again_watches_the_new_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras calls on_train_begin/on_train_end at each `fit`: a callback given to a second `fit`
    (fine-tuning after training) started a thread that ended at once: that run went unwatched."""
    asked = fake_daemon(monkeypatch, lambda: {"gpus": []})
    w = Watch("http://gpumon.invalid", log=lambda line: None, every_s=0.05)
    w.start()
    assert wait_until(lambda: asked[0] >= 1)
    w.stop(summary=False)
    before = asked[0]
    w.start()
    try:
        assert wait_until(lambda: asked[0] > before + 1), "the second run is never watched"
    finally:
        w.stop(summary=False)


def test_keras_watches_the_next_fit_afresh_after_one_that_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras calls no on_train_end when `fit` raises: the next `fit` went on with the old run (its
    start, episodes and summary), and a `fit` never repeated left its thread asking for good."""
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))  # before Keras's import
    from gpumon.integrations.keras import GpumonCallback  # imports Keras: this test only

    fake_daemon(monkeypatch, lambda: {"gpus": []})
    cb = GpumonCallback(log=lambda line: None, every_s=0.05)
    cb.on_train_begin()
    thread = cb.watch._thread
    started = cb.watch._started_at
    assert thread is not None
    cb.on_train_begin()  # the first fit raised: no on_train_end came
    try:
        thread.join(10)
        assert not thread.is_alive(), "the raised fit's thread still asks the daemon"
        assert cb.watch._thread is not None and cb.watch._thread is not thread
        assert cb.watch._started_at > started, "the new fit goes on with the old run"
    finally:
        cb.on_train_end()


def test_lightning_stops_asking_when_a_run_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning calls on_exception, not on_train_end, when training raises: each failed `fit`
    left a thread asking the daemon for the rest of the process (a notebook's many tries)."""
    from gpumon.integrations.lightning import GpumonCallback  # imports Lightning: this test only

    fake_daemon(monkeypatch, lambda: {"gpus": []})

    class Trainer:
        is_global_zero = True

    cb = GpumonCallback(log=lambda line: None, every_s=0.05)
    cb.on_train_start(Trainer(), None)
    first = cb.watch
    assert first is not None and first._thread is not None
    thread = first._thread
    cb.on_exception(Trainer(), None, RuntimeError("out of memory"))
    thread.join(10)
    assert not thread.is_alive() and cb.watch is None

    cb.on_train_start(Trainer(), None)  # (a callback whose run ended unseen: the old one is stopped)
    second = cb.watch
    assert second is not None and second._thread is not None
    thread = second._thread
    cb.on_train_start(Trainer(), None)
    thread.join(10)
    assert not thread.is_alive()
    cb.on_train_end(Trainer(), None)


# -- dstat --gpu's plugin ----------------------------------------------------------------------------


def test_a_password_in_gpumon_url_is_never_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`GPUMON_URL=http://scraper:hunter2@host:9877 dstat --gpu` with the daemon down printed the
    password in its "did not answer at" line."""
    monkeypatch.setenv("GPUMON_URL", "http://scraper:hunter2@127.0.0.1:1")
    p = plugin()
    p._nvml_open = lambda: None

    def exit_(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    with pytest.raises(SystemExit) as ended:
        p.check()
    assert ended.value.code == 8
    err = capsys.readouterr().err
    assert "no GPU data" in err and "127.0.0.1:1" in err
    assert "hunter2" not in err and "scraper" not in err, err


def test_credentials_in_the_url_are_an_authorization_header_not_the_host(
    raw_server: Callable[..., RawServer],
) -> None:
    """They went in the Host header (which servers and proxies log), and no Authorization was
    sent: a daemon behind basic auth never answered."""
    state = json.dumps({"ready": True, "gpus": [{"index": 0, "available": True, "label": "healthy"}]})

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        server.sent.append(request_of(conn))
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + state.encode())

    server = raw_server(answer)
    p = plugin()
    p.url = f"http://scraper:hun%40ter2@127.0.0.1:{server.port}"
    assert p._daemon_state() is not None
    head = server.sent[0].decode()
    assert f"Host: 127.0.0.1:{server.port}\r\n" in head and "hun" not in head.split("Authorization")[0]
    assert f"Authorization: Basic {base64.b64encode(b'scraper:hun@ter2').decode()}\r\n" in head


def test_a_daemon_naming_thousands_of_gpus_gets_a_bounded_number_of_columns() -> None:
    """100,000 GPUs had dstat write 5 MB a line, 6 s a line; an index of 10**30 a 31-digit
    column name; the same index twice two columns of one name."""
    gpus = plugin().namespace["_gpumon_gpus"]
    many = gpus({"ready": True, "gpus": [{"index": i, "available": True} for i in range(100_000)]})
    assert len(many) == 256
    odd = gpus(
        {
            "ready": True,
            "gpus": [
                {"index": 0},
                {"index": 0},
                {"index": 10**30},
                {"index": 1, "mig": 10**30},
                {"index": 1, "mig": 2},
            ],
        }
    )
    assert [(g["index"], g["mig"]) for g in odd] == [(0, None), (1, 2)]


# -- pcp-dstat's installer ---------------------------------------------------------------------------


def test_a_password_that_is_not_utf8_is_no_internal_error(tmp_path: Path) -> None:
    """`gpumon dstat-plugin install --for pcp --basic-auth $'user:\\xff'`: exit 1, "internal
    error: UnicodeEncodeError"."""
    p = gpumon(
        "dstat-plugin",
        "install",
        "--user",
        "--for",
        "pcp",
        "--basic-auth",
        os.fsdecode(b"user:\xff"),
        env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0 and "error" not in p.stderr, p.stderr


def test_the_url_file_carries_a_password_that_is_not_utf8_as_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {
        "PCP_SYSCONF_DIR": str(tmp_path / "etc"),
        "PCP_PMDAS_DIR": str(tmp_path / "pmdas"),
        "PCP_PMCDCONF_PATH": str(tmp_path / "pmcd.conf"),
        "PCP_VAR_DIR": str(tmp_path / "var"),
        "PCP_PYTHON_PROG": "python3",
        "PCP_LOG_DIR": str(tmp_path / "log"),
    }
    monkeypatch.setattr(dstat_pcp, "_register_pmda", lambda conf: None)
    monkeypatch.setattr(dstat_pcp, "_signal_pmcd", lambda: None)
    dstat_pcp.install(True, "http://127.0.0.1:1", os.fsdecode(b"user:\xff"), conf=conf)
    text = dstat_pcp.url_file(conf).read_text()
    token = base64.b64encode(os.fsencode(os.fsdecode(b"user:\xff"))).decode()
    assert f"HEADER: Authorization: Basic {token}\n" in text


def system_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[tuple[str, str | None]], str]:
    """`gpumon dstat-plugin install --system --for pcp ARGS`, PCP itself left alone: (exit code,
    the URL and credentials the installer was given, what was printed)."""
    given: list[tuple[str, str | None]] = []

    def install(system: bool, url: str, auth: str | None) -> tuple[list[Path], list[str]]:
        given.append((url, auth))
        return [], []

    monkeypatch.setattr(dstat_pcp, "install", install)
    monkeypatch.setattr(dstat_pcp, "probe", lambda url: f"PCP reads 1 GPU(s) from gpumon serve at {url}")
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    try:
        code = gpumon_main(["dstat-plugin", "install", "--system", "--for", "pcp", *args])
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, given, out.out + out.err


def test_a_password_in_the_url_becomes_the_header_and_is_never_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url http://user:pw@host:9877` was written into the .url file as it was (mode 0644 without
    --basic-auth: every local user could read the password) and printed in the installer's last
    line."""
    code, given, said = system_install(monkeypatch, capsys, "--url", "http://scraper:s3cret@10.0.0.5:9877")
    assert code == 0, said
    assert given == [("http://10.0.0.5:9877", "scraper:s3cret")]
    assert "s3cret" not in said


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:9877\nHEADER: X-Evil: 1",
        "10.0.0.5:9877",
        "http://10.0.0.5:99999",
        "ftp://h/",
        "http://h:9877/?x=1",
        "http://u:p@10.0.0.5:99999",
        "http://h:9877/#",
        "http://h:9877/?",
    ],
    ids=[
        "a newline",
        "no scheme",
        "a port out of range",
        "not http",
        "a query",
        "credentials and a port out of range",
        "an empty fragment",
        "an empty query",
    ],
)
def test_a_url_pcp_cannot_read_is_a_usage_error_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """Each was written into PCP's .url file (a newline wrote a header line of its own)."""
    code, given, said = system_install(monkeypatch, capsys, "--url", url)
    assert code == 2 and given == [], said
    assert said.count("\n") == 1 and "--url" in said and "Traceback" not in said, said


def test_gpumon_url_that_pcp_cannot_read_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUMON_URL", os.fsdecode(b"http://\xff:9877"))
    code, given, said = system_install(monkeypatch, capsys)
    assert code == 2 and given == [] and "GPUMON_URL" in said, said


def test_the_installers_check_of_the_daemon_has_a_deadline(raw_server: Callable[..., RawServer]) -> None:
    """urllib's timeout is per read: a daemon trickling its /metrics/pcp held `install --system`
    for good."""
    head = b"HTTP/1.0 200 OK\r\n\r\n"

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        request_of(conn)
        trickle(head + b"x" * 100_000)(conn, stop)

    server = raw_server(answer)
    done, answered = finishes(lambda: dstat_pcp._answers(f"http://127.0.0.1:{server.port}", None, 0.5))
    assert done and answered is False


def test_the_installers_check_sends_no_credentials_where_a_redirect_points(
    raw_server: Callable[..., RawServer],
) -> None:
    """urllib followed a redirect with the Authorization header: to any host the daemon named."""

    def elsewhere(conn: socket.socket, stop: threading.Event) -> None:
        other.sent.append(request_of(conn))
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")

    other = raw_server(elsewhere)

    def redirect(conn: socket.socket, stop: threading.Event) -> None:
        request_of(conn)
        conn.sendall(f"HTTP/1.0 302 Found\r\nLocation: http://127.0.0.1:{other.port}/x\r\n\r\n".encode())

    server = raw_server(redirect)
    dstat_pcp._answers(f"http://127.0.0.1:{server.port}", "user:s3cret", 5.0)
    assert not any(b"Authorization" in sent for sent in other.sent), other.sent


def test_uninstall_removes_nothing_a_damaged_manifest_names_relatively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`"files": "gpu"` in ~/.pcp/dstat/.gpumon-installed.json (hand-edited, or half-written) was
    the files g, p and u: `uninstall` removed those from the directory it ran in."""
    conf = {"PCP_SYSCONF_DIR": str(tmp_path / "etc"), "PCP_PMCDCONF_PATH": str(tmp_path / "pmcd.conf")}
    pdir = dstat_pcp.plugin_dir(False, conf, home=tmp_path)
    pdir.mkdir(parents=True)
    (pdir / dstat_pcp.MANIFEST).write_text(json.dumps({"files": "gpu"}))
    cwd = tmp_path / "work"
    cwd.mkdir()
    for name in "gpu":
        (cwd / name).write_text("the user's")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path))
    removed, _ = dstat_pcp.uninstall(False, conf)
    assert removed == [] and sorted(p.name for p in cwd.iterdir()) == ["g", "p", "u"]


def test_a_relative_xdg_data_home_is_ignored_as_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """XDG_DATA_HOME='~/.local/share' (quoted: no shell expanded it) had install make a directory
    named "~" in the directory it ran in, and put dool's plugin there."""
    monkeypatch.setenv("XDG_DATA_HOME", "~/.local/share")
    monkeypatch.chdir(tmp_path)
    targets = dstat_install.targets(False, home=tmp_path / "home")
    assert targets[1] == tmp_path / "home/.local/share/dool/plugins/dool_gpu.py"


def test_the_hook_takes_gpus_as_cuda_visible_devices_holds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpus=os.environ["CUDA_VISIBLE_DEVICES"].split(",")`: strings, which no index of a daemon's
    is: the job's starvation was never said, and nothing said why."""
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", gpus=["1", "GPU-7"], log=lines.append)
    t0 = w._started_unix
    state = [gpu(1, "stalled", t0 + 1, pids=[]), gpu(3, "stalled", t0 + 1, pids=[], uuid="GPU-7")]
    fake_daemon(monkeypatch, lambda: {"time_unix_s": t0 + 20, "gpus": state})
    w._poll()
    assert [line.split(" stalled")[0] for line in lines] == ["gpumon: GPU 1", "gpumon: GPU 3"], lines


def test_gpus_that_the_daemon_does_not_list_are_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Indices in a container's numbering match none of the host daemon's: the hook said nothing
    for the whole run."""
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", gpus=["0"], log=lines.append)
    t0 = w._started_unix
    state = [gpu(4, "stalled", t0 + 1, pids=[]), gpu(5, "stalled", t0 + 1, pids=[])]
    fake_daemon(monkeypatch, lambda: {"time_unix_s": t0 + 20, "gpus": state})
    w._poll()
    assert lines == [], "before the search's 60 s, nothing is said"
    w._started_at -= hooks.FIND_S + 1
    for _ in range(3):
        w._poll()
    assert len(lines) == 1 and "no GPU named by gpus=" in lines[0], lines


def test_a_url_with_a_password_and_a_bad_port_is_shown_without_the_password() -> None:
    """`redacted` read the port outside its guard: `report --url http://u:p@h:99999` and the pcp
    installer's check ended in an internal error."""
    for url in ("http://u:secret@10.0.0.5:99999/x", "http://u:secret@h:abc/"):
        shown = fetch.redacted(url)
        assert "secret" not in shown and "***@" in shown, shown


def test_an_endless_gpus_iterator_never_holds_the_training_code() -> None:
    """`Watch(gpus=...)` read the whole iterable, in the training code's thread: an endless one
    held it for good."""

    def endless() -> Iterator[int]:
        while True:
            yield 0  # (the same GPU: a set of it never grows, while the old code looped)

    lines: list[str] = []
    done, w = finishes(lambda: Watch("http://gpumon.invalid", gpus=endless(), log=lines.append))
    assert done and w is not None and w.gpus == {0}
    assert len(lines) == 1 and "more than" in lines[0], lines


def test_credentials_in_the_hooks_url_are_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """`url="http://user:pw@host:9877"` (as `gpumon report` takes it): the hook sent no
    Authorization, and the daemon's 401 read "no daemon"."""
    monkeypatch.delenv("GPUMON_BASIC_AUTH", raising=False)
    seen: list[dict[str, str]] = []

    def get(url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
        seen.append(headers)
        return b'{"gpus": []}'

    monkeypatch.setattr(hooks, "get", get)
    Watch("http://scraper:hun%40ter2@10.0.0.5:9877", log=lambda line: None)._poll()
    assert seen == [{"Authorization": "Basic " + base64.b64encode(b"scraper:hun@ter2").decode()}]


@pytest.mark.parametrize("listed", [[], ["gpu0", {"index": "0"}, {"index": -1}]], ids=["none", "none valid"])
def test_a_daemon_listing_no_gpu_it_can_show_ends_dstat_as_no_data_does(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raw_server: Callable[..., RawServer],
    listed: list[Any],
) -> None:
    """`dstat -c --gpu` said "Module dstat_gpu failed to load" and ran on without GPU columns,
    exit 0: asked for GPUs, it never runs quietly without them (docs/dstat.md)."""
    state = json.dumps({"ready": True, "gpus": listed}).encode()

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        request_of(conn)
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + state)

    server = raw_server(answer)
    monkeypatch.setenv("GPUMON_URL", f"http://127.0.0.1:{server.port}")

    def exit_(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    with pytest.raises(SystemExit) as ended:
        plugin().check()
    assert ended.value.code == 8
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no GPUs" in err and f"127.0.0.1:{server.port}" in err, err


def test_gpus_as_bytes_floats_or_odd_objects_are_read_as_meant() -> None:
    """b"0,1" was iterated into the indices 48, 44 and 49; `gpus=[0.0]` (0.0 == 0) was refused;
    an object whose repr raises turned the whole watch off."""

    class Odd:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    lines: list[str] = []
    assert Watch("http://gpumon.invalid", gpus=b"0,1", log=lines.append).gpus == {0, 1}
    assert Watch("http://gpumon.invalid", gpus=[0.0, 2], log=lines.append).gpus == {0, 2}  # type: ignore[list-item]
    assert lines == []
    w = Watch("http://gpumon.invalid", gpus=[Odd(), 1], log=lines.append)  # type: ignore[list-item]
    assert w.gpus == {1} and len(lines) == 1 and "Odd" in lines[0], lines
