"""`gpumon analyze`: classify each GPU of a recorded trace and report why it waited."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpumon.cli import flags
from gpumon.config.settings import Setting, SettingError, Spec
from gpumon.core.errors import EXIT_OK, UsageError
from gpumon.core.terminal import printable

JOBS = Setting(
    "jobs",
    int,
    None,
    Spec(
        "processes sharing the GPUs of a long range (default: one per CPU, at most 8)",
        "--jobs",
        metavar="N",
        minimum=1,
        maximum=64,
    ),
)
"""Each process reads the whole range for its share of the GPUs (and no more are started than
the range has GPUs): 64 is more than any node's GPUs that are not MIG instances of one board.
Only a bound: 10**6 was taken, and a trace naming 4,096 GPUs forked 4,096 processes."""


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "analyze", parents=[common], help="classify each GPU of a recorded trace and report why it waited"
    )
    s.add_argument(
        "trace",
        metavar="TRACE",
        nargs="?",
        help="a trace written by 'gpumon record' (or one recorder segment)",
    )
    r = s.add_argument_group("a range of the daemon's recording (docs/recorder.md)")
    r.add_argument(
        "--from",
        dest="directory",
        metavar="DIR",
        help="the recorder's directory (record_dir: /var/lib/gpumon/recordings under the systemd unit)",
    )
    r.add_argument(
        "--since",
        type=flags.time_point,
        metavar="TIME",
        help="from this time: ISO 8601 (2026-11-30T02:00, local time unless a zone is given) or how long "
        "ago (90s, 30m, 2h, 1d); default: the start of the recording",
    )
    r.add_argument(
        "--until",
        type=flags.time_point,
        metavar="TIME",
        help="to this time, as --since (default: the recording's end, even one stamped ahead of the "
        "wall clock by a simulation at --speed)",
    )
    r.add_argument(
        "--jobs",
        type=int,  # its range is checked with --from (a --jobs 0 without it says to use --from)
        default=None,
        metavar="N",
        help=f"{JOBS.spec.help}; {JOBS.describe_range()}",
    )
    r.add_argument(
        "--gpu",
        type=_gpu_list,
        metavar="N[,N...]",
        help="only these GPU indices (with --from)",
    )
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
    from gpumon.analyze.trace_report import analyze, analyze_range, render_text, render_warnings, to_json
    from gpumon.analyze.truth import compare_truth, read_truth

    th = flags.thresholds(args)
    if (args.trace is None) == (args.directory is None):
        raise UsageError("name a TRACE file, or a recorder's directory with --from DIR (not both)")
    if args.directory is None and any(x is not None for x in (args.since, args.until, args.gpu, args.jobs)):
        # (`is not None`: --since 1970-01-01T00:00Z is 0.0, --jobs 0 is 0: both were passed over)
        raise UsageError(
            "--since, --until, --gpu and --jobs select from and read a recording: use them with --from DIR"
        )
    if args.directory is not None and (args.plot or args.truth):
        raise UsageError("--plot and --truth take one TRACE file (`gpumon trace convert` can cut one)")
    windows = read_truth(args.truth) if args.truth else None  # a bad file fails before the work
    if args.plot:
        from gpumon.analyze.plot import require_matplotlib

        require_matplotlib()
    if args.directory is not None:
        import math

        until = args.until if args.until is not None else math.inf
        since = args.since if args.since is not None else 0.0
        try:
            jobs = JOBS.parse(args.jobs) if args.jobs is not None else min(8, os.cpu_count() or 1)
        except SettingError as e:
            raise UsageError(f"--jobs: {e}") from None
        if until <= since:  # a bad pair of flags (exit 2), not a bad recording (it was exit 4)
            raise UsageError(
                "--until must be after --since" if args.since is not None else "--until must be after 1970"
            )
        result = analyze_range(args.directory, since, until, args.gpu, th, jobs=jobs)
    else:
        # streamed unless a picture or the truth needs every verdict whole: memory grows with the
        # output (--json's rows), not with the ticks read
        keep = "all" if args.plot or args.truth else ("rows" if args.json else "none")
        result = analyze(args.trace, th, keep=keep)
    if args.plot:
        from gpumon.analyze.plot import plot

        plot(result, args.plot)
    truth = compare_truth(result, windows) if windows is not None else None
    if args.json:
        doc = to_json(result)
        if truth is not None:
            doc["truth"] = {"file": args.truth, **truth.__dict__, "agreement": round(truth.agreement, 4)}
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(printable(render_text(result)))  # names and jobs from the trace: no terminal escapes
        if result.warnings:
            print(printable(render_warnings(result)), file=sys.stderr)
        if truth is not None:
            print(truth.render(args.truth))
        if args.plot:
            print(f"plot: {args.plot}")
    return EXIT_OK


def _gpu_list(text: str) -> frozenset[int]:
    try:
        found = frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0 or 0,3; got {text!r}") from None
    if any(i < 0 for i in found):
        raise argparse.ArgumentTypeError(f"GPU indices are 0 or more, got {text!r}")
    return found


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
