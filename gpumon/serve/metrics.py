"""Prometheus metrics from a snapshot: fresh families per rendering (gpumon.serve.textformat).

Never global gauges: a GPU that vanishes simply has no series in the next snapshot. The values
are sampled in the background (the detector needs sub-second history), so `gpumon_last_sample_age_seconds`
says how old they are. docs/metrics.md lists every series; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpumon import __version__
from gpumon.core.model import GpuSample, JobRef, clock_reasons
from gpumon.detect.remedies import Advice, Kind
from gpumon.detect.vocabulary import STARVATION_CAUSES, State
from gpumon.serve.snapshot import Snapshot
from gpumon.serve.textformat import Family, counter, gauge

GPU_LABELS = ["gpu", "uuid", "mig"]
"""`mig`: the GPU instance id on a MIG instance (`gpu` is then its parent's index, `uuid` its
MIG-... UUID); empty on a whole GPU, which Prometheus stores as no label at all."""
GPM_RATIOS = (
    ("graphics_ratio", "gpumon_gpu_graphics_active_ratio", "Share of time any work was active (GPM)."),
    (
        "sm_active_ratio",
        "gpumon_gpu_sm_active_ratio",
        "Share of SMs busy (GPM SM activity): low beside high utilization means small kernels.",
    ),
    ("sm_occupancy_ratio", "gpumon_gpu_sm_occupancy_ratio", "Active warps against the maximum (GPM)."),
    ("tensor_ratio", "gpumon_gpu_tensor_active_ratio", "Share of time tensor cores ran (GPM)."),
    ("dram_bw_ratio", "gpumon_gpu_dram_bandwidth_ratio", "DRAM bandwidth used against the maximum (GPM)."),
)
JOB_LABELS = ["scheduler", "job_id", "user", "namespace", "pod", "container", "via"]


def job_label_values(j: JobRef) -> list[str]:
    """An absent value is the empty label, which Prometheus treats as no label at all."""
    return [j.scheduler, j.job_id, j.user or "", j.namespace or "", j.pod or "", j.container or "", j.via]


def families(s: Snapshot | None, age_s: float | None) -> Iterator[Family]:
    """Every family of one snapshot (only the build's before the first); `age_s`: what
    gpumon_last_sample_age_seconds says."""
    yield from _build_info()
    if s is None:
        return
    yield from _gpu_metrics(s)
    yield from _host_metrics(s)
    yield from _self_metrics(s, age_s or 0.0)


def _build_info() -> Iterator[Family]:
    m = gauge("gpumon_build_info", "gpumon's version, as a label; always 1.", labels=["version"])
    m.add_metric([__version__], 1)
    yield m


def _gauge(name: str, doc: str, extra: list[str] | None = None) -> Family:
    return gauge(name, doc, labels=GPU_LABELS + (extra or []))


def _gpu_metrics(s: Snapshot) -> Iterator[Family]:
    bg = " Sampled in the background every tick; see gpumon_last_sample_age_seconds."
    info = _gauge("gpumon_gpu_info", "GPU identity; always 1.", ["name"])
    up = _gauge("gpumon_gpu_up", "1 when the GPU answered NVML this tick, 0 when lost or hung.")
    util = _gauge(
        "gpumon_gpu_utilization_ratio",
        "Share of the driver's last sample period in which a kernel ran (NVML)." + bg,
    )
    mem_util = _gauge(
        "gpumon_gpu_memory_utilization_ratio",
        "Share of the last sample period in which device memory was read or written.",
    )
    mem_used = _gauge(
        "gpumon_gpu_memory_used_bytes", "Device memory used (NVML v2: without the driver's reserve)."
    )
    mem_total = _gauge("gpumon_gpu_memory_total_bytes", "Device memory in all.")
    power = _gauge("gpumon_gpu_power_watts", "Power draw.")
    limit = _gauge("gpumon_gpu_power_limit_watts", "Enforced power limit.")
    temp = _gauge("gpumon_gpu_temperature_celsius", "GPU temperature.")
    procs = _gauge("gpumon_gpu_processes", "Compute processes on the GPU.")
    duty = _gauge(
        "gpumon_gpu_duty_cycle_ratio",
        "Mean of the driver's sub-second utilization samples over the detector's window.",
    )
    gap = _gauge(
        "gpumon_gpu_idle_gap_seconds",
        "Mean length of the idle gaps in the window, at the driver's sample resolution.",
    )
    bursts = _gauge("gpumon_gpu_bursts_per_second", "Bursts of work seen per second in the window.")
    job_cpu = _gauge(
        "gpumon_gpu_job_cpu_cores",
        "CPU used by the GPU's processes and their descendants (loader workers), in cores.",
    )
    busiest = _gauge(
        "gpumon_gpu_job_busiest_process_cpu_ratio",
        "The busiest single process of the job (main or a loader worker), share of one core.",
    )
    state = _gauge(
        "gpumon_gpu_state", "1 for the GPU's current state (docs/detector.md), 0 for the others.", ["state"]
    )
    cause = _gauge(
        "gpumon_gpu_starvation_cause",
        "1 for the cause of a starved GPU (cpu, io, host), 0 for the others and when not starved.",
        ["cause"],
    )
    conf = _gauge("gpumon_gpu_state_confidence_ratio", "The detector's confidence in the current state.")
    since = _gauge("gpumon_gpu_state_duration_seconds", "How long the GPU has been in its current state.")
    in_state = counter(
        "gpumon_gpu_state_seconds",
        "Seconds spent in each state since gpumon started.",
        labels=[*GPU_LABELS, "state"],
    )
    starved = counter(
        "gpumon_gpu_starved_seconds", "Seconds spent starved, by cause.", labels=[*GPU_LABELS, "cause"]
    )
    wasted = counter(
        "gpumon_gpu_wasted_seconds",
        "GPU-seconds wasted: the idle share of starved and underutilized time, all of "
        "stalled time, and of sync-stall time the share spent waiting.",
        labels=GPU_LABELS,
    )
    episodes = counter(
        "gpumon_gpu_episodes", "Episodes started, by state and cause label.", labels=[*GPU_LABELS, "label"]
    )
    unattributed = _gauge(
        "gpumon_gpu_unattributed_info",
        "Why no job or pod is named for the GPU, where a scheduler is in use (reason: no-process, "
        "kubelet-unavailable, unknown-process; docs/kubernetes.md); always 1.",
        ["reason"],
    )
    jobs = gauge(
        "gpumon_gpu_job_info",
        "The job (Slurm) or pod (Kubernetes) holding the GPU; always 1. One series per GPU and job: "
        "join it to other series on (instance, gpu, uuid) rather than carry job labels on every series.",
        labels=[*GPU_LABELS, *JOB_LABELS],
    )
    gpm_fams = [(field, _gauge(name, doc + bg)) for field, name, doc in GPM_RATIOS]
    fp = _gauge(
        "gpumon_gpu_fp_active_ratio",
        "Share of time non-tensor FP math ran, by precision (GPM).",
        ["precision"],
    )
    pcie = _gauge("gpumon_gpu_gpm_pcie_bytes_per_second", "PCIe traffic, by direction (GPM).", ["direction"])
    nvlink = _gauge(
        "gpumon_gpu_nvlink_bytes_per_second", "NVLink traffic, all links, by direction (GPM).", ["direction"]
    )
    clock_now = _gauge(
        "gpumon_gpu_clock_event_active",
        "1 for each clock-event reason holding the GPU's clocks now (nvmlClocksEventReasons).",
        ["reason"],
    )
    clock_s = counter(
        "gpumon_gpu_clock_event_seconds",
        "Seconds the GPU's clocks spent held by each reason since gpumon started.",
        labels=[*GPU_LABELS, "reason"],
    )
    xid = counter(
        "gpumon_gpu_xid_errors",
        "XID errors (NVML critical-error events) since gpumon started, by code (docs/metrics.md).",
        labels=[*GPU_LABELS, "xid"],
    )
    last_xid = _gauge("gpumon_gpu_last_xid", "The code of the last XID error since gpumon started.")
    last_xid_t = _gauge(
        "gpumon_gpu_last_xid_timestamp_seconds", "When the last XID error was seen (Unix time)."
    )
    ceiling = _gauge(
        "gpumon_gpu_input_speedup_ceiling",
        "A starved GPU: how many times today's steps per second it could run at most were the GPU "
        "busy all the time (1 / duty cycle); only while starved (docs/detector.md, what a fix buys).",
    )
    predicted = _gauge(
        "gpumon_gpu_predicted_speedup",
        "A starved GPU: the steps per second a change on the input side is predicted to bring, "
        "against today's (change: workers+1, recommended (the smallest change of loader workers "
        "reaching the most; 1 when more gain nothing), cache); only where the signals support a number.",
        ["change"],
    )
    for g in s.tick.gpus:
        lv = [str(g.index), g.uuid, "" if g.mig is None else str(g.mig)]
        info.add_metric([*lv, g.name], 1)
        v = s.verdict_for(g.index, g.uuid)
        if v is not None and v.state == State.STARVED:  # a healthy GPU's advice has no series
            _advice_metrics(s.advice.get((g.index, g.uuid)), lv, ceiling, predicted)
        for j in g.jobs:
            jobs.add_metric([*lv, *job_label_values(j)], 1)
        if g.unattributed is not None:
            unattributed.add_metric([*lv, g.unattributed], 1)
        up.add_metric(lv, 1 if g.available else 0)
        for fam, value in (
            (util, g.util_ratio),
            (mem_util, g.mem_util_ratio),
            (mem_used, g.mem_used_bytes),
            (mem_total, g.mem_total_bytes),
            (power, g.power_w),
            (limit, g.power_limit_w),
            (temp, g.temp_c),
        ):
            if value is not None:  # unsupported: the series is left out, not NaN
                fam.add_metric(lv, value)
        if g.available:
            procs.add_metric(lv, len(g.processes))
        _hopper_metrics(g, lv, gpm_fams, fp, pcie, nvlink)
        if g.clock_events is not None:
            for reason in clock_reasons(g.clock_events):
                clock_now.add_metric([*lv, reason], 1)
        for reason, seconds in g.clock_event_s:
            clock_s.add_metric([*lv, reason], round(seconds, 3))
        for x in g.xids:
            xid.add_metric([*lv, str(x.xid)], x.seen)
        if g.last_xid is not None:
            last_xid.add_metric(lv, g.last_xid[0])
            last_xid_t.add_metric(lv, round(g.last_xid[1], 3))
        if v is not None:
            ev = v.evidence
            for fam, value in (
                (duty, ev.duty_cycle),
                (gap, ev.mean_gap_s),
                (bursts, ev.bursts_per_s),
                (job_cpu, ev.job_cpu_cores),
                (busiest, ev.busiest_job_core),
            ):
                if value is not None:
                    fam.add_metric(lv, round(value, 6))
            for st in State:
                state.add_metric([*lv, st], 1 if v.state == st else 0)
            for c in STARVATION_CAUSES:
                cause.add_metric([*lv, c], 1 if v.cause == c else 0)
            conf.add_metric(lv, v.confidence)
            since.add_metric(lv, round(s.t_s - v.since_s, 3))
        counters = s.counters.get((g.index, g.uuid))
        if counters is not None:
            for st in State:
                in_state.add_metric([*lv, st], round(counters.seconds_in_state.get(st, 0.0), 3))
            for c in STARVATION_CAUSES:
                starved.add_metric([*lv, c], round(counters.starved_seconds_by_cause.get(c, 0.0), 3))
            wasted.add_metric(lv, round(counters.wasted_gpu_s, 3))
            for label, n in sorted(counters.episodes_started.items()):
                episodes.add_metric([*lv, label], n)
    yield from (
        info,
        up,
        util,
        mem_util,
        mem_used,
        mem_total,
        power,
        limit,
        temp,
        procs,
        duty,
        gap,
        bursts,
        job_cpu,
        busiest,
        state,
        cause,
        conf,
        since,
        in_state,
        starved,
        wasted,
        episodes,
    )
    yield from (f for f in (ceiling, predicted) if f.samples)
    yield from (fam for _, fam in gpm_fams if fam.samples)
    yield from (f for f in (fp, pcie, nvlink, clock_now, clock_s, xid, last_xid, last_xid_t) if f.samples)
    if jobs.samples:
        yield jobs
    if unattributed.samples:
        yield unattributed


def _advice_metrics(a: Advice | None, lv: list[str], ceiling: Family, predicted: Family) -> None:
    """What a fix buys: series only for a starved GPU (a fed one has nothing to gain on the input
    side), at most 3 per GPU."""
    if a is None or a.kind == Kind.GPU_LIMIT:
        return
    if a.ceiling is not None:  # (none said where NVML reads 0% and GPM sees kernels)
        ceiling.add_metric(lv, round(a.ceiling, 4))
    if a.kind != Kind.PREDICTED:
        return  # cannot predict: the ceiling alone
    step = next((c for c in a.candidates if c.change == "workers+1"), None)
    if step is not None:
        predicted.add_metric([*lv, "workers+1"], round(step.speedup, 4))
    predicted.add_metric([*lv, "recommended"], round(a.best.speedup if a.best is not None else 1.0, 4))
    if a.cache is not None:
        predicted.add_metric([*lv, "cache"], round(a.cache.speedup, 4))


def _hopper_metrics(
    g: GpuSample,
    lv: list[str],
    ratios: list[tuple[str, Family]],
    fp: Family,
    pcie: Family,
    nvlink: Family,
) -> None:
    """GPM series: only where the GPU has GPM (Hopper and newer), else left out."""
    a = g.gpm
    if a is None:
        return
    for field, fam in ratios:
        value = getattr(a, field)
        if value is not None:
            fam.add_metric(lv, value)
    for precision, value in (("fp16", a.fp16_ratio), ("fp32", a.fp32_ratio), ("fp64", a.fp64_ratio)):
        if value is not None:
            fp.add_metric([*lv, precision], value)
    for fam, rx, tx in (
        (pcie, a.pcie_rx_bytes_per_s, a.pcie_tx_bytes_per_s),
        (nvlink, a.nvlink_rx_bytes_per_s, a.nvlink_tx_bytes_per_s),
    ):
        for direction, value in (("rx", rx), ("tx", tx)):
            if value is not None:
                fam.add_metric([*lv, direction], round(value, 1))


def _host_metrics(s: Snapshot) -> Iterator[Family]:
    h = s.tick.host
    if h is None:
        return
    for name, doc, value in (
        ("gpumon_host_cpu_ratio", "Share of all CPUs busy over the last tick.", h.cpu_ratio),
        (
            "gpumon_host_busiest_core_ratio",
            "The busiest single CPU over the last tick.",
            h.busiest_core_ratio,
        ),
        ("gpumon_host_iowait_ratio", "Share of CPU time idle with I/O outstanding.", h.iowait_ratio),
        ("gpumon_host_load1", "1-minute load average.", h.load1),
        ("gpumon_host_disk_read_bytes_per_second", "Storage reads, all disks.", h.disk_read_bytes_per_s),
        ("gpumon_host_cpus", "Logical CPUs.", h.cpu_count),
    ):
        if value is not None:
            yield gauge(name, doc, value=value)


def _self_metrics(s: Snapshot, age_s: float) -> Iterator[Family]:
    ok = gauge("gpumon_source_up", "1 when the source's last reading succeeded.", labels=["source"])
    dur = gauge(
        "gpumon_source_duration_seconds", "How long the source's last reading took.", labels=["source"]
    )
    fails = counter("gpumon_source_failures", "Failed readings since start.", labels=["source"])
    problems = counter(
        "gpumon_source_problems",
        "Problems a source ran into since start (a lost or hung GPU, a field that failed, the source "
        "itself failing), each occurrence counted; the state API lists those going on now.",
        labels=["source"],
    )
    for name, st in sorted(s.sources.items()):
        ok.add_metric([name], 1 if st.last_success else 0)
        dur.add_metric([name], round(st.last_duration_s, 6))
        fails.add_metric([name], st.failures)
    for name in sorted(set(s.sources) | set(s.problem_totals)):
        problems.add_metric([name], s.problem_totals.get(name, 0))
    yield from (ok, dur, fails, problems)
    if s.tick.attribution:
        attr = gauge(
            "gpumon_attribution_up",
            "1 when the attribution source (slurm, dcgm-mapping, kubernetes) answered this tick; "
            "the state API says why not.",
            labels=["source"],
        )
        for a in s.tick.attribution:
            attr.add_metric([a.source], 1 if a.up else 0)
        yield attr
    yield gauge(
        "gpumon_last_sample_age_seconds",
        "Seconds since the newest sample: the values are sampled in the background.",
        value=age_s,
    )
    yield gauge("gpumon_gpus", "GPUs seen in the last tick.", value=len(s.tick.gpus))
    yield counter("gpumon_sampler_ticks", "Sampler ticks since start.", value=s.ticks)
    yield counter(
        "gpumon_sampler_skipped_ticks",
        "Ticks skipped because the sampler fell behind.",
        value=s.skipped_ticks,
    )
    yield gauge(
        "gpumon_simulated",
        "1 when the GPUs are simulated (--simulate) or replayed.",
        value=1 if s.source_description.simulated_gpus else 0,
    )
    yield from _recorder_metrics(s)


def _recorder_metrics(s: Snapshot) -> Iterator[Family]:
    r = s.recorder
    if r is None:
        return
    yield gauge(
        "gpumon_recorder_up",
        "1 while the flight recorder writes every tick; 0 while paused (disk full, unwritable); "
        "the state API says why.",
        value=1 if r.up else 0,
    )
    yield counter(
        "gpumon_recorder_written_bytes",
        "Compressed bytes the recorder wrote since start.",
        value=r.bytes_written,
    )
    yield counter(
        "gpumon_recorder_errors",
        "Writes, opens and deletes of segments that failed since start.",
        value=r.errors,
    )
    yield counter(
        "gpumon_recorder_dropped_ticks",
        "Ticks not recorded since start (paused, or the disk too slow for the queue).",
        value=r.dropped_ticks,
    )
    yield gauge("gpumon_recorder_segments", "Segment files kept.", value=r.segments)
    yield gauge(
        "gpumon_recorder_disk_bytes",
        "Bytes the kept segments take (retention holds it under the limit).",
        value=r.disk_bytes,
    )
    reach = 0.0 if r.oldest_unix_s is None or r.newest_unix_s is None else r.newest_unix_s - r.oldest_unix_s
    yield gauge(
        "gpumon_recorder_oldest_sample_age_seconds",
        "How far back the recording reaches: the newest sample's time less the oldest segment's start "
        "(0 before the first is written).",
        value=round(max(0.0, reach), 3),
    )
