"""Hostile and clumsy HTTP clients, as fixtures for the exporter's tests and its benchmark: the
slowloris that trickles a header line at a time, the client that hangs up mid-request, requests
that smuggle a body, and a plain raw exchange to see exactly what the server wrote; and a raw
server, for a hostile daemon that gpumon's own clients talk to."""

from __future__ import annotations

import http.client
import re
import resource
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def raw_exchange(host: str, port: int, data: bytes, wait_s: float = 2.0) -> bytes:
    """Send `data` and return every byte the server sends until it closes (or `wait_s` of quiet)."""
    with socket.create_connection((host, port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def responses_in(data: bytes) -> list[bytes]:
    """The status lines found in raw bytes from the server."""
    return [line for line in data.split(b"\r\n") if line.startswith(b"HTTP/")]


def raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


class Slowloris:
    """`count` connections that each send a request line, then one header line every `every_s`,
    never finishing the request. `open_count()` says how many the server still keeps."""

    def __init__(self, host: str, port: int, count: int, every_s: float = 5.0) -> None:
        raise_fd_limit(count + 256)
        self.socks: list[socket.socket] = []
        for _ in range(count):
            s = socket.create_connection((host, port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            self.socks.append(s)
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(self._every):
            for s in self.socks:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass

    def open_count(self) -> int:
        alive = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                alive += s.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive

    def close(self) -> None:
        self._stop.set()
        for s in self.socks:
            s.close()


@contextmanager
def slowloris(host: str, port: int, count: int, every_s: float = 5.0) -> Iterator[Slowloris]:
    s = Slowloris(host, port, count, every_s)
    try:
        yield s
    finally:
        s.close()


def hang_up_mid_request(host: str, port: int) -> None:
    """Half a request, then a reset (SO_LINGER 0): the rudest way to leave."""
    s = socket.create_connection((host, port))
    s.sendall(b"GET /metr")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def scrape_latencies(
    host: str, port: int, n: int, pause_s: float = 0.0, source: str = ""
) -> tuple[list[float], dict[int, int]]:
    """`n` scrapes of /metrics on fresh connections: (seconds each, count by status)."""
    lat: list[float] = []
    codes: dict[int, int] = {}
    for _ in range(n):
        t0 = time.perf_counter()
        c = http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0) if source else None)
        try:
            c.request("GET", "/metrics")
            r = c.getresponse()
            r.read()
            codes[r.status] = codes.get(r.status, 0) + 1
        except OSError:
            codes[0] = codes.get(0, 0) + 1
        finally:
            c.close()
        lat.append(time.perf_counter() - t0)
        if pause_s:
            time.sleep(pause_s)
    return lat, codes


def keepalive_latencies(host: str, port: int, n: int) -> list[float]:
    """`n` requests sent back to back on one keep-alive connection: seconds each."""
    c = http.client.HTTPConnection(host, port, timeout=10)
    out = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            c.request("GET", "/metrics")
            c.getresponse().read()
            out.append(time.perf_counter() - t0)
    finally:
        c.close()
    return out


def whole_in_first_read(host: str, port: int, n: int, path: str = "/metrics") -> list[bool]:
    """`n` requests back to back on one keep-alive connection: for each, whether the whole response
    (its head and Content-Length bytes of body) came in the first read after the request. A server
    that writes a response in pieces leaves the later ones to Nagle's algorithm, which holds them
    until the client's delayed ACK (~40 ms on Linux): the stall this detects, without a clock."""
    out = []
    with socket.create_connection((host, port), timeout=10) as s:
        for _ in range(n):
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            first = s.recv(1 << 20)
            head, _, body = first.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
            out.append(len(body) == length)
            while len(body) < length:  # the rest, to keep the connection in step
                body += s.recv(1 << 20)
    return out


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


class RawServer:
    """A TCP server on 127.0.0.1 that hands each connection to `answer(conn, stop)` on a thread of
    its own (a client hanging up is no error); `close()` stops it and sets `stop`."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.answer = answer
        self.sent: list[bytes] = []
        self.stop = threading.Event()
        self.srv = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.srv.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.answer(conn, self.stop)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.srv.close()


def self_signed(directory: Path) -> tuple[Path, Path, Path]:
    """A certificate and key for localhost in `directory`, and a web config serving TLS with them."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
         str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    web_yml = directory / "web.yml"
    web_yml.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return cert, key, web_yml
