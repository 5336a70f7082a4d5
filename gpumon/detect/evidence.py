"""Evidence: the numbers a verdict rests on, computed from one window of samples. Pure."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from gpumon.core.model import (
    HELD_BY_POWER,
    HELD_BY_SLOWDOWN,
    HELD_BY_THERMAL,
    GpuSample,
    HostSample,
    ProcessCpu,
    UtilPoint,
)
from gpumon.detect.thresholds import Thresholds


class GpuWindow(NamedTuple):
    """What the detector sees of one GPU at one moment: the latest sample and recent history."""

    t_s: float
    gpu: GpuSample
    samples: tuple[GpuSample, ...]
    """This GPU's tick samples within the window, oldest first (the latest is `gpu`)."""
    points: tuple[UtilPoint, ...]
    """Driver utilization samples within the window, oldest first."""
    hosts: tuple[HostSample, ...]
    """Host samples within the host window, oldest first."""


class Evidence(NamedTuple):
    points: int
    period_s: float | None
    duty_cycle: float | None
    """Mean of the driver samples: share of time a kernel ran."""
    recent_duty: float | None
    """The same over the window's last quarter: what the GPU does now."""
    p5: float | None
    p95: float | None
    gap_share: float | None
    """Share of samples at or below the gap threshold."""
    bursts_per_s: float | None
    mean_burst_s: float | None
    mean_gap_s: float | None
    bursty_quarters: int
    """How many of the window's four quarters hold both bursts and gaps."""
    change_age_s: float | None
    """How long ago the GPU went from fed to bursts and gaps, when the window shows such a change:
    its older part fed (duty >= fed_duty + hysteresis), its newer part (a quarter of the window or
    more) with bursts and gaps at a duty at or below fed_duty - hysteresis. None otherwise."""
    duty_since_change: float | None
    """The duty cycle since that change: what the GPU does now, not diluted by the fed past."""
    gap_cv: float | None
    """Regularity of the gaps: standard deviation / mean of gap lengths (low: regular, as a
    CPU-bound loader; high: irregular, as storage stalls). None with fewer than two gaps."""
    power_ratio: float | None
    has_job: bool
    pids: tuple[int, ...]
    job_seen_on_host: bool
    """The host source knows the GPU's processes (not so across PID namespaces)."""
    job_cpu_cores: float | None
    """The GPU processes and all their descendants, in cores."""
    main_cpu_cores: float | None
    busiest_child_cpu_cores: float | None
    loader_workers: int | None
    job_read_bytes_per_s: float | None
    job_cpu_demand_cores: float | None
    """The most CPU one of the job's processes wanted (on-CPU plus waiting for a CPU), in cores."""
    job_runq_wait_cores: float | None
    """The job's processes' time waiting for a CPU, per second, all together."""
    job_blkio_wait_s: float | None
    """The job's processes' time waiting for block I/O, per second, all together (None unless the
    kernel counts it: delayacct)."""
    host_cpu_ratio: float | None
    busiest_core_ratio: float | None
    iowait_ratio: float | None
    disk_read_bytes_per_s: float | None
    sm_active: float | None = None
    """GPM (Hopper and newer): share of SMs busy, averaged over the window. None without GPM."""
    sm_while_busy: float | None = None
    """GPM: SM activity over graphics activity: how much of the GPU the kernels fill while they
    run (1.0: every SM; low: kernels too small for the GPU)."""
    clock_held: str | None = None
    """`power`, `thermal` or `slowdown` when that clock-event reason held the clocks down for half
    of the window or more (the job computes slower, fed or not); None otherwise."""
    job_age_s: float | None = None
    """How long the job's oldest GPU process has been running (the host's newest reading); None
    where the host does not say."""
    cpu_count: int | None = None
    """The host's CPUs (what a fix's prediction counts the free cores of: detect/remedies.py)."""
    disk_busy_ratio: float | None = None
    """The busiest disk's share of time doing I/O over the host window (iostat's %util)."""
    host_runnable: float | None = None
    """Threads runnable on the host besides gpumon's reading thread, a mean over the host window
    (/proc/loadavg's running count less one); None where the host does not say."""
    waiting_for_gpu: int | None = None
    """Another GPU of the same job (by attribution) that read starved at the previous tick: the
    rank this one may be waiting for in a collective (FleetDetector sets it; gather() never does)."""
    waiting_share: float | None = None
    """That GPU's gap share (1 - its duty cycle): in synchronous data parallelism, the share of
    each step the job's other ranks spend waiting for it."""
    waiting_for_power_ratio: float | None = None
    """That GPU's power, as a share of its limit."""
    sm_active_recent: float | None = None
    """GPM: the most SM activity of a tick in the window's newer half (None without GPM): whether
    kernels run now, where NVML's whole-percent samples show next to none (a small model)."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in _EVIDENCE_FIELDS:  # not dataclasses.asdict: it deep-copies, on every tick
            v = getattr(self, k)
            out[k] = round(v, 4) if isinstance(v, float) else v
        return out

    @property
    def busiest_job_core(self) -> float | None:
        """The most saturated single process of the job: main process or a loader worker."""
        values = [v for v in (self.main_cpu_cores, self.busiest_child_cpu_cores) if v is not None]
        return max(values) if values else None


def _percentile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _runs(flags: list[bool]) -> tuple[list[int], list[int]]:
    """Lengths of consecutive True runs (gaps) and False runs (bursts)."""
    if not flags:
        return [], []
    # where each run ends (the indices where the flag changes, then the window's end); runs
    # alternate, so gaps and bursts are every other length. In C iterators: this runs per GPU
    # per tick over the window's ~180 points.
    ends = [*itertools.compress(itertools.count(1), map(operator.ne, flags, flags[1:])), len(flags)]
    lengths = list(map(operator.sub, ends, [0, *ends]))
    if flags[0]:
        return lengths[0::2], lengths[1::2]
    return lengths[1::2], lengths[0::2]


_EVIDENCE_FIELDS = Evidence._fields


def _max_or_none(values: Iterable[float | None]) -> float | None:
    """The largest, or None if any is unknown."""
    found = list(values)
    return None if not found or any(v is None for v in found) else max(v for v in found if v is not None)


def _sum_or_none(values: Iterable[float | None]) -> float | None:
    found = list(values)
    return None if not found or any(v is None for v in found) else sum(v for v in found if v is not None)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _bursty_quarters(values: list[float], th: Thresholds) -> int:
    n = len(values)
    count = 0
    for q in range(4):
        part = values[q * n // 4 : (q + 1) * n // 4]
        if len(part) < 2:
            continue
        lo, hi = min(part), max(part)
        if lo <= th.burst_low_util and hi - lo >= th.bursty_spread:
            count += 1
    return count


def _fed_then_starved(values: list[float], th: Thresholds) -> tuple[int, float] | None:
    """Where a fed window turned to bursts and gaps: (index of the first sample after the change,
    duty since), or None.

    A split qualifies when a quarter of the window or more lies on each side, the older side is
    fed (duty >= fed_duty + hysteresis) and the newer side starved-looking (<= fed_duty -
    hysteresis) in its first half as well as in all (so the change is not placed early, in the
    fed part). Of those, the most significant (the means' difference weighted by
    sqrt(n_old * n_new / n), as a two-sample z statistic is). Then it must still hold now: the
    newest eighth of the window (a second by default) below fed_duty, and the newer side, less
    the two samples at the change, swinging as a bursty quarter does (a step down to steady lower
    use is no starvation). O(n) per window, from prefix sums."""
    n = len(values)
    q = n // 4
    if q < 4:
        return None  # too few samples to tell a change from noise
    newest = values[-max(2, n // 8) :]
    if sum(newest) / len(newest) >= th.fed_duty:
        return None  # fed now (most windows: said before any prefix sum)
    prefix = [0.0, *itertools.accumulate(values)]
    total = prefix[-1]
    fed, starved = th.fed_duty + th.hysteresis, th.fed_duty - th.hysteresis
    best: tuple[float, int, float] | None = None
    for k in range(q, n - q + 1):
        old, new = prefix[k] / k, (total - prefix[k]) / (n - k)
        half = (k + n) // 2
        if old >= fed and new <= starved and (prefix[half] - prefix[k]) / (half - k) <= starved:
            score = (old - new) * math.sqrt(k * (n - k) / n)
            if best is None or score > best[0]:
                best = (score, k, new)
    if best is None:
        return None
    _, k, new = best
    tail = values[k + 2 :]  # not the first two: a driver sample's period may straddle the change
    lo, hi = min(tail), max(tail)
    if lo > th.burst_low_util or hi - lo < th.bursty_spread:
        return None
    return k, new


def _job_processes(window: GpuWindow, pids: tuple[int, ...]) -> list[list[ProcessCpu]]:
    """Per host sample, the entries for this GPU's processes."""
    wanted = set(pids)
    return [[p for p in h.processes if p.pid in wanted] for h in window.hosts]


