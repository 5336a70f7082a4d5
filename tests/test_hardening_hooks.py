"""The training-log hooks against a daemon that misbehaves (issue 28, item 6): the hooks run inside
the user's training job, so whatever the daemon does, no exception reaches the training code,
`stop()` (Keras' and Lightning's on_train_end, the torch context's exit) returns within its
deadline, and what is read is bounded in bytes."""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from gpumon.integrations import MAX_STATE_BYTES, STOP_DEADLINE_S, Watch, get
from gpumon.integrations.torch import watch as torch_watch

from .hostile import RawServer

TRICKLE_S = 60.0
"""How long the hostile daemon keeps a connection trickling: nothing may wait that out."""

GOOD = json.dumps({"gpus": [], "time_unix_s": 0}).encode()


class Hostile(RawServer):
    """A daemon that answers its first `honest` requests properly, then does `then` to every
    later connection: trickle its answer a byte at a time, stream an endless body, or send a
    body given as bytes."""

    def __init__(self, then: str | bytes, honest: int = 1) -> None:
        self.then = then
        self.honest = honest
        self.asked = 0
        self.trickling = threading.Event()
        """Set once a connection is being trickled."""
        self.trickle_ends = float("inf")
        """When the first trickle would end, if waited out (the adversary's own timeline)."""
        super().__init__(self._serve)

    def _serve(self, conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        self.asked += 1
        if self.asked <= self.honest:
            conn.sendall(self._response(GOOD))
        elif self.then == "trickle":
            self._trickle(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000)
        elif self.then == "trickle-body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            self._trickle(conn, b" " * 100000)
        elif self.then == "trickle-to-close":  # no length: the body ends with the connection
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            self._trickle(conn, b" " * 100000)
        elif self.then == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"100000\r\n" + b"[" * 0x100000 + b"\r\n"
            while not self.stop.is_set():
                conn.sendall(chunk)
        elif self.then == "endless-length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n")
            block = b"[" * 0x100000
            while not self.stop.is_set():
                conn.sendall(block)
        else:
            assert isinstance(self.then, bytes)
            conn.sendall(self._response(self.then))

    def _trickle(self, conn: socket.socket, data: bytes) -> None:
        end = time.monotonic() + TRICKLE_S
        self.trickle_ends = min(self.trickle_ends, end)
        self.trickling.set()
        for byte in data:
            if self.stop.is_set() or time.monotonic() > end:
                return
            conn.sendall(bytes([byte]))
            self.stop.wait(0.2)

    @staticmethod
    def _response(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    made: list[Hostile] = []

    def make(then: str | bytes, honest: int = 1) -> Hostile:
        made.append(Hostile(then, honest))
        return made[-1]

    yield make
    for h in made:
        h.close()


def started(h: Hostile, lines: list[str]) -> Watch:
    w = Watch(h.url, gpus=[0], every_s=0.05, timeout_s=1.0, log=lines.append).start()
    deadline = time.monotonic() + 30
    while h.asked < h.honest + 1 and time.monotonic() < deadline:  # answered, and asked again
        time.sleep(0.02)
    return w


@pytest.mark.parametrize("then", ["trickle", "trickle-body", "trickle-to-close"])
def test_stop_returns_within_its_deadline_against_a_trickling_daemon(
    hostile: Callable[..., Hostile], then: str
) -> None:
    h = hostile(then)
    lines: list[str] = []
    w = started(h, lines)
    assert h.trickling.wait(30), "the daemon is trickling its answer now"
    t0 = time.monotonic()
    w.stop()  # what on_train_end and the torch context's exit call, in the training thread
    took = time.monotonic() - t0
    assert time.monotonic() < h.trickle_ends, "stop() waited the trickle out"
    assert took < 3 * STOP_DEADLINE_S, f"stop() took {took:.1f} s; its deadline is {STOP_DEADLINE_S} s"


def test_the_torch_context_ends_within_its_deadline(hostile: Callable[..., Hostile]) -> None:
    h = hostile("trickle")
    lines: list[str] = []
    t0 = time.monotonic()
    with torch_watch(h.url, gpus=[0], every_s=0.05, log=lines.append) as w:
        w.timeout_s = 1.0
        assert h.trickling.wait(30)
        t0 = time.monotonic()
    assert time.monotonic() < h.trickle_ends and time.monotonic() - t0 < 3 * STOP_DEADLINE_S


def test_one_question_has_a_total_deadline_not_one_per_read(hostile: Callable[..., Hostile]) -> None:
    h = hostile("trickle", honest=0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        get(h.url + "/api/v1/state", {}, 1.0, MAX_STATE_BYTES)
    assert time.monotonic() < h.trickle_ends, "the trickle (60 s) was waited out"
    assert time.monotonic() - t0 < 5, "one second in all, not per read"


@pytest.mark.parametrize("then", ["endless", "endless-length"])
def test_an_endless_body_is_read_to_a_bound(hostile: Callable[..., Hostile], then: str) -> None:
    h = hostile(then, honest=0)
    tracemalloc.start()
    try:
        with pytest.raises((ValueError, TimeoutError)):
            get(h.url, {}, 30.0, MAX_STATE_BYTES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_STATE_BYTES, f"{peak / 1e6:.0f} MB held for an endless body"


@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2, 3]",
        b'"a string"',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"gpus": {"0": 1}}',
        b'{"gpus": [{"index": 0, "uuid": null, "label": "starved-cpu", "episodes": 7}]}',
        b'{"gpus": [{"index": 0, "label": "starved-cpu", "episodes": [{"start_unix_s": "soon"}]}]}',
        b'{"gpus": [{"index": 0, "seconds_in_state": [1], "wasted_gpu_s": "x"}]}',
        b"not json at all",
        b"\xff\xfe",
    ],
    ids=["list", "string", "deep", "gpus-dict", "episodes-int", "start-str", "odd-counters", "text", "bytes"],
)
def test_no_state_a_daemon_sends_raises_into_the_training_code(
    hostile: Callable[..., Hostile], body: bytes
) -> None:
    h = hostile(body, honest=0)
    lines: list[str] = []
    w = Watch(h.url, gpus=[0], every_s=0.05, timeout_s=1.0, log=lines.append)
    w._reachable = True  # as after a first good answer: the summary is asked for too
    w.start()
    deadline = time.monotonic() + 30
    while h.asked < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    w.drain()
    w.stop()  # no exception, whatever the body


def test_a_log_function_that_raises_never_reaches_the_training_code() -> None:
    def broken(line: str) -> None:
        raise RuntimeError("the user's logger is broken")

    w = Watch("http://127.0.0.1:1", gpus=[0], timeout_s=0.5, log=broken, defer=True)
    w._poll()  # no daemon: a line is queued for the log
    assert w.pending
    w.drain()
    w.stop()
    w.log = broken
    w.defer = False
    w._reachable = None
    w._poll()  # said at once, through the broken log, from the watch's thread: still no exception
