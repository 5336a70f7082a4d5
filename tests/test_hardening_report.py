"""`gpumon report` (which the Slurm epilog runs) against servers that misbehave (issue 28, item 7):
it ends within its deadline whatever a daemon or Prometheus does, reads bounded bodies, answers
malformed JSON with exit 9 naming the URL, prints no terminal escapes a server sent, and takes
basic auth from the URL or a flag without ever printing the password."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpumon.analyze.job_report import MAX_BODY_BYTES
from gpumon.cli import main

from .test_hardening_hooks import Hostile, hostile  # noqa: F401  (a fixture)

EXIT_UNREACHABLE = 9


class Server:
    """Answers every GET with `body` (bytes, or a dict as JSON); remembers the headers seen."""

    def __init__(self) -> None:
        self.body: bytes | dict[str, Any] = b"{}"
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.headers.append(dict(self.headers))
                body = server.body if isinstance(server.body, bytes) else json.dumps(server.body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", "--job", "7", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def state(**gpu: Any) -> dict[str, Any]:
    g = {
        "index": 0,
        "uuid": "GPU-0",
        "label": "starved-cpu",
        "jobs": [{"job_id": "7", "user": "ann", "scheduler": "slurm"}],
        "episodes": [
            {"label": "starved-cpu", "start_unix_s": 1e9, "end_unix_s": 1e9 + 60, "wasted_gpu_s": 20}
        ],
    }
    g.update(gpu)
    return {"ready": True, "hostname": "node1", "time_unix_s": 1e9 + 120, "gpus": [g]}


# -- servers that never finish ----------------------------------------------------------------------


@pytest.mark.parametrize("then", ["trickle", "trickle-body", "trickle-to-close"])
def test_a_trickling_daemon_is_exit_9_within_the_deadline(
    hostile: Callable[..., Hostile],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    then: str,
) -> None:
    h = hostile(then, honest=0)
    t0 = time.monotonic()
    code, _, err = report(capsys, "--url", h.url, "--timeout", "1")
    assert time.monotonic() < h.trickle_ends, "the trickle (60 s) was waited out"
    assert time.monotonic() - t0 < 5, "one second per request in all, not per read"
    assert code == EXIT_UNREACHABLE and "no whole answer within 1 s" in err, err


@pytest.mark.parametrize("then", ["trickle", "trickle-to-close"])
def test_a_trickling_prometheus_is_exit_9_within_the_deadline(
    hostile: Callable[..., Hostile],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    then: str,
) -> None:
    """(An answer with no length, ending with its connection, was read to its end whatever the
    deadline: http.client hands such a socket to the response, out of the cut's reach; found by a
    hostile-input pass.)"""
    h = hostile(then, honest=0)
    code, _, err = report(capsys, "--prometheus", h.url, "--timeout", "1")
    assert time.monotonic() < h.trickle_ends
    assert code == EXIT_UNREACHABLE and "no whole answer" in err, err


@pytest.mark.parametrize("then", ["endless", "endless-length"])
def test_an_endless_body_is_refused_at_its_bound(
    hostile: Callable[..., Hostile],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    then: str,
) -> None:
    h = hostile(then, honest=0)
    tracemalloc.start()
    try:
        code, _, err = report(capsys, "--url", h.url)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == EXIT_UNREACHABLE and "longer than" in err, err
    assert peak < 3 * MAX_BODY_BYTES, f"{peak / 1e6:.0f} MB"


# -- answers of the wrong shape ---------------------------------------------------------------------

DAEMON_ANSWERS = {
    "not json": b"<html>hello</html>",
    "a list": b"[1, 2]",
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "gpus not a list": {"ready": True, "gpus": 5},
    "a gpu not an object": {"ready": True, "gpus": [1]},
    "jobs not a list": state(jobs=7),
    "index not a number": state(index="zero"),
    "episode without start": state(episodes=[{"label": "idle"}]),
    "start not a time": state(episodes=[{"label": "idle", "start_unix_s": 1e300}]),
    "start NaN-like": state(episodes=[{"label": "idle", "start_unix_s": "NaN"}]),
    "label not a string": state(episodes=[{"label": {"x": 1}, "start_unix_s": 1e9}]),
    "wasted infinite": b'{"ready": true, "time_unix_s": 1000000120, "gpus": [{"index": 0, '
    b'"jobs": [{"job_id": "7"}], "episodes": [{"label": "idle", "start_unix_s": 1e9, '
    b'"wasted_gpu_s": 1e999}]}]}',
}


@pytest.mark.parametrize("answer", list(DAEMON_ANSWERS))
def test_a_daemon_answer_of_the_wrong_shape_is_exit_9_naming_the_url(
    server: Server, capsys: pytest.CaptureFixture[str], answer: str
) -> None:
    server.body = DAEMON_ANSWERS[answer]
    code, _, err = report(capsys, "--url", server.url)
    assert code == EXIT_UNREACHABLE, err
    assert server.url in err and len(err.strip().splitlines()) == 1, err


PROMETHEUS_ANSWERS = {
    "not json": b"nope",
    "error": {"status": "error", "error": "bad query"},
    "no data": {"status": "success"},
    "result not a list": {"status": "success", "data": {"result": 3}},
    "series not objects": {"status": "success", "data": {"result": [1]}},
    "values not pairs": {"status": "success", "data": {"result": [{"metric": {"gpu": "0"}, "values": [1]}]}},
    "gpu not a number": {
        "status": "success",
        "data": {"result": [{"metric": {"gpu": "x", "state": "idle"}, "values": [[1, "1"]]}]},
    },
}


@pytest.mark.parametrize("answer", list(PROMETHEUS_ANSWERS))
def test_a_prometheus_answer_of_the_wrong_shape_is_exit_9(
    server: Server, capsys: pytest.CaptureFixture[str], answer: str
) -> None:
    server.body = PROMETHEUS_ANSWERS[answer]
    code, _, err = report(capsys, "--prometheus", server.url)
    assert code == EXIT_UNREACHABLE and server.url in err, err


def test_terminal_escapes_from_a_server_are_not_printed(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
    doc = state(label="starved-cpu" + evil, uuid="GPU-0" + evil)
    doc["hostname"] = "node1" + evil
    doc["gpus"][0]["jobs"][0]["user"] = "ann" + evil
    server.body = doc
    code, out, _ = report(capsys, "--url", server.url)
    assert code == 0, out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "node1?" in out
    code, out, _ = report(capsys, "--url", server.url, "--json")
    assert code == 0 and "\x1b" not in out  # JSON escapes them


# -- basic auth --------------------------------------------------------------------------------------


def test_credentials_in_the_url_are_sent_and_never_printed(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server.body = state()
    server.headers.clear()
    url = f"http://scraper:hunter2@127.0.0.1:{server.port}"
    code, out, err = report(capsys, "--url", url)
    assert code == 0, err
    assert server.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"scraper:hunter2").decode()
    assert "hunter2" not in out + err and "scraper:***@" in out
    code, _, err = report(capsys, "--url", "http://scraper:hunter2@127.0.0.1:1")  # refused: an error
    assert code == EXIT_UNREACHABLE and "hunter2" not in err and "scraper:***@" in err, err


def test_basic_auth_from_the_flag_or_the_environment(
    server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.body = state()
    server.headers.clear()
    assert report(capsys, "--url", server.url, "--basic-auth", "a:b")[0] == 0
    monkeypatch.setenv("GPUMON_BASIC_AUTH", "c:d")
    assert report(capsys, "--url", server.url)[0] == 0
    sent = [h["Authorization"] for h in server.headers]
    assert sent == ["Basic " + base64.b64encode(x).decode() for x in (b"a:b", b"c:d")]
    with pytest.raises(SystemExit) as e:
        main(["report", "--job", "7", "--url", server.url, "--basic-auth", "nocolon"])
    assert e.value.code == 2 and "USER:PASSWORD" in capsys.readouterr().err


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://scraper:hunter2@[::1", "http://scraper:hunter2@[::1/x@y"]
)
def test_a_url_that_is_none_is_exit_9_naming_it_without_its_password(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """Once an internal error (ValueError: Invalid IPv6 URL) from showing the URL without its
    password (found by a hostile-input pass)."""
    code, _, err = report(capsys, "--url", url)
    assert code == EXIT_UNREACHABLE and "not a URL" in err and "hunter2" not in err, err


def test_credentials_that_are_not_utf8_are_sent_as_given(
    server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment variable's bytes that are not UTF-8 (Python holds them as lone surrogates)
    were an internal error; they are the credentials the user set."""
    import os

    server.body = state()
    server.headers.clear()
    monkeypatch.setenv("GPUMON_BASIC_AUTH", os.fsdecode(b"u:\xff"))
    assert report(capsys, "--url", server.url)[0] == 0
    assert server.headers[-1]["Authorization"] == "Basic " + base64.b64encode(b"u:\xff").decode()


def test_samples_of_no_value_from_prometheus_never_reach_the_report(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN and infinite samples (values, or times) were taken: the text said `wasted: -inf
    GPU-hours` and `--json` wrote -Infinity, which is not JSON (found by a hostile-input pass)."""
    metric = {"gpu": "0", "job_id": "7", "instance": "n1", "uuid": "GPU-1", "state": "starved"}
    values = '[[1700000000, "1"], [1700000015, "NaN"], ["Inf", "1"], [1e400, "-Inf"], [1700000030, "-Inf"]]'
    series = '{"metric": ' + json.dumps(metric) + ', "values": ' + values + "}"
    head = '{"status": "success", "data": {"resultType": "matrix", "result": ['
    server.body = (head + series + "]}}").encode()
    code, out, err = report(capsys, "--prometheus", server.url, "--json")
    assert code == 0, err

    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    doc = json.loads(out, parse_constant=no_constant)
    assert doc["gpus"] and all(abs(g["wasted_gpu_s"]) < 1e12 for g in doc["gpus"]), doc["gpus"]