JobKey = tuple[frozenset[int], frozenset[str]]
"""Who holds a GPU: its processes' ids, and its attributed jobs (`scheduler:id`)."""


def job_key(g: GpuSample) -> JobKey | None:
    """Who holds the GPU: its processes' ids and its attributed jobs; None when no process does."""
    if not g.processes:
        return None
    return frozenset(p.pid for p in g.processes), frozenset(f"{j.scheduler}:{j.job_id}" for j in g.jobs)


def another_job(
    old: tuple[frozenset[int], frozenset[str]] | None, new: tuple[frozenset[int], frozenset[str]] | None
) -> bool:
    """A job change: other processes, or another attributed job where both are known (a job whose
    attribution comes and goes, as the kubelet does when it hangs, is the same job)."""
    if old is None or new is None:
        return False
    return old[0] != new[0] or (bool(old[1]) and bool(new[1]) and old[1] != new[1])


def job_label(g: GpuSample) -> str | None:
    """How reports name the job holding the GPU: `slurm 4242`, `ml/trainer-0`, or `pid 123`."""
    if g.jobs:
        return ", ".join(sorted({f"{j.scheduler} {j.job_id}" for j in g.jobs}))
    if g.processes:
        return "pid " + ",".join(sorted({str(p.pid) for p in g.processes}, key=int))
    return None


