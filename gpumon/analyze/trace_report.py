"""`gpumon analyze`: run a recorded trace through the sampler and detector, and report.

The trace is replayed through the same Sampler and DetectorSink as a live run, on a virtual clock
aligned with the trace's own times, so an offline verdict is the one the daemon would have given.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import multiprocessing
import os
import stat
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpumon.collect.pipeline import Pipeline, SourceSpec
from gpumon.collect.pipeline.sources import OpenedSources, replayed
from gpumon.collect.pipeline.spec import SourceDescription
from gpumon.collect.sources.replay import ReplayHost, ReplaySource
from gpumon.core.clock import VirtualClock
from gpumon.core.errors import TraceError
from gpumon.core.files import kind_of
from gpumon.core.model import Tick
from gpumon.core.problems import Problems
from gpumon.detect.classify import LOOP_OVERHEAD, LOOP_WORK, PAUSED, RESUMED
from gpumon.detect.remedies import WORKERS_KNOB, Advice, fed
from gpumon.detect.stragglers import StragglerHistory, history
from gpumon.detect.thresholds import Thresholds
from gpumon.detect.tracker import Episode, Verdict
from gpumon.detect.vocabulary import main_label
from gpumon.trace.range import GpuSelection, Span, read_range
from gpumon.trace.reader import Trace, iter_trace, read_trace
from gpumon.trace.segments import list_segments, segment_start

SCHEMA = "gpumon-analysis/1"

SUGGESTIONS = {
    "starved-cpu": "the input pipeline is CPU-bound: preprocess in more worker processes "
    "(Keras: PyDataset(workers=N, use_multiprocessing=True); PyTorch: "
    "DataLoader(num_workers=N)), cache decoded samples, or move augmentation to the GPU",
    "starved-io": "input waits on storage: copy the dataset to local SSD or page cache, read fewer "
    "larger files (sharded records), and prefetch with more I/O threads "
    "(PyDataset workers without multiprocessing help here)",
    "starved-host": "the GPU waits on the host but neither CPU nor disks are saturated: look at "
    "network or remote data sources, and host-side work between steps "
    "(synchronous logging, .item()/.numpy() calls, checkpoints)",
    "stalled": "a process holds the GPU but runs nothing: check for a hang "
    "(py-spy dump --pid PID), a deadlocked data loader, or a rank waiting for a peer; where the "
    "reason says the training process is busy, a long checkpoint or evaluation on the CPU",
    "paused": "the GPU pauses now and then with nothing running and its loader idle (checkpoints, "
    "evaluation on the CPU): write checkpoints less often or asynchronously, evaluate less often",
    "loop-work": "the training process is the busy one, not its loader workers: move input work "
    "still done in the loop into the Dataset or collate_fn (the workers run them), and make "
    "checkpoints, metrics and logging asynchronous or less frequent; more workers would not help",
    "loop-overhead": "the GPU idles between steps while the training process does each step's "
    "host work (the Python loop, launching kernels, waiting for them: .item() or per-step logging "
    "and metrics), not for input: more loader workers would not help; synchronize less often, raise "
    "the batch size, or cut launch overhead (torch.compile, CUDA graphs)",
    "sync-stall": "kernels spin at idle power: ranks wait in collectives for a straggler; compare "
    "per-rank step times and balance the input across ranks",
    "underutilized": "steady low use without gaps: the work is too small for the GPU; raise the "
    "batch size (a multiple of the GPU count), use mixed precision, or share the GPU",
    "underutilized-small-kernels": "NVML reads the GPU busy but its kernels fill few of its SMs "
    "(GPM): raise the batch size, fuse small operations (torch.compile, XLA's jit_compile), and "
    "cut launch overhead with CUDA graphs; or give the job a MIG slice of the GPU",
    "idle": "no job on the GPU: release it or schedule work",
}


PAUSE_MAX_S = 30.0
"""The longest underutilized episode a "paused" reason is taken at its word for (a checkpoint, an
evaluation: tens of seconds; a longer pause is stalled)."""


class VerdictRow(NamedTuple):
    """One window's verdict, as `--json` lists it: a tenth of a Verdict's memory (no evidence kept),
    so that a long trace's analysis grows with what it prints, not with the samples it read."""

    t_s: float
    state: str
    cause: str | None
    confidence: float
    raw: str
    duty_cycle: float | None

    @classmethod
    def of(cls, v: Verdict) -> VerdictRow:
        duty = v.evidence.duty_cycle
        return cls(
            v.t_s, v.state, v.cause, v.confidence, v.raw.label, None if duty is None else round(duty, 4)
        )


