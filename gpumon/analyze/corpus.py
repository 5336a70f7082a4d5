"""A labeled corpus of simulated traces: the ground truth the detector is held to.

Each case is a fleet of 1-8 GPUs at a sample period of 1/6 s or 1 s, with noise, jittered step
times and, on about a third of the GPUs, a change of workload mid-run. Every workload is a
scenario from `gpumon.sim.scenarios` with its parameters drawn within the bounds of its state
(a starved job's duty cycle between 10% and 60%, a healthy one's between 86% and 99%, ...), so the
corpus tests the definitions rather than one memorised pattern.

Known limit, kept out of the corpus on purpose and stated in docs/detector.md: at a 1 s sample
period, starvation with no CPU or storage evidence (`starved-host`) reads as steady low use and
cannot be told from `underutilized` from outside the process; those cases only run at 1/6 s.
The same holds for storage starvation on a CPU-saturated host when the kernel does not count block
I/O delay (delayacct off) and the job reads less than `read_bytes_high`: at 1 s such cases read
more than that, as their bursts and gaps (which would make lower reads count) cannot be seen.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace

from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.collect.pipeline.sources import simulated
from gpumon.collect.pipeline.spec import SourceDescription
from gpumon.core.clock import VirtualClock
from gpumon.core.problems import Problems
from gpumon.sim import scenarios as sc
from gpumon.sim.fleet import Fleet
from gpumon.sim.scenarios import Phase, Scenario
from gpumon.trace.records import make_header
from gpumon.trace.writer import TraceWriter

LABELS = (
    "healthy",
    "starved-cpu",
    "starved-io",
    "starved-host",
    "idle",
    "stalled",
    "sync-stall",
    "underutilized",
    "underutilized-small-kernels",
    "starting",
)
NEVER_STARVED = frozenset({"healthy", "idle", "underutilized", "underutilized-small-kernels", "starting"})
GPM_ONLY = frozenset({"underutilized-small-kernels"})
MIG_SHARE = 0.4
"""Of the GPM cases, the share whose GPUs read as MIG instances do: activity from GPM at 5 Hz."""
FLEET_LIFE_SHARE = 0.4
"""Share of cases with what fleets live with (issue 25): neighbours that saturate the host's CPUs
beside GPUs they do not feed, jobs that start up (the GPU held, no kernel yet) and jobs that
take over a GPU from another."""
HOPPER_SHARE = 0.3
"""Share of cases on GPUs with GPM (Hopper): SM activity read, some healthy GPUs power-capped,
some running kernels too small for the GPU (only GPM tells those from fed), some as MIG instances
(MIG_SHARE)."""


@dataclass(frozen=True)
class Case:
    name: str
    seed: int
    period_s: float
    duration_s: int
    noise: float
    scenarios: tuple[Scenario, ...]

    def truth(self, gpu: int, t_s: float) -> str:
        label = self.scenarios[gpu].truth[0][1]
        for start, lab in self.scenarios[gpu].truth:
            if start <= t_s:
                label = lab
        return label

    def transitions(self, gpu: int) -> list[tuple[float, str]]:
        return list(self.scenarios[gpu].truth[1:])


def _duty_steps(rng: random.Random, duty: float, compute: tuple[float, float]) -> tuple[float, float]:
    c = rng.uniform(*compute)
    return c, c * (1 - duty) / duty


def draw_phase(label: str, rng: random.Random, period_s: float = 1 / 6) -> Phase:
    """A phase of the given state, its parameters drawn within that state's bounds (at the sample
    period the case runs at: see the module's known limits)."""
    jitter = rng.uniform(0.05, 0.4)
    if label == "healthy":
        c, w = _duty_steps(rng, rng.uniform(0.86, 0.99), (0.04, 0.3))
        return replace(
            sc.HEALTHY,
            compute_s=c,
            wait_s=w,
            jitter=jitter,
            main_cpu=rng.uniform(0.3, 0.8),
            workers=rng.randint(0, 8),
            worker_cpu=rng.uniform(0.05, 0.6),
        )
    if label == "starved-cpu":
        c, w = _duty_steps(rng, rng.uniform(0.1, 0.6), (0.03, 0.2))
        if rng.random() < 0.25:  # more loaders than cores on a busy host, reading from a fast disk
            share = rng.uniform(0.35, 0.75)
            return replace(
                sc.STARVED_CPU_CONTENDED,
                compute_s=c,
                wait_s=w,
                jitter=jitter,
                workers=rng.randint(3, 8),
                worker_cpu=share,
                worker_runq=rng.uniform(0.95, 1.05) - share,
                read_bytes_per_s=rng.uniform(10e6, 60e6),
                other_cores=rng.uniform(3.0, 7.0),
                iowait=rng.uniform(0.0, 0.01),
            )
        if rng.random() < 0.5:  # the GIL: one feeder thread in the main process
            return replace(
                sc.STARVED_CPU,
                compute_s=c,
                wait_s=w,
                jitter=jitter,
                main_cpu=rng.uniform(0.95, 1.0),
                workers=rng.randint(0, 2),
                worker_cpu=rng.uniform(0.0, 0.3),
            )
        return replace(
            sc.STARVED_CPU,
            compute_s=c,
            wait_s=w,
            jitter=jitter,  # too few workers
            main_cpu=rng.uniform(0.2, 0.6),
            workers=rng.randint(1, 8),
            worker_cpu=rng.uniform(0.95, 1.0),
        )
    if label == "starved-io":
        if rng.random() < 0.25:  # on a host whose CPUs other work keeps busy: iowait near 0
            blkio = rng.uniform(0.4, 0.95) if rng.random() < 0.5 else 0.0
            return replace(
                sc.STARVED_IO_CONTENDED,
                compute_s=rng.uniform(0.03, 0.15),
                wait_s=rng.uniform(0.1, 0.3),
                jitter=rng.uniform(0.2, 0.6),
                worker_cpu=rng.uniform(0.03, 0.15),
                worker_runq=rng.uniform(0.0, 0.1),
                # half as if the kernel counted block I/O delay, half as if not (its default)
                worker_blkio=blkio,
                read_bytes_per_s=rng.uniform(15e6, 60e6)
                if blkio or period_s < 0.5
                else rng.uniform(55e6, 90e6),
                other_cores=rng.uniform(5.0, 8.0),
                iowait=rng.uniform(0.0, 0.01),
            )
        return replace(
            sc.STARVED_IO,
            compute_s=rng.uniform(0.03, 0.15),
            wait_s=rng.uniform(0.05, 0.2),
            jitter=rng.uniform(0.2, 0.6),
            long_gap_p=rng.uniform(0.2, 0.5),
            long_gap_s=(rng.uniform(0.3, 0.6), rng.uniform(0.8, 1.6)),
            iowait=rng.uniform(0.08, 0.4),
            read_bytes_per_s=rng.uniform(100e6, 800e6),
        )
    if label == "starved-host":
        return replace(
            sc.STARVED_HOST,
            compute_s=rng.uniform(0.03, 0.12),
            wait_s=rng.uniform(0.25, 0.6),
            jitter=rng.uniform(0.3, 0.6),
        )
    if label == "idle":
        return replace(sc.IDLE, power_idle_ratio=rng.uniform(0.05, 0.12))
    if label == "stalled":
        return replace(
            sc.STALLED,
            mem_used_ratio=rng.uniform(0.1, 0.95),
            main_cpu=rng.uniform(0.0, 0.05),
            power_idle_ratio=rng.uniform(0.08, 0.15),
        )
    if label == "sync-stall":
        p = rng.uniform(0.1, 0.22)
        return replace(
            sc.SYNC_STALL, power_idle_ratio=p - 0.02, power_busy_ratio=p, main_cpu=rng.uniform(0.1, 1.0)
        )
    if label == "underutilized":
        return replace(
            sc.UNDERUTILIZED,
            duty=rng.uniform(0.1, 0.65),
            main_cpu=rng.uniform(0.2, 0.7),
            workers=rng.randint(0, 4),
            worker_cpu=rng.uniform(0.02, 0.3),
        )
    raise ValueError(label)