JobArrival = tuple[float, float] | None
"""What the tracker saw of the job on the GPU now: (t of the last sample before it came, t of the
first sample it held), or None if it held the GPU from the tracker's first window."""


def _arrival_in_window(samples: tuple[GpuSample, ...], arrival: JobArrival) -> float | None:
    """When the job now on the GPU came, while the window still holds driver samples that are not
    its: the ticks up to its arrival, or the one after it, whose first driver sample straddles the
    arrival (its period may have begun before the job came)."""
    if arrival is None or not samples:
        return None
    before, came = arrival
    if samples[0].t_s > came + (came - before) + 1e-9:
        return None
    return came


def _since_first_work(
    points: tuple[UtilPoint, ...],
    samples: tuple[GpuSample, ...],
    th: Thresholds,
    arrival: JobArrival | bool = False,
) -> tuple[UtilPoint, ...]:
    """The window of the job on the GPU now. When the window shows that job arriving (from no
    process, or after another job), what came before is not its, and neither is its start-up:
    a job starting up (importing, compiling, allocating) leaves the GPU idle while its main process
    is busy, which is start-up, not starvation. So the window starts at its first burst of work;
    a job that has run nothing yet keeps what it has (and is starting, or stalled)."""
    job_since: float | None = None
    if arrival is False:  # nobody followed the job: read its arrival from the window's samples
        current = job_key(samples[-1]) if samples else None
        appeared = False
        for s in reversed(samples):  # when the job appeared, if we saw it appear in this window
            key = job_key(s)
            if (key is None) != (current is None) or another_job(key, current):
                appeared = True
                break
            job_since = s.t_s
        if not appeared:
            job_since = None
    else:  # the tracker followed it (`arrival`): no key per sample, and it knows the arrival
        # still when the tick before it has left the window (its straddling sample has not)
        job_since = _arrival_in_window(samples, arrival if arrival is not True else None)
    if job_since is None or not points:
        return points
    # Not the driver samples up to the tick the job was first seen at, nor the first one after
    # it: its period may have begun before the job came (the job before's last kernels), as the
    # tracker does not count it as the job's first kernel. A job that followed another at once
    # read the other's kernels as its own work: `starved-cpu` for its first seconds, not `starting`.
    mine = tuple(p for p in points if p.t_s > job_since)[1:]
    for n, p in enumerate(mine):
        if p.util_ratio > th.gap_util:
            return mine[n:]
    return mine if samples and samples[-1].processes else points


