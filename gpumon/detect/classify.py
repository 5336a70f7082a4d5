"""One window's evidence -> a state, a cause and a confidence. Pure; the rules read top to bottom.

Order matters and is the documented precedence (docs/detector.md):
unknown > idle > stalled > sync-stall > healthy > starved (cpu, io, host) > underutilized.
"""

from __future__ import annotations

from typing import NamedTuple

from gpumon.detect.evidence import KERNEL_SM_ACTIVE, Evidence
from gpumon.detect.thresholds import Thresholds
from gpumon.detect.vocabulary import Cause, State, state_label


class Classification(NamedTuple):
    state: State
    cause: Cause | None
    confidence: float
    reason: str
    """One line a person can read: why this state."""
    since_s: float | None = None
    """How long ago the evidence for this state began, when the window shows the change itself
    (a fed GPU turning to bursts and gaps): the tracker confirms from then, not from this tick."""

    @property
    def label(self) -> str:
        return state_label(self.state, self.cause)


def _conf(margin: float, scale: float) -> float:
    """0.5 at the threshold, rising to 1.0 at `scale` beyond it."""
    return round(0.5 + 0.5 * max(0.0, min(1.0, margin / scale if scale > 0 else 1.0)), 3)


def starting_work(ev: Evidence, th: Thresholds) -> str | None:
    """What a job that has run no kernel does on the host, where it works there
    (Thresholds.starting_busy_s); None where it is quiet. Work is one of its processes saturating a
    core, or wanting a whole one (on a core it shares: 8 tokenizers on a Slurm cpuset of 4 cores
    each get half of one and wait for the rest), or the job reading. Not the job's sum: four
    workers polling at a quarter of a core each while the job hangs prepare nothing."""
    said = []
    busiest, demand = ev.busiest_job_core or 0.0, ev.job_cpu_demand_cores or 0.0
    if max(busiest, demand) >= th.pinned_core:
        said.append(
            f"its busiest process at {busiest:.0%} of a core"
            + (f", wanting {demand:.0%}" if demand >= busiest + 0.05 else "")
        )
    reads = ev.job_read_bytes_per_s or 0.0
    if reads >= th.read_bytes_with_gaps:
        said.append(f"reading {reads / 1e6:.0f} MB/s")
    return ", ".join(said) or None


