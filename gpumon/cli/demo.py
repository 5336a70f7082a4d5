"""`gpumon demo`: the product end to end without a GPU: a real Keras job, fed then starved."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpumon.cli import flags


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "demo",
        parents=[common],
        help="the product end to end without a GPU: a real Keras job, fed then starved",
    )
    flags.add_setting(
        s,
        flags.DURATION,
        flag="--phase-seconds",
        dest="phase_seconds",
        default=60.0,
        help="length of the fed and of the starved phase (default 60 s)",
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:9877",
        metavar="HOST:PORT",
        help="where the exporter serves meanwhile (default 127.0.0.1:9877; :0 for any free port)",
    )
    s.add_argument(
        "--out",
        default="gpumon-demo",
        metavar="DIR",
        help="trace, ground truth and plot (default gpumon-demo/)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.demo import run_demo

    return run_demo(args.phase_seconds, args.listen, Path(args.out))
