"""What a fix buys: from a starved GPU's evidence, the speed-up each remedy on the input side would
bring, or why no number can be given. Pure: numbers in, a prediction out (docs/detector.md, "What a
fix buys").

The model, in steps per second relative to today's (`speedup` 1.0 is no change):
- the ceiling: the GPU is busy a share `duty` of the time and waits for input the rest; with input
  for free it runs at most 1/duty as many steps;
- the loader: today's steps are what its workers make with the CPU they get (the job is starved,
  so every batch they make is used). Its CPU per step is fixed, so `s` times the steps needs `s`
  times today's worker CPU, spread over the new number of workers, each at most one core (a worker
  is one single-threaded process). A storage-bound loader's workers each keep one read in flight:
  `s` times the steps needs `s` times today's readers' streams;
- the main process needs `s` times its CPU too (launching kernels, collating, the training loop),
  and its loop gets one core at most: `s` is at most 1 / its CPU where that is under a core (its
  Python runs one thread at a time; CUDA's synchronize spins it while the GPU computes);
- the cores the job can have: on a host with idle cores, all but what other users' work uses; on
  a saturated one, Linux shares the machine fairly among the scheduling groups that want CPU, so
  the job gets at most its share among them however many workers it adds, and within that more
  workers win CPU only while they spread the job over more CPUs (job_cpu_cap);
- storage: the busiest disk's utilization (iostat's %util) grows with the reads, to 1.0 at most.
The speed-up of a change is the largest `s` (at most the ceiling) whose demands all fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from gpumon.detect.classify import LOOP_WORK_MAX_RUNQ
from gpumon.detect.evidence import KERNEL_SM_ACTIVE, Evidence
from gpumon.detect.vocabulary import Cause, State

HIDDEN_DUTY = 0.01
"""The duty of a GPU whose NVML utilization reads 0% while GPM sees kernels (KERNEL_SM_ACTIVE): under
1% busy (NVML's samples are whole percents), so the GPU binds no sooner than 100x. Its ceiling is not
said (unknown but high); the loader, the training loop and the host's cores bind long before."""
NO_GAIN = 1.10
"""A predicted speed-up below this is "no gain": the noise of a loader's batch times (5-15%,
Lotus, IISWC 2024) and of a shared host's steps is as large."""
NEAR_BEST = 0.95
"""The smallest change reaching this share of the best candidate's speed-up is the one named."""
MAX_MORE_WORKERS = 8
"""Candidates go up to this many workers more than today's (and no further than the host's cores
allow: a CPU-bound worker beyond them only shares)."""
SATURATED_IDLE_CORES = 0.15
"""A host with fewer idle cores than this (all cores together) is saturated: other users'
processes may want more than they get."""
OTHERS_CPU_BOUND = 0.8
"""On a saturated host, other work that uses this share of the job's CPU or more is taken as
CPU-bound groups at their fair share (they would take more if it were free)."""
COARSE_PERIOD_S = 0.5
"""A driver sample period this long or longer (consumer GPUs: 1 s) blurs sub-second steps."""
WORKERS_KNOB = "loader workers (DataLoader(num_workers), PyDataset(workers))"
"""The setting a change of workers is, where the framework is not known."""
WORKER_SATURATED = 0.90
"""A loader worker at this share of a core or more is saturated (the detector's `pinned_core`
default); below it, beside a busier training process, the workers have CPU to spare."""
MIN_WINDOWS = 5
"""Windows of an episode (one per tick) a prediction needs: fewer is too noisy to name a number."""
LOOP_CORES = 1.0
"""The training process's own work a step (its loop: launching kernels, waiting on them, collating
what the workers send) runs on one core at most: its Python runs one thread at a time, and a
synchronize spins that thread while the GPU computes. Where the process reads less than this,
`s` times the steps needs `s` times its CPU, so `s` is at most LOOP_CORES / its CPU (on an H200,
2026-12-04: a starved job's training process at 0.16 of a core and its GPU at 12% of the time;
fed, it reached 6.3x, at 1.07 cores, where 1/duty said 8.4x). A process that reads a core or more
is more than its loop's thread, and its loop's share cannot be told: "cannot predict" (predict)."""


class Kind(StrEnum):
    PREDICTED = "predicted"
    """A starved GPU whose signals support a number: candidates with their speed-ups."""
    GPU_LIMIT = "gpu-limit"
    """Fed: nothing on the input side to gain, the GPU is the limit."""
    CANNOT = "cannot-predict"
    """Starved, but the signals cannot support a number (`why` says which)."""


class Limit(StrEnum):
    GPU = "gpu"
    """The ceiling: the GPU computes all the time."""
    LOADER = "loader"
    """The loader's workers: each at a whole core (more workers would help further)."""
    CPU = "cpu"
    """The host's cores, shared with the main process and other users."""
    STORAGE = "storage"
    """The storage device's utilization reaches 100%."""
    LOOP = "loop"
    """The training process's own loop: a core's worth of its work a step (LOOP_CORES)."""


class RemedyInputs(NamedTuple):
    """What the model reads from one window's evidence (or the median of an episode's)."""

    duty: float
    """The GPU's busy share (since a fed-to-starved change, where the window shows one)."""
    job_seen: bool
    """The host sees the job's processes."""
    coarse_blur: bool
    """The driver samples are coarse (>= COARSE_PERIOD_S) and none reads idle: steps blurred."""
    cpu_count: int | None
    main_cores: float | None
    """The training process's CPU."""
    worker_cores: float | None
    """The loader workers' CPU, all together (the training process's descendants)."""
    busiest_worker_cores: float | None
    workers: int | None
    host_busy_cores: float | None
    """All CPUs busy, in cores (the job, other users, the system)."""
    disk_busy_ratio: float | None
    read_bytes_per_s: float | None
    peer_cores: float = 0.0
    """A straggler's: the CPU of the job's other ranks on this host, which wait for it (in
    sync-stall); their steps, and so their CPU, grow with its (detect/stragglers.py)."""
    runq_cores: float | None = None
    """The job's processes' wait for a CPU, in cores' worth (schedstat; None where not counted)."""
    host_runnable: float | None = None
    """Threads runnable on the host besides gpumon's reading thread, all users' (the job's
    included), a mean: at most this many scheduling groups can want CPU at once (None where the
    host does not say)."""
    sm_active: float | None = None
    """GPM's SM activity, a mean over the window (None without GPM): where NVML's utilization reads
    0%, whether kernels ran all the same (too short for its samples)."""

    @classmethod
    def of(cls, ev: Evidence, peer_cores: float = 0.0) -> RemedyInputs | None:
        """From one window's evidence (and a straggler's peers' CPU); None without a duty cycle."""
        duty = ev.duty_since_change if ev.duty_since_change is not None else ev.duty_cycle
        if duty is None:
            return None
        main, job = ev.main_cpu_cores, ev.job_cpu_cores
        coarse = ev.period_s is not None and ev.period_s >= COARSE_PERIOD_S
        host = ev.host_cpu_ratio * ev.cpu_count if ev.host_cpu_ratio is not None and ev.cpu_count else None
        return cls(
            duty=duty,
            job_seen=ev.job_seen_on_host,
            coarse_blur=coarse and (ev.gap_share or 0.0) == 0.0,
            cpu_count=ev.cpu_count,
            main_cores=main,
            worker_cores=None if main is None or job is None else max(0.0, job - main),
            busiest_worker_cores=ev.busiest_child_cpu_cores,
            workers=ev.loader_workers,
            host_busy_cores=host,
            disk_busy_ratio=ev.disk_busy_ratio,
            read_bytes_per_s=ev.job_read_bytes_per_s,
            peer_cores=peer_cores,
            runq_cores=ev.job_runq_wait_cores,
            host_runnable=ev.host_runnable,
            sm_active=ev.sm_active,
        )


_FIELDS = RemedyInputs._fields
_FLAGS = frozenset({"job_seen", "coarse_blur"})
_COUNTS = frozenset({"cpu_count", "workers"})


def median_inputs(inputs: Sequence[RemedyInputs]) -> RemedyInputs:
    """Each input's median over windows (a number known in at least half of them, else None); the
    flags hold when they hold in most windows. Medians, not means: one window with a worker found
    late or a neighbour's burst does not move them."""
    import statistics  # (and fractions, decimal): only once an episode has windows to take

    out: dict[str, Any] = {}
    # field by field, each a column of the windows (zip transposes them in one pass: a daemon
    # works this out for each starved GPU every RECOMPUTE_S, over up to a minute of windows)
    columns = list(zip(*inputs, strict=True)) or [()] * len(_FIELDS)
    for name, values in zip(_FIELDS, columns, strict=True):
        if name in _FLAGS:
            out[name] = sum(map(bool, values)) * 2 > len(values)
            continue
        known = [v for v in values if v is not None]
        if len(known) * 2 < len(values) or not known:
            out[name] = None
        elif name in _COUNTS:
            out[name] = int(statistics.median_low(known))
        else:
            out[name] = statistics.median(known)
    return RemedyInputs(**out)


class Candidate(NamedTuple):
    change: str
    """`workers+1`, `workers+2`, ... or `cache` (the label value of gpumon_gpu_predicted_speedup)."""
    workers: int | None
    """The loader's worker count after the change (None for `cache`)."""
    speedup: float
    """Predicted steps per second against today's."""
    limit: Limit
    """What binds after the change."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "workers": self.workers,
            "speedup": round(self.speedup, 3),
            "limit": self.limit,
        }


class Advice(NamedTuple):
    """What a fix buys on one GPU: the prediction, or why there is none."""

    kind: Kind
    cause: Cause | None = None
    ceiling: float | None = None
    """1 / duty: the most any input-side fix can buy (None when fed)."""
    workers: int | None = None
    """The loader's worker processes today."""
    candidates: tuple[Candidate, ...] = ()
    best: Candidate | None = None
    """The smallest change of workers that reaches (nearly) the most they can buy; None: no gain."""
    cache: Candidate | None = None
    """Caching decoded samples (cpu) or the data on local storage (io): the loader's cost gone."""
    why: str = ""
    """For `cannot-predict`: why not; otherwise the binding limit in words."""
    windows: int = 0
    """How many windows the inputs are the median of."""

    @property
    def ready(self) -> bool:
        """Not waiting for more of the episode's windows (a first look says "cannot predict" until
        MIN_WINDOWS are in)."""
        return self.kind != Kind.CANNOT or self.windows >= MIN_WINDOWS

    @property
    def no_gain(self) -> bool:
        """Nothing to gain from more loader workers (fed, or every candidate under NO_GAIN)."""
        return self.kind == Kind.GPU_LIMIT or (self.kind == Kind.PREDICTED and self.best is None)

    def line(self, workers_knob: str = "loader workers") -> str:
        """One line for people: "raise loader workers 1 -> 3: about 2.4x steps/s; beyond 3, the
        GPU is the limit". `workers_knob` names the setting (DataLoader(num_workers) in a torch job)."""
        if self.kind == Kind.GPU_LIMIT:
            return "nothing on the input side: the GPU is the limit"
        if self.kind == Kind.CANNOT:
            ceiling = f" (at most {self.ceiling:.1f}x with input for free)" if self.ceiling else ""
            return f"cannot predict what a fix buys{ceiling}: {self.why}"
        cache = ""
        if self.cache is not None and self.cache.speedup >= NO_GAIN:
            what = (
                "caching decoded samples"
                if self.cause == Cause.CPU
                else "the data on local SSD or in page cache"
            )
            cache = f"; {what}: about {self.cache.speedup:.1f}x"
        if self.best is None:
            return f"more {workers_knob} gain nothing: {self.why}{cache}"
        b = self.best
        beyond = {
            Limit.GPU: "the GPU is the limit",
            Limit.CPU: "the host's CPUs are the limit",
            Limit.STORAGE: "the storage is the limit",
            Limit.LOADER: "more workers would still add",
            Limit.LOOP: "the training loop is the limit",
        }[b.limit]
        return (
            f"raise {workers_knob} {self.workers} -> {b.workers}: about {b.speedup:.1f}x steps/s; "
            f"beyond {b.workers}, {beyond}{cache}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cause": self.cause,
            "ceiling": None if self.ceiling is None else round(self.ceiling, 3),
            "workers": self.workers,
            "best": None if self.best is None else self.best.as_dict(),
            "candidates": [c.as_dict() for c in self.candidates],
            "cache": None if self.cache is None else self.cache.as_dict(),
            "no_gain": self.no_gain,
            "why": self.why,
            "windows": self.windows,
            "ready": self.ready,
            "line": self.line(),
        }


def fed() -> Advice:
    return Advice(Kind.GPU_LIMIT, why="the GPU computes nearly all the time")


def healthy(duty: float | None, fed_duty: float, windows: int = 0) -> Advice:
    """A healthy GPU's advice, from its steady windows' median duty (`windows` of them): nothing on
    the input side, except under the fed line once MIN_WINDOWS are in, where the GPU is healthy
    only by the detector's hysteresis (it entered fed and has not dropped below fed_duty -
    hysteresis). It then waits for part of the time; where its windows read no cause the model
    scales (the advisor looks), there is nothing to scale: "cannot predict", with its ceiling (a
    healthy GPU has no speed-up series on /metrics all the same). Until MIN_WINDOWS, fed: a live
    reader never sees a "cannot predict" that is not yet ready on a healthy GPU."""
    if duty is None or duty >= fed_duty or windows < MIN_WINDOWS:
        return fed()
    return cannot(
        f"the GPU computes {duty:.0%} of the time, under the fed line ({fed_duty:.0%}): healthy by the "
        "detector's hysteresis, and its windows read no cause the model scales",
        ceiling=1.0 / max(duty, 1e-3),
        windows=windows,
    )


def cannot(why: str, cause: Cause | None = None, ceiling: float | None = None, windows: int = 0) -> Advice:
    return Advice(Kind.CANNOT, cause=cause, ceiling=ceiling, why=why, windows=windows)


class Contention(NamedTuple):
    """How other users' work shares a saturated host with the job (see job_cpu_cap)."""

    weight: float
    """G: how much of each CPU other users' work claims, in groups' worth (1 for one other group
    spread over every CPU, C for a single-process group on each CPU)."""
    level: float
    """The job's fair share of the machine among the groups that want CPU, in cores."""


def contention(i: RemedyInputs, cause: Cause) -> Contention | None:
    """None when the host has idle cores, or when other users' work takes less than the job gets
    (it has what it wants, and keeps it): the job can then have all but that work's CPU.

    The fair-share level counts the other groups that want CPU. A CPU-bound job's loader is hungry,
    so the job gets the level, and other work is that many groups as hungry (G = their CPU / the
    job's). A storage-bound job uses less than its share, so its CPU tells nothing of the level: the
    other work is taken at a core a group."""
    assert i.main_cores is not None and i.worker_cores is not None and i.host_busy_cores is not None
    cores = float(i.cpu_count or 1)
    job = max(0.05, i.main_cores + i.peer_cores + i.worker_cores)
    others = max(0.0, i.host_busy_cores - job)
    if cores - i.host_busy_cores >= SATURATED_IDLE_CORES or others < OTHERS_CPU_BOUND * job:
        return None
    # a CPU-bound job is hungry, so what it gets is the level, and each other group as hungry takes as
    # much; one that wants less than its share says nothing of the level: the others at a core a group
    groups = round(others / job if cause == Cause.CPU else others)
    if i.host_runnable is not None:
        # a group that wants CPU has a thread runnable: no more groups than the threads runnable
        # besides the job's (its CPU plus its wait for one, in threads' worth), the nearest whole
        # count (the mean of a count sampled once a tick). A count under the others' busy cores
        # cannot be (a thread is on a core or waiting for one): it says nothing
        threads = i.host_runnable - job - (i.runq_cores or 0.0)
        if threads >= others:
            groups = min(groups, math.floor(threads + 0.5))
    groups = max(1, groups)
    wanted = min(cores, _cpus_wanted(i, cause, i.workers or 0, i.worker_cores, 1.0))
    weight = 1.0 if wanted <= job + 0.02 else max(0.0, cores * (wanted - job) / (wanted * job))
    return Contention(weight, max(job, cores / (groups + 1)))


def _cpus_wanted(i: RemedyInputs, cause: Cause, workers: int, worker_cpu: float, s: float) -> float:
    """The CPUs the job's processes keep runnable at `s` times today's steps: a CPU-bound loader's
    workers one each (each always has a batch to make), a storage-bound one's what they use, the
    main process its share."""
    assert i.main_cores is not None
    per_worker = min(1.0, worker_cpu * s / workers) if workers else 0.0
    busy = 1.0 if cause == Cause.CPU and worker_cpu > 0 else per_worker
    return min(1.0, i.main_cores * s) + i.peer_cores * s + workers * busy


def job_cpu_cap(i: RemedyInputs, wanted: float, shared: Contention | None) -> float:
    """The most CPU the job's processes can have together when they keep `wanted` CPUs runnable.

    Linux shares a saturated host among the scheduling groups that want CPU (cgroups: a Slurm job,
    a pod, a systemd service; a login session's autogroup), fairly: the job gets at most its
    share of the machine among them (`level`: cores / (G + 1) for G other groups as hungry as
    it), however many workers it adds. Within that, each CPU is shared by weight, and a group's
    weight is split over the CPUs its processes run on: a job whose processes want k CPUs of C
    gets k*C / (C + k*G) cores, so more workers win CPU only while they spread the job over more
    CPUs. G is what makes today's share come out. Without contention: all but what other users'
    work uses."""
    assert i.main_cores is not None and i.worker_cores is not None and i.host_busy_cores is not None
    cores = float(i.cpu_count or 1)
    if shared is None:
        return cores - max(0.0, i.host_busy_cores - i.main_cores - i.peer_cores - i.worker_cores)
    k = min(cores, max(1.0, wanted))  # less than a CPU's worth still concentrates on one CPU
    return min(shared.level, k * cores / (cores + k * shared.weight))


def _speedup(
    i: RemedyInputs, cause: Cause, workers: int, ceiling: float, cache: bool = False
) -> tuple[float, Limit]:
    """The largest speed-up (at most the ceiling) whose demands fit, with `workers` loader workers
    (or the loader's cost gone: `cache`), and what binds there."""
    assert i.main_cores is not None and i.worker_cores is not None and i.workers
    shared = contention(i, cause)
    today = i.workers
    # a storage-bound worker keeps one read in flight: streams scale with workers, to the device's limit
    io_cap = math.inf
    if cause == Cause.IO and not cache:
        io_cap = workers / today
        if i.disk_busy_ratio is not None and i.disk_busy_ratio > 0.02:
            io_cap = min(io_cap, 1.0 / i.disk_busy_ratio)
    worker_cpu = 0.0 if cache and cause == Cause.CPU else i.worker_cores
    main = i.main_cores + i.peer_cores  # the job's other ranks here step with it
    loop_cap = LOOP_CORES / i.main_cores if 0.0 < i.main_cores < LOOP_CORES else math.inf

    def binding(s: float) -> Limit | None:
        if s > loop_cap + 1e-9:
            return Limit.LOOP  # the training loop's own work a step, on one core at most
        per_worker = worker_cpu * s / workers
        if per_worker > 1.0:
            return Limit.LOADER  # each worker is one process: a core at most
        if s > io_cap + 1e-9:
            return Limit.STORAGE if io_cap < workers / today - 1e-9 else Limit.LOADER
        wanted = _cpus_wanted(i, cause, workers, worker_cpu, s)
        if (main + worker_cpu) * s > job_cpu_cap(i, wanted, shared) + 1e-9:
            return Limit.CPU
        return None

    if binding(ceiling) is None:
        return ceiling, Limit.GPU
    lo, hi = 0.0, ceiling
    for _ in range(30):
        mid = (lo + hi) / 2
        if binding(mid) is None:
            lo = mid
        else:
            hi = mid
    return lo, binding(hi) or Limit.CPU


def predict(
    state: State,
    cause: Cause | None,
    i: RemedyInputs | None,
    windows: int = MIN_WINDOWS,
    saturated: float = WORKER_SATURATED,
) -> Advice | None:
    """What a fix buys on a GPU in `state` (its cause) whose windows gave `i` (their median, over
    `windows` windows). None for states with nothing to say (idle, stalled, underutilized ...).
    `saturated`: a process's share of a core from which it is saturated (the detector's
    `pinned_core`, which the classifier read the window by)."""
    if state == State.HEALTHY:
        return fed()
    if state != State.STARVED:
        return None
    if i is None:  # no steady window yet: an episode shorter than a window and its onset
        return cannot(f"only {windows} window(s) of this episode so far", cause, windows=windows)
    hidden = i.duty <= 0 and i.sm_active is not None and i.sm_active >= KERNEL_SM_ACTIVE
    if i.duty <= 0 and not hidden:
        return cannot("no duty cycle in the window", cause, windows=windows)
    # kernels too short for NVML's utilization (GPM sees them): the GPU's ceiling is not said
    ceiling = 1.0 / HIDDEN_DUTY if hidden else 1.0 / max(i.duty, 1e-3)
    said = None if hidden else ceiling
    if ceiling < NO_GAIN:
        return Advice(
            Kind.PREDICTED, cause, ceiling, i.workers, why="the GPU is nearly the limit", windows=windows
        )
    if windows < MIN_WINDOWS:
        return cannot(f"only {windows} window(s) of this episode so far", cause, said, windows)
    if cause not in (Cause.CPU, Cause.IO):
        return cannot(
            "neither a CPU of the job nor its storage is saturated: what it waits for is not on this "
            "host's counters",
            cause,
            said,
            windows,
        )
    if i.coarse_blur:
        return cannot(
            "the driver samples the GPU once a second or less often and no sample reads idle: "
            "sub-second steps blur into a steady duty, so input waits cannot be told from other idle time",
            cause,
            said,
            windows,
        )
    if not i.job_seen or i.main_cores is None or i.worker_cores is None or i.host_busy_cores is None:
        return cannot(
            "the job's processes are not visible to this host (another PID namespace?): "
            "their CPU and their loader workers cannot be counted",
            cause,
            said,
            windows,
        )
    busiest = i.busiest_worker_cores or 0.0
    # As the classifier reads it: the training process does the CPU work only where it is itself
    # saturated and the job waits for no CPU. Workers below a core that wait for one, or a training
    # process that wants a core it does not get, are CPU-bound on a busy host (its contended rule):
    # the contention model below gives their number.
    waiting = (i.runq_cores or 0.0) >= LOOP_WORK_MAX_RUNQ
    inline = cause == Cause.CPU and i.main_cores > busiest and i.main_cores >= saturated and not waiting
    if i.workers and inline and busiest < saturated:
        # the workers have CPU to spare (their queues full): "move it to worker processes" would
        # tell a job that checkpoints or computes metrics in its loop to add what it has
        return cannot(
            f"the training process is busier than any of its {i.workers} loader workers (the "
            f"busiest at {busiest:.0%} of a core): the GPU waits on work in the training loop "
            "itself: input work done there, in threads or inline (move it into the workers: the "
            "Dataset or collate_fn), or other host-side work (writing checkpoints, evaluation "
            "metrics, logging, .item() calls); more workers would not change it",
            cause,
            said,
            windows,
        )
    if not i.workers or inline:
        return cannot(
            "the input work runs in the training process itself (threads, or inline), not in loader "
            "worker processes: its CPU cannot be told from the training loop's, nor what more "
            "processes would buy; move it to worker processes (DataLoader(num_workers), "
            "PyDataset(workers, use_multiprocessing=True))",
            cause,
            said,
            windows,
        )
    if i.main_cores >= LOOP_CORES:
        # below a core its loop's bound reads "no gain" near one; at a core or more the process is
        # more than its loop's thread, and neither that bound nor none can be told: no number, for
        # any cause (a number there flipped from "no gain" at 0.99 of a core to 9x at 1.00)
        return cannot(
            f"the training process reads {i.main_cores:.0%} of a core: its loop's own work a step, on "
            "one core, may be what binds (then more workers gain nothing), but a process busier than a "
            "core is more than its loop's thread, and the loop's share cannot be told",
            cause,
            said,
            windows,
        )
    cores = i.cpu_count or 1
    more = min(MAX_MORE_WORKERS, max(2, cores)) if cause == Cause.CPU else MAX_MORE_WORKERS
    candidates = []
    for n in range(i.workers + 1, i.workers + more + 1):
        s, limit = _speedup(i, cause, n, ceiling)
        candidates.append(Candidate(f"workers+{n - i.workers}", n, s, limit))
    top = max(c.speedup for c in candidates)
    best = next((c for c in candidates if c.speedup >= NEAR_BEST * top), None)
    if best is not None and best.speedup < NO_GAIN:
        best = None
    elif best is not None:
        # what holds it back beyond the named change: the ceiling (within noise), or what binds one
        # worker further
        after = next((c for c in candidates if c.workers == (best.workers or 0) + 1), None)
        limit = Limit.GPU if best.speedup >= NEAR_BEST * ceiling else after.limit if after else best.limit
        best = Candidate(best.change, best.workers, best.speedup, limit)
    s, limit = _speedup(i, cause, i.workers, ceiling, cache=True)
    cache = Candidate("cache", None, s, limit)
    if best is not None:
        why = {
            Limit.GPU: "the GPU",
            Limit.CPU: "the host's CPUs",
            Limit.STORAGE: "the storage device",
            Limit.LOADER: "the loader",
            Limit.LOOP: "the training loop",
        }[best.limit]
        why = f"beyond {best.workers} workers, {why} is the limit"
    else:
        why = _no_gain_why(i, cause, candidates[0].limit)
    return Advice(Kind.PREDICTED, cause, said, i.workers, tuple(candidates), best, cache, why, windows)


def _no_gain_why(i: RemedyInputs, cause: Cause, limit: Limit) -> str:
    cores = i.cpu_count or 1
    busy = i.host_busy_cores or 0.0
    job = (i.main_cores or 0.0) + (i.worker_cores or 0.0)
    if limit == Limit.STORAGE:
        return f"the storage device is {100 * (i.disk_busy_ratio or 0):.0f}% busy"
    if limit == Limit.GPU:
        return "the GPU is the limit"
    if limit == Limit.LOOP:
        return (
            f"the training loop is the limit: its process reads {i.main_cores or 0.0:.0%} of a core, "
            "and its own work a step runs on one"
        )
    return (
        f"the host's CPUs are the limit ({busy:.1f} of {cores} cores busy, the job {job:.1f}, "
        f"other processes {max(0.0, busy - job):.1f})"
    )
