"""The exporter's HTTP side against hostile and clumsy clients: a real `gpumon serve` process
(started once for the module) on 8 simulated GPUs, attacked as users of node_exporter expect it
to hold: slowloris crowds, smuggled bodies, malformed heads, rude disconnects, keep-alive."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.serve.http import _bind

from . import hostile
from .conftest import ROOT, free_port

HOST = "127.0.0.1"


class Served:
    def __init__(self, port: int, proc: subprocess.Popen[str], log: Path) -> None:
        self.port, self.proc, self.log = port, proc, log


def start(tmp: Path, *args: str, listen: str | None = None, port: int | None = None) -> Served:
    port = port or free_port()
    log = tmp / f"serve-{port}.log"
    conf = tmp / f"gpumon-{port}.toml"
    conf.write_text("request_timeout_s = 2\n")
    proc = subprocess.Popen(
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
            listen or f"{HOST}:{port}",
            *args,
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        text=True,
    )
    deadline = time.monotonic() + 20
    while "serving on" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return Served(port, proc, log)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start(tmp_path_factory.mktemp("serve"), "--simulate", "healthy,starved-cpu", "--gpus", "8")
    deadline = time.monotonic() + 10
    while hostile.scrape_latencies(HOST, s.port, 1)[1].get(200) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    yield s
    s.proc.terminate()
    s.proc.wait(10)


def test_a_slowloris_crowd_does_not_keep_scrapes_out(served: Served) -> None:
    with hostile.slowloris(HOST, served.port, 1000, every_s=0.5) as crowd:
        time.sleep(0.3)
        held, threads = crowd.open_count(), threads_of(served.proc.pid)
        lat, codes = hostile.scrape_latencies(HOST, served.port, 60, pause_s=0.01)
        assert codes == {200: 60}, codes
        # kept out, a scrape would wait for crowd connections to reach their deadline (2 s, the
        # server's request_timeout_s); how fast it is otherwise is the benchmark's (p99 50 ms),
        # not a test's: a loaded machine is slower
        assert hostile.p99(lat) < 2.0, f"p99 {hostile.p99(lat) * 1e3:.0f} ms: scrapes waited for the crowd"
    # idle connections are held without a thread each (on a loaded machine the crowd may not all
    # be open at once: each is closed 2 s after it began, request_timeout_s, however it trickles)
    assert threads < 20 <= held, (threads, held)


def threads_of(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def test_a_request_head_has_a_deadline_as_a_whole_not_per_byte(served: Served) -> None:
    with hostile.slowloris(
        HOST, served.port, 5, every_s=0.25
    ) as crowd:  # a byte well within any per-read timeout
        time.sleep(3.5)  # request_timeout_s is 2 in this server's file
        assert crowd.open_count() == 0, "trickling headers must not keep a connection forever"


def test_back_to_back_keepalive_requests_do_not_wait_for_a_delayed_ack(served: Served) -> None:
    # a response written in pieces waited ~40 ms for each request (the delayed-ACK stall): each is
    # now written at once, so it arrives whole (on loopback, one write of < 64 KiB is one segment)
    whole = hostile.whole_in_first_read(HOST, served.port, 20)
    assert all(whole), whole


@pytest.mark.parametrize(
    "request_bytes,status",
    [
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", b"400"),
        (b"GET /metrics\r\n\r\n", b"400"),  # HTTP/0.9 style: still a status line
        (b"FOO /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
        (b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"400"),  # TLS on the plain port
    ],
)
def test_malformed_requests_get_one_status_line_and_no_traceback(
    served: Served, request_bytes: bytes, status: bytes
) -> None:
    out = hostile.raw_exchange(HOST, served.port, request_bytes)
    lines = hostile.responses_in(out)
    assert len(lines) == 1 and lines[0].startswith(b"HTTP/1.1 " + status), out[:200]
    assert b"bytearray(" not in out, "a reason for people, not the bytes as Python writes them"
    if status == b"405":
        assert b"Allow: GET, HEAD" in out


@pytest.mark.parametrize(
    "smuggled",
    [
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nContent-Length: 41\r\n\r\n"
        b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 37\r\n\r\n"
        b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_a_body_is_never_read_as_a_second_request(served: Served, smuggled: bytes) -> None:
    out = hostile.raw_exchange(HOST, served.port, smuggled)
    assert len(hostile.responses_in(out)) == 1, out[:300]
    assert b"404" not in out and b"not found" not in out


def test_rude_disconnects_leave_no_tracebacks_in_the_log(served: Served) -> None:
    for _ in range(50):
        hostile.hang_up_mid_request(HOST, served.port)
    time.sleep(0.3)
    assert hostile.scrape_latencies(HOST, served.port, 1)[1] == {200: 1}
    text = served.log.read_text()
    assert "Traceback" not in text and "Exception" not in text and "ERROR" not in text, text[-2000:]


def test_gzip_when_the_scraper_asks(served: Served) -> None:
    import gzip
    import http.client

    c = http.client.HTTPConnection(HOST, served.port, timeout=10)
    c.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.getheader("Content-Encoding") == "gzip" and r.getheader("Vary") == "Accept-Encoding"
    text = gzip.decompress(body).decode()
    assert "gpumon_gpu_state{" in text and len(body) < len(text) / 4


def test_the_sample_age_is_computed_when_scraped(served: Served) -> None:
    import re

    bodies = []
    for _ in range(2):
        out = hostile.raw_exchange(
            HOST, served.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        bodies.append(float(re.search(rb"\ngpumon_last_sample_age_seconds (\S+)", out).group(1)))  # type: ignore[union-attr]
        time.sleep(0.3)
    assert bodies[0] != bodies[1], "the age moves between two scrapes of the same sample"


def test_a_listening_host_given_by_name_is_resolved() -> None:
    """`listen: localhost:9877` binds where the name resolves (an ASCII name is looked up as bytes:
    gpumon.serve.http._bind)."""
    (s,) = _bind("localhost", 0)
    try:
        host, port = s.getsockname()[:2]
        assert host in ("127.0.0.1", "::1")
        with socket.create_connection((host, port), timeout=5):
            pass
    finally:
        s.close()


def test_ipv6_and_dual_stack(tmp_path: Path) -> None:
    port = free_port()
    s6 = start(tmp_path, "--simulate", "healthy", listen=f"[::1]:{port}", port=port)
    try:
        out = hostile.raw_exchange(
            "::1", port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert out.startswith(b"HTTP/1.1 "), out
    finally:
        s6.proc.terminate()
        s6.proc.wait(10)
    port = free_port()
    both = start(tmp_path, "--simulate", "healthy", listen=f":{port}", port=port)
    try:
        for host in ("127.0.0.1", "::1"):
            out = hostile.raw_exchange(
                host, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert out.startswith(b"HTTP/1.1 "), (host, out)
    finally:
        both.proc.terminate()
        both.proc.wait(10)


def test_the_tls_port_never_answers_in_plaintext(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
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
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    s = start(tmp_path, "--simulate", "healthy", "--web-config-file", str(web))
    try:
        out = hostile.raw_exchange(HOST, s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"HTTP/1.1" not in out, "plain HTTP on a TLS port gets no HTTP answer"
        with socket.create_connection((HOST, s.port)) as raw:  # says nothing, not even a ClientHello
            raw.settimeout(30)  # the handshake deadline is request_timeout_s (5 s); a timeout here fails
            assert raw.recv(10) == b"", "dropped at the handshake deadline"
    finally:
        s.proc.terminate()
        s.proc.wait(10)
