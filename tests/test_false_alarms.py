"""No false alarms where fleets live (issue 25): busy neighbours, job start-up, a job change, MIG,
the first seconds of a range. Each case beside the one that must still be flagged."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumon.analyze.trace_report import Analysis, analyze, to_json
from gpumon.detect.thresholds import Thresholds
from gpumon.trace.reader import read_trace

from .conftest import gpumon
from .fakenvml import driver


def recorded(tmp_path: Path, scenarios: str, seconds: int, *extra: str) -> Path:
    out = tmp_path / "t.jsonl"
    p = gpumon(
        "record",
        "--simulate",
        scenarios,
        "--speed",
        "max",
        "--duration",
        str(seconds),
        "-o",
        str(out),
        *extra,
    )
    assert p.returncode == 0, p.stderr
    return out


def labels(a: Analysis, gpu: int = 0) -> list[str]:
    return [e.label for e in a.gpus[gpu].episodes if e.state != "unknown"]


# -- job start-up ---------------------------------------------------------------------------------


def test_a_job_starting_up_is_starting_then_healthy_never_stalled(tmp_path: Path) -> None:
    a = analyze(str(recorded(tmp_path, "starting-then-healthy", 90)))
    assert labels(a) == ["starting", "healthy"], labels(a)
    starting = a.gpus[0].episodes[0] if a.gpus[0].episodes[0].state == "starting" else a.gpus[0].episodes[1]
    assert starting.wasted_gpu_s == 0, "start-up is not waste"
    assert "has run no kernel yet" in starting.reason


def test_past_the_grace_a_job_that_runs_nothing_is_stalled(tmp_path: Path) -> None:
    trace = recorded(tmp_path, "starting-then-healthy", 90)
    a = analyze(str(trace), Thresholds(starting_grace_s=20.0))
    assert labels(a) == ["starting", "stalled", "healthy"], labels(a)
    stalled = next(e for e in a.gpus[0].episodes if e.state == "stalled")
    assert 20 <= stalled.start_s <= 24, stalled.start_s  # the job's processes are 20 s old then


def _start_up(
    tmp_path: Path, name: str, prepare: Any, seconds: float, th: Thresholds | None = None
) -> Analysis:
    """A job that opens the GPU, prepares for `seconds` (no kernel), then trains fed."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0}
    life = sc.Scenario(
        name,
        "prepares, then trains",
        ((0.0, replace(prepare, **fresh)), (seconds, replace(sc.HEALTHY, **fresh))),
        ((0.0, "starting"), (seconds, "healthy")),
    )
    trace = tmp_path / f"{name}.jsonl"
    record(Case(name, 0, 1 / 6, seconds + 40, 0.05, (life,)), str(trace))
    return analyze(str(trace), th)


def _preparations() -> dict[str, Any]:
    from dataclasses import replace

    from gpumon.sim import scenarios as sc

    return {
        # datasets.map(num_proc=8) after the CUDA context is open
        "tokenizes-in-8-processes": replace(
            sc.STARTING, workers=8, worker_cpu=0.99, main_cpu=0.1, read_bytes_per_s=30e6
        ),
        # a checkpoint read from network storage: little CPU, much reading
        "loads-a-checkpoint": replace(sc.STARTING, main_cpu=0.35, read_bytes_per_s=300e6, iowait=0.02),
        "compiles-on-one-core": replace(sc.STARTING, main_cpu=1.0),
        # 8 tokenizers on a Slurm cpuset of 4 cores: each gets half a core and waits for the rest
        "tokenizes-on-a-shared-cpuset": replace(
            sc.STARTING, main_cpu=0.05, workers=8, worker_cpu=0.5, worker_runq=0.5, read_bytes_per_s=0.0
        ),
    }