@dataclass
class GpuReport:
    index: int
    uuid: str
    name: str
    verdicts: list[Verdict] = field(default_factory=list)
    """Every window's whole verdict (kept = "all": for --plot and --truth, and library callers)."""
    rows: list[VerdictRow] = field(default_factory=list)
    """Every window's verdict as --json lists it (kept = "rows")."""
    episodes: list[Episode] = field(default_factory=list)
    seconds_by_label: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wasted_gpu_s: float = 0.0
    jobs: dict[str, str | None] = field(default_factory=dict)
    """job id -> user, for every job seen on the GPU in the trace."""
    mig: int | None = None
    """A MIG instance's GPU instance id (`index` is its parent's)."""
    advice: dict[float, Advice | None] = field(default_factory=dict)
    """What a fix buys, per episode (by its start; detect/advisor.py)."""

    def advice_for(self, e: Episode) -> Advice | None:
        """An episode's advice (one a range cut at its start is found by where it began)."""
        if e.start_s in self.advice:
            return self.advice[e.start_s]
        earlier = [t for t in self.advice if t <= e.start_s]
        # a range's first episode starts at the range (the pre-roll's part cut): its advice is the
        # one the advisor began before; only starved and healthy episodes have advice
        return self.advice[max(earlier)] if earlier and e.state in ("starved", "healthy") else None

    @property
    def fix(self) -> Advice | None:
        """What a fix buys for the GPU's worst starved episode; for a GPU that was only ever fed,
        its longest healthy episode's: nothing on the input side, or "cannot predict" where it was
        healthy under the fed line (remedies.healthy)."""
        starved = [e for e in self.episodes if e.state == "starved"]
        if starved:
            return self.advice_for(max(starved, key=lambda e: e.wasted_gpu_s))
        if self.main_label != "healthy":
            return None
        fed_episodes = [e for e in self.episodes if e.state == "healthy"]
        if not fed_episodes:
            return fed()
        # the analysis closes every episode at its end (a library caller's open one counts as none)
        longest = max(fed_episodes, key=lambda e: (e.end_s if e.end_s is not None else e.start_s) - e.start_s)
        return self.advice_for(longest) or fed()

    @property
    def observed_s(self) -> float:
        return sum(self.seconds_by_label.values())

    @property
    def wasted_by_job(self) -> dict[str, float]:
        """GPU-seconds wasted per job that held the GPU (episodes never span two jobs)."""
        out: dict[str, float] = {}
        for e in self.episodes:
            if e.job is not None and e.wasted_gpu_s > 0:
                out[e.job] = round(out.get(e.job, 0.0) + e.wasted_gpu_s, 3)
        return out

    @property
    def worst_episode(self) -> Episode | None:
        wasteful = [e for e in self.episodes if e.wasted_gpu_s > 0]
        return max(wasteful, key=lambda e: e.wasted_gpu_s, default=None)

    @property
    def main_label(self) -> str:
        return main_label(self.seconds_by_label)

    @property
    def final_label(self) -> str | None:
        """The last known state, when it differs from the main one (a change late in the trace)."""
        now = next((e for e in reversed(self.episodes) if e.state != "unknown"), None)
        return now.label if now is not None and now.label != self.main_label else None

    @property
    def suggestion(self) -> str | None:
        worst = self.worst_episode
        label = worst.label if worst else self.main_label
        reason = worst.reason if worst else ""
        # An episode's reason is its last window's: a long underutilized episode (a small batch)
        # that ends in a stop or heavier work says "paused" at its end; only a short one is a pause.
        short = worst is not None and worst.end_s is not None and worst.end_s - worst.start_s <= PAUSE_MAX_S
        if short and (PAUSED in reason or RESUMED in reason):  # not the work too small for the GPU
            return SUGGESTIONS["paused"]
        if LOOP_WORK in reason:  # not a loader short of workers
            return SUGGESTIONS["loop-work"]
        if LOOP_OVERHEAD in reason:  # a busy GPU whose loop works between its steps
            return SUGGESTIONS["loop-overhead"]
        return SUGGESTIONS.get(label)


