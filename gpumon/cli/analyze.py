"""`gpumon analyze`: classify each GPU of a recorded trace and report why it waited."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.cli import flags
from gpumon.errors import EXIT_OK, UsageError


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "analyze", parents=[common], help="classify each GPU of a recorded trace and report why it waited"
    )
    s.add_argument("trace", metavar="TRACE", help="a trace written by 'gpumon record'")
    s.add_argument(
        "--json", action="store_true", help="per-window verdicts and episodes as JSON (docs/detector.md)"
    )
    s.add_argument("--plot", metavar="FILE.png", help="also draw a timeline to this PNG file")
    s.add_argument(
        "--truth",
        metavar="FILE",
        help="ground truth from `gpumon bench --truth`: how well the detector agreed",
    )
    flags.add_threshold(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.analysis import analyze, render_text, to_json

    th = flags.thresholds(args)
    result = analyze(args.trace, th)
    if not result.trace.ticks:
        raise UsageError(f"{args.trace}: the trace holds no ticks to analyze")
    if args.plot:
        from gpumon.plot import plot

        plot(result, args.plot)
    truth = None
    if args.truth:
        from gpumon.analysis import compare_truth

        truth = compare_truth(result, args.truth)
    if args.json:
        doc = to_json(result)
        if truth is not None:
            doc["truth"] = {"file": args.truth, **truth.__dict__, "agreement": round(truth.agreement, 4)}
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(render_text(result))
        if truth is not None:
            print(truth.render(args.truth))
        if args.plot:
            print(f"plot: {args.plot}")
    return EXIT_OK
