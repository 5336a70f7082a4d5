"""The training-log hooks against a user and a timeline that misbehave, and the daemon's TLS side
against clients that never finish their handshake (a review's findings). Each test failed before
its fix."""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpumon.integrations as hooks
from gpumon.integrations import Watch, advice, fix_line
from gpumon.serve import http
from gpumon.serve.webconfig import load_web_config

from .hostile import self_signed

ME = os.getpid()
HOST = "127.0.0.1"
HALF_HELLO = b"\x16\x03\x01\x02\x00\x01"
"""A ClientHello's first bytes, and no more: a handshake that never finishes."""


# -- helpers -----------------------------------------------------------------------------------------


def starved(index: int, uuid: str, start: float) -> dict[str, Any]:
    """A GPU of this process, starved for CPU since `start`, with a fix line ready."""
    return {
        "index": index,
        "uuid": uuid,
        "label": "starved-cpu",
        "pids": [ME],
        "evidence": {"duty_cycle": 0.4},
        "episodes": [{"label": "starved-cpu", "start_unix_s": start, "end_unix_s": None}],
        "advice": {"ready": True, "kind": "loader", "line": "4 more loader workers: 2.0x the steps"},
        "seconds_in_state": {"starved": 10.0},
        "wasted_gpu_s": 6.0,
    }


class Daemon:
    """Stands in for `hooks.get`: answers `state` at once, except the question it is told to
    hold, which waits for `release` (a slow answer, still out when its run stops)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.hold_at: int | None = None
        """The question (1 the first) held until `release`, with `held_state` as its answer."""
        self.held_state: dict[str, Any] = {}
        self.holding = threading.Event()
        self.release = threading.Event()
        self.asked = 0

    def get(self, url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
        self.asked += 1
        if self.asked == self.hold_at:
            self.holding.set()
            self.release.wait(30)
            return json.dumps(self.held_state).encode()
        return json.dumps(self.state).encode()


def thread_named(name: str) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == name)


# -- framework= (finding 1) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "framework",
    [["torch"], {"torch": 1}, {"keras"}, 5, "jax"],
    ids=["a list", "a dict", "a set", "an int", "a framework without advice"],
)
def test_a_framework_not_understood_is_the_general_advice_and_one_line(
    monkeypatch: pytest.MonkeyPatch, framework: Any
) -> None:
    """`framework=["torch"]` (or a dict) made each line's advice lookup raise TypeError, which the
    poll swallowed: no starvation line at all, and no word why."""
    now = time.time()
    monkeypatch.setattr(
        hooks, "get", Daemon({"gpus": [starved(0, "GPU-0", now)], "time_unix_s": now + 5}).get
    )
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", framework=framework, log=lines.append)
    w._poll()
    w._poll()
    assert len(lines) == 2, lines
    assert "framework" in lines[0] and "general advice" in lines[0], lines[0]
    assert "GPU 0 starved (cpu) for 5 s" in lines[1], "the episode is still said"
    assert "preprocess in more worker processes" in lines[1], "with the general advice"
    assert "4 more loader workers" in lines[1], "and the fix line, in the general words"
    assert w.framework is None


def test_the_frameworks_with_advice_are_said_nothing_of(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    monkeypatch.setattr(hooks, "get", Daemon({"gpus": [starved(0, "GPU-0", now)], "time_unix_s": now}).get)
    for framework, knob in (
        ("torch", "DataLoader(num_workers)"),
        ("keras", "PyDataset(workers)"),
        (None, ""),
    ):
        lines: list[str] = []
        w = Watch("http://gpumon.invalid", framework=framework, log=lines.append)
        w._poll()
        assert len(lines) == 1 and knob in lines[0], lines


def test_advice_and_fix_line_take_any_framework() -> None:
    """The module's own functions, called with what a caller passed: no TypeError."""
    ready = {"ready": True, "kind": "loader", "line": "2 more loader workers"}
    for framework in (["torch"], {"a": 1}, {"torch"}, 3.5):
        assert advice("starved-cpu", framework) == advice("starved-cpu", None)
        assert fix_line(ready, framework) == "2 more loader workers"


# -- a restarted watch (finding 2) -------------------------------------------------------------------


