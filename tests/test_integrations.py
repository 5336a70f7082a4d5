"""gpumon's verdict in the training log (gpumon.integrations): against a stub daemon whose state
the test writes. With real jobs (Keras bench, a plain PyTorch loop, Lightning) driving a
`gpumon serve --drive`: tests/test_real_jobs.py."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpumon.integrations import SETTLE_S, Watch, process_tree

from .conftest import free_port

# -- a stub daemon ----------------------------------------------------------------------------------


class Stub:
    """Serves whatever `state` holds; `gate`, when set, holds every answer until released."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"gpus": []}
        self.gate: threading.Event | None = None
        self.asked = 0
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.asked += 1
                if stub.gate is not None:
                    stub.gate.wait(20)
                body = json.dumps(stub.state).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    if s.gate is not None:
        s.gate.set()
    s.server.shutdown()


def gpu(index: int, label: str, pids: list[int], start: float, **kw: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "label": label,
        "pids": pids,
        "evidence": {"duty_cycle": kw.get("duty", 0.38)},
        "episodes": [{"label": label, "start_unix_s": start, "end_unix_s": None}],
        "seconds_in_state": kw.get("seconds", {}),
        "wasted_gpu_s": kw.get("wasted", 0.0),
    }


def test_one_line_per_starvation_episode_of_this_jobs_gpus(stub: Stub) -> None:
    lines: list[str] = []
    w = Watch(stub.url, framework="torch", log=lines.append)
    t0, me, other = time.time(), os.getpid(), 1
    stub.state = {
        "time_unix_s": t0 + 50,
        "gpus": [gpu(0, "starved-cpu", [me], t0 + 5), gpu(1, "starved-io", [other], t0)],
    }
    for _ in range(3):
        w._poll()  # the thread's work, driven by hand
    tip = "raise DataLoader(num_workers) or cache decoded samples"
    assert lines == [f"gpumon: GPU 0 starved (cpu) for 45 s, 62% idle: {tip}"]
    stub.state = {"time_unix_s": t0 + 150, "gpus": [gpu(0, "healthy", [me], t0 + 100)]}
    w._poll()
    stub.state = {"time_unix_s": t0 + 250, "gpus": [gpu(0, "starved-io", [me], t0 + 230)]}
    w._poll()
    w._poll()
    assert len(lines) == 2 and lines[1].startswith("gpumon: GPU 0 starved (io) for 20 s")


def test_the_previous_jobs_episode_is_not_this_runs(stub: Stub) -> None:
    """A GPU still judged starved from the job before: said only if it goes on once the detector
    has had time to judge this run, and then only for this run's part of it."""
    lines: list[str] = []
    w = Watch(stub.url, log=lines.append)
    t0, me = w._started_unix, os.getpid()
    stub.state = {"time_unix_s": t0 + 5, "gpus": [gpu(0, "starved-cpu", [me], t0 - 600)]}
    w._poll()
    assert lines == []
    stub.state = {"time_unix_s": t0 + 30, "gpus": [gpu(0, "starved-cpu", [me], t0 - 600)]}
    w._poll()
    assert len(lines) == 1 and "starved (cpu) for 30 s" in lines[0]


def test_a_childs_gpu_is_this_jobs_and_a_stranger_is_not(stub: Stub) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_tree(os.getpid())
        lines: list[str] = []
        w = Watch(stub.url, framework="keras", log=lines.append)
        t0 = w._started_unix
        stub.state = {"time_unix_s": t0 + 20, "gpus": [gpu(3, "starved-cpu", [child.pid], t0 + 1)]}
        w._poll()
        assert lines and "GPU 3" in lines[0] and "PyDataset(workers=N" in lines[0]
    finally:
        child.kill()
        child.wait()


def test_the_summary_counts_only_this_run(stub: Stub) -> None:
    lines: list[str] = []
    w = Watch(stub.url, log=lines.append)
    me = os.getpid()
    before = {"healthy": 5000.0, "starved": 100.0}
    # a GPU whose state goes on from before the run: this run's from the detector's settling time on
    stub.state = {
        "time_unix_s": w._started_unix + SETTLE_S,
        "gpus": [gpu(0, "healthy", [me], 0.0, seconds=before, wasted=50.0)],
    }
    w.start()
    deadline = time.monotonic() + 10
    while stub.asked == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    after = {"healthy": 5080.0, "starved": 145.0}
    stub.state = {"gpus": [gpu(0, "healthy", [me], 0.0, seconds=after, wasted=77.0)]}
    w.stop()
    assert lines[-1] == (
        "gpumon: this run on GPU 0: healthy 80 s (64%), starved 45 s (36%); 0.0075 GPU-hours wasted "
        "(judged from 15 s in)"
    )


def test_the_gpus_state_before_the_run_is_not_the_runs(stub: Stub) -> None:
    # a fed job on a GPU that was idle: the daemon says idle for its window and confirmation after
    # the first steps; the summary counts from its first verdict on this run
    lines: list[str] = []
    w = Watch(stub.url, log=lines.append)
    t0, me = w._started_unix, os.getpid()
    for t, label, start, seconds in (
        (1.0, "idle", t0 - 3600, {"idle": 9000.0}),
        (6.0, "idle", t0 - 3600, {"idle": 9005.0}),
        (11.0, "healthy", t0 + 9, {"idle": 9010.0, "healthy": 1.0}),  # its start: the change
        (18.0, "healthy", t0 + 9, {"idle": 9010.0, "healthy": 8.0}),
    ):
        stub.state = {"time_unix_s": t0 + t, "gpus": [gpu(0, label, [me], start, seconds=seconds)]}
        w._poll()
    w._say_summary()
    summary = "healthy 7 s (100%); 0.0000 GPU-hours wasted (judged from 11 s in)"
    assert lines == [f"gpumon: this run on GPU 0: {summary}"]


def test_no_daemon_is_one_line_then_silence() -> None:
    lines: list[str] = []
    w = Watch(f"http://127.0.0.1:{free_port()}", log=lines.append)
    for _ in range(5):
        w._poll()
    w.stop()
    assert len(lines) == 1 and lines[0].startswith("gpumon: no daemon at http://127.0.0.1:")


def test_a_hung_daemon_never_holds_up_a_training_step(stub: Stub) -> None:
    """The callback's per-step hook returns at once while the daemon does not answer: the gate is
    released only after 10,000 steps have run, so a step that waited would never finish."""
    os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported (as gpumon bench does)
    from gpumon.integrations.keras import GpumonCallback

    stub.gate = threading.Event()
    cb = GpumonCallback(stub.url, log=lambda line: None)
    cb.on_train_begin()
    deadline = time.monotonic() + 10
    while stub.asked == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stub.asked == 1, "the thread is waiting on the daemon"
    for n in range(10_000):
        cb.on_train_batch_end(n)
    stub.gate.set()
    cb.on_train_end()
