"""The daemon hands freed heap back to the system (gpumon.core.memory): its RSS stays flat over
days although glibc keeps the pages its threads freed (issue 29)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpumon.core import memory

from .conftest import ROOT

FREED_IN_A_THREAD = """
import threading
from pathlib import Path
from gpumon.core import memory

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

keep = []
def work():
    blobs = [bytes(2000 + (i % 7) * 100) for i in range(40000)]  # ~90 MB through malloc
    keep.append(blobs[::50])  # a few survivors scattered over the pages, holding little
    del blobs

t = threading.Thread(target=work)
t.start()
t.join()
before = rss_mb()
trimmed = memory.trim()
print(before, rss_mb(), trimmed)
"""


def test_pages_freed_by_a_thread_go_back_to_the_system_when_trimmed() -> None:
    """What a daemon's threads free stays in its RSS until malloc_trim: here ~90 MB freed, two
    per cent of it still alive, and the RSS falls by most of it."""
    if not memory.trim():
        pytest.skip("not glibc: malloc_trim is not there")
    out = subprocess.run(
        [sys.executable, "-c", FREED_IN_A_THREAD], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    before, after, trimmed = float(out[0]), float(out[1]), out[2] == "True"
    assert trimmed and before - after > 40, (before, after)


def test_the_daemon_trims_once_per_period_of_real_time() -> None:
    from .test_serve import simulated_daemon

    d = simulated_daemon(seconds=1)
    calls: list[float] = []
    now = [0.0]
    d._trim_clock = lambda: now[0]
    d._next_trim = 600.0
    real = memory.trim
    try:
        memory.trim = lambda: calls.append(now[0]) or True  # type: ignore[assignment,func-returns-value]
        for t in range(2, 40):
            now[0] = t * 50.0  # 50 s of real time per tick: a trim at 600, 1200 and 1800 s
            d.sampler.tick(float(t))
    finally:
        memory.trim = real  # type: ignore[assignment]
    assert calls == [600.0, 1200.0, 1800.0]