def _on_hopper(scenario: Scenario, rng: random.Random, mig: bool) -> Scenario:
    """The same workload on a GPU with GPM; a quarter of them small kernels instead. `mig`: as
    NVML shows a MIG instance (no utilization, samples or power: GPM only), except a GPU waiting
    in a collective, which needs power to be told from busy (docs/detector.md)."""
    mig = mig and not any(label == "sync-stall" for _, label in scenario.truth)
    if rng.random() < 0.25:
        c, w = _duty_steps(rng, rng.uniform(0.86, 0.99), (0.02, 0.1))
        phase = replace(
            sc.SMALL_KERNELS,
            compute_s=c,
            wait_s=w,
            jitter=rng.uniform(0.05, 0.4),
            sm_fill=rng.uniform(0.1, 0.4),
            power_busy_ratio=rng.uniform(0.4, 0.6),
            mig=mig,
        )
        label = "underutilized-small-kernels"
        return Scenario(label, label, ((0.0, phase),), ((0.0, label),))
    phases = []
    for start, ph in scenario.phases:
        capped = ph.has_job and rng.random() < 0.2  # held by the power cap (or heat): slower, still fed
        phases.append(
            (
                start,
                replace(
                    ph,
                    gpm=True,
                    sm_fill=rng.uniform(0.6, 0.95),
                    clock_events=rng.choice((0x4, 0x20, 0x40)) if capped and not mig else 0,
                    mig=mig,
                ),
            )
        )
    return replace(scenario, phases=tuple(phases))


