"""Real training jobs (`gpumon bench`, Keras on torch's CPU build) driving simulated GPUs, recorded
and judged against the job's own ground truth.

The detector is judged on the seconds the job's steps ran (the truth file's windows say when),
after its settling time (the window and the confirmation) from the job's first step: never on a
whole recording, whose start (imports, data generation: 20 s on a cold machine) and tail (the
recorder after the job) read `idle` whatever the job did.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gpumon.analyze.trace_report import Analysis

from .conftest import ROOT


def require_bench() -> None:
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None:
        pytest.fail("the bench extra is missing: scripts/test.sh installs keras and torch==2.13.0 (CPU)")


def gpumon(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.Popen[str]:
    """`gpumon ARGS` in a session of its own: what it starts (a bench's loader workers, the demo's
    daemon and jobs) can be ended with it (finish)."""
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "gpumon", *args],
        cwd=ROOT,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kw,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """Its stdout and stderr once it ends; one that has not ended after `timeout_s` fails the test,
    and it and everything it started are killed (a hung job left running slows every later test)."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"{proc.args!r} did not end within {timeout_s:g} s: {err[-2000:]}") from None


def truth_windows(truth: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in truth.read_text().splitlines() if line.strip()]


def last_tick_unix(trace: Path) -> float | None:
    """The wall-clock time of the newest tick a version 1 trace holds so far (it is flushed line by
    line while the recorder runs)."""
    try:
        lines = trace.read_bytes().splitlines()
    except OSError:
        return None
    if not lines:
        return None
    started = json.loads(lines[0]).get("started_unix_s")
    for raw in reversed(lines[1:]):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # the line being written
        if rec.get("type") == "tick":
            return float(started) + float(rec["t_s"])
    return None


def wait_until_recorded(trace: Path, unix_s: float, recorder: subprocess.Popen[str]) -> None:
    """Until the recording holds a tick at or after `unix_s` (the job's last step has left the
    detector's recent samples), or the recorder has stopped."""
    while recorder.poll() is None:
        newest = last_tick_unix(trace)
        if newest is not None and newest >= unix_s:
            return
        time.sleep(0.2)


def record_jobs(
    tmp_path: Path, jobs: list[tuple[str, ...]], beside: list[subprocess.Popen[str]] | None = None
) -> tuple[Path, Path]:
    """Record the GPUs driven by each `gpumon bench ARGS` in turn (one, or one per rank); returns
    the trace (version 1) and the jobs' ground truth."""
    drive, truth, trace = tmp_path / "drive", tmp_path / "truth.jsonl", tmp_path / "trace.jsonl"
    drive.touch()  # the recorder starts first and waits for the job's steps
    recorder = gpumon("record", "--drive", str(drive), "--duration", "900", "-o", str(trace))
    try:
        for args in jobs:
            job = gpumon("bench", *args, "--drive", str(drive), "--truth", str(truth), "--quiet")
            _, err = finish(job, 300)
            assert job.returncode == 0, err
            assert "Traceback" not in err, err  # e.g. each loader worker's, at the end of fit
            with (tmp_path / "bench.err").open("a") as f:
                f.write(err)
        ended = max(float(w["end_unix_s"]) for w in truth_windows(truth))  # type: ignore[arg-type]
        wait_until_recorded(trace, ended + 2.0, recorder)
    finally:
        recorder.terminate()
        _, err = recorder.communicate(timeout=120)
    assert recorder.returncode == 130 and "(interrupted)" in err, err  # SIGTERM: stopped, trace kept
    return trace, truth


def steps_span(a: Analysis, truth: Path, gpu: int | None = None) -> tuple[float, float]:
    """When the job's steps ran (on GPU `gpu`'s rank, when given), on the analysis's timeline."""
    offset = a.unix(0.0)
    assert offset is not None
    windows = [w for w in truth_windows(truth) if gpu is None or w.get("gpu") == gpu]
    assert windows, f"no truth windows for GPU {gpu}"
    first = min(float(w["start_unix_s"]) for w in windows)  # type: ignore[arg-type]
    last = max(float(w["end_unix_s"]) for w in windows)  # type: ignore[arg-type]
    return first - offset, last - offset


def labels_while_training(
    a: Analysis,
    truth: Path,
    gpu: int | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
) -> Counter[str]:
    """Seconds by label on GPU `gpu` (the only one when None) while the job's steps ran, from the
    detector's settling time after the first step (or after `since_s`, on the analysis's timeline)."""
    first, last = steps_span(a, truth, gpu)
    settle = a.thresholds.window_s + a.thresholds.confirm_s
    begin = max(first, since_s if since_s is not None else first) + settle
    end = last if until_s is None else min(last, until_s)
    (report,) = [g for g in a.gpus if gpu is None or g.index == gpu]
    return Counter(v.label for v in report.verdicts if begin <= v.t_s <= end)


def main_label_while_training(a: Analysis, truth: Path, gpu: int | None = None) -> str:
    seen = labels_while_training(a, truth, gpu)
    assert seen, "no verdict while the job trained"
    return seen.most_common(1)[0][0]


def all_but_one(hit: int, of: int) -> bool:
    """Window by window, at most one of several truth windows may read otherwise: each is decided
    by the majority of its few settled verdicts, on two cores shared with the rest of the suite
    (a loader's slice of them moves with whatever else runs). The job's label and its episodes
    are judged whole, by the tests, besides."""
    return of >= 1 and hit >= max(1, of - 1)
