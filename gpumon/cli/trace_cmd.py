"""`gpumon trace convert IN OUT`: between trace format versions 1, 2 and 3 (docs/trace-format.md)."""

from __future__ import annotations

import argparse
import os
import sys

from gpumon.core.errors import EXIT_OK, OutputError
from gpumon.core.terminal import printable


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser("trace", parents=[common], help="convert a trace between format versions 1, 2 and 3")
    actions = s.add_subparsers(dest="trace_action", metavar="ACTION", required=True)
    c = actions.add_parser("convert", parents=[common], help="rewrite a trace in another format version")
    c.add_argument("input", metavar="IN", help="a trace, any version (a daemon's segment too)")
    c.add_argument("output", metavar="OUT", help="the trace to write")
    c.add_argument(
        "--to",
        type=int,
        choices=[1, 2, 3],
        default=None,
        help="the version to write (default: 1 for an OUT ending in .jsonl, else 3)",
    )
    c.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.core.model import Tick
    from gpumon.trace.reader import iter_trace
    from gpumon.trace.writer import open_writer, version_for

    if (
        os.path.exists(args.output)
        and os.path.exists(args.input)
        and os.path.samefile(args.input, args.output)
    ):
        raise OutputError(f"{args.output}: the same file as IN: write the conversion elsewhere")
    version = version_for(args.output, args.to)
    warnings: list[str] = []
    items = iter_trace(args.input, warnings)
    header = next(items)
    assert not isinstance(header, Tick)
    writer = open_writer(args.output, header, version, force=args.force)
    end = None
    last = None
    try:
        for item in items:
            if isinstance(item, Tick):
                writer.write_tick(item)
                last = item.t_s
            else:
                end = item
    except BaseException:
        writer.close(last, None)  # what was converted stays readable; the error says where it stopped
        raise
    # the end record as the format has it (a number or null, a word), whatever IN's held
    end_t = end.get("t_s") if end else None
    end_t = end_t if type(end_t) in (int, float) else last
    reason = end.get("reason") if end else None
    reason = reason if isinstance(reason, str) and reason.isprintable() and len(reason) <= 64 else "converted"
    writer.close(end_t, reason if end else None)
    for w in warnings:  # as every gpumon warning is said (a name from IN shown without its escapes)
        print(printable(f"gpumon: warning: {w}").replace("\n", "?"), file=sys.stderr)
    note = "" if end else " (IN had no end record: OUT has none either)"
    print(
        f"gpumon: {args.input} -> {args.output}: {writer.ticks} ticks, version {version}, "
        f"{os.path.getsize(args.output)} bytes{note}",
        file=sys.stderr,
    )
    return EXIT_OK
