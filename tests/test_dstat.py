"""`dstat --gpu` (Debian's dstat 0.7.4) and `dool --gpu` (PyPI dool), the real binaries, with the
plugin installed by `gpumon dstat-plugin install`.

Debian's `pcp` package replaces dstat 0.7.4 with pcp-dstat (tests/test_pcp.py), so the original runs
here from its extracted .deb (scripts/test.sh puts it in tests/.dstat-0.7.4): one Python script,
run by the system's python3 as its #! line says."""

from __future__ import annotations

import csv
import fcntl
import http.server
import io
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakenvml import driver

from .conftest import ROOT, free_port, start_serve

GOLDEN = Path(__file__).parent / "golden"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


DSTAT_074 = Path(__file__).parent / ".dstat-0.7.4" / "usr" / "bin" / "dstat"


def tool(name: str) -> str:
    path = DSTAT_074 if name == "dstat" else Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/test.sh fetches it (dstat: Debian's .deb; dool: PyPI)")
    return str(path)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HOME with the plugin installed the documented way."""
    home = tmp_path_factory.mktemp("home")
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "dstat-plugin", "install", "--user", "--for", "dstat"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT)),
    )
    assert p.returncode == 0, p.stderr
    assert (home / ".dstat" / "dstat_gpu.py").exists()
    assert (home / ".local/share/dool/plugins/dool_gpu.py").exists()
    return home


def run(
    which: str, args: list[str], home: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ, HOME=str(home), XDG_DATA_HOME=str(home / ".local/share"), TERM="dumb")
    base.pop("LD_LIBRARY_PATH", None)
    base.update(env or {})
    return subprocess.run(
        [tool(which), *args], capture_output=True, text=True, env=base, timeout=timeout, cwd=home
    )


@pytest.fixture(scope="module")
def daemon():
    """`gpumon serve --simulate starved-cpu,healthy`, once its detector has settled."""
    port = free_port()
    proc = start_serve("--simulate", "starved-cpu,healthy", port=port)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            import urllib.request

            state = json.loads(urllib.request.urlopen(url + "/api/v1/state", timeout=2).read())
            if [g["label"] for g in state.get("gpus", [])] == ["starved-cpu", "healthy"]:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "gpumon serve never settled"
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def rows(stdout: str) -> list[str]:
    return [ln for ln in ANSI.sub("", stdout).splitlines() if re.match(r"\s*\d", ln)]


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_the_starved_gpu_shows_its_state_beside_the_cpu(home: Path, daemon: str, which: str) -> None:
    p = run(which, ["-c", "--gpu", "1", "3"], home, {"GPUMON_URL": daemon})
    assert p.returncode == 0, p.stderr
    text = ANSI.sub("", p.stdout)
    assert re.search(r"gpu0.*gpu1", text) and "util" in text and "state" in text and "usr" in text
    body = rows(p.stdout)
    assert len(body) >= 3
    for line in body:
        gpu0, gpu1 = re.split(r"[:┊]", line.split("|" if which == "dstat" else "│", 1)[1])
        util0, mem0, state0 = gpu0.split()
        util1, _, state1 = gpu1.split()
        assert state0 == "STcpu" and state1 == "ok"
        # utilization is the last 1/6 s: a starved GPU may read 0 in a gap, never busy
        assert 0 <= int(util0) <= 60 and int(util1) >= 80 and int(mem0) == 60


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_csv_output_works_and_has_numeric_columns(
    home: Path, daemon: str, which: str, tmp_path: Path
) -> None:
    out = tmp_path / "gpu.csv"
    p = run(which, ["-c", "--gpu", "--output", str(out), "1", "3"], home, {"GPUMON_URL": daemon})
    assert p.returncode == 0, p.stderr  # Debian's dstat crashes here without the plugin's repair
    table = list(csv.reader(io.StringIO(out.read_text())))
    header = next(i for i, r in enumerate(table) if "gpu0:util" in r)
    cols = table[header]
    data = [r for r in table[header + 1 :] if r]
    assert len(data) >= 3
    for r in data:
        values = dict(zip(cols, r))
        assert 0 <= float(values["gpu0:util"]) <= 100 and 0 <= float(values["gpu1:mem"]) <= 100
        # as pcp-dstat writes them (tests/test_pcp.py): the state's short code, whole percents
        assert values["gpu0:state"] == "STcpu" and values["gpu1:state"] == "ok"
        assert values["gpu1:mem"] == "60" and values["gpu0:util"].isdigit()
        assert float(values["usr"]) >= 0


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_without_a_daemon_it_reads_nvml_directly(home: Path, which: str, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "healthy,starved-cpu", epoch_us=1_700_000_000_000_000)
    env = driver.environment(config, FAKENVML_NOW_US="30000000", GPUMON_URL=f"http://127.0.0.1:{free_port()}")
    p = run(
        which,
        ["--gpu", "1", "2"],
        home,
        {k: env[k] for k in ("LD_LIBRARY_PATH", "FAKENVML_CONFIG", "FAKENVML_NOW_US", "GPUMON_URL")},
    )
    assert p.returncode == 0, p.stderr
    ours = json.loads(
        subprocess.run(
            [sys.executable, "-m", "gpumon", "devices", "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=dict(env, PYTHONPATH=str(ROOT)),
        ).stdout
    )["gpus"]
    for line in rows(p.stdout):
        blocks = re.split(r"[:┊]", line)
        assert len(blocks) == 2
        for g, block in zip(ours, blocks):
            util, mem, state = block.split()
            assert state == "-", "no daemon, no verdict"
            assert int(util) == round(g["util_ratio"] * 100)
            assert int(mem) == round(100 * g["mem_used_bytes"] / g["mem_total_bytes"])


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_with_neither_it_says_what_to_start_and_exits_8(home: Path, which: str) -> None:
    p = run(which, ["--gpu", "1", "1"], home, {"GPUMON_URL": f"http://127.0.0.1:{free_port()}"})
    assert p.returncode == 8
    failed = [ln for ln in p.stderr.splitlines() if "dstat_gpu" in ln or "dool_gpu" in ln]
    assert len(failed) == 1 and "gpumon serve" in failed[0] and "libnvidia-ml.so.1" in failed[0]
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_with_the_daemon_down_other_columns_do_not_hide_it(home: Path, which: str) -> None:
    """`dstat -c --gpu` would carry on without the GPU columns and exit 0: asked for GPUs, it says
    what to start, in one line, and exits 8."""
    p = run(which, ["-c", "--gpu", "1", "1"], home, {"GPUMON_URL": f"http://127.0.0.1:{free_port()}"})
    assert p.returncode == 8, (p.stdout, p.stderr)
    said = [ln for ln in p.stderr.splitlines() if "imp module" not in ln and "import imp" not in ln]
    assert len(said) == 1 and f"{which}_gpu: no GPU data" in said[0] and "gpumon serve" in said[0], said
    assert "failed to load" not in p.stderr and not rows(p.stdout)


MALFORMED = {
    "a list": [1, 2],
    "a string": "ready",
    "gpus not a list": {"ready": True, "gpus": {"index": 0}},
    "wrong types": {
        "ready": True,
        "gpus": [
            {"index": "0", "available": True, "label": "healthy"},
            {"index": True, "available": True},
            {"index": 1, "available": True, "util_ratio": "0.5", "mem_used_ratio": [1], "label": 5},
            {"index": 2, "mig": "x", "available": True},
            {"index": 3, "available": "yes", "gpm": [], "label": None},
            "gpu",
        ],
    },
    "hostile label": {
        "ready": True,
        "gpus": [{"index": 0, "available": True, "util_ratio": 2.5, "label": "\x1b[2J\x1b[31mevil" * 20}],
    },
}
"""States that are not gpumon's (issue 28): each is no answer, or a GPU shown with what is valid."""


@pytest.fixture(scope="module")
def malformed_daemon():
    """Serves MALFORMED's documents at /CASE/api/v1/state (the plugin's URL may carry a path)."""
    cases = {f"/{i}/api/v1/state": json.dumps(doc).encode() for i, doc in enumerate(MALFORMED.values())}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = cases.get(self.path, b"{}")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("which", ["dstat", "dool"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_state_is_never_a_traceback(
    home: Path, malformed_daemon: str, which: str, case: str
) -> None:
    url = f"{malformed_daemon}/{list(MALFORMED).index(case)}"
    p = run(which, ["--gpu", "1", "1"], home, {"GPUMON_URL": url})
    assert "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr
    assert "\x1b[2J" not in p.stdout
    if case == "wrong types":  # GPU 1 and GPU 3 have integer indexes: shown, their junk left blank
        assert p.returncode == 0, p.stderr
        assert re.search(r"gpu1.*gpu3", p.stdout), p.stdout
        for line in rows(p.stdout):
            gpu1, gpu3 = re.split(r"[:┊]", line)
            assert gpu1.split() == ["?"] and gpu3.split() == ["lost"], line
    elif case == "hostile label":  # an impossible ratio is blank, the label an unknown state
        assert p.returncode == 0, p.stderr
        shown = ANSI.sub("", p.stdout).strip().splitlines()
        assert shown[-1].split() == ["-", "-", "?"], p.stdout
    else:
        assert p.returncode == 8 and "no GPU data" in p.stderr, p.stderr


# -- golden screen: a fixed fleet from a stub daemon ---------------------------------------------------


FIXED_STATE = {
    "schema": "gpumon-state/1",
    "ready": True,
    "gpus": [
        {"index": 0, "available": True, "util_ratio": 0.31, "mem_used_ratio": 0.6, "label": "starved-cpu"},
        {"index": 1, "available": True, "util_ratio": 0.97, "mem_used_ratio": 0.75, "label": "healthy"},
        {"index": 2, "available": True, "util_ratio": 0.18, "mem_used_ratio": 0.5, "label": "starved-io"},
        {"index": 3, "available": False, "util_ratio": None, "mem_used_ratio": None, "label": "unknown"},
    ],
}


@pytest.fixture(scope="module")
def stub_daemon():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(FIXED_STATE).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_screen_matches_the_golden_file(
    home: Path, stub_daemon: str, which: str, request: pytest.FixtureRequest
) -> None:
    p = run(which, ["--gpu", "1", "3"], home, {"GPUMON_URL": stub_daemon})
    assert p.returncode == 0, p.stderr
    screen = "\n".join(ln.rstrip() for ln in ANSI.sub("", p.stdout).splitlines() if ln.strip()) + "\n"
    golden = GOLDEN / f"{which}_screen.txt"
    if request.config.getoption("--update-golden"):
        golden.write_text(screen)
    assert screen == golden.read_text(), (
        f"the {which} --gpu screen changed: review, then pytest --update-golden"
    )


def test_a_starved_gpu_stands_out_in_red_on_a_terminal(home: Path, stub_daemon: str) -> None:
    """With a TTY, dstat colours: the starved state in white on red, a healthy one plain."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # dstat fits the terminal
    env = dict(os.environ, HOME=str(home), TERM="xterm", GPUMON_URL=stub_daemon)
    proc = subprocess.Popen(
        [tool("dstat"), "--gpu", "1", "2"],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=home,
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=10)
    os.close(master)
    text = output.decode(errors="replace")
    red_bg = "\x1b[41m"
    starved = [m.start() for m in re.finditer("STcpu", text)]
    assert starved and all(red_bg in text[max(0, i - 20) : i] for i in starved)
    healthy = [m.start() for m in re.finditer("ok   ", text)]
    assert healthy and not any(red_bg in text[max(0, i - 8) : i] for i in healthy)


TRICKLE_BODY = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + b'{"ready": true}' * 100
TRICKLE_S = 0.5 * len(TRICKLE_BODY)


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """A server that answers one byte every half second: never silent long enough to time out a read."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        conn.recv(4096)
        for byte in TRICKLE_BODY:
            if stop.wait(0.5):
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
        conn.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    srv.close()


@pytest.mark.parametrize("which", ["dstat", "dool"])
def test_a_trickling_server_is_given_up_on_within_the_timeout(
    home: Path, which: str, trickling_server: str
) -> None:
    # the trickle lasts TRICKLE_S; a plugin that waited on it would run into run()'s timeout
    p = run(which, ["--gpu", "1", "1"], home, {"GPUMON_URL": trickling_server}, timeout=TRICKLE_S / 10)
    assert p.returncode == 8 and "no GPU data" in p.stderr


@pytest.mark.timeout(30)  # (a FIFO once hung the install: fail, not hang)
@pytest.mark.parametrize("there", ["fifo", "symlink", "old-plugin"])
def test_install_replaces_what_stands_at_the_plugins_name_never_writing_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, there: str
) -> None:
    """A FIFO at the plugin's name hung the install for good (found by a hostile-input pass); a
    symlink there had the plugin written into the file it names (as root with --system, any
    file). The plugin is written beside it and renamed over it."""
    from gpumon.dstat import install

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    target = tmp_path / ".dstat" / "dstat_gpu.py"
    target.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    if there == "fifo":
        os.mkfifo(target)
    elif there == "symlink":
        target.symlink_to(victim)
    else:
        target.write_text("an older plugin\n")
    done = install.install(system=False)
    assert target in done and target.is_file() and not target.is_symlink()
    assert target.read_bytes() == install.source()
    assert victim.read_text() == "keep me\n"
    assert [p.name for p in target.parent.iterdir()] == ["dstat_gpu.py"], "no temporary file left"
    assert target.stat().st_mode & 0o777 == 0o644, "readable by every user of dstat"
