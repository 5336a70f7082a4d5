"""`gpumon serve`: the metrics a fleet scrapes, the HTTP side, configuration and lifecycle."""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.collect.pipeline import OpenedSources, SourceDescription, open_sources
from gpumon.config.settings import Config, ConfigError, load
from gpumon.config.sources import source_spec
from gpumon.core.clock import VirtualClock
from gpumon.core.model import GpuSample
from gpumon.core.problems import Problems
from gpumon.serve import http
from gpumon.serve.daemon import Daemon
from gpumon.serve.webconfig import WebConfig

from .conftest import ROOT
from .hostile import self_signed

GOLDEN = Path(__file__).parent / "golden" / "metrics.txt"


def simulated_daemon(
    scenarios: str = "starved-cpu,healthy,starved-io,idle", seconds: int = 20, **cfg_kw
) -> Daemon:
    """A daemon on a virtual clock, ticked `seconds` times without threads."""
    clock = VirtualClock()
    cfg_kw.setdefault("jobs_dir", str(ROOT / "tests/golden/no-jobs-here"))  # whatever this host runs
    cfg = Config(simulate=scenarios, listen="127.0.0.1:0", **cfg_kw)
    daemon = Daemon(cfg, clock=clock)
    daemon.sampler.timer = lambda: 0.0  # source durations 0: the golden exposition stays byte for byte
    daemon.sampler.run(duration_s=seconds)
    return daemon


def test_metrics_match_the_golden_file(request: pytest.FixtureRequest) -> None:
    """What users see on /metrics for a fixed simulated fleet; `pytest --update-golden` rewrites it."""
    text = simulated_daemon().render_metrics("")[0].decode()
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the /metrics text changed: review, then run pytest --update-golden"


def test_metrics_follow_prometheus_conventions() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: scripts/test.sh installs Debian's prometheus package")
    body = simulated_daemon().render_metrics("")[0]
    p = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name, labels)


def test_metrics_say_which_gpu_is_starved_and_why() -> None:
    text = simulated_daemon().render_metrics("")[0].decode()
    assert sample(text, "gpumon_gpu_state", gpu="0", state="starved") == 1
    assert sample(text, "gpumon_gpu_starvation_cause", gpu="0", cause="cpu") == 1
    assert sample(text, "gpumon_gpu_starvation_cause", gpu="2", cause="io") == 1
    assert sample(text, "gpumon_gpu_state", gpu="1", state="healthy") == 1
    assert sample(text, "gpumon_gpu_state", gpu="3", state="idle") == 1
    assert sample(text, "gpumon_gpu_state", gpu="1", state="starved") == 0
    assert sample(text, "gpumon_gpu_starved_seconds_total", gpu="0", cause="cpu") > 10
    assert sample(text, "gpumon_gpu_wasted_seconds_total", gpu="0") > 5
    assert sample(text, "gpumon_gpu_wasted_seconds_total", gpu="1") == 0
    assert sample(text, "gpumon_gpu_duty_cycle_ratio", gpu="0") < 0.4
    assert sample(text, "gpumon_simulated") == 1
    assert sample(text, "gpumon_source_up", source="nvml") == 1


def test_unsupported_fields_are_left_out_not_nan() -> None:
    d = simulated_daemon("healthy", seconds=3)
    snap = d.snapshot
    g = snap.tick.gpus[0]._replace(power_w=None, temp_c=None)
    d.snapshot = snap._replace(tick=snap.tick._replace(gpus=(g,)))
    text = d.render_metrics("")[0].decode()
    assert "gpumon_gpu_power_watts{" not in text and "gpumon_gpu_temperature_celsius{" not in text
    assert "NaN" not in text and "gpumon_gpu_utilization_ratio{" in text


