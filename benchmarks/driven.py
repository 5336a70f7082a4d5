"""What the real-job benchmarks share: record the simulated GPUs a `gpumon bench` job drives."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from gpumon.detect.thresholds import Thresholds

ROOT = Path(__file__).resolve().parent.parent


def gpumon(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpumon", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def record_bench(folder: Path, *bench: str) -> tuple[Path, Path, Path]:
    """Run `gpumon bench BENCH --drive --truth` under `gpumon record --drive`, which starts first
    and stops a few seconds after the job (its last steps must reach the recorder). Returns the
    trace, the drive file and the job's truth."""
    drive, truth, trace = folder / "drive", folder / "truth.jsonl", folder / "trace.jsonl"
    drive.touch()
    recorder = gpumon("record", "--drive", str(drive), "--duration", "600", "-o", str(trace))
    job = gpumon("bench", *bench, "--drive", str(drive), "--truth", str(truth), "--quiet")
    _, err = job.communicate(timeout=600)
    if job.returncode != 0:
        recorder.terminate()
        sys.exit(f"bench failed: {err[-800:]}")
    time.sleep(3)
    recorder.terminate()
    recorder.communicate(timeout=60)
    return trace, drive, truth


def require_judged(ap: argparse.ArgumentParser, flag: str, seconds: float, after: str) -> None:
    """Refuse (argparse's one line, exit 2) a span no longer than the detector's window and its
    confirmation: none of its seconds would be judged, and a benchmark run for minutes would report
    0% or nothing as if it had measured it."""
    th = Thresholds()
    least = th.window_s + th.confirm_s
    if seconds <= least:
        ap.error(
            f"{flag}: more than {least:g} s (a window and the confirmation after {after} come before "
            "the first second judged)"
        )
