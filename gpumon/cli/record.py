"""`gpumon record`: sample GPUs and host into a trace file (docs/trace-format.md)."""

from __future__ import annotations

import argparse
import sys

from gpumon.cli import flags
from gpumon.collect.pipeline import Pipeline
from gpumon.core.clock import SinceStart
from gpumon.core.errors import EXIT_INTERRUPTED, EXIT_OK


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser("record", parents=[common], help="sample GPUs and host into a trace file")
    s.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    flags.add_duration(s)
    flags.add_interval(s)
    s.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    flags.add_trace_format(s)
    flags.add_source_flags(s, speed=True)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.trace.records import make_header
    from gpumon.trace.writer import open_writer, version_for

    spec = flags.source_spec(args)
    clock = SinceStart(flags.clock_for(args, spec))
    pipeline = Pipeline(spec, clock, interval_s=args.interval_s, attribution=flags.attribution())
    try:
        version = version_for(args.output, args.trace_format)
        writer = open_writer(
            args.output,
            make_header(pipeline.description.to_json(), args.interval_s),
            version,
            force=args.force,
        )
    except BaseException:
        pipeline.close()
        raise
    pipeline.on_tick(writer.write_tick)
    until = f"for {args.duration:g} s" if args.duration else "until interrupted (Ctrl-C)"
    print(
        f"gpumon: recording {pipeline.description.phrase()} every {args.interval_s:g} s {until} "
        f"to {args.output} (trace format {version})",
        file=sys.stderr,
    )
    reason = "duration"
    try:
        result = flags.run_until_done(pipeline, args.duration)
        if result.interrupted:
            reason = "interrupted"
        elif pipeline.sources.exhausted is not None and pipeline.sources.exhausted():
            reason = "replay-ended"
    finally:
        last = pipeline.sampler.last_tick
        writer.finish(reason)  # at the last tick written: one still being taken is dropped
        pipeline.close()
    gpus = last.gpus if last else ()
    print(
        f"gpumon: wrote {writer.ticks} ticks of {len(gpus)} GPU(s) to {args.output} ({reason})",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED if reason == "interrupted" or flags.interrupted_late() else EXIT_OK