@pytest.mark.parametrize("name", list(_preparations()))
def test_a_job_preparing_on_the_host_past_the_grace_is_starting_and_fires_no_alert(
    tmp_path: Path, name: str
) -> None:
    """No kernel for 5 minutes while its processes work on the host (a false-alarm hunt found these
    paged: the tokenizing job as starved-cpu with the advice to add loader workers, the checkpoint
    load as a critical `stalled`): it prepares, it is not hung, and no input-side remedy applies.
    Past `starting_busy_s` it is judged as any job."""
    from .test_false_alarms_loops import assert_no_alert_fires

    a = _start_up(tmp_path, name, _preparations()[name], 300)
    assert labels(a) == ["starting", "healthy"], labels(a)
    (g,) = a.gpus
    starting = next(e for e in g.episodes if e.state == "starting")
    assert starting.wasted_gpu_s == 0, "preparing is not waste"
    late = next(v for v in g.verdicts if v.t_s >= 200)
    assert "work on the host" in late.reason, late.reason
    assert_no_alert_fires(tmp_path, g)
    soon = Thresholds(starting_busy_s=150)
    bounded = _start_up(tmp_path, f"{name}-bounded", _preparations()[name], 300, soon)
    judged = [e for e in bounded.gpus[0].episodes if e.state not in ("unknown", "starting", "healthy")]
    assert judged and 150 <= judged[0].start_s <= 156, labels(bounded)


@pytest.mark.parametrize(
    "quiet",
    [
        {"main_cpu": 0.03, "workers": 0},  # a rendezvous for ranks that never come
        {"main_cpu": 0.05, "workers": 4, "worker_cpu": 0.23},  # a deadlock, its workers polling
    ],
)
def test_past_the_grace_a_quiet_job_that_runs_nothing_is_stalled(
    tmp_path: Path, quiet: dict[str, Any]
) -> None:
    """A job waiting (a rendezvous, a deadlock before the first step) is stalled once the grace
    is over, as before: only one of its processes saturating a core, or its reads, extend it
    (four workers polling at a quarter of a core each add up to a core, and prepare nothing)."""
    from dataclasses import replace

    from gpumon.sim import scenarios as sc

    a = _start_up(tmp_path, "quiet", replace(sc.STARTING, **quiet), 200)
    assert labels(a) == ["starting", "stalled", "healthy"], labels(a)
    stalled = next(e for e in a.gpus[0].episodes if e.state == "stalled")
    assert 120 <= stalled.start_s <= 124, stalled.start_s


def test_a_preparation_that_pauses_between_its_bursts_of_work_is_one_start_up(tmp_path: Path) -> None:
    """Files tokenized one after another with a 90 s wait between them (a lock, a download): not
    stalled at each pause (a reviewer's finding: at a quiet spell of 60 s it went starting,
    stalled, starting ten times in one start-up)."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0}
    work = replace(sc.STARTING, main_cpu=1.0, **fresh)
    wait = replace(sc.STARTING, main_cpu=0.02, **fresh)
    # work 60 s, wait 90 s, three times, then train
    bursts = [(0.0, work), (60.0, wait), (150.0, work), (210.0, wait), (300.0, work), (360.0, wait)]
    life = sc.Scenario(
        "pauses",
        "prepares in bursts",
        (*bursts, (450.0, replace(sc.HEALTHY, **fresh))),
        ((0.0, "starting"), (450.0, "healthy")),
    )
    trace = tmp_path / "pauses.jsonl"
    record(Case("pauses", 0, 1 / 6, 500, 0.05, (life,)), str(trace))
    a = analyze(str(trace))
    assert labels(a) == ["starting", "healthy"], labels(a)


def test_a_young_job_that_ran_kernels_and_stops_is_stalled_not_starting(tmp_path: Path) -> None:
    """Within the grace, but it has computed: a hang, not a start-up. And a job older than the
    grace that has run nothing since gpumon saw it is stalled too."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0}
    life = sc.Scenario(
        "young-hang",
        "starts, trains, hangs",
        (
            (0.0, replace(sc.STARTING, **fresh)),
            (15.0, replace(sc.HEALTHY, **fresh)),
            (40.0, replace(sc.STALLED, **fresh)),
        ),  # type: ignore[arg-type]
        ((0.0, "starting"), (15.0, "healthy"), (40.0, "stalled")),
    )
    trace = tmp_path / "young.jsonl"
    record(Case("young-hang", 0, 1 / 6, 70, 0.05, (life, sc.SCENARIOS["stalled"])), str(trace))
    a = analyze(str(trace))
    # (a job that stops passes a few seconds as underutilized, while its window empties)
    lasting = [e.label for e in a.gpus[0].episodes if e.state != "unknown" and e.duration_s(a.end_s) >= 8]
    assert lasting == ["starting", "healthy", "stalled"], labels(a, 0)
    assert labels(a, 1) == ["stalled"], labels(a, 1)