def _fleet_life(scen: list[Scenario], rng: random.Random, duration: int, period_s: float) -> list[Scenario]:
    """One of: the host's CPUs saturated by neighbours (the GPUs' own processes as drawn; those
    that are underutilized asleep), a job starting up on one GPU, or a job taking over a GPU."""
    kind = rng.choice(("busy-host", "start-up", "job-change"))
    out = list(scen)
    if kind == "busy-host":
        cores = max(8, min(128, 8 * len(out)))  # the simulated host's (gpumon.sim.fakehost)
        for n, s in enumerate(out):
            phases = []
            for start, ph in s.phases:
                if ph.stepped is False and ph.has_job and 0 < ph.duty < 0.8:  # steady low use: asleep
                    ph = replace(ph, main_cpu=0.0, workers=0, worker_cpu=0.0, read_bytes_per_s=0.0)
                phases.append((start, replace(ph, other_cores=float(cores) if n == 0 else 0.0)))
            out[n] = replace(s, phases=tuple(phases))
        return out
    k = rng.randrange(len(out))
    # a job that starts up and then runs (a stalled one would read starting until its grace is over)
    label = rng.choice(
        [lab for lab in LABELS if lab not in GPM_ONLY and lab not in ("idle", "starting", "stalled")]
    )
    if label == "starved-host" and period_s == 1.0:
        label = "healthy"
    job = draw_phase(label, rng, period_s)
    prep = rng.uniform(10, 60)
    if kind == "start-up":  # the recording begins as the job opens the GPU
        first = replace(sc.STARTING, job=1, started_before_s=0.0)
        second = replace(job, job=1, started_before_s=0.0)
        out[k] = Scenario(
            "start-up", "start-up", ((0.0, first), (prep, second)), ((0.0, "starting"), (prep, label))
        )
        return out
    change = float(rng.randint(25, max(26, duration - 45)))
    prep = min(prep, max(5.0, duration - change - 25))  # the new job trains long enough to be judged
    before = out[k].phases[0][1]
    if not before.has_job:
        before = draw_phase("healthy", rng, period_s)
    prepare = replace(sc.STARTING, job=1, started_before_s=0.0)
    after = replace(job, job=1, started_before_s=0.0)
    truth0 = out[k].truth[0][1] if out[k].phases[0][1].has_job else "healthy"
    out[k] = Scenario(
        "job-change",
        "job-change",
        ((0.0, before), (change, prepare), (change + prep, after)),
        ((0.0, truth0), (change, "starting"), (change + prep, label)),
    )
    return out


def _scenario(label: str, rng: random.Random, period_s: float) -> Scenario:
    return Scenario(label, label, ((0.0, draw_phase(label, rng, period_s)),), ((0.0, label),))


def generate(n: int, seed: int = 0, min_s: int = 60, max_s: int = 150) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        period = rng.choice([1 / 6, 1.0])
        labels = [
            lab
            for lab in LABELS
            if not (lab == "starved-host" and period == 1.0)
            and lab not in GPM_ONLY  # drawn below
            and lab != "starting"  # drawn with the fleet's life, below
        ]
        duration = rng.randint(min_s, max_s)
        gpus = rng.randint(1, 8)
        # a third of the cases are whole fleets that are never starved: false-alarm material
        never = rng.random() < 0.33
        pool = [lab for lab in labels if lab in NEVER_STARVED] if never else labels
        scen = []
        for _ in range(gpus):
            first = _scenario(rng.choice(pool), rng, period)
            if rng.random() < 0.35 and duration >= 60:
                second = _scenario(rng.choice([x for x in pool if x != first.name]), rng, period)
                first = first.then(second, float(rng.randint(25, duration - 30)))
            scen.append(first)
        # the fleet's life draws from its own generator too, after the others
        life = random.Random(seed * 7_000_003 + i)
        if life.random() < FLEET_LIFE_SHARE:
            scen = _fleet_life(scen, life, duration, period)
        # GPM cases draw from their own generator, so the cases without it stay as they were
        hw = random.Random(seed * 1_000_003 + i)
        if hw.random() < HOPPER_SHARE:
            mig = hw.random() < MIG_SHARE
            scen = [_on_hopper(x, hw, mig) for x in scen]
        cases.append(
            Case(
                name=f"case{i:03d}",
                seed=seed * 100_003 + i,
                period_s=period,
                duration_s=duration,
                noise=rng.uniform(0.02, 0.15),
                scenarios=tuple(scen),
            )
        )
    return cases


def record(case: Case, path: str) -> None:
    """Write the case as a trace file, exactly as `gpumon record --simulate ... --speed max` would."""
    clock = VirtualClock()
    fleet = Fleet(list(case.scenarios), None, case.seed, clock, case.period_s, noise=case.noise)
    description = SourceDescription.simulated(
        [s.name for s in case.scenarios], len(case.scenarios), case.seed, case.period_s, corpus_case=case.name
    )
    problems = Problems(logging.getLogger("gpumon.analyze.corpus"))
    pipeline = Pipeline(
        SourceSpec("simulated"), clock, sources=simulated(fleet, description, problems), problems=problems
    )
    writer = TraceWriter(path, make_header(description.to_json(), 1.0), force=True)
    pipeline.on_tick(writer.write_tick)
    pipeline.run(duration_s=case.duration_s)
    writer.close(clock.now(), "duration")