def test_an_answer_for_a_stopped_run_is_not_read_into_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras calls `fit` again with the same callback: a question of the first run, still out when
    it stopped (stop waits STOP_DEADLINE_S, the question up to timeout_s), was answered into the
    second run: an episode line for it, and its reading taken as the second run's first."""
    monkeypatch.setattr(hooks, "STOP_DEADLINE_S", 0.05)  # (stop gives up on the held question)
    daemon = Daemon({"gpus": [], "time_unix_s": time.time()})
    daemon.hold_at = 1
    monkeypatch.setattr(hooks, "get", daemon.get)
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append, every_s=3600)
    w.start()
    assert daemon.holding.wait(30)
    first_run = w._thread
    assert first_run is not None
    w.stop(summary=False)
    assert first_run.is_alive(), "(the first run's question is still out)"
    w.start()  # the second fit
    try:
        now = time.time()  # the held answer comes now, with an episode of this very moment
        daemon.held_state = {"gpus": [starved(0, "GPU-old", now)], "time_unix_s": now}
        daemon.release.set()
        first_run.join(30)
        assert not first_run.is_alive()
        assert lines == [], "the first run's answer said nothing in the second"
        assert not w._last and not w._first and not w._reported, "nor became its readings"
        daemon.state = {"gpus": [starved(1, "GPU-new", now)], "time_unix_s": now}
        w._poll()  # the second run's own question is read as before
        assert list(w._last) == ["GPU-new"] and len(lines) == 1 and "GPU 1 starved" in lines[0], lines
    finally:
        w.stop(summary=False)


def test_a_summary_still_out_when_the_next_run_starts_is_not_said_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a run asks the daemon once more, then sums up: when that question outlived
    stop()'s deadline, its answer and the summary came in the next run (its counters, mid-run)."""
    monkeypatch.setattr(hooks, "STOP_DEADLINE_S", 0.05)
    now = time.time()
    daemon = Daemon({"gpus": [starved(0, "GPU-0", now)], "time_unix_s": now})
    monkeypatch.setattr(hooks, "get", daemon.get)
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append, every_s=3600)
    w._poll()  # the first run: reachable, one GPU
    daemon.hold_at = daemon.asked + 1  # its last question (at stop) is slow
    daemon.held_state = daemon.state
    w.stop(summary=True)
    assert daemon.holding.wait(30)
    final = thread_named("gpumon-watch-end")
    said = len(lines)
    daemon.state = {"gpus": [], "time_unix_s": now}
    w.start()
    try:
        daemon.release.set()
        final.join(30)
        assert not final.is_alive()
        assert lines[said:] == [], "nothing of the first run said in the second"
        assert not w._last, "nor read into it"
    finally:
        w.stop(summary=False)


# -- TLS handshakes that never finish (finding 3) ----------------------------------------------------


@pytest.fixture(scope="module")
def web_yml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A web config serving TLS with a certificate for localhost."""
    return self_signed(tmp_path_factory.mktemp("tls"))[2]


@pytest.fixture
def tls_server(web_yml: Path) -> Iterator[Callable[..., http.WebServer]]:
    made: list[http.WebServer] = []

    def start(**kw: Any) -> http.WebServer:
        routes = http.Routes(
            metrics=lambda accept, gz: (b"up 1\n", "text/plain", None),
            state=dict,
            health=lambda: (True, "ok"),
            landing=lambda: "gpumon",
        )
        web = http.WebServer((HOST, 0), routes, load_web_config(str(web_yml)), timeout_s=60.0, **kw)
        web.start()
        made.append(web)
        return web

    yield start
    for web in made:
        web.stop()


def half_open(port: int, n: int) -> list[socket.socket]:
    """`n` connections that start a TLS handshake and never finish it."""
    held = []
    for _ in range(n):
        s = socket.create_connection((HOST, port), timeout=30)
        s.sendall(HALF_HELLO)
        held.append(s)
    return held


def closed_by_server(s: socket.socket) -> bool:
    """Waits (up to the socket's timeout) for the server to close `s`."""
    try:
        return s.recv(100) == b""
    except (ConnectionResetError, ssl.SSLEOFError):
        return True
    except TimeoutError:
        return False


def real_client(port: int) -> int:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"https://{HOST}:{port}/healthz", context=ctx, timeout=30) as r:
        return int(r.status)