def test_a_job_whose_loader_crawls_is_starved_not_stalled(tmp_path: Path) -> None:
    """Kernels too few to show in NVML's utilization (an H200 running a small model fed by one
    busy worker: 0-1%, docs/gpu-check.md) while the loader worker runs flat out: the job is starved
    by its input, not hung, and the critical `stalled` alert must not fire on it. A job that hangs
    (its workers idle) is stalled as before."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    crawl = replace(sc.STARVED_CPU, compute_s=0.001, wait_s=0.3, main_cpu=0.15, workers=1, worker_cpu=1.0)
    life = sc.Scenario(
        "crawl",
        "trains, then its loader crawls",
        ((0.0, sc.HEALTHY), (30.0, crawl)),  # type: ignore[arg-type]
        ((0.0, "healthy"), (30.0, "starved")),
    )
    trace = tmp_path / "crawl.jsonl"
    record(Case("crawl", 0, 1 / 6, 90, 0.05, (life, sc.SCENARIOS["stalled"])), str(trace))
    a = analyze(str(trace))
    crawling = [e for e in a.gpus[0].episodes if e.start_s >= 30 and e.state != "unknown"]
    assert crawling and all(e.label == "starved-cpu" for e in crawling), labels(a, 0)
    assert labels(a, 1) == ["stalled"], labels(a, 1)


def test_a_fresh_job_whose_kernels_only_gpm_sees_is_starved_not_starting(tmp_path: Path) -> None:
    """On an H200 a small model fed by one busy loader worker stepped 6 times a second while NVML's
    utilization read 0-1% from its first step (docs/gpu-check.md, runs 1 and 2): gpumon read it
    `starting` for its whole minute, and past the grace it would have been `stalled`, a hung job,
    the critical alert. GPM's SM activity saw its kernels in every tick (0.1%): a job whose kernels
    GPM sees for KERNEL_TICKS ticks in a row has run, and is judged: starved by its loader here."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0, "gpm": True}
    crawl = replace(sc.STARVED_CPU, compute_s=0.001, wait_s=0.16, main_cpu=0.15, workers=1, worker_cpu=1.0)
    life = sc.Scenario(
        "small-model",
        "starts up, then steps with kernels NVML's utilization rounds to nothing",
        ((0.0, replace(sc.STARTING, **fresh)), (10.0, replace(crawl, **fresh))),  # type: ignore[arg-type]
        ((0.0, "starting"), (10.0, "starved")),
    )
    trace = tmp_path / "small.jsonl"
    record(Case("small-model", 0, 1 / 6, 60, 0.05, (life,)), str(trace))
    tr = analyze(str(trace))
    episodes = [e for e in tr.gpus[0].episodes if e.state != "unknown"]
    assert [e.label for e in episodes] == ["starting", "starved-cpu"], labels(tr)
    assert 10 <= episodes[1].start_s <= 20, episodes[1].start_s


