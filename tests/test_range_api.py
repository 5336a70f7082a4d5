"""/api/v1/analysis for a recent range: answered in-process from the daemon's own verdicts, the same
as the replay of the recording; cached until a new tick; one at a time; under a CPU budget.
One simulated daemon for the module, ticked by hand on a virtual clock, recording to a directory."""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest

from gpumon.analyze.trace_report import analyze_range, to_json
from gpumon.config.settings import Config
from gpumon.core.clock import VirtualClock
from gpumon.serve import verdict_log
from gpumon.serve.analysis_api import TURN_GRACE_S, AnalysisApi, Answer
from gpumon.serve.cpu_budget import CpuBudget
from gpumon.serve.daemon import Daemon
from gpumon.serve.verdict_log import VerdictLog

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = "starved-cpu,healthy,healthy-then-starved,job-change,stalled,small-kernels"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    clock = VirtualClock()
    cfg = Config(
        simulate=SCENARIOS,
        listen="127.0.0.1:0",
        record_dir=str(tmp_path_factory.mktemp("recordings")),
        jobs_dir=str(ROOT / "tests/golden/no-jobs-here"),
    )
    d = Daemon(cfg, clock=clock)
    assert d.recorder is not None
    d.recorder.start()
    d.sampler.timer = lambda: 0.0
    tick(d, 900)
    yield d
    d.recorder.close()


def tick(d: Daemon, seconds: float) -> None:
    """`seconds` more of sampling, written to disk, then the clock a little past the last tick (as
    a request finds it: the range `since <= t < now` then holds that tick)."""
    assert d.recorder is not None and isinstance(d.clock, VirtualClock)
    d.sampler.run(duration_s=seconds)
    d.recorder.flush()
    d.clock.advance(0.25)


def iso(unix_s: float) -> str:
    return quote(datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat())


def ask(api: AnalysisApi, query: str, client: str = "?") -> Answer:
    return asyncio.run(api.answer(query, client))


def how(a: Answer) -> str | None:
    return dict(a.headers).get("X-Gpumon-Analysis")


def episodes(g: dict) -> list[tuple]:
    return [(e["label"], e["job"], e["start_unix_s"], e["end_unix_s"]) for e in g["episodes"]]


@pytest.mark.parametrize("since", ["10m", "the first minute"])
def test_in_process_answer_as_the_replay_of_the_recording(daemon: Daemon, since: str) -> None:
    if since == "the first minute":  # where the jobs change and a healthy GPU starves
        view = daemon.recent.view() if daemon.recent is not None else None
        assert view is not None
        since = iso(view.ticks[0].unix_s + 20.5)  # between two ticks: the recording rounds their times
    got = ask(daemon.analysis, f"since={since}")
    assert got.status == 200 and how(got) == "in-process", got.body
    live = json.loads(got.body)
    r = live["range"]
    replayed = to_json(analyze_range(daemon.analysis.directory or "", r["since_unix_s"], r["until_unix_s"]))
    assert set(live) == set(replayed) and live["schema"] == replayed["schema"]
    assert live["source"] == replayed["source"] and live["warnings"] == replayed["warnings"] == []
    for k in ("since_unix_s", "until_unix_s", "origin_unix_s", "segments", "ticks"):
        assert live["range"][k] == replayed["range"][k], k
    for k in ("first_unix_s", "last_unix_s"):  # the recording rounds times to the microsecond
        assert live["range"][k] == pytest.approx(replayed["range"][k], abs=1e-5)
    assert live["duration_s"] == replayed["duration_s"]
    assert len(live["gpus"]) == len(replayed["gpus"]) == 6
    for mine, theirs in zip(live["gpus"], replayed["gpus"], strict=True):
        same = ("index", "uuid", "name", "mig", "verdict", "final", "jobs", "seconds_in_state", "suggestion")
        assert {k: mine[k] for k in same} == {k: theirs[k] for k in same}
        assert set(mine) == set(theirs) and mine["verdicts"] == theirs["verdicts"] == []
        assert episodes(mine) == episodes(theirs)
        # waste is summed from values rounded to the milligpu-second, on both sides
        assert mine["wasted_gpu_s"] == pytest.approx(theirs["wasted_gpu_s"], abs=0.002)
        for a, b in zip(mine["episodes"], theirs["episodes"], strict=True):
            assert a["wasted_gpu_s"] == pytest.approx(b["wasted_gpu_s"], abs=0.002)
    if "T" in since:
        assert any(len(g["episodes"]) > 1 for g in live["gpus"]), "the range holds a change of state"


