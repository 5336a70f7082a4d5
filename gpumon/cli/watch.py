"""`gpumon watch`: a line per GPU per interval with its verdict; each GPU's episodes at the end."""

from __future__ import annotations

import argparse
import sys

from gpumon.cli import flags
from gpumon.collect.pipeline import Pipeline
from gpumon.core.clock import SinceStart
from gpumon.core.errors import EXIT_INTERRUPTED, EXIT_OK
from gpumon.core.model import Tick
from gpumon.core.terminal import printable
from gpumon.detect.tracker import Verdict

_COLORS = {
    "healthy": "32",
    "starved": "1;31",
    "stalled": "1;35",
    "sync-stall": "1;35",
    "underutilized": "33",
    "idle": "2",
    "starting": "36",
    "mig": "2",
    "unknown": "2",
}


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "watch", parents=[common], help="print each GPU's utilization and verdict every interval"
    )
    flags.add_duration(s)
    flags.add_interval(s, what="time between lines")
    s.add_argument("--no-color", action="store_true", help="never colour the state column")
    s.add_argument("-o", "--output", metavar="FILE", help="also record the samples to this trace file")
    s.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    flags.add_trace_format(s)
    flags.add_threshold(s)
    flags.add_source_flags(s, speed=True)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    th = flags.thresholds(args)
    spec = flags.source_spec(args)
    clock = SinceStart(flags.clock_for(args, spec))
    pipeline = Pipeline(
        spec, clock, interval_s=args.interval_s, thresholds=th, attribution=flags.attribution()
    )
    writer = None
    try:
        if args.output:
            from gpumon.trace.records import make_header
            from gpumon.trace.writer import open_writer, version_for

            writer = open_writer(
                args.output,
                make_header(pipeline.description.to_json(), args.interval_s),
                version_for(args.output, args.trace_format),
                force=args.force,
            )
            pipeline.on_tick(writer.write_tick)
    except BaseException:
        pipeline.close()
        raise
    color = sys.stdout.isatty() and not args.no_color
    print(
        f"gpumon watch: {pipeline.description.phrase()}, every {args.interval_s:g} s (Ctrl-C to stop)",
        flush=True,
    )
    print(
        f"{'TIME':>7} {'GPU':>3} {'UTIL':>5} {'DUTY':>5} {'MEM':>5} {'JOBCPU':>7}  "
        f"{'STATE':<14} {'CAUSE':<5} {'CONF':>4} {'SINCE':>6}",
        flush=True,
    )
    pipeline.on_verdicts(lambda tick, verdicts: _show(tick, verdicts, color))
    reason = "duration"
    try:
        if flags.run_until_done(pipeline, args.duration).interrupted:
            reason = "interrupted"
    finally:
        last = pipeline.sampler.last_tick
        if writer is not None:
            writer.finish(reason)  # at the last tick written: one still being taken is dropped
        pipeline.close()
    end = last.t_s if last else 0.0
    for key, det in sorted(pipeline.detector.fleet.gpus.items()):
        episodes = [e for e in det.close(end) if e.state != "unknown"]
        summary = ", ".join(f"{e.label} {e.start_s:.0f}-{e.end_s:.0f} s" for e in episodes) or "-"
        print(f"GPU {key[0]}: {summary}; wasted {det.wasted_gpu_s:.0f} GPU-s", flush=True)
    if writer is not None:
        print(f"trace: {args.output} ({writer.ticks} ticks)", flush=True)
    # README "Exit codes": Ctrl-C or SIGTERM is 130, the summary above printed all the same
    return EXIT_INTERRUPTED if reason == "interrupted" or flags.interrupted_late() else EXIT_OK


def _show(tick: Tick, verdicts: list[Verdict], color: bool) -> None:
    for v in verdicts:
        g = next((x for x in tick.gpus if x.index == v.index and x.uuid == v.uuid), None)
        util = f"{g.util_ratio:.0%}" if g and g.util_ratio is not None else "-"
        mem = (
            f"{g.mem_used_bytes / g.mem_total_bytes:.0%}"
            if g and g.mem_used_bytes is not None and g.mem_total_bytes
            else "-"
        )
        ev = v.evidence
        duty = f"{ev.duty_cycle:.0%}" if ev.duty_cycle is not None else "-"
        cpu = f"{ev.job_cpu_cores:.1f}c" if ev.job_cpu_cores is not None else "-"
        state = v.state.upper() if v.state == "starved" else v.state
        text = f"{state:<14}"
        if color:
            text = f"\033[{_COLORS.get(v.state, '0')}m{text}\033[0m"
        jobs = " ".join(f"job {j.job_id}" + (f" ({j.user})" if j.user else "") for j in g.jobs) if g else ""
        jobs = printable(jobs)  # from job files and schedulers: no terminal escapes
        gpu = str(v.index) if g is None or g.mig is None else f"{v.index}/{g.mig}"  # GPU/MIG instance
        if util == "-" and g is not None and g.gpm is not None and g.gpm.graphics_ratio is not None:
            util = f"{g.gpm.graphics_ratio:.0%}"  # a MIG instance: GPM's activity
        print(
            f"{tick.t_s:7.1f} {gpu:>3} {util:>5} {duty:>5} {mem:>5} {cpu:>7}  {text} "
            f"{v.cause or '-':<5} {v.confidence:4.2f} {tick.t_s - v.since_s:5.0f}s"
            + (f"  {jobs}" if jobs else ""),
            flush=True,
        )