PERIOD_POINTS = 33
KERNEL_SM_ACTIVE = 0.0005
"""GPM's SM activity (the share of SM-time busy over a tick) from which kernels ran in that tick.
A job whose kernels are too short for NVML's utilization (on an H200, a small model fed by one busy
loader worker: its samples 0-1% while it stepped 6 times a second, docs/gpu-check.md) read 0.1% in
every tick; an idle GPU, and a job before its first kernel, 0.0. Half the trace's resolution of
0.1%, so a replay reads a tick as the live daemon did."""
_util_of = operator.attrgetter("util_ratio")
_time_of = operator.attrgetter("t_s")


def sample_period(newest: Sequence[UtilPoint]) -> float | None:
    """The driver's sample period, from a window's newest PERIOD_POINTS samples (oldest first): the
    median of their spacings (constant for a GPU; a median over all of a window's samples would
    cost a sort per tick for nothing). None from fewer than two."""
    if len(newest) < 2:
        return None
    times: list[float] = list(map(_time_of, newest))
    spacing: list[float] = sorted(map(operator.sub, times[1:], times))
    mid = len(spacing) // 2  # the median, as statistics.median has it
    return spacing[mid] if len(spacing) % 2 else (spacing[mid - 1] + spacing[mid]) / 2


def gather(
    window: GpuWindow,
    th: Thresholds,
    work_since_s: float | None = None,
    arrival: JobArrival | bool = False,
) -> Evidence:
    """`work_since_s`: when the job on the GPU ran its first kernel (the tracker knows): what came
    before is its start-up, not part of its work's pattern. `arrival`: when the job now on the GPU
    came, as the tracker followed it (see JobArrival); False: read it from the window's samples."""
    pts = window.points
    if len(pts) < 2 and window.samples:
        # No sub-second history (GetSamples unsupported, e.g. MIG): fall back to tick readings.
        pts = tuple(UtilPoint(s.t_s, s.util_ratio) for s in window.samples if s.util_ratio is not None)
    pts = _since_first_work(pts, window.samples, th, arrival)
    if work_since_s is not None and pts and pts[0].t_s < work_since_s:
        pts = tuple(p for p in pts if p.t_s >= work_since_s - 1e-9)
    values = list(map(_util_of, pts))
    period = sample_period(pts[-PERIOD_POINTS:])
    duty = p5 = p95 = gap_share = bursts_per_s = mean_burst = mean_gap = gap_cv = None
    bursty_quarters = 0
    recent_duty = change_age = duty_since_change = None
    if values:
        bursty_quarters = _bursty_quarters(values, th)
        change = _fed_then_starved(values, th)
        if change is not None:
            change_age, duty_since_change = max(0.0, window.t_s - pts[change[0]].t_s), change[1]
        ordered = sorted(values)
        duty = sum(values) / len(values)
        tail = values[len(values) * 3 // 4 :] or values[-1:]
        recent_duty = sum(tail) / len(tail)
        p5, p95 = _percentile(ordered, 0.05), _percentile(ordered, 0.95)
        gap_util = th.gap_util
        flags = list(map(operator.le, values, itertools.repeat(gap_util)))
        gap_share = sum(flags) / len(flags)
        gaps, bursts = _runs(flags)
        if period:
            span = max(period * len(values), 1e-9)
            # bursts that start in the window: every burst after a gap (the first burst, when the
            # window opens in one, started before it)
            starts = len(bursts) - (0 if flags[0] else 1) if bursts else 0
            bursts_per_s = starts / span
            mean_burst = _mean([n * period for n in bursts])
            mean_gap = _mean([n * period for n in gaps])
            if len(gaps) >= 2:
                lengths = [n * period for n in gaps]
                mean = sum(lengths) / len(lengths)  # plain floats: statistics.pstdev works in Fractions
                gap_cv = math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths)) / mean

    ratios, sm, busy, clocks, sm_recent = _per_sample(window.samples, window.t_s - th.window_s / 2)
    gpu = window.gpu
    pids = tuple(sorted(p.pid for p in gpu.processes))
    per_host = _job_processes(window, pids)
    seen = [procs for procs in per_host if procs]
    hosts = window.hosts

    host_cpu, busiest_core, iowait, disk_read, disk_busy, runnable = _host_means(hosts)
    job = _job_means(seen)
    return Evidence(
        points=len(values),
        period_s=period,
        duty_cycle=duty,
        recent_duty=recent_duty,
        p5=p5,
        p95=p95,
        gap_share=gap_share,
        bursts_per_s=bursts_per_s,
        mean_burst_s=mean_burst,
        mean_gap_s=mean_gap,
        bursty_quarters=bursty_quarters,
        change_age_s=change_age,
        duty_since_change=duty_since_change,
        gap_cv=gap_cv,
        power_ratio=_mean(ratios),
        has_job=bool(pids),
        pids=pids,
        job_seen_on_host=bool(seen),
        job_cpu_cores=job.cpu,
        main_cpu_cores=job.main,
        busiest_child_cpu_cores=job.child,
        loader_workers=job.workers,
        job_read_bytes_per_s=job.reads,
        job_cpu_demand_cores=job.demand,
        job_runq_wait_cores=job.runq,
        job_blkio_wait_s=job.blkio,
        job_age_s=job.age,
        host_cpu_ratio=host_cpu,
        busiest_core_ratio=busiest_core,
        iowait_ratio=iowait,
        disk_read_bytes_per_s=disk_read,
        cpu_count=hosts[-1].cpu_count if hosts else None,
        disk_busy_ratio=disk_busy,
        host_runnable=runnable,
        sm_active=_mean(sm),
        sm_while_busy=min(1.0, sum(sm) / sum(busy)) if sm and sum(busy) > 0 else None,
        clock_held=_clock_held(clocks),
        sm_active_recent=sm_recent,
    )