def test_an_answer_is_reused_until_a_new_tick_arrives(daemon: Daemon) -> None:
    api = daemon.analysis
    first = ask(api, "since=5m&gpu=0,1")
    runs = api.analyses
    again = ask(api, "since=5m&gpu=0,1")
    assert how(again) == "cached" and again.body == first.body and api.analyses == runs
    assert how(ask(api, "since=5m&gpu=1")) == "in-process", "another GPU selection is another answer"
    tick(daemon, 1)
    fresh = ask(api, "since=5m&gpu=0,1")
    assert how(fresh) == "in-process"
    moved = json.loads(fresh.body)["range"]["last_unix_s"] - json.loads(first.body)["range"]["last_unix_s"]
    assert moved == pytest.approx(1.0)


def test_ticks_logged_while_the_analysis_waits_for_its_thread_do_not_make_it_a_replay(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "since=5m" ends at the moment it was asked; the analysis thread runs at nice 19 and, beside
    # busy cores, starts late: the ticks logged meanwhile made the range look older than the log
    api = daemon.analysis
    inner = api._in_process

    def late(*args: object) -> Answer | None:
        tick(daemon, 3)  # three ticks before the thread gets a core
        return inner(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_in_process", late)
    got = ask(api, "since=5m&gpu=0")
    assert got.status == 200 and how(got) == "in-process", (got.status, how(got))


def test_a_tick_logged_between_reading_now_and_the_verdicts_does_not_make_it_a_replay(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sampler runs on its own thread: under load a tick can land after the query read "now"
    # and before the analysis looks at the verdicts; the range to the present then looked older
    # than the log and was replayed (seen under load in test_recorder_serve)
    api = daemon.analysis
    inner = api._now
    calls = []

    def now_then_a_tick() -> float:
        t = inner()
        calls.append(t)
        if len(calls) == 1:
            tick(daemon, 1)
        return t

    monkeypatch.setattr(api, "_now", now_then_a_tick)
    got = ask(api, "since=2m&gpu=0")
    assert got.status == 200 and how(got) == "in-process", (got.status, how(got))
    r = json.loads(got.body)["range"]
    assert r["until_unix_s"] == pytest.approx(calls[-1], abs=1e-3), "the range ends at the later now"
    assert r["until_unix_s"] - r["since_unix_s"] == pytest.approx(120), "and is the length asked"
    assert r["last_unix_s"] > calls[0], "the range holds the tick logged meanwhile"


def test_a_range_older_than_the_daemon_holds_is_replayed(daemon: Daemon) -> None:
    got = ask(daemon.analysis, "since=14m&until=12m")
    assert got.status == 200 and how(got) == "replayed", got.body


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def api_over(daemon: Daemon, monotonic: FakeMonotonic) -> AnalysisApi:
    return AnalysisApi(
        daemon.analysis.directory,
        lambda: daemon.cfg,
        recent=daemon.recent,
        header=daemon.analysis._header,
        now=daemon.analysis._now,
        monotonic=monotonic,
        budget=CpuBudget(share=0.05, burst_s=3.0, now=monotonic.t),
    )


def test_a_spent_cpu_budget_answers_429_with_retry_after_until_it_refills(daemon: Daemon) -> None:
    clock = FakeMonotonic()
    api = api_over(daemon, clock)
    api.budget.charge(5.0, clock.t)  # a long analysis overdrew it by 2 s
    refused = ask(api, "since=10m")
    assert refused.status == 429 and "budget" in json.loads(refused.body)["error"]
    assert dict(refused.headers)["Retry-After"] == "40"  # 2 CPU-s at 5% of a core
    clock.t += 39
    assert ask(api, "since=10m").status == 429
    clock.t += 1.5
    assert ask(api, "since=10m").status == 200


def test_a_client_that_polls_cannot_take_every_refill_from_one_that_waits_as_told(daemon: Daemon) -> None:
    """Even one that asks a new query every time (a new query once took every place in the line, so
    the polite client never got one: found by a hostile-input pass): an address holds one place."""
    clock = FakeMonotonic()
    api = api_over(daemon, clock)
    api.budget.charge(5.0, clock.t)  # spent: 40 s to refill
    polite = ask(api, "since=10m", client="10.0.0.2")
    assert polite.status == 429 and dict(polite.headers)["Retry-After"] == "40"
    for i in range(400):  # another client asks ten times a second meanwhile, a new query each time
        clock.t += 0.101
        assert ask(api, f"since={180 + i}s", client="10.0.0.3").status == 429
    assert len(api._line) == 2, "one place for each address, whatever it asks"
    assert ask(api, "since=3m", client="10.0.0.3").status == 429, "the client refused first goes first"
    assert ask(api, "since=10m", client="10.0.0.2").status == 200, "it comes back as told and is answered"
    # a client that never comes back holds up the others only until its turn lapses
    api = api_over(daemon, clock)
    api.budget.charge(5.0, clock.t)
    gone = ask(api, "since=8m", client="10.0.0.4")  # refused first, and never asks again
    assert gone.status == 429 and ask(api, "since=4m", client="10.0.0.3").status == 429
    clock.t += int(dict(gone.headers)["Retry-After"]) + 0.5  # refilled
    assert ask(api, "since=4m", client="10.0.0.3").status == 429, "the first refused still has its turn"
    clock.t += TURN_GRACE_S
    assert ask(api, "since=4m", client="10.0.0.3").status == 200, "its turn lapsed"


def test_one_analysis_at_a_time_the_same_question_shares_its_answer(daemon: Daemon) -> None:
    api = api_over(daemon, FakeMonotonic())
    release = threading.Event()
    inner = api._in_process

    def held(*args: object) -> Answer | None:
        assert release.wait(30)
        return inner(*args)  # type: ignore[arg-type]

    api._in_process = held  # type: ignore[method-assign]

    async def scenario() -> tuple[Answer, Answer, Answer]:
        first = asyncio.create_task(api.answer("since=10m"))
        while api._running is None:
            await asyncio.sleep(0)
        second = asyncio.create_task(api.answer("since=10m"))
        other = await api.answer("since=2m")  # answered at once, while the first is held
        assert not first.done()
        release.set()
        return await first, await second, other

    first, second, other = asyncio.run(scenario())
    assert first.status == second.status == 200 and first.body == second.body
    assert api.analyses == 1
    assert other.status == 429 and dict(other.headers)["Retry-After"] == "1"


def _job(job_id: str, user: str) -> Any:
    return SimpleNamespace(job_id=job_id, user=user)


def _gpu(index: int, jobs: list[Any], mig: int | None = None) -> Any:
    """A tick's sample of one GPU, as the verdict log reads it."""
    return SimpleNamespace(index=index, uuid=f"GPU-{index}", jobs=jobs, mig=mig)


def _verdict(index: int, t: float, label: str, wasted: float) -> Any:
    return SimpleNamespace(
        index=index, uuid=f"GPU-{index}", name="H100", label=label, t_s=t, since_s=t - 5, wasted_gpu_s=wasted
    )


def test_the_verdict_log_gives_back_each_ticks_verdicts_with_the_jobs_of_that_tick() -> None:
    """The log packs a GPU's identity once while it holds: a job change shows from its tick on,
    never on the ticks before it, and every field comes back as recorded."""
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=60.0)
    jobs_by_tick = [[_job("1", "alice")], [_job("2", "bob")], [_job("2", "bob")], []]
    for k, jobs in enumerate(jobs_by_tick):
        t = 100.0 + k
        tick: Any = SimpleNamespace(t_s=t, gpus=(_gpu(0, jobs), _gpu(1, [], mig=3)))
        verdicts = [_verdict(0, t, "starved (cpu)", 2.5 * k), _verdict(1, t, "healthy", 0.0)]
        log.record(tick, verdicts, 1e9 + t, {}, 10)
    view = log.view()
    assert view is not None and [e.unix_s for e in view.ticks] == [1e9 + 100 + k for k in range(4)]
    assert [e.gpus[0].jobs for e in view.ticks] == [(("1", "alice"),), (("2", "bob"),), (("2", "bob"),), ()]
    first = view.ticks[1].gpus
    assert first[0] == (0, "GPU-0", "H100", None, 101.0, "starved (cpu)", 96.0, 2.5, (("2", "bob"),))
    assert first[1] == (1, "GPU-1", "H100", 3, 101.0, "healthy", 96.0, 0.0, ())
    assert first[0].label == "starved (cpu)" and first[1].mig == 3


def test_the_verdict_log_is_bounded_in_verdicts_whatever_the_gpu_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many GPUs at a short interval: the log keeps as many ticks as its bound in verdicts allows,
    the newest (a range older than them is then replayed from the recording)."""
    monkeypatch.setattr(verdict_log, "MAX_VERDICTS", 12)
    log = VerdictLog(interval_s=0.05, preroll_s=0.0, kept_s=60.0)
    for k in range(10):
        t = 100.0 + 0.05 * k
        tick: Any = SimpleNamespace(t_s=t, gpus=tuple(_gpu(i, []) for i in range(4)))
        log.record(tick, [_verdict(i, t, "healthy", 0.0) for i in range(4)], 1e9 + t, {}, 10)
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0 + 0.05 * k for k in (7, 8, 9)]
    assert all(len(e.gpus) == 4 for e in view.ticks)


def _log_tick(log: VerdictLog, k: int, gpus: int, labels_every: int = 7) -> None:
    """Tick k of `gpus` GPUs: each verdict's numbers tell its tick and GPU apart; each GPU's label
    changes every `labels_every` ticks."""
    t = 100.0 + k
    tick: Any = SimpleNamespace(t_s=t, gpus=tuple(_gpu(i, []) for i in range(gpus)))
    labels = ("healthy", "starved (cpu)")
    verdicts = [_verdict(i, t, labels[(k // labels_every + i) % 2], k + i / 100) for i in range(gpus)]
    log.record(tick, verdicts, 1e9 + t, {}, 10)


def test_the_verdict_log_keeps_the_newest_ticks_in_order_as_it_wraps_around() -> None:
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=8.0)  # room for 10 ticks
    for k in range(23):
        _log_tick(log, k, 3)
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0 + k for k in range(13, 23)]
    for e in view.ticks:
        k = round(e.t_s - 100)
        assert [(j.index, j.t_s, j.since_s, j.wasted_gpu_s) for j in e.gpus] == [
            (i, e.t_s, e.t_s - 5, k + i / 100) for i in range(3)
        ]
        assert [j.label for j in e.gpus] == [("healthy", "starved (cpu)")[(k // 7 + i) % 2] for i in range(3)]
    assert view.index_at(1e9 + 117.5) == 5


def test_the_verdict_log_keeps_its_ticks_when_more_gpus_come() -> None:
    """MIG instances made: a tick brings more GPUs than the log was made for; the ticks before keep
    their GPUs and numbers, those after have all of theirs."""
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=60.0)
    for k in range(5):
        _log_tick(log, k, 2)
    for k in range(5, 8):
        _log_tick(log, k, 5)
    _log_tick(log, 8, 1)  # and a GPU gone
    view = log.view()
    assert view is not None
    assert [len(e.gpus) for e in view.ticks] == [2] * 5 + [5] * 3 + [1]
    assert [j.wasted_gpu_s for j in view.ticks[4].gpus] == [4.0, 4.01]
    assert [j.wasted_gpu_s for j in view.ticks[7].gpus] == [7 + i / 100 for i in range(5)]
    assert view.ticks[8].gpus[0].wasted_gpu_s == 8.0


def test_the_verdict_log_takes_its_memory_at_its_first_tick_and_never_more() -> None:
    """A daemon's memory must not climb while the log fills for its 15 minutes (issue 29): what a
    tick leaves behind is numbers in columns made at the first tick, not Python objects. (GPUs whose
    labels hold, as most do from tick to tick; a label that changes shares its tuple with the ticks
    after it.)"""
    import tracemalloc

    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=300.0)
    mine = [tracemalloc.Filter(True, verdict_log.__file__)]
    tracemalloc.start()
    try:
        _log_tick(log, 0, 8, labels_every=10_000)
        first = tracemalloc.take_snapshot().filter_traces(mine)
        for k in range(1, 600):  # the log full twice over
            _log_tick(log, k, 8, labels_every=10_000)
        grown = sum(
            s.size_diff for s in tracemalloc.take_snapshot().filter_traces(mine).compare_to(first, "lineno")
        )
    finally:
        tracemalloc.stop()
    assert grown < 1_000, f"the log grew by {grown} bytes over 600 ticks"
    view = log.view()
    assert view is not None and len(view.ticks) == 302
    assert [j.wasted_gpu_s for j in view.ticks[-1].gpus] == [599 + i / 100 for i in range(8)]


def test_a_reader_never_sees_a_tick_half_written() -> None:
    """The sampling thread writes while the analysis thread copies: every copy holds whole ticks,
    in order, each GPU's numbers those of its own tick. The writer writes back to back but pauses
    now and then (the sampler's pause is a second), and the reader starts after its first tick:
    the fresh-machine check once saw all of a reader's views None on a loaded machine (a view
    before the first tick is None, and a writer that never pauses can leave no moment between
    ticks). Whether a reader copies a tick half written is also tested without threads, below."""
    import sys

    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=20.0)
    stop, first = threading.Event(), threading.Event()
    written = [0]

    def write() -> None:
        k = 0
        while not stop.is_set():
            _log_tick(log, k, 4)
            k += 1
            written[0] = k
            first.set()
            if k % 10 == 0:  # back to back, but a pause now and then (the sampler's is a second)
                stop.wait(0.001)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    writer = threading.Thread(target=write)
    writer.start()
    views = []
    try:
        first.wait(10.0)  # a view before the first tick is None: that is not what this tests
        while written[0] < 2000 and writer.is_alive():  # copies through 2,000 of the writer's ticks
            view = log.view()
            if view is not None and len(views) < 2000:
                views.append(view)
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(before)
    last = log.view()  # no write going on now: a reader always gets the log
    assert last is not None and round(last.latest.t_s - 100) == written[0] - 1
    assert views, "a reader got the log between the writer's ticks"
    for view in [*views, last]:
        times = [e.t_s for e in view.ticks]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert view.ticks[-1].t_s == view.latest.t_s
        for e in view.ticks:
            k = round(e.t_s - 100)
            assert [(j.t_s, j.wasted_gpu_s) for j in e.gpus] == [(e.t_s, k + i / 100) for i in range(4)]


def test_a_wrapped_log_remade_for_more_gpus_keeps_its_newest_ticks_in_order() -> None:
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=8.0)  # room for 10 ticks
    for k in range(23):  # wrapped around twice
        _log_tick(log, k, 2)
    _log_tick(log, 23, 3)  # a MIG instance made: the ring is made again, wider
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0 + k for k in range(14, 24)]
    for e in view.ticks:
        k = round(e.t_s - 100)
        assert [j.wasted_gpu_s for j in e.gpus] == [k + i / 100 for i in range(2 if k < 23 else 3)]


def test_a_log_bound_by_many_gpus_holds_its_ticks_again_once_they_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One tick of many GPUs (MIG instances made and removed) shortens the log while that tick is in
    it, not for the daemon's life."""
    monkeypatch.setattr(verdict_log, "MAX_VERDICTS", 40)
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=8.0)  # 10 ticks of 2 GPUs
    for k in range(12):
        _log_tick(log, k, 2)
    _log_tick(log, 12, 8)  # 5 ticks of 8 GPUs fit in 40 verdicts
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0 + k for k in range(8, 13)]
    for k in range(13, 40):
        _log_tick(log, k, 2)
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0 + k for k in range(30, 40)]
    assert all([j.wasted_gpu_s for j in e.gpus] == [e.t_s - 100, e.t_s - 100 + 0.01] for e in view.ticks)