def test_a_start_up_whose_gpm_shows_a_moment_of_kernels_is_still_starting(tmp_path: Path) -> None:
    """The false alarm on the other side: a job that runs a second or two of small kernels while
    it starts (initialisation, a warm-up), then goes on starting up on the CPU, is `starting`, not
    starved or stalled: GPM must see kernels in KERNEL_TICKS ticks in a row."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0, "gpm": True}
    starting = replace(sc.STARTING, **fresh)
    blip = replace(
        sc.STARVED_CPU, compute_s=0.001, wait_s=0.05, main_cpu=0.9, workers=0, worker_cpu=0.0, **fresh
    )
    life = sc.Scenario(
        "warm-up",
        "starts up with two seconds of small kernels, then compiles on the CPU",
        ((0.0, starting), (8.0, blip), (10.0, starting)),  # type: ignore[arg-type]
        ((0.0, "starting"),),
    )
    trace = tmp_path / "warm.jsonl"
    record(Case("warm-up", 0, 1 / 6, 60, 0.05, (life,)), str(trace))
    tr = analyze(str(trace))
    ticks = read_trace(str(trace)).ticks
    active = [
        t.t_s - ticks[0].t_s for t in ticks if t.gpus[0].gpm and (t.gpus[0].gpm.sm_active_ratio or 0) > 0
    ]
    assert active and all(6 <= t <= 12 for t in active), active  # GPM saw the warm-up's kernels
    assert labels(tr) == ["starting"], labels(tr)


def _recorded_at(tmp_path: Path, life: Any, interval: float, seconds: float) -> Path:
    """A simulated scenario recorded at another tick interval than the corpus's 1 s."""
    import logging

    from gpumon.analyze import corpus
    from gpumon.collect.pipeline import Pipeline, SourceSpec
    from gpumon.collect.pipeline.sources import simulated
    from gpumon.core.clock import VirtualClock
    from gpumon.core.problems import Problems
    from gpumon.sim.fleet import Fleet
    from gpumon.trace.writer import TraceWriter

    path = tmp_path / f"at-{interval}.jsonl"
    clock = VirtualClock()
    fleet = Fleet([life], None, 0, clock, 1 / 6, noise=0.05)
    desc = corpus.SourceDescription.simulated([life.name], 1, 0, 1 / 6, corpus_case=life.name)
    problems = Problems(logging.getLogger("test"))
    p = Pipeline(
        SourceSpec("simulated"),
        clock,
        sources=simulated(fleet, desc, problems),
        problems=problems,
        interval_s=interval,
    )
    w = TraceWriter(str(path), corpus.make_header(desc.to_json(), interval), force=True)
    p.on_tick(w.write_tick)
    p.run(duration_s=seconds)
    w.close(clock.now(), "duration")
    return path


@pytest.mark.parametrize("interval", [0.2, 1.0])
def test_the_warm_up_is_told_in_seconds_not_ticks(tmp_path: Path, interval: float) -> None:
    """KERNEL_TICKS counted ticks: at --interval 0.2 the same 2 s warm-up made 10 ticks of SM activity
    and the job read `stalled` at 12 s (a reviewer's find). The run must also last KERNEL_SECONDS."""
    from dataclasses import replace

    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0, "gpm": True}
    starting = replace(sc.STARTING, **fresh)
    blip = replace(
        sc.STARVED_CPU, compute_s=0.001, wait_s=0.05, main_cpu=0.9, workers=0, worker_cpu=0.0, **fresh
    )
    life = sc.Scenario("warm-up", "w", ((0.0, starting), (8.0, blip), (10.0, starting)), ((0.0, "starting"),))
    trace = _recorded_at(tmp_path, life, interval, 60)
    assert labels(analyze(str(trace))) == ["starting"], labels(analyze(str(trace)))