@dataclass
class Analysis:
    path: str
    """The trace file, or the recorder's directory for a range."""
    header: dict[str, Any]
    thresholds: Thresholds
    gpus: list[GpuReport]
    host: list[tuple[float, float, float | None, float]]
    """(t_s, cpu_ratio, iowait_ratio, busiest_core_ratio) per tick with a host sample (a single
    trace only: a range keeps no per-tick data)."""
    duration_s: float
    end_s: float
    warnings: list[str]
    trace: Trace | None = None
    """The whole trace, when one file was analyzed (for --plot)."""
    span: Span | None = None
    """What a range read (`analyze --from`): times are then seconds since span.origin_unix_s."""

    @property
    def wasted_gpu_s(self) -> float:
        return sum(g.wasted_gpu_s for g in self.gpus)

    def unix(self, t_s: float) -> float | None:
        """Wall-clock time of a time in this analysis, where known."""
        if self.span is not None:
            return self.span.origin_unix_s + t_s
        started = self.header.get("started_unix_s")
        return started + t_s if isinstance(started, (int, float)) else None


KEEP = ("all", "rows", "none")
"""What `analyze` keeps of a trace: "all" (the whole trace and every Verdict: --plot, --truth),
"rows" (streamed; a VerdictRow per window: --json), "none" (streamed; episodes and totals only:
the text report). Streamed, memory grows with what is kept, not with the ticks read."""


def analyze(trace: Trace | str, thresholds: Thresholds | None = None, *, keep: str = "all") -> Analysis:
    """One trace file: read whole with `keep="all"`, else streamed (see KEEP)."""
    th = thresholds or Thresholds()
    if isinstance(trace, str):
        if keep != "all":
            return _analyze_stream(trace, th, keep)
        trace = read_trace(trace)
    opened = replayed(trace)
    t0 = trace.ticks[0].t_s if trace.ticks else 0.0
    run = _run(opened, t0, trace.path, trace.header, th, keep="all")
    reports, host, end = run.reports, run.host, run.end_s
    return Analysis(
        path=trace.path,
        header=trace.header,
        thresholds=th,
        gpus=reports,
        host=host,
        duration_s=trace.duration_s,
        end_s=end,
        warnings=trace.warnings,
        trace=trace,
    )


def _analyze_stream(path: str, th: Thresholds, keep: str) -> Analysis:
    """One trace file read one tick at a time, by the same rules as read_trace: its errors are
    raised (after the replay, as the reader meets them), its warnings kept."""
    warnings: list[str] = []
    items = iter_trace(path, warnings)
    header = next(items)
    assert isinstance(header, dict)
    failure: list[TraceError] = []
    seen = {"ticks": 0, "end": 0, "last_t": 0.0}

    def ticks() -> Iterator[Tick]:
        # the sampler isolates its sources' failures: a trace's error is carried out around it
        try:
            for item in items:
                if isinstance(item, Tick):
                    seen["ticks"] += 1
                    seen["last_t"] = item.t_s
                    yield item
                else:
                    seen["end"] += 1
        except TraceError as e:
            failure.append(e)

    stream = ticks()
    first = next(stream, None)
    if failure:
        raise failure[0]
    if first is None:
        raise TraceError(path, None, "the trace holds no ticks (a header only): nothing to analyze or replay")
    interval = header.get("interval_s")
    replay = ReplaySource(
        ticks=itertools.chain([first], stream),
        interval_s=float(interval) if isinstance(interval, (int, float)) else None,
    )
    opened = OpenedSources(
        gpu=replay,
        host=ReplayHost(replay),
        description=SourceDescription.replay(path, header.get("source")),
        exhausted=lambda: replay.exhausted,
        next_data=replay.next_data_s,
    )
    run = _run(opened, first.t_s, path, header, th, keep=keep)
    reports, end = run.reports, run.end_s
    if failure:
        raise failure[0]
    if not seen["end"]:
        warnings.append(
            f"{path}: no end record: the recording did not stop cleanly ({seen['ticks']} ticks kept)"
        )
    return Analysis(
        path=path,
        header=header,
        thresholds=th,
        gpus=reports,
        host=[],
        duration_s=seen["last_t"] - first.t_s,
        end_s=end,
        warnings=warnings,
    )


MAX_RANGE_S = 366 * 86400.0