def at_rest(g: GpuSample) -> bool:
    """Nothing on the GPU in this tick's sample: it answered, no process or job holds it, it is not
    a MIG instance, its utilization and every driver sample since the tick before read 0, and GPM
    (where read) saw no kernel. What lets the tracker carry an idle verdict on (StarvationDetector.
    carry): any of these, and the GPU is judged from its window again."""
    if not g.available or g.mig is not None or g.processes or g.jobs or g.util_ratio != 0.0:
        return False
    a = g.gpm
    if a is not None and a.sm_active_ratio is not None and a.sm_active_ratio >= KERNEL_SM_ACTIVE:
        return False
    return not any(map(_util_of, g.util_history))


class _JobMeans(NamedTuple):
    cpu: float | None
    main: float | None
    child: float | None
    workers: int | None
    reads: float | None
    demand: float | None
    runq: float | None
    blkio: float | None
    age: float | None


def _job_means(seen: list[list[ProcessCpu]]) -> _JobMeans:
    """The job's CPU and I/O over the host window, in one pass over each host sample's entries for
    it: per sample, the processes' total (or the busiest one's) reading, then the mean over the
    samples that have it. A reading any process lacks is unknown for that sample (not zero)."""
    cpu: list[float] = []
    main: list[float] = []
    child: list[float] = []
    workers: int | None = None
    reads: list[float] = []
    demand: list[float] = []
    runq: list[float] = []
    blkio: list[float] = []
    for procs in seen:
        total = 0.0
        top = top_child = -math.inf
        children = 0
        read: float | None = 0.0
        want: float | None = -math.inf
        wait: float | None = 0.0
        block: float | None = 0.0
        for p in procs:
            total += p.cpu_ratio + p.children_cpu_ratio
            top = max(top, p.cpu_ratio)
            top_child = max(top_child, p.busiest_child_cpu_ratio)
            children += p.children
            r, d, q, b = p.read_bytes_per_s, p.busiest_demand_ratio, p.runq_wait_ratio, p.blkio_wait_ratio
            read = None if read is None or r is None else read + r
            want = None if want is None or d is None else max(want, d)
            wait = None if wait is None or q is None else wait + q
            block = None if block is None or b is None else block + b
        cpu.append(total)
        main.append(top)
        child.append(top_child)
        workers = children if workers is None else max(workers, children)
        if read is not None:
            reads.append(read)
        if want is not None:
            demand.append(want)
        if wait is not None:
            runq.append(wait)
        if block is not None:
            blkio.append(block)
    return _JobMeans(
        cpu=_mean(cpu),
        main=_mean(main),
        child=_mean(child),
        workers=workers,
        reads=_mean(reads) if seen and len(reads) == len(seen) else None,
        demand=_mean(demand),
        runq=_mean(runq),
        blkio=_mean(blkio),
        age=_max_or_none(p.age_s for p in seen[-1]) if seen else None,
    )


