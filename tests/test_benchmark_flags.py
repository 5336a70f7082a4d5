"""Benchmarks refuse what they cannot run or judge in one line (exit 2), before they start a daemon or
a job: fewer GPUs than simulated scenarios (they used to end in a traceback or, through a daemon
that refused, in "the daemon never held 11 minutes of samples"), and a real job's run too short to
judge (bench_onset, sync_boundary)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.parametrize(
    "argv",
    [
        ["soak", "--gpus", "2"],
        ["serve_load", "--gpus", "8", "2"],
        ["range_api", "--gpus", "3"],
        ["recorder_range", "--gpus", "1"],
    ],
)
def test_fewer_gpus_than_scenarios_is_refused_in_one_line(argv: list[str]) -> None:
    last = refusal(argv)
    assert last.endswith("--gpus: at least 4, one for each of the 4 simulated scenarios"), last


def refusal(argv: list[str]) -> str:
    """Run `python -m benchmarks.ARGV[0] ARGV[1:]`, which must refuse (exit 2, no traceback): its
    last line on stderr."""
    p = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{argv[0]}", *argv[1:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    return p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench_onset", "--starved", "10"], "--starved: more than 11 s"),
        (["bench_onset", "--cases", "starved-cpu,nope"], "--cases: unknown 'nope' (known: starved-cpu,"),
        (["bench_onset", "--runs", "0"], "--runs: at least 1"),
        (["sync_boundary", "--duration", "8"], "--duration: more than 11 s"),
        (["sync_boundary", "--ranks", "1"], "--ranks: at least 2"),
        (["sync_boundary", "--passes", "1,x"], "--passes: whole numbers separated by commas"),
        (["sync_boundary", "--passes", "0"], "--passes: each at least 1"),
    ],
)
def test_a_real_job_benchmark_refuses_a_run_it_could_not_judge_in_one_line(
    argv: list[str], said: str
) -> None:
    """bench_onset and sync_boundary train real jobs for minutes; a starved part or a run shorter than
    a window and its confirmation left nothing judged, and they printed 0% agreement (or nothing)
    as if measured. They now refuse it before any job starts."""
    assert said in refusal(argv)


def test_a_real_gpu_pair_of_missing_files_is_refused_in_one_line(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("")
    last = refusal(["advice", "--pair", str(trace), str(tmp_path / "truth.jsonl"), str(trace)])
    assert last.endswith(f"--pair: {tmp_path / 'truth.jsonl'}: no such file"), last


def test_a_real_gpu_pair_with_a_line_that_is_no_truth_window_names_it(tmp_path) -> None:
    truth = tmp_path / "truth.jsonl"
    truth.write_text('{"pipeline": "starved-cpu", "steps_per_s": 6.1}\n\n["not", "a", "window"]\n')
    last = refusal(["advice", "--pair", str(truth), str(truth), str(truth)])
    assert last.endswith(f"--pair: {truth}:3: not a truth window (bench --truth writes a JSON object a line)")


def test_a_real_gpu_pair_whose_trace_gpumon_cannot_read_says_so_with_its_exit_code(tmp_path) -> None:
    trace, truth = tmp_path / "trace.jsonl", tmp_path / "truth.jsonl"
    trace.write_text("")
    truth.write_text('{"pipeline": "starved-cpu", "steps_per_s": 6.1}\n' * 2)
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.advice", "--pair", str(trace), str(truth), str(truth)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 4, p.stderr  # gpumon's exit code for a trace it cannot read
    assert p.stderr.strip() == f"advice: {trace}: empty file: not a gpumon trace"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["serve_idle", "--scenarios", "idle,nope"], "--scenarios: unknown scenario 'nope'; known: healthy,"),
        (["serve_idle", "--real", "--scenarios", "idle"], "--scenarios: the stand-in's; not with --real"),
    ],
)
def test_serve_idle_refuses_scenarios_it_cannot_run_in_one_line(argv: list[str], said: str) -> None:
    assert said in refusal(argv)