def analyze_range(
    directory: str,
    since_unix_s: float,
    until_unix_s: float = math.inf,
    gpus: frozenset[int] | None = None,
    thresholds: Thresholds | None = None,
    jobs: int = 1,
) -> Analysis:
    """A recorder's segments between two wall-clock times (to the recording's end by default),
    streamed: memory stays bounded however long the range (no per-tick verdicts are kept; episodes
    and totals are). With `jobs` > 1 the GPUs are shared among that many processes (by index, no
    more processes than GPUs), each reading the range for its own."""

    th = thresholds or Thresholds()
    if not os.path.isdir(directory):
        try:
            mode = os.stat(directory).st_mode
            what = f"not a directory (a {'file' if stat.S_ISREG(mode) else kind_of(mode)})"
        except OSError:
            what = "no such directory"
        raise TraceError(directory, None, f"{what}: --from names the recorder's record_dir")
    try:  # (a listing that fails reads as no segments: "no recorder segments here" was wrong)
        os.scandir(directory).close()
    except OSError as e:
        raise TraceError(directory, None, f"cannot list the directory: {e.strerror}") from None
    if until_unix_s <= since_unix_s:
        raise TraceError(directory, None, "the range is empty: --until must be after --since")
    if jobs <= 1:
        whole = _analyze_share(directory, since_unix_s, until_unix_s, GpuSelection(gpus), th)
        assert whole is not None  # not quiet: it raised instead
        return whole

    span, ticks = read_range(directory, since_unix_s, until_unix_s)
    first_tick = next(ticks, None)
    if first_tick is None:  # said here, once, before any worker starts
        raise TraceError(directory, None, _nothing_between(span))
    ticks.close()  # type: ignore[attr-defined]
    # no more processes than GPUs to share (the first tick's, those asked for)
    indices = {g.index for g in first_tick.gpus if gpus is None or g.index in gpus}
    jobs = min(jobs, max(1, len(indices)))
    if jobs <= 1:
        return analyze_range(directory, since_unix_s, until_unix_s, gpus, th)
    shares = [GpuSelection(gpus, jobs, k) for k in range(jobs)]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [
            pool.submit(_analyze_share, directory, since_unix_s, until_unix_s, s, th, True) for s in shares
        ]
        parts = [f.result() for f in futures]
    found = [p for p in parts if p is not None]
    if not found:
        return analyze_range(directory, since_unix_s, until_unix_s, gpus, th)  # it says why
    first = found[0]
    first.gpus = sorted((g for p in found for g in p.gpus), key=lambda r: (r.index, r.uuid))
    first.warnings = list(dict.fromkeys(w for p in found for w in p.warnings))
    first.duration_s = max(p.duration_s for p in found)
    first.end_s = max(p.end_s for p in found)
    return first


def _analyze_share(
    directory: str,
    since_unix_s: float,
    until_unix_s: float,
    gpus: GpuSelection,
    th: Thresholds,
    quiet: bool = False,
) -> Analysis | None:
    """One process's share of a range: None (with `quiet`) when it holds none of its GPUs."""

    # a pre-roll of the detector's window and confirmation before `since`, so that the range's
    # first seconds are judged as the daemon judged them (read, not reported)
    preroll_s = th.window_s + th.confirm_s
    span, ticks = read_range(directory, since_unix_s - preroll_s, until_unix_s, gpus)
    first = next(ticks, None)
    if first is None or span.header is None:
        span.since_unix_s = since_unix_s
        raise TraceError(directory, None, _nothing_between(span))
    interval = span.header.get("interval_s")
    replay = ReplaySource(
        ticks=itertools.chain([first], ticks),
        interval_s=float(interval) if isinstance(interval, (int, float)) else None,
    )
    opened = OpenedSources(
        gpu=replay,
        host=ReplayHost(replay),
        description=SourceDescription.replay(directory, span.header.get("source")),
        exhausted=lambda: replay.exhausted,
        next_data=replay.next_data_s,
    )
    report_from = since_unix_s - span.origin_unix_s
    run = _run(opened, first.t_s, directory, span.header, th, keep="none", report_from_s=report_from)
    reports, end = run.reports, run.end_s
    # the span as asked for: the pre-roll was read, not reported (nor the segments only it read)
    span.since_unix_s = since_unix_s
    starts = [segment_start(os.path.basename(p)) for p in span.segments]
    span.segments = [
        p
        for p, nxt in zip(span.segments, [*starts[1:], None], strict=True)
        if nxt is None or nxt > since_unix_s
    ]
    span.ticks = run.ticks_reported
    span.first_unix_s = None if run.first_reported_s is None else span.origin_unix_s + run.first_reported_s
    if span.first_unix_s is None:
        raise TraceError(directory, None, _nothing_between(span))
    if not reports:
        if quiet:
            return None
        asked = ", ".join(map(str, sorted(gpus.indices or ())))
        raise TraceError(directory, None, f"no GPU {asked} in the range" if asked else "no GPU in the range")
    first_s = (span.first_unix_s or since_unix_s) - span.origin_unix_s
    return Analysis(
        path=directory,
        header=span.header,
        thresholds=th,
        gpus=reports,
        host=[],
        duration_s=end - first_s,
        end_s=end,
        warnings=span.warnings,
        span=span,
    )