@pytest.mark.parametrize(("interval", "window_s"), [(0.5, 4.0), (1.0, 8.0), (2.0, 8.0)])
def test_the_start_up_sign_is_not_held_to_the_detectors_window(
    tmp_path: Path, interval: float, window_s: float
) -> None:
    """The run of ticks with GPM's kernels was looked for inside the detector's window: a window of
    5 s or less, or an interval of 1.6 s or more with the default 8 s, never held it, and the small
    model read `starting` for its whole run (a second reviewer's find). It is counted tick by tick."""
    from dataclasses import replace

    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0, "gpm": True}
    crawl = replace(
        sc.STARVED_CPU, compute_s=0.001, wait_s=0.16, main_cpu=0.15, workers=1, worker_cpu=1.0, **fresh
    )
    life = sc.Scenario(
        "small",
        "s",
        ((0.0, replace(sc.STARTING, **fresh)), (10.0, crawl)),
        ((0.0, "starting"), (10.0, "starved")),
    )
    trace = _recorded_at(tmp_path, life, interval, 90)
    got = labels(analyze(str(trace), Thresholds(window_s=window_s)))
    assert got == ["starting", "starved-cpu"], got


def test_a_small_model_stepping_in_bursts_is_not_stalled(tmp_path: Path) -> None:
    """A small model starved by its host (batches in chunks: it steps at its fed rate for a moment,
    then waits ~3 s), its workers idle: NVML's samples read 0% between bursts and 3-9% in them, its
    duty under 2%; GPM sees every burst. The stalled rule's exemption asked NVML's p95 to be at
    most 5% and read it `stalled`, the critical alert, for most of the run (a third reviewer's
    find). Without GPM nothing tells it from a hang (left as it was)."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    burst = replace(
        sc.STARVED_HOST,
        compute_s=0.002,
        wait_s=0.030,
        jitter=0.3,
        long_gap_p=0.1,
        long_gap_s=(2.5, 3.5),
        gpm=True,
    )
    life = sc.Scenario("burst", "x", ((0.0, burst),), ((0.0, "starved"),))
    trace = tmp_path / "burst.jsonl"
    record(Case("burst", 0, 1 / 6, 120, 0.05, (life,)), str(trace))
    assert "stalled" not in labels(analyze(str(trace))), labels(analyze(str(trace)))


def test_a_job_whose_kernels_nvml_saw_is_stalled_as_soon_with_gpm_as_without(tmp_path: Path) -> None:
    """The stalled rule's exemption for kernels GPM alone sees held while GPM's mean over the window
    had not emptied: a job 5% busy that hangs read `stalled` 3 s later on a GPU with GPM (a second
    reviewer's find). It holds only where NVML shows next to no kernels in the window."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    starts = []
    for gpm in (False, True):
        fresh = {"job": 1, "started_before_s": 0.0, "gpm": gpm}
        low = replace(sc.STARVED_CPU, compute_s=0.02, wait_s=0.4, **fresh)
        phases = ((0.0, low), (30.0, replace(sc.STALLED, **fresh)))
        life = sc.Scenario("low", "x", phases, ((0.0, "starved"), (30.0, "stalled")))  # type: ignore[arg-type]
        trace = tmp_path / f"low-{gpm}.jsonl"
        record(Case("low", 0, 1 / 6, 70, 0.05, (life,)), str(trace))
        a = analyze(str(trace))
        starts.append(next(e.start_s for e in a.gpus[0].episodes if e.state == "stalled"))
    assert starts[1] == starts[0], starts


def test_a_small_model_whose_loader_keeps_up_is_underutilized_not_stalled(tmp_path: Path) -> None:
    """Kernels GPM sees in every tick, NVML's utilization about 1%, the loader workers at 0.4 of a
    core: the job steps, its work too small for the GPU. Once its kernels ended `starting`, the
    stalled rule (duty under 2%) read it `stalled`, the critical alert, 5 s later (a reviewer's
    find): GPM's kernels are not a hang."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0, "gpm": True}
    tiny = replace(sc.HEALTHY, compute_s=0.001, wait_s=0.16, main_cpu=0.3, workers=2, worker_cpu=0.4, **fresh)
    life = sc.Scenario(
        "tiny",
        "a small model, fed",
        ((0.0, replace(sc.STARTING, **fresh)), (10.0, tiny)),
        ((0.0, "healthy"),),
    )
    trace = tmp_path / "tiny.jsonl"
    record(Case("tiny", 0, 1 / 6, 90, 0.05, (life,)), str(trace))
    a = analyze(str(trace))
    assert labels(a) == ["starting", "underutilized"], labels(a)
    # and a job that hangs, GPM reading nothing, is still stalled (no kernels: not stepping)
    phases = ((0.0, replace(sc.HEALTHY, **fresh)), (30.0, replace(sc.STALLED, **fresh)))
    hung = sc.Scenario("hung", "trains, then hangs", phases, ((0.0, "healthy"), (30.0, "stalled")))  # type: ignore[arg-type]
    record(Case("hung", 0, 1 / 6, 90, 0.05, (hung,)), str(trace))
    assert labels(analyze(str(trace)))[-1] == "stalled", labels(analyze(str(trace)))


# -- a job change -------------------------------------------------------------------------------------


def test_episodes_follow_jobs_and_waste_is_counted_per_job(tmp_path: Path) -> None:
    a = analyze(str(recorded(tmp_path, "job-change", 100)))
    (gpu,) = a.gpus
    episodes = [e for e in gpu.episodes if e.state != "unknown"]
    assert [e.label for e in episodes] == ["starved-cpu", "starting", "starved-cpu"], episodes
    first, _, second = episodes
    assert first.job != second.job and first.job and second.job
    assert first.end_s is not None and 39 <= first.end_s <= 41  # where the job changed (40 s)
    waste = gpu.wasted_by_job
    assert set(waste) == {first.job, second.job} and all(w > 0 for w in waste.values())
    doc = to_json(a)["gpus"][0]
    assert doc["wasted_gpu_s_by_job"] == waste
    assert {e["job"] for e in doc["episodes"] if e["state"] != "unknown"} == {first.job, second.job}


@pytest.mark.parametrize("period", [1 / 6, 1.0])
def test_a_job_that_takes_the_gpu_the_tick_another_leaves_is_starting_not_starved(
    tmp_path: Path, period: float
) -> None:
    """A Slurm array's next task (a sweep's next trial) opens the GPU the tick the last one left it,
    and prepares on one core. The driver samples up to its arrival, and the one that straddles it,
    are the last job's kernels: read as the new job's work, its first 6-7 s were `starved-cpu` (an
    episode, 5.5-6.7 GPU-s of waste charged to it) instead of `starting` (a reviewer's find)."""
    from dataclasses import replace

    from gpumon.analyze.corpus import Case, record
    from gpumon.sim import scenarios as sc

    fresh = {"job": 1, "started_before_s": 0.0}
    life = sc.Scenario(
        "next-task",
        "a fed job, then the next one opens the GPU at once and prepares",
        (
            (0.0, sc.HEALTHY),
            (200.0, replace(sc.STARTING, main_cpu=0.95, **fresh)),
            (290.0, replace(sc.HEALTHY, **fresh)),
        ),
        ((0.0, "healthy"), (200.0, "starting"), (290.0, "healthy")),
    )
    trace = tmp_path / "next-task.jsonl"
    record(Case("next-task", 0, period, 320, 0.05, (life,)), str(trace))
    a = analyze(str(trace))
    assert labels(a) == ["healthy", "starting", "healthy"], labels(a)
    (gpu,) = a.gpus
    newer = next(e for e in gpu.episodes if e.state == "starting")
    assert 200 <= newer.start_s <= 209, newer.start_s  # after the confirmation, as for any start-up
    assert gpu.episodes[0].job not in (None, newer.job)
    assert gpu.wasted_by_job.get(newer.job or "", 0.0) == 0.0, gpu.wasted_by_job


# -- busy neighbours, through the real NVML path ------------------------------------------------------


@pytest.fixture
def processes() -> Iterator[dict[str, int]]:
    """Real processes of this host for the stand-in's GPUs: one that pins a core, four asleep, and
    a neighbour (on no GPU) that keeps another core busy."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = {
        "pinned": subprocess.Popen(spin),
        "neighbour": subprocess.Popen(spin),
        **{f"asleep{i}": subprocess.Popen(["sleep", "600"]) for i in range(4)},
    }
    yield {name: p.pid for name, p in procs.items()}
    for p in procs.values():
        p.kill()
        p.wait()


def test_a_busy_host_starves_only_the_gpu_whose_process_is_pinned(
    tmp_path: Path, processes: dict[str, int]
) -> None:
    """The issue's check on the stand-in driver through the real pynvml: GPU 0's process pins a
    core; GPUs 1-4 are steady at 35-96% with sleeping processes; a neighbour keeps another core
    busy, so the host reads all but saturated. Only GPU 0 is ever starved."""
    sims = [40000 + 100 * i for i in range(5)]  # the simulator's process ids, GPU by GPU
    real = [processes["pinned"], *(processes[f"asleep{i}"] for i in range(4))]
    config = driver.simulated_config(
        tmp_path,
        "starved-cpu,underutilized,underutilized,healthy,healthy",
        seconds=60,
        pid_map=dict(zip(sims, real, strict=True)),
    )
    out = tmp_path / "standin.jsonl"
    p = gpumon("record", "--duration", "30", "-o", str(out), env=driver.environment(config), timeout=120)
    assert p.returncode == 0, p.stderr
    a = analyze(str(out))
    host_busy = [h[1] for h in a.host]
    assert max(host_busy) >= 0.9, f"the neighbours did not keep the host busy: {host_busy}"
    starved = {g.index for g in a.gpus for v in g.verdicts if v.state == "starved"}
    assert starved == {0}, {g.index: labels(a, g.index) for g in a.gpus}
    assert a.gpus[0].main_label == "starved-cpu", dict(a.gpus[0].seconds_by_label)
    for g in a.gpus[1:]:
        assert g.main_label in ("underutilized", "healthy"), (g.index, dict(g.seconds_by_label))


def test_busy_neighbours_never_starve_a_simulated_fleet(tmp_path: Path) -> None:
    a = analyze(str(recorded(tmp_path, "underutilized-busy-host,healthy-busy-host,starved-cpu", 60)))
    assert [g.main_label for g in a.gpus] == ["underutilized", "healthy", "starved-cpu"]
    assert not any(v.state == "starved" for g in a.gpus[:2] for v in g.verdicts)


# -- the first seconds of a range ----------------------------------------------------------------


def test_a_range_analysis_judges_its_first_seconds(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    p = gpumon(
        "serve", "--simulate", "starved-cpu", "--speed", "max", "--duration", "400", "--record-dir", str(rec),
        "--listen", "127.0.0.1:0",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    every = gpumon("analyze", "--from", str(rec), "--since", "2000-01-01", "--until", "2100-01-01", "--json")
    since = json.loads(every.stdout)["range"]["first_unix_s"] + 200
    iso = datetime.datetime.fromtimestamp(since, datetime.UTC).isoformat()
    out = gpumon("analyze", "--from", str(rec), "--since", iso, "--until", "2100-01-01", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (g,) = doc["gpus"]
    assert "unknown" not in g["seconds_in_state"], g["seconds_in_state"]
    assert g["verdict"] == "starved-cpu"
    assert doc["range"]["first_unix_s"] >= since and doc["range"]["ticks"] <= 201
    assert g["episodes"][0]["start_unix_s"] >= since - 1, "an episode under way starts at the range"
