"""`gpumon bench`: a Keras training job, fed or starved on purpose (needs the bench extra)."""

from __future__ import annotations

import argparse
import sys

from gpumon.cli import flags
from gpumon.errors import EXIT_OK, MissingDependency


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "bench",
        parents=[common],
        help="a Keras training job, fed or starved on purpose (needs the bench extra)",
    )
    s.add_argument("--pipeline", choices=["fed", "starved-cpu", "starved-io"], default="fed")
    flags.add_setting(s, flags.DURATION, default=60.0, help="how long to train (default 60 s)")
    s.add_argument("--batch-size", type=int, default=64, metavar="N")
    s.add_argument(
        "--workers", type=int, default=2, metavar="N", help="loader processes for the fed pipeline"
    )
    s.add_argument("--drive", metavar="FILE", help="write each step's busy interval, for a simulated GPU")
    s.add_argument("--truth", metavar="FILE", help="write the labeled input-bound timeline (ground truth)")
    s.add_argument("--save", metavar="FILE.keras", help="save the trained (template) model")
    s.add_argument("--quiet", action="store_true", help="no Keras progress bar")
    s.add_argument(
        "--watch",
        nargs="?",
        const="",
        metavar="URL",
        help="gpumon's verdict in the training log (gpumon.integrations.keras): ask the daemon at URL "
        "(default $GPUMON_URL, else http://127.0.0.1:9877)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from gpumon.bench.job import BenchOptions
        from gpumon.bench.job import run as run_job
    except ImportError as e:
        raise MissingDependency(
            f"gpumon bench needs Keras 3 and a backend ({e.name} is missing): pip install "
            "'gpumon-datastall[bench]' torch (on machines without a GPU: torch==2.13.0, the CPU build)"
        ) from None
    result = run_job(
        BenchOptions(
            pipeline=args.pipeline,
            duration_s=args.duration,
            batch_size=args.batch_size,
            workers=args.workers,
            drive=args.drive,
            truth=args.truth,
            save=args.save,
            verbose=0 if args.quiet else 1,
            watch=args.watch,
        )
    )
    print(
        f"gpumon bench: {args.pipeline}: {result['steps']:.0f} steps in {result['seconds']:.0f} s "
        f"on {result['gpus']:.0f} device(s), batch {result['batch']:.0f}",
        file=sys.stderr,
    )
    return EXIT_OK