def classify(
    ev: Evidence,
    th: Thresholds,
    current: str | None,
    available: bool = True,
    expected_points: int | None = None,
    starting_s: float | None = None,
) -> Classification:
    """`starting_s`: the job on the GPU opened it this long ago and has run no kernel since, within
    the start-up grace, or past it while its processes work on the host (the tracker knows; None
    otherwise)."""
    if not available:
        return Classification(State.UNKNOWN, None, 0.0, "GPU unavailable (lost or failing)")
    if ev.points < th.min_points or ev.duty_cycle is None:
        return Classification(State.UNKNOWN, None, 0.0, f"only {ev.points} utilization samples in the window")
    duty = ev.duty_cycle
    fill = min(1.0, ev.points / expected_points) if expected_points else 1.0

    def result(state: State, cause: Cause | None, confidence: float, reason: str) -> Classification:
        return Classification(state, cause, round(confidence * fill, 3), reason)

    def starved(cause: Cause | None, confidence: float, reason: str) -> Classification:
        if ev.change_age_s is None:
            return result(State.STARVED, cause, confidence, reason)
        reason += f" (since {ev.change_age_s:.1f} s ago, when a fed GPU turned to bursts and gaps)"
        return Classification(State.STARVED, cause, round(confidence * fill, 3), reason, ev.change_age_s)

    # Processes can be invisible (another container's PID namespace) while kernels run: a GPU
    # doing work has a job, listed or not. Idle is judged on the recent samples, so a job that
    # just ended shows as idle without waiting for its work to leave the window.
    recent = ev.recent_duty if ev.recent_duty is not None else duty
    if not ev.has_job and recent < th.stalled_duty:
        return result(
            State.IDLE, None, _conf(th.stalled_duty - recent, th.stalled_duty), "no process on the GPU"
        )
    if duty < th.stalled_duty and starting_s is not None:
        if starting_s < th.starting_grace_s:
            return result(
                State.STARTING,
                None,
                _conf(th.starting_grace_s - starting_s, th.starting_grace_s / 2),
                f"a job opened the GPU {starting_s:.0f} s ago and has run no kernel yet: starting up "
                f"(imports, data, compilation; stalled if still nothing after {th.starting_grace_s:g} s)",
            )
        # past the grace, while its processes work on the host (the tracker tells: Thresholds.starting_busy_s)
        work = starting_work(ev, th) or "until a moment ago: quiet now"
        return result(
            State.STARTING,
            None,
            _conf(th.starting_busy_s - starting_s, th.starting_busy_s / 2),
            f"a job opened the GPU {starting_s:.0f} s ago and has run no kernel yet, while its processes "
            f"work on the host ({work}): still preparing (preprocessing, loading, compiling; "
            f"judged as any job after {th.starting_busy_s:g} s)",
        )
    # A GPU that runs next to nothing while the job's loader workers run flat out is starved by
    # them, not stalled: a hung job's workers fill their queue and idle. On an H200 a job whose
    # kernels round to 0% in NVML's utilization, its one loader worker at 100% of a core, would
    # have read `stalled` (critical) past its start-up grace (docs/gpu-check.md): it goes on to
    # the causes.
    feeding = bool(ev.loader_workers) and (ev.busiest_child_cpu_cores or 0.0) >= th.pinned_core
    # Kernels too short for NVML's whole-percent samples, which GPM sees (a small model stepping,
    # steadily or in bursts), are not a hang either: the job is judged by the rules below (starved,
    # or underutilized). GPM's ticks in the window's newer half: a job that hangs is stalled as
    # soon as its duty falls, not once GPM's mean over the whole window has emptied.
    stepping = ev.sm_active_recent is not None and ev.sm_active_recent >= KERNEL_SM_ACTIVE
    if duty < th.stalled_duty and not feeding and not stepping:
        busy = ""
        main = ev.main_cpu_cores
        if main is not None and main >= th.pinned_core:
            # what a person checks first: a hang is quiet, a checkpoint being written is not
            busy = (
                f", while its training process runs at {main:.0%} of a core (host-side work: "
                "writing a checkpoint, evaluating on the CPU, or a busy loop; not a deadlock)"
            )
        return result(
            State.STALLED,
            None,
            _conf(th.stalled_duty - duty, th.stalled_duty),
            f"a process holds the GPU but kernels ran {duty:.1%} of the time{busy}",
        )
    if duty >= th.sync_min_duty and ev.power_ratio is not None and ev.power_ratio <= th.sync_max_power_ratio:
        return result(
            State.SYNC_STALL,
            None,
            _conf(th.sync_max_power_ratio - ev.power_ratio, th.sync_max_power_ratio / 2),
            f"{duty:.0%} busy at {ev.power_ratio:.0%} of the power limit: kernels spin, "
            "not compute (waiting in a collective?)",
        )
    waited = ev.waiting_share
    if duty >= th.sync_min_duty and waited is not None and ev.waiting_for_gpu is not None:
        gaps = th.sync_peer_gaps - (th.hysteresis if current == State.SYNC_STALL else 0.0)
        power, theirs = ev.power_ratio, ev.waiting_for_power_ratio
        margin = th.sync_peer_power_margin
        drawn = ""
        if power is not None and theirs is not None:
            drawn = f", drawing {power:.0%} of its power limit to its {theirs:.0%}"
        if waited >= gaps and (power is None or theirs is None or power <= theirs + margin):
            return result(
                State.SYNC_STALL,
                None,
                _conf(waited - gaps, 0.25),
                f"{duty:.0%} busy while GPU {ev.waiting_for_gpu} of the same job is starved "
                f"({waited:.0%} gaps){drawn}: waiting for it in a collective about {waited:.0%} of the time",
            )
    # Hysteresis holds the state the GPU is in: fed stays fed down to fed_duty - hysteresis, starved
    # or underutilized stays so up to fed_duty + hysteresis. From no such state (a job's first
    # windows, after unknown, idle, starting or a stall) the line is fed_duty itself: a job steady at
    # 82% that never entered healthy was held starved by a hysteresis it had never crossed.
    if current == State.HEALTHY:
        fed = th.fed_duty - th.hysteresis
    elif current is not None and current.startswith((State.STARVED, State.UNDERUTILIZED)):
        fed = th.fed_duty + th.hysteresis  # (a label: starved-cpu, underutilized-small-kernels)
    else:
        fed = th.fed_duty
    # A window whose older part was fed and whose newer part has bursts and gaps is judged on the
    # newer part: a job that starves now is not healthy because it was fed six seconds ago.
    changed = ev.duty_since_change is not None and ev.change_age_s is not None
    if changed and ev.duty_since_change is not None:
        duty = ev.duty_since_change
    if duty >= fed:
        held = f" (clocks held down: {ev.clock_held})" if ev.clock_held else ""
        sm = ev.sm_while_busy
        if sm is not None:  # GPM: busy is not enough, the SMs must be too
            limit = th.small_kernels_sm + (th.hysteresis if current == State.UNDERUTILIZED else 0.0)
            if sm < limit:
                return result(
                    State.UNDERUTILIZED,
                    Cause.SMALL_KERNELS,
                    _conf(limit - sm, 0.2),
                    f"kernels ran {duty:.0%} of the time but filled only {sm:.0%} of the SMs while "
                    f"running: kernels too small for the GPU (a small batch, launch-bound steps){held}",
                )
        return result(
            State.HEALTHY, None, _conf(duty - fed, 0.1), f"kernels ran {duty:.0%} of the time{held}"
        )

    short = _conf(fed - duty, 0.3)
    busiest = ev.busiest_job_core
    bursty = changed or ev.bursty_quarters >= th.bursty_quarters
    # Host-wide signals (all cores busy, iowait, the host's disk reads) stand in for the job's own
    # only when the job has processes the host cannot see (another PID namespace), and only for a
    # GPU whose utilization shows starvation's signature (bursts and gaps, or the change to them):
    # a steady GPU beside busy neighbours is not starved by them, and a GPU with no process gets
    # no cause from its neighbours. The job's own processes (pinned, waiting for a CPU, reading,
    # waiting on storage) name a cause with or without visible gaps: a driver sample (1/6 s to
    # 1 s) averages short steps' gaps into steady use.
    host_wide = ev.has_job and not ev.job_seen_on_host and bursty
    cpu = busiest is not None and busiest >= th.pinned_core
    if host_wide:
        cpu = cpu or (ev.host_cpu_ratio is not None and ev.host_cpu_ratio >= th.host_cpu_busy)
        cpu = cpu or (ev.busiest_core_ratio is not None and ev.busiest_core_ratio >= th.pinned_core)
    # A process that wants a whole core but gets part of it (waiting in the run queue on a busy
    # host) is as CPU-bound as a pinned one: the kernel's schedstat says so, totals cannot.
    pinned = busiest is not None and busiest >= th.pinned_core
    demand = ev.job_cpu_demand_cores
    contended = not pinned and demand is not None and demand >= th.pinned_core
    blkio = ev.job_blkio_wait_s
    storage_waits = blkio is not None and blkio >= th.blkio_wait_high
    if storage_waits and blkio is not None and blkio <= (ev.job_runq_wait_cores or 0.0):
        storage_waits = False  # waiting for CPU more than for storage
    if ev.job_read_bytes_per_s is not None:
        io = ev.job_read_bytes_per_s >= th.read_bytes_high or (
            bursty and ev.job_read_bytes_per_s >= th.read_bytes_with_gaps
        )
    else:
        io = host_wide and (
            (ev.iowait_ratio is not None and ev.iowait_ratio >= th.iowait_high)
            or (ev.disk_read_bytes_per_s is not None and ev.disk_read_bytes_per_s >= th.read_bytes_high)
        )
    io = io or storage_waits
    idle_share = 1 - duty
    resumed = ev.recent_duty is not None and ev.recent_duty >= th.fed_duty + th.hysteresis and not bursty
    if resumed:
        # busy now (the window's last quarter): a mean pulled down by a past workload (a change
        # from steady low use to busy) is no starvation, whatever the job's CPU
        contended = cpu = io = storage_waits = False
    # Nothing runs now and the window shows no recurring bursts: the GPU stopped (a checkpoint being
    # written by the training process while its loader workers idle), the mirror of the change
    # above. A training process busy then is the pause's own work, not a feeder's pace: stalled if
    # it lasts. Never where the feeder is what works: its loader workers saturated or waiting for a
    # CPU, the training process saturated with no workers (it loads the data itself), storage
    # plainly busy (reads of read_bytes_high, block-I/O waits): however long its batches take, a
    # job whose loader cannot keep up stays starved (an epoch's fresh workers too: the GPU waits
    # on their first batches).
    feeder = (
        contended
        or storage_waits
        or (ev.job_read_bytes_per_s or 0.0) >= th.read_bytes_high
        or (ev.busiest_child_cpu_cores or 0.0) >= th.pinned_core
        or (not ev.loader_workers and (ev.main_cpu_cores or 0.0) >= th.pinned_core)
    )
    # And only a pause of fed work: the GPU held healthy or underutilized (a job starved from its
    # start, or already judged starved, stays on the cause path) and busy at least half of the
    # window's older three quarters (a training process pinned for seconds between short steps,
    # RL rollouts on the CPU, is a loop that starves its GPU, not a checkpoint).
    quiet = ev.recent_duty
    stopped = (
        quiet is not None
        and quiet < th.stalled_duty
        and not bursty
        and not feeder
        and current in (State.HEALTHY, State.UNDERUTILIZED)
        and (4 * duty - quiet) / 3 >= PAUSED_AFTER_DUTY
    )
    if stopped:
        contended = cpu = io = storage_waits = False

    if contended and not storage_waits:
        assert demand is not None and busiest is not None
        return starved(
            Cause.CPU,
            short,
            f"GPU idle {idle_share:.0%} of the time while a job process wants {demand:.0%} of a core "
            f"(runs {busiest:.0%}, waits for a CPU the rest): the input pipeline is CPU-bound on a busy host",
        )
    # The loop-work rule: the training process pinned, its workers with CPU to spare (and waiting
    # for none): the loop's own work holds the GPU. On a real GPU a pinned training process is no
    # proof of host work: CUDA's synchronize spins the calling thread while kernels run, so a
    # GPU-bound job reads ~100% of a core too. A GPU busy most of the time, its workers idle, is
    # underused by the loop's per-step overhead, not starved (an H200 at 63-79% under Keras's loop,
    # its input ready: docs/gpu-check.md); storage that is plainly the limit still names `io`.
    main, child = ev.main_cpu_cores, ev.busiest_child_cpu_cores or 0.0
    runq = ev.job_runq_wait_cores or 0.0
    loop_work = (
        pinned
        and bool(ev.loader_workers)
        and main is not None
        and child < min(main, th.pinned_core)
        and runq < LOOP_WORK_MAX_RUNQ
    )
    if current is not None and current.startswith(State.STARVED):
        busy_line, idle_workers = LOOP_STARVED_DUTY + th.hysteresis, LOOP_IDLE_WORKERS - 2 * th.hysteresis
    elif current is not None and current.startswith((State.UNDERUTILIZED, State.HEALTHY)):
        busy_line, idle_workers = LOOP_STARVED_DUTY - th.hysteresis, LOOP_IDLE_WORKERS + 2 * th.hysteresis
    else:  # a job's first windows: the lines themselves, as for fed_duty above
        busy_line, idle_workers = LOOP_STARVED_DUTY, LOOP_IDLE_WORKERS
    busy_loop = loop_work and duty >= busy_line
    if cpu and not (io and (not pinned or busy_loop)):
        if loop_work:
            assert main is not None
            if busy_loop and child < idle_workers:
                return result(
                    State.UNDERUTILIZED,
                    None,
                    _conf(duty - LOOP_STARVED_DUTY, 0.2),
                    f"kernels ran {duty:.0%} of the time; between steps the training process (at "
                    f"{main:.0%} of a core) works while its {ev.loader_workers} loader workers idle "
                    f"(at most {child:.0%}): {LOOP_OVERHEAD}",
                )
            return starved(
                Cause.CPU,
                short,
                f"GPU idle {idle_share:.0%} of the time while the training process runs at "
                f"{main:.0%} of a core and its {ev.loader_workers} loader workers at most {child:.0%}: "
                f"{LOOP_WORK} (input work done in the loop, "
                "or checkpoints, metrics, logging)",
            )
        who = (
            f"a job process at {busiest:.0%} of a core"
            if busiest is not None and busiest >= th.pinned_core
            else f"host CPU at {ev.host_cpu_ratio or 0:.0%}"
        )
        return starved(
            Cause.CPU,
            short,
            f"GPU idle {idle_share:.0%} of the time while {who}: the input pipeline is CPU-bound",
        )
    if io:
        if storage_waits and blkio is not None:
            what = f"the job's processes wait on storage {blkio:.1f} s per second, all together"
        elif ev.job_read_bytes_per_s is not None:
            what = f"the job reads {ev.job_read_bytes_per_s / 1e6:.0f} MB/s"
        else:
            what = f"iowait {ev.iowait_ratio or 0:.0%}"
        return starved(
            Cause.IO,
            short,
            f"GPU idle {idle_share:.0%} of the time while {what}: input waits on storage",
        )
    waits = ev.job_runq_wait_cores
    if (
        bursty
        and waits is not None
        and waits >= LOOP_WORK_MAX_RUNQ
        and demand is not None
        and demand >= CONTENDED_DEMAND
    ):
        # no one process wants a whole core, but one wants most of one and together the job's
        # processes wait for a CPU: a loader worker that blocks handing its batch to a training
        # process that waits for a core (a batch is larger than a pipe) is CPU-bound on a busy
        # host, not waiting on the network (many workers each waiting a little are not)
        return starved(
            Cause.CPU,
            short,
            f"GPU idle {idle_share:.0%} of the time while the job's processes wait for a CPU "
            f"{waits:.2f} cores' worth (the most any one wants: {demand:.0%} of a core): "
            "the input pipeline is CPU-bound on a busy host",
        )
    if bursty:
        return starved(
            Cause.HOST,
            short * 0.9,
            f"bursts and gaps (idle {idle_share:.0%}, utilization swinging "
            f"{ev.p5:.0%}-{ev.p95:.0%}) with no saturated CPU or storage: "
            "waiting on the host for another reason",
        )
    if stopped:
        return result(
            State.UNDERUTILIZED,
            None,
            short,
            f"kernels ran {duty:.0%} of the window and none in its last quarter: {PAUSED} "
            "(a checkpoint, an evaluation, its loader idle); stalled if nothing runs for "
            "a whole window",
        )
    if resumed and ev.recent_duty is not None:
        return result(
            State.UNDERUTILIZED,
            None,
            short,
            f"kernels ran {duty:.0%} of the window and {ev.recent_duty:.0%} of its last quarter: "
            f"{RESUMED} or heavier work began",
        )
    return result(
        State.UNDERUTILIZED,
        None,
        short,
        f"steady {duty:.0%} use without gaps: the work is too small for the GPU",
    )