def _per_sample(
    samples: Sequence[GpuSample], recent_since: float
) -> tuple[list[float], list[float], list[float], list[int], float | None]:
    """In one pass over the window's tick samples: power over its limit, GPM's SM and graphics
    activity (where both are known), the clock-event bits, and the most SM activity of a tick
    after `recent_since`."""
    ratios: list[float] = []
    sm: list[float] = []
    busy: list[float] = []
    clocks: list[int] = []
    recent: float | None = None
    for s in samples:
        if s.power_w is not None and s.power_limit_w:
            ratios.append(s.power_w / s.power_limit_w)
        a = s.gpm
        if a is not None and a.sm_active_ratio is not None:
            if a.graphics_ratio is not None:
                sm.append(a.sm_active_ratio)
                busy.append(a.graphics_ratio)
            if s.t_s > recent_since and (recent is None or a.sm_active_ratio > recent):
                recent = a.sm_active_ratio
        if s.clock_events is not None:
            clocks.append(s.clock_events)
    return ratios, sm, busy, clocks, recent


_HostMeans = tuple[float | None, float | None, float | None, float | None, float | None, float | None]
_host_memo: list[tuple[tuple[HostSample, ...], _HostMeans] | None] = [None]
"""The last host window and its means: every GPU of a tick shares the same host window (one tuple,
compared by identity and held here, so its identity cannot be reused), so the means are taken once
a tick. One reference, swapped whole: safe to share between threads."""


def _host_means(hosts: tuple[HostSample, ...]) -> _HostMeans:
    """The host's CPU, busiest core, iowait, disk reads, busiest disk's utilization and threads
    runnable besides the reading one, each a mean over the host window."""
    memo = _host_memo[0]
    if memo is not None and memo[0] is hosts:
        return memo[1]
    out = (
        _mean([h.cpu_ratio for h in hosts if h.cpu_ratio is not None]),
        _mean([h.busiest_core_ratio for h in hosts if h.busiest_core_ratio is not None]),
        _mean([h.iowait_ratio for h in hosts if h.iowait_ratio is not None]),
        _mean([h.disk_read_bytes_per_s for h in hosts if h.disk_read_bytes_per_s is not None]),
        _mean([h.disk_busy_ratio for h in hosts if h.disk_busy_ratio is not None]),
        _mean([max(0, h.runnable - 1) for h in hosts if h.runnable is not None]),
    )
    _host_memo[0] = (hosts, out)
    return out


def _clock_held(bits: Sequence[int]) -> str | None:
    """The clock-event reason that held the clocks in half of the window's ticks or more."""
    if not any(bits):  # (most windows: no clock event at all)
        return None
    for name, mask in (
        ("thermal", HELD_BY_THERMAL),
        ("power", HELD_BY_POWER),
        ("slowdown", HELD_BY_SLOWDOWN),
    ):
        if sum(1 for b in bits if b & mask) * 2 >= len(bits):
            return name
    return None
