"""The flight recorder over a day: its size, and `gpumon analyze --from` over all of it.

    .venv/bin/python -m benchmarks.recorder_range [--gpus 8] [--hours 24] [--dir DIR] [--jobs N]

Records --hours of a simulated fleet of --gpus GPUs with `gpumon serve --speed max --duration ...
--record-dir DIR` (skipped when DIR already holds segments), then runs, as child processes,
`gpumon analyze --from DIR` over the whole recording and over a one-hour slice in its middle,
reporting wall time and peak RSS (the largest process, workers included). Goals (issue 16): the
recording at most 6 MB per GPU per day; analyzing 24 h of 8 GPUs within 60 s and 300 MB on a 2-core
machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpumon.trace.segments import list_segments

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = "starved-cpu,healthy,starved-io,stalled"


def run(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MB of the child and its children, stdout's first line."""
    start = time.monotonic()
    p = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))
    )
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}: {p.stderr[-1000:]}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak_kb / 1024, p.stdout.splitlines()[0] if p.stdout else ""


def iso(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--dir", help="the recording (made here when empty; default: a temporary one)")
    ap.add_argument("--jobs", type=int, default=None, help="analyze --jobs (default: its own)")
    args = ap.parse_args()
    if args.gpus < 4:  # one GPU per simulated scenario at least (gpumon's --simulate says the same)
        ap.error("--gpus: at least 4, one for each of the 4 simulated scenarios")
    directory = args.dir or tempfile.mkdtemp(prefix="gpumon-recording-")
    gpumon = [sys.executable, "-m", "gpumon"]
    if not list_segments(directory):
        wall, _, _ = run(
            [
                *gpumon,
                "serve",
                "--simulate",
                SCENARIOS,
                "--gpus",
                str(args.gpus),
                "--speed",
                "max",
                "--duration",
                str(args.hours * 3600),
                "--record-dir",
                directory,
                "--listen",
                "127.0.0.1:0",
            ]
        )
        print(f"recorded {args.hours:g} h of {args.gpus} simulated GPUs in {wall:.0f} s into {directory}")
    segments = list_segments(directory)
    size = sum(s.bytes for s in segments)
    print(
        f"{len(segments)} segments, {size / 1e6:.1f} MB: {size / 1e6 / args.gpus / (args.hours / 24):.2f} "
        "MB per GPU per day"
    )
    first = segments[0].start_unix_s
    until = first + args.hours * 3600 + 60
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    wall, rss, line = run(
        [*gpumon, "analyze", "--from", directory, "--since", iso(first - 60), "--until", iso(until), *jobs]
    )
    print(f"analyze all of it: {wall:.1f} s, peak RSS {rss:.0f} MB\n  {line}")
    middle = first + args.hours * 3600 / 2
    wall, _, line = run(
        [
            *gpumon,
            "analyze",
            "--from",
            directory,
            "--since",
            iso(middle),
            "--until",
            iso(middle + 3600),
            *jobs,
        ]
    )
    print(f"analyze one hour:  {wall:.1f} s\n  {line}")


if __name__ == "__main__":
    main()
