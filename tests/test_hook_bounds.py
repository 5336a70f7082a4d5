"""The training-log hooks' bounds against a daemon and an environment that misbehave: what the
watch keeps per GPU and what the summary prints stay bounded whatever GPUs a daemon names, and
no environment (credentials, URL) or interval raises into the training code. The daemon is a fake
`get` the test drives, one question per `_poll()`; its clock is the state's `time_unix_s`."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tracemalloc
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

import gpumon.integrations as hooks
from gpumon.integrations import (
    DEFAULT_URL,
    EVERY_S,
    MAX_GPUS,
    MAX_LINE_CHARS,
    MAX_REPORTED,
    MAX_SUMMARY_GPUS,
    TIMEOUT_S,
    Watch,
)
from gpumon.integrations.torch import watch as torch_watch

from .conftest import ROOT

ME = os.getpid()


class Daemon:
    """Answers each question with `state(n)`, n counting from 1; remembers the headers sent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, state: Callable[[int], dict[str, Any]]) -> None:
        self.state = state
        self.asked = 0
        self.headers: dict[str, str] = {}
        monkeypatch.setattr(hooks, "get", self.get)

    def get(self, url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
        self.asked += 1
        self.headers = headers
        return json.dumps(self.state(self.asked)).encode()


def gpu(index: int, uuid: str, label: str = "healthy", start: float = 0.0, **kw: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid,
        "label": label,
        "pids": [ME],
        "evidence": kw.get("evidence", {"duty_cycle": 0.4}),
        "episodes": [{"label": label, "start_unix_s": start, "end_unix_s": None}],
        "seconds_in_state": kw.get("seconds", {}),
        "wasted_gpu_s": kw.get("wasted", 0.0),
    }


def held(poll: Callable[[], None], warm: int, more: int) -> int:
    """Bytes still held after `more` polls beyond the first `warm` (what the watch keeps)."""
    tracemalloc.start()
    try:
        for _ in range(warm):
            poll()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(more):
            poll()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


# -- what is kept per GPU --------------------------------------------------------------------------


def test_a_daemon_naming_new_gpus_at_every_question_cannot_grow_the_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """64 GPUs with new UUIDs at every question, each holding this job's PID and starved: the
    watch follows the last MAX_GPUS seen, and the end of the run is a bounded summary, not a line
    per UUID ever named (9,792 of them after 153 questions)."""
    lines: deque[str] = deque(maxlen=1000)
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix

    def state(n: int) -> dict[str, Any]:
        return {
            "time_unix_s": t0 + 20 + n,
            "gpus": [gpu(i, f"GPU-{n}-{i}", "starved-cpu", t0 + n, wasted=float(i)) for i in range(64)],
        }

    daemon = Daemon(monkeypatch, state)
    for _ in range(153):
        w._poll()
    assert len(w._first) <= MAX_GPUS and len(w._judged_from) <= MAX_GPUS and len(w._last) <= MAX_GPUS
    assert len(w._reported) <= MAX_REPORTED
    assert set(w._last) == {f"GPU-{daemon.asked}-{i}" for i in range(64)}, "the GPUs seen last"
    lines.clear()
    w._say_summary()
    assert len(lines) == MAX_SUMMARY_GPUS + 1
    assert lines[-1] == f"gpumon: this run on {64 - MAX_SUMMARY_GPUS} more GPUs: 0.0000 GPU-hours wasted"


def test_what_the_watch_holds_stops_growing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new GPU at every question, each with 100 KB of evidence and a 100 KB UUID on the next:
    nothing the summary does not need is kept (a reading from the run's start is kept per GPU),
    and a name no GPU has is not followed (it would be kept with each episode said)."""
    w = Watch("http://gpumon.invalid", log=lambda line: None)
    t0 = w._started_unix

    def state(n: int) -> dict[str, Any]:
        big = {"duty_cycle": 0.4, "note": "x" * 100_000}
        return {
            "time_unix_s": t0 + 20 + n,
            "gpus": [
                gpu(0, f"GPU-{n}", evidence=big),
                gpu(1, f"GPU-{n}-" + "y" * 100_000, "starved-cpu", t0 + n),
            ],
        }

    Daemon(monkeypatch, state)
    grown = held(w._poll, warm=MAX_GPUS + 5, more=60)
    assert grown < 1_000_000, f"{grown / 1e6:.1f} MB more held after 60 questions"


def test_a_normal_jobs_summary_is_one_line_per_gpu_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four GPUs with the same UUIDs all run; GPU 3's process ends halfway: its line stays."""
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix

    def state(n: int) -> dict[str, Any]:
        on = range(4) if n <= 5 else range(3)
        return {
            "time_unix_s": t0 + 5 * n,
            "gpus": [
                gpu(i, f"GPU-{i}", start=t0 + 1, seconds={"healthy": 5.0 * n, "idle": 10.0 * i}, wasted=i * n)
                for i in on
            ],
        }

    Daemon(monkeypatch, state)
    for _ in range(10):
        w._poll()
    w._say_summary()
    assert lines == [
        "gpumon: this run on GPU 0: healthy 45 s (100%); 0.0000 GPU-hours wasted (judged from 5 s in)",
        "gpumon: this run on GPU 1: healthy 45 s (100%); 0.0025 GPU-hours wasted (judged from 5 s in)",
        "gpumon: this run on GPU 2: healthy 45 s (100%); 0.0050 GPU-hours wasted (judged from 5 s in)",
        "gpumon: this run on GPU 3: healthy 20 s (100%); 0.0033 GPU-hours wasted (judged from 5 s in)",
    ]


def test_beyond_max_summary_gpus_the_summary_names_the_worst(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix
    n_gpus = MAX_SUMMARY_GPUS + 4
    wasted = {i: 3600.0 * ((i * 7) % n_gpus) for i in range(n_gpus)}  # 0 to n_gpus - 1 hours, shuffled

    def state(n: int) -> dict[str, Any]:
        return {
            "time_unix_s": t0 + 5 * n,
            "gpus": [gpu(i, f"GPU-{i}", start=t0 + 1, wasted=wasted[i] * (n - 1)) for i in range(n_gpus)],
        }

    Daemon(monkeypatch, state)
    w._poll()
    w._poll()
    w._say_summary()
    worst = sorted(range(n_gpus), key=lambda i: -wasted[i])[:MAX_SUMMARY_GPUS]
    assert [line.split(":")[1] for line in lines[:-1]] == [f" this run on GPU {i}" for i in sorted(worst)]
    assert lines[-1] == "gpumon: this run on 4 more GPUs: 6.0000 GPU-hours wasted"  # 0 + 1 + 2 + 3


def test_counters_no_gpumon_sends_get_no_summary_line(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix
    odd = {f"state-{k}": 1.0 for k in range(10_000)}
    Daemon(
        monkeypatch,
        lambda n: {
            "time_unix_s": t0 + 20,
            "gpus": [gpu(0, "GPU-0", seconds={"healthy": 5.0 * n}), gpu(1, "GPU-1", seconds=odd)],
        },
    )
    w._poll()
    w._poll()
    w._say_summary()
    assert lines == [
        "gpumon: this run on GPU 0: healthy 5 s (100%); 0.0000 GPU-hours wasted (judged from 20 s in)"
    ]


# -- what is said ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label", ["starved-" + "x" * 100_000, "starved-\udcff"], ids=["a megabyte", "a lone surrogate"]
)
def test_a_line_is_short_text_any_log_can_write(monkeypatch: pytest.MonkeyPatch, label: str) -> None:
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", log=lines.append)
    t0 = w._started_unix
    Daemon(monkeypatch, lambda n: {"time_unix_s": t0 + 20, "gpus": [gpu(0, "GPU-0", label, t0 + 1)]})
    w._poll()
    assert len(lines) == 1 and lines[0].startswith("gpumon: GPU 0 ")
    assert len(lines[0]) <= MAX_LINE_CHARS
    lines[0].encode("utf-8")  # a UTF-8 log file takes it


# -- the environment and the arguments -------------------------------------------------------------


def test_a_password_that_is_not_utf8_is_sent_as_the_environments_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUMON_BASIC_AUTH=$'user:\\xff' (the daemon checks a password's bytes)."""
    monkeypatch.setenv("GPUMON_BASIC_AUTH", os.fsdecode(b"user:\xff"))
    lines: list[str] = []
    daemon = Daemon(monkeypatch, lambda n: {"gpus": []})
    w = torch_watch("http://gpumon.invalid", log=lines.append)  # raised UnicodeEncodeError
    w._poll()
    assert daemon.headers == {"Authorization": "Basic " + base64.b64encode(b"user:\xff").decode()}
    assert lines == []


def test_the_torch_context_runs_with_a_password_that_is_not_utf8() -> None:
    """As a user's shell runs it: `GPUMON_BASIC_AUTH=$'user:\\xff' python train.py`."""
    env = {**os.environb, b"GPUMON_BASIC_AUTH": b"user:\xff", b"PYTHONPATH": os.fsencode(ROOT)}
    code = "from gpumon.integrations.torch import watch\nwith watch('http://127.0.0.1:1'): pass\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode(errors="replace")


def test_credentials_no_header_can_carry_leave_the_hook_off_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value set from Python (no environment can hold it): one line, no thread, no exception,
    and the password is not in the line."""
    monkeypatch.setattr(os, "environ", {**os.environ, "GPUMON_BASIC_AUTH": "user:\ud800secret"})
    daemon = Daemon(monkeypatch, lambda n: {"gpus": []})
    lines: list[str] = []
    with torch_watch(log=lines.append):
        pass
    assert len(lines) == 1 and "no GPU starvation reports for this run" in lines[0], lines
    assert "GPUMON_BASIC_AUTH" in lines[0] and "secret" not in lines[0]
    assert daemon.asked == 0, "nothing is watched"


def test_the_keras_callback_is_made_whatever_the_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported (as gpumon bench does)
    from gpumon.integrations.keras import GpumonCallback

    monkeypatch.setattr(os, "environ", {**os.environ, "GPUMON_BASIC_AUTH": "user:\ud800"})
    daemon = Daemon(monkeypatch, lambda n: {"gpus": []})
    lines: list[str] = []
    cb = GpumonCallback(log=lines.append)  # raised UnicodeEncodeError
    cb.on_train_begin()
    cb.on_train_batch_end(0)
    cb.on_train_end()
    assert len(lines) == 1 and "GPUMON_BASIC_AUTH" in lines[0] and daemon.asked == 0


@pytest.mark.parametrize("every_s", [float("nan"), 0.0, -1.0, float("inf"), 1e300, "soon"])
def test_an_interval_that_is_not_seconds_is_the_default_and_one_line(every_s: Any) -> None:
    lines: list[str] = []
    w = Watch("http://gpumon.invalid", every_s=every_s, log=lines.append)
    assert w.every_s == EVERY_S, "NaN or 0 would ask the daemon as fast as it answers; 1e300 kills the thread"
    assert len(lines) == 1 and lines[0].startswith("gpumon: every_s") and "5 s instead" in lines[0]


def test_several_bad_settings_are_still_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", {**os.environ, "GPUMON_BASIC_AUTH": "\ud800"})
    lines: list[str] = []
    w = Watch(every_s=float("nan"), timeout_s=0.0, gpus=5, log=lines.append)
    w.start()
    w.stop()
    assert len(lines) == 1 and "every_s" in lines[0] and "timeout_s" in lines[0], lines
    assert w.timeout_s == TIMEOUT_S and lines[0].endswith("no GPU starvation reports for this run")


def test_an_empty_url_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUMON_URL", "")
    assert Watch(log=lambda line: None).url == DEFAULT_URL


@pytest.mark.parametrize(
    "url",
    [
        "http://\udcff:9877",  # GPUMON_URL=$'http://\xff:9877'
        "http://127.0.0.1:99999",
        "127.0.0.1:9877",
        "http://[::1",
        "http://" + "a" * 100_000,
    ],
    ids=["a byte not UTF-8", "a port out of range", "no scheme", "half an IPv6 address", "100 KB"],
)
def test_a_url_that_cannot_be_asked_is_one_short_line(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The real `get`, refusing each before it sends or resolves anything."""
    monkeypatch.setenv("GPUMON_URL", url)
    lines: list[str] = []
    w = Watch(log=lines.append)
    for _ in range(3):
        w._poll()
    assert len(lines) == 1 and lines[0].startswith("gpumon: no daemon at "), lines
    assert len(lines[0]) <= MAX_LINE_CHARS
    lines[0].encode("utf-8")


def test_a_url_with_credentials_never_shows_them_in_the_training_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpumon report` takes http://USER:PASSWORD@host; given to the hook, its "no daemon" line
    printed the password into the training log (found while hardening the hook)."""

    def refused(url: str, headers: dict[str, str], deadline_s: float, max_bytes: int) -> bytes:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(hooks, "get", refused)
    lines: list[str] = []
    w = Watch(url="http://scraper:hunter2@10.0.0.5:9877", log=lines.append)
    w._poll()
    assert len(lines) == 1 and "no daemon at http://***@10.0.0.5:9877" in lines[0], lines
    assert "hunter2" not in lines[0] and "scraper" not in lines[0]
    monkeypatch.undo()  # the real get: its own errors must not name the URL either (review)
    for url in ("ftp://user:s3cret@localhost:1", "http://u:s3cret@:9877", "http://user:p@s3cret@localhost:1"):
        lines.clear()
        Watch(url=url, log=lines.append, timeout_s=0.5)._poll()
        assert len(lines) == 1 and "s3cret" not in lines[0], lines
