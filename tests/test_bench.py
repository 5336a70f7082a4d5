"""End to end with a real Keras job: its train steps drive a simulated GPU, its real processes are
read from the host, and the detector is held to the job's own measured ground truth."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumon.analysis import analyze, compare_truth

from .conftest import ROOT

PHASE_S = 19


def gpumon(*args: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpumon", *args],
        cwd=ROOT,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def record_bench(tmp_path: Path, pipelines: tuple[str, ...], seconds: int) -> tuple[Path, Path]:
    """Record a GPU driven by `gpumon bench` while it runs each pipeline in turn; returns the
    trace and the job's ground truth."""
    drive, truth, trace = tmp_path / "drive", tmp_path / "truth.jsonl", tmp_path / "trace.jsonl"
    drive.touch()  # the recorder starts first and waits for the job's steps
    recorder = gpumon(
        "record", "--drive", str(drive), "--duration", str(len(pipelines) * seconds + 6), "-o", str(trace)
    )
    for pipeline in pipelines:
        job = gpumon(
            "bench",
            "--pipeline",
            pipeline,
            "--duration",
            str(seconds),
            "--drive",
            str(drive),
            "--truth",
            str(truth),
            "--quiet",
        )
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err
    _, err = recorder.communicate(timeout=120)
    assert recorder.returncode == 0, err
    return trace, truth


def test_a_starved_keras_job_is_flagged_cpu_and_a_fed_one_is_not(tmp_path: Path) -> None:
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None:
        pytest.fail("the bench extra is missing: scripts/test.sh installs keras and torch==2.13.0 (CPU)")
    start = time.monotonic()
    trace, truth = record_bench(tmp_path, ("fed", "starved-cpu"), PHASE_S)
    assert time.monotonic() - start <= 60, "the end-to-end test must stay within a minute"

    result = analyze(str(trace))
    (gpu,) = result.gpus
    assert gpu.name.endswith("(simulated)")
    labels = [e.label for e in gpu.episodes if e.state != "unknown"]
    assert labels[-1] == "starved-cpu", labels
    switch = next(e.start_s for e in gpu.episodes if e.state == "starved")  # the starved job began
    fed = [v.label for v in gpu.verdicts if 12 <= v.t_s < switch]
    assert fed and not any(label.startswith("starved") for label in fed), "the fed phase was flagged"
    report = compare_truth(result, str(truth))
    # in a one-minute run, windows inside the detector's settling time after each start are not judged
    assert report.starved_windows >= 1 and report.starved_flagged == report.starved_windows
    assert report.agreement == 1.0
    windows = [json.loads(line) for line in truth.read_text().splitlines()]
    assert {w["pipeline"] for w in windows} == {"fed", "starved-cpu"}
    assert all(w["band"] != "highly" for w in windows if w["pipeline"] == "fed"), "the fed job was not fed"


def test_demo_flags_the_starved_phase_and_not_the_fed_one(tmp_path: Path) -> None:
    """The README's run command on a machine without a GPU, with shorter phases."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "demo",
            "--phase-seconds",
            "18",
            "--listen",
            "127.0.0.1:0",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "SIMULATED GPU" in out and "/metrics" in out
    fed = out.split("== phase fed", 1)[1].split("== phase starved-cpu", 1)[0]
    starved = out.split("== phase starved-cpu", 1)[1].split("gpumon analyze", 1)[0]
    assert "STARVED" not in fed, fed
    assert "STARVED-CPU" in starved, starved
    report = out.split("gpumon analyze", 1)[1]
    assert "starved-cpu" in report  # an episode with its cause (the job's own wind-down may follow it)
    assert (tmp_path / "demo.png").exists() and (tmp_path / "trace.jsonl").exists()


def test_a_storage_starved_keras_job_is_flagged_io(tmp_path: Path) -> None:
    """The starved-io pipeline reads its files from storage (page cache dropped) at ~60 MB/s."""
    trace, truth = record_bench(tmp_path, ("starved-io",), 20)
    result = analyze(str(trace))
    (gpu,) = result.gpus
    assert gpu.main_label == "starved-io", dict(gpu.seconds_by_label)
    report = compare_truth(result, str(truth))
    assert report.starved_windows >= 1 and report.agreement == 1.0
