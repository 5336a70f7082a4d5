"""benchmarks/nvml_cost.py runs as the docs say, in each of its modes, on the stand-in: a handful
of ticks each, for its lines (no figure is asserted: speed lives in the benchmark). Its `--mig`
mode called the source's old name for activity sampling for days before anyone ran it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT


@pytest.mark.parametrize(
    ("flags", "lines"),
    [
        (
            ["--ticks", "5", "--repeats", "1", "--no-peers"],
            ["gpumon (GPM off) vs the floor: ", "on stand-in 1", "on stand-in 2", "gpumon with GPM"],
        ),
        (
            ["--mig", "2", "--ticks", "3", "--repeats", "1"],
            ["GPM, MIG at 5 Hz", "GPM off", "GPM, with MIG instances sampled 5 times a second, adds"],
        ),
    ],
)
def test_the_nvml_cost_benchmark_runs_in_each_mode(flags: list[str], lines: list[str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.nvml_cost", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for line in lines:
        assert line in p.stdout, p.stdout
