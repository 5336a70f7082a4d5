"""`gpumon bench` ends even when its exit hangs (gpumon.bench.exit_guard): Keras's loader pool can
deadlock the interpreter's exit once training stopped mid-epoch, and the job never ended (it held
benchmarks.advice for 10 minutes). Reproduced here without Keras: a loader-like child process, and
an exit handler that waits on a lock nobody releases, as multiprocessing's did."""

from __future__ import annotations

import subprocess
import sys
import time

from .conftest import ROOT

HANGS_AT_EXIT = """
import atexit, multiprocessing, sys, threading, time
from gpumon.bench.exit_guard import leave_even_if_stuck

def loader():
    time.sleep(600)

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=loader, daemon=False)
    child.start()
    print(child.pid, flush=True)
    never = threading.Lock()
    never.acquire()
    atexit.register(never.acquire)  # the exit handler that never returns
    leave_even_if_stuck(float(sys.argv[1]), code=0)
    print("results written", flush=True)
"""


def test_a_job_whose_exit_hangs_ends_after_the_grace_with_its_loaders_killed() -> None:
    p = subprocess.run(
        [sys.executable, "-c", HANGS_AT_EXIT, "1.0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    child_pid, said = p.stdout.split("\n", 1)
    assert "results written" in said
    assert "loader processes killed" in p.stderr
    assert _ends(int(child_pid)), "the loader process still runs"


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """The process is gone, or a zombie (killed, not yet reaped by init), within `within_s`: a
    SIGKILL is delivered and acted on asynchronously, later on a loaded machine."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_a_job_that_exits_in_time_never_notices_it() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "from gpumon.bench.exit_guard import leave_even_if_stuck\n"
            "leave_even_if_stuck(30.0)\nprint('done')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 0 and p.stdout.strip() == "done" and p.stderr == ""