def _nothing_between(span: Span) -> str:
    since, until = span.since_unix_s, span.until_unix_s
    if math.isfinite(until):
        asked = f"no samples between {_iso(since)} and {_iso(until)}"
    else:
        asked = f"no samples since {_iso(since)}" if since > 0 else "no samples"
    segments = list_segments(span.directory)
    if not segments:
        return f"{asked}: no recorder segments here (gpumon-*.jsonl.gz)"
    if span.skipped_segments:
        # every segment that might have held them is damaged: say which, first
        return f"{asked}: {span.skipped_segments} segment(s) could not be read ({span.first_skipped})"
    return (
        f"{asked}: the recording here spans {_iso(segments[0].start_unix_s)} to about now or its last segment"
    )


def _iso(unix_s: float) -> str:
    """Local time; UTC for a time that local time cannot write (a segment named 9999-12-31T23:59:59Z
    is in the year 10000 east of Greenwich: it ended an empty range's message with exit 1)."""
    try:
        return datetime.datetime.fromtimestamp(unix_s).astimezone().isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):
        try:
            return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="seconds")
        except (ValueError, OverflowError, OSError):
            return f"{unix_s:.0f} (Unix time)"


def _from(episodes: list[Episode], start_s: float, wasted_before: float) -> list[Episode]:
    """The episodes from `start_s` on: one under way then starts there, with the waste since."""
    before = sum(e.wasted_gpu_s for e in episodes if e.end_s is not None and e.end_s <= start_s)
    kept = [e for e in episodes if e.end_s is None or e.end_s > start_s]
    if kept and kept[0].start_s < start_s:
        spent = max(0.0, wasted_before - before)  # its waste before start_s
        waste = round(max(0.0, kept[0].wasted_gpu_s - spent), 3)
        kept[0] = kept[0]._replace(start_s=start_s, wasted_gpu_s=waste)
    return kept


@dataclass
class _Replayed:
    reports: list[GpuReport]
    host: list[tuple[float, float, float | None, float]]
    end_s: float
    ticks_reported: int = 0
    first_reported_s: float | None = None


def _run(
    opened: OpenedSources,
    t0: float,
    path: str,
    header: dict[str, Any],
    th: Thresholds,
    *,
    keep: str,
    report_from_s: float | None = None,
) -> _Replayed:
    """The replay through the same pipeline as a live run: per-GPU reports, host (when kept), the
    time of the last tick. `report_from_s`: what comes before is fed to the detector (a pre-roll,
    so the first reported seconds are judged) but not reported. `keep`: see KEEP."""
    keep_ticks = keep == "all"
    keep_rows = keep == "rows"
    interval = header.get("interval_s")
    interval = float(interval) if isinstance(interval, (int, float)) and interval > 0 else 1.0
    clock = VirtualClock(t0 - interval)  # the first replayed tick lands on the trace's first t_s
    pipeline = Pipeline(
        SourceSpec("replay", file=path),
        clock,
        interval_s=interval,
        thresholds=th,
        sources=opened,
        problems=Problems(logging.getLogger("gpumon.analyze")),
    )
    reports: dict[tuple[int, str], GpuReport] = {}
    host: list[tuple[float, float, float | None, float]] = []
    last_t: dict[tuple[int, str], float] = {}
    end = [t0]

    reported = _Replayed([], host, t0)
    wasted_before: dict[tuple[int, str], float] = {}

    def collect(tick: Tick, verdicts: list[Verdict]) -> None:
        end[0] = tick.t_s
        if report_from_s is not None and tick.t_s < report_from_s - 1e-9:
            for v in verdicts:
                wasted_before[(v.index, v.uuid)] = v.wasted_gpu_s
            return
        reported.ticks_reported += 1
        if reported.first_reported_s is None:
            reported.first_reported_s = tick.t_s
        if keep_ticks and tick.host is not None:
            h = tick.host
            host.append((tick.t_s, h.cpu_ratio, h.iowait_ratio, h.busiest_core_ratio))
        jobs_of = {(g.index, g.uuid): g.jobs for g in tick.gpus if g.jobs}
        for v in verdicts:
            key = (v.index, v.uuid)
            rep = reports.get(key)
            if rep is None:
                rep = reports[key] = GpuReport(v.index, v.uuid, v.name)
                rep.mig = next((g.mig for g in tick.gpus if g.index == v.index and g.uuid == v.uuid), None)
            prev = last_t.get(key)
            dt = min(v.t_s - prev, th.window_s) if prev is not None else interval
            last_t[key] = v.t_s
            if keep_ticks:
                rep.verdicts.append(v)
            elif keep_rows:
                rep.rows.append(VerdictRow.of(v))
            rep.seconds_by_label[v.label] += dt
            for j in jobs_of.get(key, ()):
                rep.jobs.setdefault(j.job_id, j.user)

    pipeline.on_verdicts(collect)
    pipeline.run()
    for key, det in pipeline.detector.fleet.gpus.items():
        rep = reports.get(key)
        if rep is None:
            continue
        rep.advice = pipeline.detector.advisor.episodes(key)
        rep.episodes = det.close(end[0])
        rep.wasted_gpu_s = det.wasted_gpu_s
        if report_from_s is not None:  # what the pre-roll read is not reported
            before = wasted_before.get(key, 0.0)
            rep.episodes = _from(rep.episodes, report_from_s, before)
            rep.wasted_gpu_s = max(0.0, det.wasted_gpu_s - before)
    reported.reports = sorted(reports.values(), key=lambda r: (r.index, r.uuid))
    reported.end_s = end[0]
    return reported


