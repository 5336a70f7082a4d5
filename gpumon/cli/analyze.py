"""`gpumon analyze`: classify each GPU of a recorded trace and report why it waited."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpumon.cli import flags
from gpumon.errors import EXIT_OK


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
    s.add_argument("--plot", metavar="FILE.png", type=_png_path, help="also draw a timeline to this PNG file")
    s.add_argument(
        "--truth",
        metavar="FILE",
        help="ground truth from `gpumon bench --truth`: how well the detector agreed",
    )
    flags.add_threshold(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.analysis import analyze, compare_truth, read_truth, render_text, to_json

    th = flags.thresholds(args)
    windows = read_truth(args.truth) if args.truth else None  # a bad file fails before the work
    if args.plot:
        from gpumon.plot import require_matplotlib

        require_matplotlib()
    result = analyze(args.trace, th)
    if args.plot:
        from gpumon.plot import plot

        plot(result, args.plot)
    truth = compare_truth(result, windows) if windows is not None else None
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


def _png_path(text: str) -> str:
    """--plot names the PNG file to write, exactly (matplotlib would add .png to a name without
    one, and write into a name that is a directory's)."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory: name the .png file to write")
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"must name a .png file, got {text!r}")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{parent}: no such directory")
    return text