def test_a_reader_during_a_tick_being_written_gets_no_view_rather_than_half_a_tick() -> None:
    """A copy asked while the writer is inside a tick (here from the writer's own thread, as the
    tick is read: the writer cannot finish first) is refused; the range is then replayed."""
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=60.0)
    for k in range(3):
        _log_tick(log, k, 2)
    seen: list[Any] = []

    class Reading(SimpleNamespace):
        @property
        def t_s(self) -> float:  # read while the tick is written
            seen.append(log.view())
            return 103.0

    log.record(Reading(gpus=(_gpu(0, []),)), [_verdict(0, 103.0, "healthy", 3.0)], 1e9 + 103, {}, 10)
    assert seen and all(v is None for v in seen)
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0, 101.0, 102.0, 103.0]
    assert view.ticks[-1].gpus[0].wasted_gpu_s == 3.0


def test_a_tick_that_cannot_be_logged_leaves_the_log_as_it_was() -> None:
    log = VerdictLog(interval_s=1.0, preroll_s=0.0, kept_s=60.0)
    _log_tick(log, 0, 2)
    bad: Any = [_verdict(0, 101.0, "healthy", None)]  # not a number
    with pytest.raises(TypeError):
        log.record(SimpleNamespace(t_s=101.0, gpus=(_gpu(0, []),)), bad, 1e9 + 101, {}, 10)
    _log_tick(log, 2, 2)
    view = log.view()
    assert view is not None and [e.t_s for e in view.ticks] == [100.0, 102.0]