PAUSED = "the GPU paused"
"""In the reason of a window whose GPU stopped after work, its feeder idle (a checkpoint, an
evaluation): what the analysis's suggestion goes by (gpumon.analyze.trace_report)."""
RESUMED = "a pause ended"
"""In the reason of a window whose GPU is busy again after a pause."""
LOOP_WORK = "the training loop's own CPU work holds the GPU back"
"""In the reason of a starved window whose training process, not its loader, is the busy one."""
PAUSED_AFTER_DUTY = 0.25
"""A stop is a pause only where the GPU was busy at least this share of the window's older three
quarters: the first seconds of a checkpoint after fed work; a loop whose GPU runs 0.2 s every 6 s
(duty ~3% throughout) is starved by it."""
LOOP_OVERHEAD = "the training loop's per-step host work leaves the GPU idle between steps"
"""In the reason of an underutilized window whose GPU is busy most of the time and whose training
process, not its loader, works between steps: the loop's overhead, not starvation."""
LOOP_STARVED_DUTY = 0.6
"""Under the loop-work rule (the training process pinned, its workers with CPU to spare), a GPU busy
at least this share of the window (with hysteresis) is underutilized by the loop's per-step host
work, not starved: a training process spinning in CUDA's synchronize reads a whole core however
little host work it does, so only a GPU idle most of the time (a small model's 95% on the H200) is
plainly held back by it. An evaluation pass at ~50% with metrics in the loop stays starved."""
LOOP_IDLE_WORKERS = 0.5
"""Under the loop-work rule on a busy GPU (LOOP_STARVED_DUTY), the busiest loader worker below this
share of a core (with twice the hysteresis, both ways) reads as idle, its queue full: only then is
the GPU's idle time the loop's overhead. Workers between it and pinned_core stay starved by the loop,
so that a worker wavering about 90% of a core (its IPC waits) never flips the state."""
LOOP_WORK_MAX_RUNQ = 0.2
"""Run-queue wait of the job's processes (cores' worth) under which workers below a core have CPU to
spare: on a saturated host, workers at 60% of a core that wait 40% for one are CPU-bound. At or
above it, with one process wanting CONTENDED_DEMAND of a core, an unexplained starved window is
CPU-bound on a busy host, not `host`."""
CONTENDED_DEMAND = 0.6
"""The most any one job process wants (on-CPU plus run-queue wait, of a core) for the job's
processes' run-queue wait to name `cpu`: 32 network-bound workers each waiting 1% are not CPU-bound."""