def test_handshakes_past_the_bound_close_the_oldest_and_a_real_client_is_served(
    tls_server: Callable[..., http.WebServer],
) -> None:
    """Each connection in its handshake costs ~70 KiB (500 held took a daemon from 29 to 63 MB,
    never given back), and nothing bounded how many: the connection limit could not close one
    still in its handshake. Past `max_handshakes`, the oldest is closed for the newcomer."""
    web = tls_server(max_handshakes=8, handshake_floor_s=0.0)
    held = half_open(web.port, 20)
    try:
        assert closed_by_server(held[11]), "the twelfth oldest was closed for the twentieth"
        assert all(closed_by_server(s) for s in held[:11]), "and those before it"
        assert len(web._handshakes) == 8 and web._unborn == 8 and web.evicted == 12
        assert real_client(web.port) == 200, "a real client is served while the crowd holds its 8"
    finally:
        for s in held:
            s.close()


def test_a_burst_of_real_clients_past_the_bound_waits_its_turn_and_is_served(
    tls_server: Callable[..., http.WebServer],
) -> None:
    """Real clients whose hellos come a moment after their connects (a slow network): closing the
    oldest handshake whatever its age closed 144 of 400 such clients. Handshakes younger than the
    floor are never closed: the newcomers wait in the kernel's backlog until one finishes."""
    web = tls_server(max_handshakes=8, handshake_floor_s=60.0)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    connected = [socket.create_connection((HOST, web.port), timeout=30) for _ in range(20)]
    served = 0
    try:
        for raw in connected:  # each says hello only now, the oldest first
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                served += s.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        for raw in connected:
            raw.close()
    assert served == 20 and web.evicted == 0, (served, web.evicted)


def test_at_the_connection_limit_a_handshake_never_finished_makes_room(
    tls_server: Callable[..., http.WebServer],
) -> None:
    """At `max_connections`, room was made only when a newcomer's handshake finished (in
    `_client`): a crowd of handshakes never finished was accepted past the limit, at
    EVICTIONS_PER_S, until the daemon ran out of file descriptors and real clients waited in vain.
    Now the newcomer makes room as it is accepted: the longest waiting goes, whether it waits in
    its handshake or for its request head."""
    web = tls_server(max_connections=6, max_handshakes=5, handshake_floor_s=0.0)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    slow = []  # two clients through their handshake, then half a request head
    for _ in range(2):
        s = ctx.wrap_socket(socket.create_connection((HOST, web.port), timeout=30))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost:")
        slow.append(s)
    held = half_open(web.port, 6)
    try:
        assert closed_by_server(slow[0]), (
            "the longest waiting (for its head) made room for the fifth handshake"
        )
        assert closed_by_server(held[0]), "the oldest handshake made room for the sixth (five at most)"
        assert len(web._conns) + web._unborn == 6 and web.evicted == 2
        assert real_client(web.port) == 200
    finally:
        for s in [*slow, *held]:
            s.close()


def test_the_end_of_a_run_says_no_traceback_when_its_last_question_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """stop() asks once more on a thread of its own: an exception there (reading /proc as the job
    ends) printed a thread's traceback in the training log; the summary still follows."""
    now = time.time()
    daemon = Daemon({"gpus": [starved(0, "GPU-0", now)], "time_unix_s": now})
    monkeypatch.setattr(hooks, "get", daemon.get)
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append, every_s=3600)
    w._poll()  # the run's first question, as its thread asks it
    assert w._reachable

    def broken(pid: int) -> set[int]:
        raise RuntimeError("/proc went away")

    monkeypatch.setattr(hooks, "process_tree", broken)
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    w.stop()
    assert raised == [], raised


@pytest.mark.parametrize(("bound", "floor"), [(256, 1.0), (64, 64 / http.EVICTIONS_PER_S)])
def test_at_a_low_handshake_bound_the_floor_is_no_longer_than_the_eviction_budget_needs(
    tls_server: Callable[..., http.WebServer], bound: int, floor: float
) -> None:
    """A 1 s floor at max_handshakes 64 capped accepting at 64 a second: a flood of 100 half-open
    connections a second then held real clients 1.35 s (median) in the kernel's backlog, against
    5 ms with no floor (a review's measurement). The floor is the budget's time to go through them."""
    assert tls_server(max_handshakes=bound).handshake_floor_s == pytest.approx(floor)