# -- rendering -----------------------------------------------------------------------------------


def _fmt_evidence(e: dict[str, Any]) -> str:
    def pct(key: str) -> str:
        v = e.get(key)
        return "n/a" if v is None else f"{v:.0%}"

    def ms(key: str) -> str:
        v = e.get(key)
        return "n/a" if v is None else f"{v * 1000:.0f} ms"

    parts = [f"duty {pct('duty_cycle')}", f"p5/p95 {pct('p5')}/{pct('p95')}"]
    if e.get("bursts_per_s") is not None:
        parts.append(f"{e['bursts_per_s']:.1f} bursts/s seen")
    if e.get("mean_burst_s") is not None or e.get("mean_gap_s") is not None:
        reg = ""
        if e.get("gap_cv") is not None:
            reg = f", {'regular' if e['gap_cv'] < 0.5 else 'irregular'} gaps (cv {e['gap_cv']:.2f})"
        res = f" at {e['period_s'] * 1000:.0f} ms resolution" if e.get("period_s") else ""
        parts.append(f"busy runs {ms('mean_burst_s')}, empty runs {ms('mean_gap_s')}{res}{reg}")
    if e.get("main_cpu_cores") is not None:
        parts.append(
            f"job CPU: main {e['main_cpu_cores']:.0%} of a core, busiest loader "
            f"{(e.get('busiest_child_cpu_cores') or 0):.0%}, {e.get('loader_workers') or 0} workers"
        )
    if e.get("busiest_core_ratio") is not None:
        parts.append(f"busiest core {pct('busiest_core_ratio')}")
    if e.get("iowait_ratio") is not None:
        parts.append(f"iowait {pct('iowait_ratio')}")
    if e.get("job_read_bytes_per_s") is not None:
        parts.append(f"job reads {e['job_read_bytes_per_s'] / 1e6:.0f} MB/s")
    elif e.get("disk_read_bytes_per_s") is not None:
        parts.append(f"disk reads {e['disk_read_bytes_per_s'] / 1e6:.0f} MB/s")
    if e.get("power_ratio") is not None:
        parts.append(f"power {pct('power_ratio')} of limit")
    if e.get("sm_active") is not None:
        parts.append(f"SM activity {pct('sm_active')} ({pct('sm_while_busy')} of SMs while busy)")
    if e.get("clock_held"):
        parts.append(f"clocks held down: {e['clock_held']}")
    return ", ".join(parts)


def _clock(a: Analysis, t_s: float) -> str:
    """A time as the report shows it: seconds into a trace, or the wall clock for a range."""
    if a.span is None:
        return f"{t_s:8.1f}"

    return datetime.datetime.fromtimestamp(a.span.origin_unix_s + t_s).strftime("%m-%d %H:%M:%S")


