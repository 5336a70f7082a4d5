"""`gpumon serve` on the real pynvml path (the stand-in libnvidia-ml.so.1) under driver faults:
a driver-wide hang, a GPU whose calls hang, no driver at all, a driver that refuses this user.
What must hold: bounded threads, the watchdog stopping so systemd restarts a hung daemon, and
failures that show as failures (source down, /healthz 503, the reason in the state API)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fakenvml import driver

from .conftest import ROOT, free_port


@pytest.fixture(scope="module")
def library() -> Path:
    return driver.build()


class Serve:
    def __init__(self, tmp: Path, config: Path | None, toml: str, notify: str | None = None) -> None:
        self.port = free_port()
        conf = tmp / f"gpumon-{self.port}.toml"
        conf.write_text(toml)
        self.log = tmp / f"serve-{self.port}.log"
        env = driver.environment(config, PYTHONPATH=str(ROOT))
        if config is not None and not config.exists():
            env["FAKENVML_CONFIG"] = str(config)
        if notify:
            env.update(NOTIFY_SOCKET=notify, WATCHDOG_USEC="30000000")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumon",
                "serve",
                "--config",
                str(conf),
                "--log-level",
                "info",
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
        )
        deadline = time.monotonic() + 20
        while "serving on" not in self.log.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        text = self.get("/metrics")[1]
        for line in text.splitlines():
            if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def threads(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(10)


def wait_until(predicate, timeout: float = 20.0, step: float = 0.2) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except KeyError:  # the series is not there yet
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)


def drain(sock: socket.socket) -> list[str]:
    sock.setblocking(False)
    out = []
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except BlockingIOError:
        pass
    sock.setblocking(True)
    return out


def test_a_driver_wide_hang_keeps_threads_bounded_and_stops_the_watchdog(
    library: Path, tmp_path: Path
) -> None:
    # nvmlDeviceGetCount hangs (an hour, every call) from 3 s after nvmlInit
    config = driver.simulated_config(
        tmp_path, "healthy,healthy", faults=("block nvmlDeviceGetCount_v2 -1 3600 3000000",)
    )
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    s = Serve(tmp_path, config, "nvml_call_timeout_s = 0.3\nnvml_stale_s = 2\n", notify=sock_path)
    try:
        sock.settimeout(10)
        got = ""
        while "WATCHDOG=1" not in got:
            got += sock.recv(4096).decode()
        wait_until(lambda: s.metric("gpumon_source_up", source="nvml") == 0)
        time.sleep(2.5)  # NVML stale for 2 s: the pings stop
        drain(sock)
        time.sleep(3)
        later = drain(sock)
        assert not any("WATCHDOG=1" in m for m in later), later
        code, body = s.get("/healthz")
        assert code == 503 and "no fresh NVML data" in body, body
        state = json.loads(s.get("/api/v1/state")[1])
        assert state["sources"]["nvml"]["up"] is False and state["sources"]["nvml"]["error"]
        before = s.threads()
        time.sleep(4)  # a dozen ticks
        assert s.threads() <= before + 1, "one thread per tick was the bug: threads stay bounded"
        assert s.threads() < 20
        log = s.log.read_text()
        assert log.count("driver-wide") <= 2, log
    finally:
        s.stop()
        sock.close()


def test_a_hung_gpu_is_logged_once_and_the_other_keeps_its_data(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(
        tmp_path, "healthy,healthy", faults=("block nvmlDeviceGetPowerUsage 1 3600 2000000",)
    )
    s = Serve(tmp_path, config, "nvml_call_timeout_s = 0.3\n")
    try:
        wait_until(lambda: s.metric("gpumon_gpu_up", gpu="1") == 0)
        time.sleep(4)
        assert s.metric("gpumon_gpu_up", gpu="0") == 1
        log = s.log.read_text()
        assert log.count("gpu 1: unavailable") == 1, log
        assert s.threads() < 20
    finally:
        s.stop()


def test_no_driver_at_start_is_visible_not_healthy(library: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-driver-yet.conf"  # the stand-in reports DRIVER_NOT_LOADED without it
    s = Serve(tmp_path, missing, "nvml_stale_s = 2\n")
    try:
        wait_until(
            lambda: s.get("/api/v1/state")[0] == 200 and json.loads(s.get("/api/v1/state")[1])["ready"]
        )
        assert s.metric("gpumon_source_up", source="nvml") == 0
        state = json.loads(s.get("/api/v1/state")[1])
        assert state["sources"]["nvml"]["up"] is False
        assert "driver" in (state["sources"]["nvml"]["error"] or "").lower()
        assert state["problems"], "the reason is listed"
        wait_until(lambda: s.get("/healthz")[0] == 503, timeout=10)
        assert "no NVML data since start" in s.get("/healthz")[1]
    finally:
        s.stop()


def test_a_permission_error_does_not_say_install_a_driver(library: Path, tmp_path: Path) -> None:
    config = driver.simulated_config(tmp_path, "healthy", faults=("init_error 4",))
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "devices"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=driver.environment(config, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert "permission" in p.stderr.lower() or "refused access" in p.stderr
    assert "install the NVIDIA driver" not in p.stderr, p.stderr