def test_openmetrics_when_the_scraper_asks() -> None:
    body, ctype, _ = simulated_daemon(seconds=3).render_metrics("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


# -- HTTP ----------------------------------------------------------------------------------------


def get(
    url: str,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
    data: bytes | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def served():
    daemons: list[Daemon] = []

    def start(**cfg_kw) -> str:
        d = simulated_daemon(**cfg_kw)
        port = d.start_http_only()
        daemons.append(d)
        scheme = "https" if d.web_config.tls else "http"
        return f"{scheme}://127.0.0.1:{port}"

    start.daemons = daemons  # type: ignore[attr-defined]
    yield start
    for d in daemons:
        d.stop()


def test_endpoints(served) -> None:
    base = served()
    code, body, headers = get(base + "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"gpumon_gpu_state{" in body
    code, body, _ = get(base + "/api/v1/state")
    state = json.loads(body)
    assert state["schema"] == "gpumon-state/1" and state["simulated"] is True
    assert [g["label"] for g in state["gpus"]] == ["starved-cpu", "healthy", "starved-io", "idle"]
    assert state["gpus"][0]["evidence"]["duty_cycle"] < 0.4
    assert get(base + "/healthz")[0] == 200
    code, body, _ = get(base + "/")
    assert code == 200 and b'href="/metrics"' in body
    assert get(base + "/nope")[0] == 404
    assert get(base + "/metrics", method="POST", data=b"x")[0] == 405
    assert get(base + "/metrics", data=None, headers={"Content-Length": "5"})[0] in (400, 413)


def test_basic_auth_and_tls(served, tmp_path: Path) -> None:
    import bcrypt

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    base = served(web_config_file=str(web))
    assert base.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    code, _, headers = get(base + "/metrics", context=ctx)
    assert code == 401 and "Basic" in headers["WWW-Authenticate"]
    bad = base64.b64encode(b"prometheus:wrong").decode()
    assert get(base + "/metrics", {"Authorization": f"Basic {bad}"}, ctx)[0] == 401
    good = base64.b64encode(b"prometheus:s3cret").decode()
    code, body, _ = get(base + "/metrics", {"Authorization": f"Basic {good}"}, ctx)
    assert code == 200 and b"gpumon_gpu_up" in body
    with pytest.raises(OSError):  # plain HTTP to a TLS port gets nothing (reset, or a URLError)
        urllib.request.urlopen(base.replace("https", "http") + "/metrics", timeout=5)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("tls_server_config:\n  cert_file: /nope.pem\n", "needs both cert_file and key_file"),
        ("basic_auth_users:\n  alice: plaintext\n", "expected a bcrypt hash"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("tls_server_config: [\n", "not valid YAML"),
    ],
)
def test_bad_web_config_names_the_problem(tmp_path: Path, content: str, needle: str) -> None:
    from gpumon.serve.webconfig import WebConfigError, load_web_config

    path = tmp_path / "web.yml"
    path.write_text(content)
    with pytest.raises(WebConfigError, match=re.escape(needle)):
        load_web_config(str(path))


def test_at_the_connection_cap_a_silent_client_makes_room_for_a_real_one(served) -> None:
    base = served(max_connections=2, request_timeout_s=5.0)
    host, port = base.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(2)]  # slow clients: say nothing
    try:
        time.sleep(0.2)
        assert get(base + "/healthz")[0] == 200, "the real scraper got in"
        idle[0].settimeout(2)
        assert idle[0].recv(100) == b"", "the client that waited longest was closed to make room"
    finally:
        for s in idle:
            s.close()


def _keepalive_get(sock: socket.socket, path: str = "/healthz") -> bytes:
    """One request on a kept-alive connection; the response's status line."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n")[0]


def _slowloris(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` connections that each send half a request head and wait, as slowloris does (a
    connection the server has not accepted yet is queued by the kernel)."""
    crowd = []
    for _ in range(n):
        s = socket.create_connection((host, port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost:")
        crowd.append(s)
    return crowd


@contextlib.contextmanager
def _served_scraper(base: str) -> Iterator[tuple[str, int, socket.socket, list[socket.socket]]]:
    """(host, port, a scraper already served once on a kept-alive connection, a list for the
    test's other connections); every one closed at the end."""
    host, port = base.removeprefix("http://").split(":")
    scraper = socket.create_connection((host, int(port)))
    others: list[socket.socket] = []
    try:
        assert _keepalive_get(scraper) == b"HTTP/1.1 200 OK"
        yield host, int(port), scraper, others
    finally:
        for s in [scraper, *others]:
            s.close()


def test_a_crowd_at_the_cap_never_closes_a_scrapers_kept_alive_connection(served) -> None:
    # a crowd that reconnects as soon as it is closed makes every accept evict: the scraper that
    # has been served keeps its connection, and so never queues behind the crowd's connects
    with _served_scraper(served(max_connections=4, request_timeout_s=5.0)) as (host, port, scraper, crowd):
        crowd += _slowloris(host, port, 12)  # three times the cap, each evicting the longest waiting
        closed = 0
        for s in crowd[:-3]:
            s.settimeout(10)
            try:
                closed += s.recv(100) == b""
            except ConnectionResetError:  # closed with its half head unread
                closed += 1
        assert closed == 9, "the crowd made room for itself, longest waiting first"
        assert _keepalive_get(scraper) == b"HTTP/1.1 200 OK", "the scraper's connection was kept"


def test_at_the_cap_connections_are_accepted_no_faster_than_the_eviction_budget(
    served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a crowd that reconnects as soon as it is closed waits in the kernel's backlog instead of
    # keeping the event loop busy; the served scraper is answered meanwhile
    monkeypatch.setattr(http, "EVICTIONS_PER_S", 2.0)
    with _served_scraper(served(max_connections=3, request_timeout_s=30.0)) as (host, port, scraper, crowd):
        t0 = time.monotonic()
        crowd += _slowloris(host, port, 40)
        assert _keepalive_get(scraper) == b"HTTP/1.1 200 OK", "answered while the crowd waits"
        elapsed = time.monotonic() - t0
        web = served.daemons[-1].web  # type: ignore[attr-defined]
        # the budget: 2 at once, then 2 a second (however slow this machine ran the loop above)
        assert web.evicted <= 2 + 2 * elapsed + 1, (web.evicted, elapsed)


def test_the_eviction_budget_refills_at_its_rate() -> None:
    web = http.WebServer(("127.0.0.1", 0), None, WebConfig())  # type: ignore[arg-type]
    try:
        rate = http.EVICTIONS_PER_S
        web._tokens_at = 100.0
        assert sum(web._may_evict(100.0) for _ in range(int(rate) + 5)) == int(rate)  # the burst
        assert not web._may_evict(100.0)
        later = 100.0 + 1.5 / rate  # a token and a half refilled
        assert web._may_evict(later) and not web._may_evict(later)
        assert sum(web._may_evict(200.0) for _ in range(int(rate) * 3)) == int(rate), "no more than a burst"
    finally:
        web.stop()


def test_a_served_connection_waits_keepalive_timeout_and_a_new_one_request_timeout(served) -> None:
    with _served_scraper(served(request_timeout_s=0.5, keepalive_timeout_s=30.0)) as (
        host,
        port,
        scraper,
        others,
    ):
        silent = socket.create_connection((host, port))
        others.append(silent)
        silent.settimeout(10)
        assert silent.recv(100) == b"", "a connection that never sent a request is closed"
        # the scraper idled as long as the silent client's whole life: its connection still serves
        assert _keepalive_get(scraper) == b"HTTP/1.1 200 OK"
        scraper.sendall(b"GET /healthz HTTP/1.1\r\n")  # then trickles a head: request_timeout_s
        scraper.settimeout(10)
        assert scraper.recv(100) == b"", "a served client may trickle no more than a new one"


def test_a_hung_source_never_stalls_a_scrape() -> None:
    clock = VirtualClock()
    cfg = Config(simulate="healthy", listen="127.0.0.1:0")
    real = open_sources(source_spec(cfg), clock, Problems(logging.getLogger("test")))
    release = threading.Event()

    class Hanging:
        name = "nvml"
        calls = 0

        def poll(self, t_s: float) -> list[GpuSample]:
            Hanging.calls += 1
            if Hanging.calls > 3:
                release.wait(30)  # a driver call that never returns
            return real.gpu.poll(t_s)

    daemon = Daemon(cfg, clock=clock, sources=OpenedSources(Hanging(), real.host, real.description))
    daemon.sampler.run(duration_s=3)
    port = daemon.start_http_only()
    worker = threading.Thread(target=daemon.sampler.tick, daemon=True)
    worker.start()  # the fourth tick hangs inside the source
    try:
        time.sleep(0.2)
        clock.advance(30.0)
        code, body, _ = get(f"http://127.0.0.1:{port}/metrics")  # while the tick still hangs
        assert code == 200 and worker.is_alive()
        age = sample(body.decode(), "gpumon_last_sample_age_seconds")
        assert age >= 30, "the scrape says how old its data is"
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503
    finally:
        release.set()
        daemon.stop()


# -- configuration --------------------------------------------------------------------------------


def test_precedence_is_flags_then_environment_then_file(tmp_path: Path) -> None:
    f = tmp_path / "gpumon.toml"
    f.write_text('listen = ":9001"\ninterval_s = 2\nsimulate = "healthy"\n[thresholds]\nfed_duty = 0.7\n')
    assert load(str(f), {}, {}).listen == ":9001"
    assert load(str(f), {"GPUMON_LISTEN": ":9002"}, {}).listen == ":9002"
    assert load(str(f), {"GPUMON_LISTEN": ":9002"}, {"listen": ":9003"}).listen == ":9003"
    cfg = load(str(f), {}, {})
    assert cfg.interval_s == 2.0 and cfg.thresholds.fed_duty == 0.7 and cfg.simulate == "healthy"
    assert load(None, {"GPUMON_CONFIG": str(f)}, {}).listen == ":9001"


@pytest.mark.parametrize(
    "content,needle",
    [
        ('lisen = ":9001"\n', "unknown key 'lisen'"),
        ('interval_s = "soon"\n', "interval_s: must be a number"),
        ("interval_s = 0\n", "interval_s: must be between 0.05 and 3600 s, got 0"),
        ('listen = "9001"\n', "listen: expected HOST:PORT"),
        ('listen = ":99999"\n', "port must be 0-65535"),
        ("[thresholds]\nfed_dutty = 0.5\n", "unknown threshold 'fed_dutty'"),
        ("[thresholds]\nfed_duty = 3\n", "fed_duty"),
        ("interval_s = \n", "not valid TOML"),
        ('log_level = "loud"\n', "log_level: must be debug, info, warning or error"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "gpumon.toml"
    f.write_text(content)
    with pytest.raises(ConfigError) as e:
        load(str(f), {}, {})
    assert needle in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 7


def gpumon_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        cwd=ROOT,
    )


def test_check_config(tmp_path: Path) -> None:
    good = ROOT / "systemd" / "gpumon.toml"
    p = gpumon_cli("serve", "--check-config", "--config", str(good))
    assert p.returncode == 0 and "configuration ok" in p.stdout, p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("intervl_s = 1\n")
    p = gpumon_cli("serve", "--check-config", "--config", str(bad))
    assert p.returncode == 7 and "unknown key 'intervl_s'" in p.stderr and "Traceback" not in p.stderr
    p = gpumon_cli("serve", "--check-config", "--config", str(tmp_path / "missing.toml"))
    assert p.returncode == 7 and "no such config file" in p.stderr
    p = gpumon_cli("serve", "--check-config", env={"GPUMON_LISTEN": "nowhere"})
    assert p.returncode == 7 and "GPUMON_LISTEN (listen): expected HOST:PORT" in p.stderr


# -- lifecycle, as systemd runs it ------------------------------------------------------------------


class ServeProcess:
    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumon",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--log-level",
                "info",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = int(self.wait_for(r"serving on 127\.0\.0\.1:(\d+)").group(1))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            time.sleep(0.05)
        raise AssertionError(f"never logged {pattern!r}: {''.join(self.lines)}")


def test_sigterm_stops_cleanly_within_two_seconds(tmp_path: Path) -> None:
    s = ServeProcess(tmp_path, "--simulate", "healthy")
    assert get(f"http://127.0.0.1:{s.port}/metrics")[0] == 200
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=30)
    assert s.proc.returncode == 0
    # the daemon's own measure of its stop (what it waits for is bounded: a stopped loop, the
    # sampler thread's join), not the machine's speed at tearing down a process
    stopped = s.wait_for(r"stopped in ([0-9.]+) s")
    assert float(stopped.group(1)) < 2.0, stopped.group(0)
    assert "Traceback" not in "".join(s.lines)


def test_sighup_reloads_and_a_bad_reload_keeps_the_running_config(tmp_path: Path) -> None:
    conf = tmp_path / "gpumon.toml"
    conf.write_text('simulate = "underutilized"\n')
    s = ServeProcess(tmp_path, "--config", str(conf))
    base = f"http://127.0.0.1:{s.port}"
    time.sleep(14)  # the detector needs its window and confirmation
    state = json.loads(get(base + "/api/v1/state")[1])
    assert state["gpus"][0]["label"] == "underutilized"
    conf.write_text('simulate = "underutilized"\n[thresholds]\nfed_duty = 0.2\n')  # 35% is now "fed"
    s.proc.send_signal(signal.SIGHUP)
    s.wait_for("configuration reloaded")
    deadline = time.monotonic() + 15
    while json.loads(get(base + "/api/v1/state")[1])["gpus"][0]["label"] != "healthy":
        assert time.monotonic() < deadline, "the new threshold never applied"
        time.sleep(0.5)
    conf.write_text("not toml at all = = =\n")
    s.proc.send_signal(signal.SIGHUP)
    s.wait_for("reload failed, keeping the running configuration")
    assert get(base + "/healthz")[0] == 200
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=10)


def test_systemd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(15)
    s = ServeProcess(
        tmp_path, "--simulate", "healthy", env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "3000000"}
    )
    messages = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and sum("WATCHDOG=1" in m for m in messages) < 2:
        messages.append(sock.recv(4096).decode())
    assert any("READY=1" in m for m in messages)
    assert sum("WATCHDOG=1" in m for m in messages) >= 2, "pings come from the sampling loop, every tick"
    s.proc.send_signal(signal.SIGTERM)
    stop_seen = False
    while not stop_seen:
        stop_seen = "STOPPING=1" in sock.recv(4096).decode()
    s.proc.wait(timeout=10)
    sock.close()


def test_logs_carry_syslog_priorities_under_journald(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    with open(log, "w") as err:
        st = os.fstat(err.fileno())
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--simulate", "healthy", "--listen", "127.0.0.1:0"],
            stderr=err,
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT), JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}"),
        )
        deadline = time.monotonic() + 20
        while "serving on" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    lines = log.read_text().splitlines()
    assert lines and all(re.match(r"<[0-7]>", ln) for ln in lines), lines
    assert any(ln.startswith("<6>serving on 127.0.0.1:") for ln in lines)
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "serve", "--check-config", "--config", "/nonexistent.toml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert p.stderr.startswith("gpumon") and p.returncode == 7  # not under journald: plain lines


# -- problems: from the source to the state API and a counter, and cleared on recovery -----------


def test_nvml_problems_reach_the_state_api_and_a_counter_and_clear_when_they_recover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gpumon.collect.sources.nvml.source import NvmlSource

    from .test_nvml_source import FakePynvml

    fake = FakePynvml()
    clock = VirtualClock()
    cfg = Config(listen="127.0.0.1:0")
    problems = Problems(logging.getLogger("gpumon.test-problems"))
    nvml = NvmlSource(fake, problems)
    nvml.open()
    sources = OpenedSources(gpu=nvml, host=None, description=SourceDescription.nvml())
    daemon = Daemon(cfg, clock=clock, sources=sources, problems=problems)
    sampler = daemon.pipeline.sampler

    def state() -> dict:
        return daemon.state()

    def counter() -> float:
        return sample(daemon.render_metrics("")[0].decode(), "gpumon_source_problems_total", source="nvml")

    with caplog.at_level(logging.INFO, logger="gpumon.test-problems"):
        sampler.tick(1.0)
        assert state()["problems"] == [] and counter() == 0
        fake.lost = {1}
        for t in (2.0, 3.0, 4.0):
            sampler.tick(t)
        assert any("gpu 1: unavailable" in p for p in state()["problems"]), state()["problems"]
        assert counter() == 3
        fake.lost = set()
        sampler.tick(5.0)
        assert state()["problems"] == [], "the problem cleared when the GPU answered again"
        fake.lost = {1}
        sampler.tick(6.0)  # it happens again: logged again
    logged = [r.getMessage() for r in caplog.records]
    assert sum("gpu 1: unavailable" in m and "logged once" in m for m in logged) == 2, logged
    assert sum(m.startswith("recovered after 3 failures: gpu 1: unavailable") for m in logged) == 1, logged
    assert counter() == 4


def test_each_new_snapshot_is_scraped_afresh_even_at_a_freed_ones_address() -> None:
    """The exposition is rendered once per snapshot. Keyed by `id`, a new snapshot allocated where
    the one scraped last was freed got that one's text (CI saw a problem counter stuck at 0): every
    scrape must show the latest tick."""
    from gpumon.collect.sources.nvml.source import NvmlSource

    from .test_nvml_source import FakePynvml

    fake = FakePynvml()
    problems = Problems(logging.getLogger("gpumon.test-problems"))
    nvml = NvmlSource(fake, problems)
    nvml.open()
    sources = OpenedSources(gpu=nvml, host=None, description=SourceDescription.nvml())
    daemon = Daemon(Config(listen="127.0.0.1:0"), clock=VirtualClock(), sources=sources, problems=problems)
    fake.lost = {1}
    for n in range(1, 61):
        daemon.pipeline.sampler.tick(float(n))
        gc.collect()  # the snapshots no longer held are freed now, their memory ready for reuse
        if n % 2:  # scraped every other tick, as when scrapes are slower than ticks
            continue
        text = daemon.render_metrics("")[0].decode()
        assert sample(text, "gpumon_source_problems_total", source="nvml") == n, f"scrape after tick {n}"


# -- lifecycle edges: early signals, a dying sampler, exit codes -----------------------------------


def _holds_sighup(pid: int) -> bool:
    """Whether gpumon has taken SIGHUP over: blocked in its main thread or caught (the masks in
    /proc/PID/status; SIGHUP is bit 0). Before that, SIGHUP's default action ends any process."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return False
    masks = [int(ln.split(":", 1)[1], 16) for ln in lines if ln.startswith(("SigBlk:", "SigCgt:"))]
    return any(m & (1 << (signal.SIGHUP - 1)) for m in masks)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """A Python script that drives gpumon from inside, with this tree's gpumon."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_serve_holds_its_signals_before_importing_anything_of_its_own() -> None:
    # what makes start-up's unguarded window short on any machine: nothing beyond the command line's
    # first file is imported (the daemon, NVML, psutil, the config) before SIGHUP is held
    code = textwrap.dedent("""
        import importlib.abc, os, signal, sys
        early = []
        class Watch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name not in sys.modules:
                    held = signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, [])
                    if not held:
                        early.append(name)
                    if name == "gpumon.serve.daemon":
                        print(" ".join(early))
                        sys.stdout.flush()
                        os._exit(0)
                return None
        sys.meta_path.insert(0, Watch())
        sys.argv = ["gpumon", "serve", "--simulate", "healthy", "--listen", "127.0.0.1:0"]
        from gpumon.cli import main
        main()
    """)
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    early = p.stdout.split()
    own = [m for m in early if m.split(".")[0] in ("gpumon", "pynvml", "psutil", "yaml", "tomllib")]
    assert set(own) <= {"gpumon", "gpumon.cli", "gpumon.serve", "gpumon.serve.signals"}, own


def _read_lines(proc: subprocess.Popen[str], into: list[str]) -> None:
    assert proc.stderr is not None
    into.extend(iter(proc.stderr.readline, ""))


def test_sighup_during_startup_is_a_reload_not_a_death(tmp_path: Path) -> None:
    # from the moment gpumon holds the signal (its first lines; Python's own start-up is before
    # anything can act, and takes as long as the machine makes it): the clock starts there, not at
    # the fork, so a slow machine sends it no earlier in gpumon's start-up than a fast one
    for delay in (0.0, 0.1, 0.3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--simulate", "healthy", "--listen", "127.0.0.1:0"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not _holds_sighup(proc.pid):
                assert proc.poll() is None and time.monotonic() < deadline, "gpumon never took SIGHUP over"
                time.sleep(0.002)
            time.sleep(delay)
            proc.send_signal(signal.SIGHUP)
            # the SIGHUP is a reload once serve is up: wait for its line, or for the end of stderr
            lines: list[str] = []
            reader = threading.Thread(target=_read_lines, args=(proc, lines), daemon=True)
            reader.start()
            while not any("configuration reloaded" in ln for ln in lines) and reader.is_alive():
                assert time.monotonic() < deadline, lines
                time.sleep(0.05)
            died = f"SIGHUP {delay} s into start-up killed it (exit {proc.returncode}): {lines}"
            assert proc.poll() is None, died
            assert any("configuration reloaded" in ln for ln in lines), lines
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
            reader.join(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_sampler_that_dies_ends_the_process_with_a_failure(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        from gpumon.config.settings import Config
        from gpumon.serve.daemon import Daemon, run_forever
        d = Daemon(Config(simulate="healthy", listen="127.0.0.1:0"))
        calls = [0]
        def bug(tick, verdicts):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("a bug in a sink")
        d.pipeline.on_verdicts(bug)
        raise SystemExit(run_forever(d))
    """)
    p = run_python(code)
    assert p.returncode == 1, (p.returncode, p.stderr)  # systemd's Restart=on-failure restarts it
    assert "the sampler stopped" in p.stderr


def test_the_readme_exit_code_table_matches_sigterm() -> None:
    text = (ROOT / "README.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| 130 |"))
    assert "record" in row and "serve" in row and "exits 0" in row, row


def test_a_route_that_fails_gives_its_client_a_500_and_the_server_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug of gpumon's behind one route (the analysis API once raised on a date it could not
    write): that client gets a 500 and a line in the log, not a dropped connection; others are
    served."""

    async def broken(query: str, client: str) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
        raise ValueError("year 10000 is out of range")

    routes = http.Routes(
        metrics=lambda accept, gz: (b"up 1\n", "text/plain", None),
        state=dict,
        health=lambda: (True, "ok"),
        landing=lambda: "gpumon",
        analysis=broken,
    )
    web = http.WebServer(("127.0.0.1", 0), routes, WebConfig())
    web.start()
    try:
        base = f"http://127.0.0.1:{web.port}"
        with (
            caplog.at_level(logging.ERROR, logger="gpumon.serve.http"),
            pytest.raises(urllib.error.HTTPError) as failed,
        ):
            urllib.request.urlopen(f"{base}/api/v1/analysis?since=10m", timeout=10)
        assert failed.value.code == 500 and b"internal error" in failed.value.read()
        assert "internal error answering" in caplog.text and "year 10000" in caplog.text
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            assert r.status == 200 and r.read() == b"up 1\n"
    finally:
        web.stop()


@pytest.mark.parametrize(
    ("header", "gzip"),
    [
        ("gzip", True),
        ("deflate, GZIP", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("gzip;level=1;q=0", False),  # q after another parameter (once read as no q at all)
        ("gzip;level=1;q=0.5", True),
        ("gzip;q=abc", False),
        ("identity", False),
        ("", False),
    ],
)
def test_gzip_is_sent_only_where_the_accept_encoding_header_takes_it(header: str, gzip: bool) -> None:
    assert http.accepts_gzip(header) is gzip


def test_a_request_in_absolute_form_is_served_as_its_path() -> None:
    """`GET http://host:9877/metrics HTTP/1.1` (a proxy's form, which a server must accept: RFC 9112
    3.2.2) was a 404 (found by a hostile-input pass)."""
    web = http.WebServer(("127.0.0.1", 0), _up_routes(), WebConfig())
    web.start()
    try:
        for target in (f"http://127.0.0.1:{web.port}/metrics", "HTTP://gpumon/metrics?x=1"):
            with socket.create_connection(("127.0.0.1", web.port), timeout=10) as s:
                s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"up 1\n"), (target, got[:100])
    finally:
        web.stop()


def _up_routes() -> http.Routes:
    """Routes whose /metrics says `up 1` (an in-process WebServer's, for the HTTP side's tests)."""
    return http.Routes(
        metrics=lambda accept, gz: (b"up 1\n", "text/plain", None),
        state=dict,
        health=lambda: (True, "ok"),
        landing=lambda: "gpumon",
    )


def test_a_tls_handshake_never_finished_holds_a_small_buffer(tmp_path: Path) -> None:
    """asyncio's TLS layer gave each connection a 256 KiB read buffer: 1,500 connects without a
    handshake took the daemon to 190 MB, 3,000 half-open ones to 980 MB (found by a hostile-input
    pass). Python's own memory per connection still in its handshake stays small."""
    import tracemalloc

    from gpumon.serve.webconfig import load_web_config

    _, _, web_yml = self_signed(tmp_path)
    routes = _up_routes()
    web = http.WebServer(("127.0.0.1", 0), routes, load_web_config(str(web_yml)))
    web.start()
    held: list[socket.socket] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", web.port), timeout=10)
            s.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes, and no more
            held.append(s)
        deadline = time.monotonic() + 20
        while web._unborn + len(web._conns) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)  # (accepted by the server's thread)
        time.sleep(0.5)
        per_connection = (tracemalloc.get_traced_memory()[0] - before) / 100
        assert per_connection < 64 * 1024, f"{per_connection / 1024:.0f} KiB a half-open connection"
    finally:
        tracemalloc.stop()
        for s in held:
            s.close()
        web.stop()


def test_a_reload_applies_the_tls_settings_to_new_connections(tmp_path: Path) -> None:
    """SIGHUP with `min_version: TLS13` said "configuration reloaded" and TLS 1.2 clients were
    still served: only the new certificate was loaded into the old context (found by a
    hostile-input pass). New connections get the new context, whole."""
    import time as _time

    from gpumon.serve.webconfig import load_web_config

    cert, key, web_yml = self_signed(tmp_path)
    routes = _up_routes()
    web = http.WebServer(("127.0.0.1", 0), routes, load_web_config(str(web_yml)))
    web.start()

    def tls12_handshake() -> bool:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        try:
            with (
                socket.create_connection(("127.0.0.1", web.port), timeout=10) as raw,
                ctx.wrap_socket(raw) as s,
            ):
                return s.version() == "TLSv1.2"
        except (ssl.SSLError, OSError):
            return False

    try:
        assert tls12_handshake()
        tls = f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        web_yml.write_text(tls + "  min_version: TLS13\n")
        web.reconfigure(load_web_config(str(web_yml)))
        deadline = _time.monotonic() + 10
        while tls12_handshake() and _time.monotonic() < deadline:
            _time.sleep(0.05)  # (applied on the server's own thread)
        assert not tls12_handshake(), "a TLS 1.2 client refused once TLS 1.3 is the least"
    finally:
        web.stop()