def render_text(a: Analysis) -> str:
    source = SourceDescription.from_json(a.header.get("source")).phrase()
    if a.span is None:
        lines = [f"gpumon analyze {a.path}: {len(a.gpus)} GPU(s), {a.duration_s:.0f} s ({source})"]
    else:
        sp = a.span
        first, last = sp.first_unix_s or sp.since_unix_s, sp.last_unix_s or sp.until_unix_s
        lines = [
            f"gpumon analyze --from {a.path}: {len(a.gpus)} GPU(s), {_iso(first)} to {_iso(last)} "
            f"({_span_text(last - first)}, {sp.ticks} ticks from {len(sp.segments)} segment(s); {source})"
        ]
    starved = [g for g in a.gpus if g.main_label.startswith("starved")]
    lines.append(
        f"fleet: {len(starved)} of {len(a.gpus)} GPU(s) mostly starved; "
        f"{a.wasted_gpu_s / 3600:.3f} GPU-hours wasted ({a.wasted_gpu_s:.0f} GPU-s)"
    )
    lines += straggler_lines(a)
    unit = "" if a.span is not None else " s"
    for g in a.gpus:
        total = g.observed_s or 1.0
        lines.append("")
        where = f"GPU {g.index}" + (f" MIG {g.mig}" if g.mig is not None else "")
        lines.append(f"{where}  {g.name or '?'}  {g.uuid or '?'}")
        if g.jobs:
            lines.append("  jobs:    " + ", ".join(f"{j} ({u})" if u else j for j, u in g.jobs.items()))
        headline = f"  verdict: {g.main_label.upper()}"
        if g.final_label:
            start = next(e.start_s for e in reversed(g.episodes) if e.label == g.final_label)
            since = _clock(a, start).strip()
            headline += f" most of the time; {g.final_label.upper()} at the end (from {since}{unit})"
        lines.append(headline)
        shares = sorted(g.seconds_by_label.items(), key=lambda kv: -kv[1])
        lines.append(
            "  time:    " + ", ".join(f"{k} {v:.0f} s ({v / total:.0%})" for k, v in shares if v > 0)
        )
        lines.append(f"  wasted:  {g.wasted_gpu_s / 3600:.4f} GPU-hours ({g.wasted_gpu_s:.0f} GPU-s)")
        by_job = g.wasted_by_job
        if len(by_job) > 1:  # more than one job held the GPU: each its own share
            lines.append("           " + ", ".join(f"{j}: {w:.0f} GPU-s" for j, w in by_job.items()))
        shown = [e for e in g.episodes if e.state != "unknown"]
        lines.append(f"  episodes ({len(shown)}):")
        for e in shown[:8]:
            end = e.end_s if e.end_s is not None else a.end_s
            duty = f", mean duty {e.mean_duty:.0%}" if e.mean_duty is not None else ""
            lines.append(
                f"    {_clock(a, e.start_s)} - {_clock(a, end)}{unit}  {e.label:<14} "
                f"({end - e.start_s:.0f} s{duty}, wasted {e.wasted_gpu_s:.0f} GPU-s)"
            )
        if len(shown) > 8:
            lines.append(f"    ... {len(shown) - 8} more (--json lists them all)")
        worst = g.worst_episode
        if worst is not None and worst.worst is not None:
            lines.append(
                f"  worst:   {worst.label} from {_clock(a, worst.start_s).strip()}{unit}: {worst.reason}"
            )
            lines.append(f"           evidence: {_fmt_evidence(worst.worst)}")
        if g.suggestion:
            lines.append(f"  suggest: {g.suggestion}")
        fix = g.fix
        if fix is not None:
            lines += fix_lines(fix)
    # a line each: a newline in a name, a job or the source from the trace ("A100\n  verdict:
    # HEALTHY") printed a line of its own (the CLI's printable() shows the other controls as '?')
    return "\n".join(line.replace("\n", "?") for line in lines)


def render_warnings(a: Analysis) -> str:
    """What was wrong with the input (a torn segment, a partial record), a line each: for standard
    error, beside the report (`analyze > report.txt` once hid them in the file)."""
    return "\n".join(f"gpumon: warning: {w}" for w in a.warnings)


def stragglers_of(a: Analysis) -> StragglerHistory[int]:
    """Which GPU the others waited for in sync-stall, when, from the GPUs' episodes."""
    return history(
        {
            g.index: [(e.start_s, e.end_s if e.end_s is not None else a.end_s, e.label) for e in g.episodes]
            for g in a.gpus
            if g.mig is None
        }
    )


