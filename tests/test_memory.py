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


def test_trimming_leaves_nothing_for_the_collector() -> None:
    """The daemon trims once a minute for as long as it runs: each trim must leave no garbage
    behind (a C library opened per call did: a class and a function pointer in a cycle, each
    minute, until a full collection came)."""
    import gc

    memory.trim()  # the C library opened, as at the daemon's first trim
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(20):
            memory.trim()
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_the_daemon_trims_once_per_period_of_real_time() -> None:
    from gpumon.serve.daemon import TRIM_EVERY_S

    from .test_serve import simulated_daemon

    d = simulated_daemon(seconds=1)
    calls: list[float] = []
    now = [0.0]
    d._trim_clock = lambda: now[0]
    d._next_trim = TRIM_EVERY_S
    real = memory.trim
    try:
        memory.trim = lambda: calls.append(now[0]) or True  # type: ignore[assignment,func-returns-value]
        for t in range(2, 40):
            now[0] = t * TRIM_EVERY_S / 12  # 12 ticks a period of real time: a trim every 12th
            d.sampler.tick(float(t))
    finally:
        memory.trim = real  # type: ignore[assignment]
    assert calls == [TRIM_EVERY_S, 2 * TRIM_EVERY_S, 3 * TRIM_EVERY_S]


SERVE_AND_LOOK = """
import gc, os, sys, threading, time, urllib.request
port = int(sys.argv[1])
during = []

def look():
    while True:
        during.append(gc.isenabled())
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
            break
        except OSError:  # not listening yet, or 503 "starting": no sample yet
            time.sleep(0.01)
    deadline = time.monotonic() + 10
    while not gc.isenabled() and time.monotonic() < deadline:  # the main thread's next look
        time.sleep(0.05)
    print(gc.isenabled(), gc.get_freeze_count())
    sys.stdout.flush()
    os._exit(0)

sys.argv = ["gpumon", "serve", "--simulate", "healthy", "--listen", f"127.0.0.1:{port}"]
from gpumon.cli import main
threading.Thread(target=look, daemon=True).start()
main()
"""


def test_serve_starts_without_the_collector_and_freezes_what_the_start_made() -> None:
    """`gpumon serve` stops the cyclic collector while it imports and starts (it would scan the
    start's 30,000 lasting objects again and again), and once the first sample is out it runs
    again, with those objects frozen out of its scans: never left off."""
    from .conftest import free_port

    out = subprocess.run(
        [sys.executable, "-c", SERVE_AND_LOOK, str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    enabled, frozen = out.stdout.split()
    assert enabled == "True", out.stderr
    assert int(frozen) > 10_000, frozen


def test_settle_without_hold_leaves_the_collector_alone() -> None:
    """Outside `gpumon serve` (a test, an embedding) nothing is frozen or turned on."""
    import gc

    before = gc.get_freeze_count()
    assert memory.settle() is False
    assert gc.get_freeze_count() == before and gc.isenabled()


def test_the_start_s_garbage_is_collected_before_the_rest_is_frozen() -> None:
    """What the daemon's start leaves as cyclic garbage while the collector is held (its own, and
    that of requests answered while a slow driver opens) is collected at `settle`, not frozen for
    the life of the process."""
    import gc
    import weakref

    class Node:
        pass

    was_enabled = gc.isenabled()
    kept = Node()
    memory.hold_collector()
    try:
        assert not gc.isenabled()
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # a cycle: only the collector frees it
        assert memory.settle() is True
        assert gone() is None and gc.isenabled()
        assert gc.get_freeze_count() > 0 and kept is not None
    finally:
        gc.unfreeze()  # this test's process is not a daemon: its objects go back to the collector
        if not was_enabled:
            gc.disable()
