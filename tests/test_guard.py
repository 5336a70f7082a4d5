"""A hung NVML call costs its thread, never the other GPUs or the loop: the guard, the supervisor
and the NVML source together, on a pynvml look-alike whose calls the test blocks and releases."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gpumon.collect.pipeline.supervisor import Supervisor
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.core.guard import CallGuard
from gpumon.core.problems import Problems

from .test_nvml_source import FakePynvml


class BlockingPynvml(FakePynvml):
    """Calls on the GPUs in `blocked` (or the count, with `count_blocked`) wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked: set[int] = set()
        self.count_blocked = False
        self.release = threading.Event()

    def nvmlDeviceGetCount(self) -> int:
        if self.count_blocked:
            self.release.wait(30)
        return 2

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h in self.blocked:
            self.release.wait(30)
        return super().nvmlDeviceGetPowerUsage(h)


def setup() -> tuple[BlockingPynvml, CallGuard, NvmlSource, Supervisor]:
    fake = BlockingPynvml()
    guard = CallGuard()
    src = NvmlSource(fake, Problems(logging.getLogger("test.guard")), guard=guard)
    src.open()
    return fake, guard, src, Supervisor(guard, timeout_s=0.1)


def test_a_hung_gpu_costs_one_thread_and_is_read_again_once_its_call_returns() -> None:
    fake, guard, src, sup = setup()
    fake.blocked = {1}
    gpus = sup.call(lambda: src.poll(1.0))  # returns while GPU 1's call still waits to be released
    assert gpus[0].available and not gpus[1].available and "does not return" in (gpus[1].error or "")
    assert sup.replaced == 1 and guard.stuck_threads == 1
    gpus = sup.call(lambda: src.poll(2.0))  # the stuck GPU is skipped at once: no new thread
    assert sup.replaced == 1 and not gpus[1].available
    fake.blocked = set()
    fake.release.set()  # the hung call returns; its thread ends without handing anything back
    deadline = time.monotonic() + 5
    while guard.stuck_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.stuck_threads == 0
    gpus = sup.call(lambda: src.poll(3.0))
    assert all(g.available for g in gpus), "read again once the call returned"


def test_a_driver_wide_hang_makes_the_source_fail_fast_with_bounded_threads() -> None:
    fake, guard, src, sup = setup()
    fake.count_blocked = True
    before = threading.active_count()
    failures = 0
    for t in range(20):
        try:
            sup.call(lambda t=t: src.poll(float(t)))  # type: ignore[misc]
        except RuntimeError as e:
            failures += 1
            assert "driver-wide" in str(e)
    assert failures >= 19 and sup.replaced == 1, "one thread left behind, not one per tick"
    assert threading.active_count() <= before + 1
    fake.count_blocked = False
    fake.release.set()
    deadline = time.monotonic() + 5
    while guard.stuck_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sup.call(lambda: src.poll(30.0))) == 2, "the driver is read again once it answers"


def test_a_call_returning_just_as_it_is_abandoned_leaves_nothing_marked() -> None:
    guard = CallGuard()
    marks: list[tuple[str, object]] = []
    guard.on_hang = lambda what, since: marks.append(("hang", what))
    guard.on_return = lambda what: marks.append(("return", what))
    guard.enter("gpu 0")
    ident = threading.get_ident()
    guard.leave()  # it returned first: abandoning now finds nothing
    assert guard.abandon(ident) is False and marks == []


def test_a_gpu_hung_for_hours_costs_no_memory_per_tick() -> None:
    import gc
    import tracemalloc

    fake, _, src, sup = setup()
    fake.blocked = {1}
    sup.call(lambda: src.poll(0.0))  # abandoned once: GPU 1 is stuck from now on
    for t in range(200):  # warm up: caches, the first problems noted
        src.poll(float(t))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for t in range(200, 5200):  # 5,000 ticks with the call still hanging
        src.poll(float(t))
    gc.collect()  # the exceptions NVML raises form reference cycles: the collector's, not a leak
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    fake.release.set()
    assert grown < 20_000, f"{grown} bytes for 5,000 ticks: the hang must not grow memory"


# -- the daemon's driver opens on its own thread (gpumon serve imports the rest meanwhile) ---------