def straggler_lines(a: Analysis) -> list[str]:
    """A data-parallel job's straggler: the GPU the others wait for, and what fixing it buys the
    whole job (it steps at its slowest rank); SPDL's rule when it moves."""
    h = stragglers_of(a)
    lines = []
    for k in h.ranks:
        g = next(r for r in a.gpus if r.index == k and r.mig is None)
        lines.append(
            f"straggler: GPU {k}, starved while the others waited in sync-stall ({h.seconds[k]:.0f} s)"
        )
        fix = g.fix
        if fix is not None and not h.moving:
            lines.append(f"  its fix is the whole job's: {fix.line(WORKERS_KNOB)}")
    said = h.diagnosis() if h.moving else None
    if said:
        lines.append(said)
    return lines


def fix_lines(fix: Advice) -> list[str]:
    """What a fix buys, as `analyze` shows it: the change to make and its predicted speed-up, then
    every candidate and the ceiling."""
    lines = [f"  fix buys: {fix.line(WORKERS_KNOB)}"]
    if fix.candidates:
        shown = ", ".join(f"-> {c.workers}: {c.speedup:.1f}x" for c in fix.candidates[:4])
        ceiling = f"; the GPU's ceiling {fix.ceiling:.1f}x" if fix.ceiling is not None else ""
        lines.append(f"           workers {fix.workers} {shown}{ceiling}; median of {fix.windows} windows")
    return lines


def _span_text(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def to_json(a: Analysis) -> dict[str, Any]:
    def episode(g: GpuReport, e: Episode) -> dict[str, Any]:
        start_unix = a.unix(e.start_s)
        end_unix = a.unix(e.end_s) if e.end_s is not None else None
        return {
            "state": e.state,
            "cause": e.cause,
            "label": e.label,
            "start_s": e.start_s,
            "end_s": e.end_s,
            "start_unix_s": None if start_unix is None else round(start_unix, 3),
            "end_unix_s": None if end_unix is None else round(end_unix, 3),
            "job": e.job,
            "wasted_gpu_s": e.wasted_gpu_s,
            "mean_duty": e.mean_duty,
            "reason": e.reason,
            "worst_evidence": e.worst,
            "causes": [{"from_s": t, "cause": c} for t, c in e.causes],
            "causes_dropped": e.causes_dropped,
            "advice": advice(g.advice_for(e)),
        }

    def advice(x: Advice | None) -> dict[str, Any] | None:
        return None if x is None else x.as_dict()

    sp = a.span
    return {
        "schema": SCHEMA,
        "trace": a.path,
        "source": a.header.get("source"),
        "duration_s": round(a.duration_s, 3),
        "range": None
        if sp is None
        else {
            "directory": sp.directory,
            "since_unix_s": round(sp.since_unix_s, 3),
            "until_unix_s": round(sp.until_unix_s, 3) if math.isfinite(sp.until_unix_s) else None,
            "first_unix_s": sp.first_unix_s,
            "last_unix_s": sp.last_unix_s,
            "origin_unix_s": round(sp.origin_unix_s, 3),
            "segments": len(sp.segments),
            "ticks": sp.ticks,
        },
        "thresholds": {k: getattr(a.thresholds, k) for k in a.thresholds.__slots__},
        "wasted_gpu_s": round(a.wasted_gpu_s, 3),
        "stragglers": _stragglers_json(a),
        "gpus": [
            {
                "index": g.index,
                "mig": g.mig,
                "uuid": g.uuid,
                "name": g.name,
                "verdict": g.main_label,
                "final": g.final_label or g.main_label,
                "jobs": [{"job_id": j, "user": u} for j, u in g.jobs.items()],
                "seconds_in_state": {k: round(v, 3) for k, v in g.seconds_by_label.items() if v > 0},
                "wasted_gpu_s": round(g.wasted_gpu_s, 3),
                "wasted_gpu_s_by_job": g.wasted_by_job,
                "suggestion": g.suggestion,
                "advice": advice(g.fix),
                "episodes": [episode(g, e) for e in g.episodes],
                "verdicts": [r._asdict() for r in (g.rows or map(VerdictRow.of, g.verdicts))],
            }
            for g in a.gpus
        ],
        "warnings": a.warnings,
    }


def _stragglers_json(a: Analysis) -> dict[str, Any]:
    h = stragglers_of(a)
    return {
        "gpus": h.ranks,
        "seconds": {str(k): round(h.seconds[k], 3) for k in h.ranks},
        "moving": h.moving,
        "diagnosis": h.diagnosis(),
    }