class SlowInitPynvml(FakePynvml):
    """nvmlInit waits until released, as a driver without persistence mode can for a second."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        self.release.wait(30)
        super().nvmlInit()


def _pipeline_on(fake: FakePynvml, retry: bool, timeout_s: float = 5.0):  # type: ignore[no-untyped-def]
    from gpumon.collect.pipeline import Pipeline
    from gpumon.collect.pipeline.sources import OpenedSources
    from gpumon.collect.pipeline.spec import SourceDescription, SourceSpec
    from gpumon.core.clock import VirtualClock

    guard = CallGuard()
    problems = Problems(logging.getLogger("test.guard"))
    src = NvmlSource(fake, problems, guard=guard, retry_init=retry)
    opened = OpenedSources(src, None, SourceDescription.nvml(), close=src.close, guard=guard, start=src.open)
    pipeline = Pipeline(
        SourceSpec(kind="nvml"),
        VirtualClock(),
        sources=opened,
        problems=problems,
        attribution=None,
        nvml_call_timeout_s=timeout_s,
        open_in_background=True,
    )
    return pipeline, src


def test_a_slow_driver_opens_while_the_daemon_goes_on_and_the_first_poll_waits_for_it() -> None:
    fake = SlowInitPynvml()
    pipeline, src = _pipeline_on(fake, retry=True)
    try:
        assert not src.is_open, "built without waiting for nvmlInit"
        polled: list[object] = []
        poller = threading.Thread(target=lambda: polled.append(pipeline.poll_once()))
        poller.start()
        poller.join(0.2)
        assert poller.is_alive() and not polled, "the first poll waits for the open"
        fake.release.set()
        poller.join(10)
        gpus = polled[0]
        assert src.is_open and fake.inits == 1
        assert [g.available for g in gpus] == [True, True]  # type: ignore[attr-defined]
    finally:
        fake.release.set()
        pipeline.close()


def test_a_driver_that_hangs_in_nvmlinit_leaves_the_daemon_sampling_with_no_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Supervised as before: the open's thread is abandoned once nvmlInit has taken longer than
    its allowance (a minute; here 0.3 s), and the daemon polls on, saying the driver does not
    answer."""
    from gpumon.collect.sources.nvml import source as source_mod

    monkeypatch.setattr(source_mod, "INIT_ALLOW_S", 0.3)
    fake = SlowInitPynvml()
    pipeline, src = _pipeline_on(fake, retry=True, timeout_s=0.1)
    try:
        from gpumon.core.errors import NoDriverError

        with pytest.raises(NoDriverError, match=r"nvmlInit.* has not returned"):
            pipeline.poll_once()
        assert not src.is_open
    finally:
        fake.release.set()
        pipeline.close()


def test_a_failed_open_is_raised_where_the_pipeline_is_first_used() -> None:
    fake = FakePynvml()
    fake.init_error = 9  # NVML_ERROR_DRIVER_NOT_LOADED, with no retry
    pipeline, _ = _pipeline_on(fake, retry=False)
    from gpumon.core.errors import GpumonError

    with pytest.raises(GpumonError):
        pipeline.poll_once()
    with pytest.raises(GpumonError):
        pipeline.run(duration_s=1)


def test_an_nvmlinit_slower_than_the_call_timeout_is_waited_for_not_given_up() -> None:
    """Without persistence mode nvmlInit takes seconds: longer than any other call may (here 0.1 s)
    but within its own allowance; it is no hang, and no problem is reported."""
    fake = SlowInitPynvml()
    pipeline, _ = _pipeline_on(fake, retry=True, timeout_s=0.1)
    timer = threading.Timer(0.6, fake.release.set)
    timer.start()
    try:
        gpus = pipeline.poll_once()
        assert [g.available for g in gpus] == [True, True]
        assert fake.inits == 1 and pipeline.supervisor is not None and pipeline.supervisor.replaced == 0
        assert not pipeline.problems.active()
    finally:
        timer.cancel()
        fake.release.set()
        pipeline.close()


def test_a_stop_while_the_driver_still_opens_ends_the_run_at_once() -> None:
    """SIGTERM during a slow nvmlInit: the sampling loop returns without waiting for the driver."""
    fake = SlowInitPynvml()
    pipeline, _ = _pipeline_on(fake, retry=True)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop})
    runner.start()
    try:
        runner.join(0.3)
        assert runner.is_alive(), "waiting for the open"
        stop.set()
        runner.join(5)
        assert not runner.is_alive(), "the run ended on the stop, the driver still opening"
        assert pipeline.sampler.ticks == 0
    finally:
        fake.release.set()
        pipeline.close()
