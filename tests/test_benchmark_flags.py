"""The benchmarks that simulate one GPU per scenario refuse fewer GPUs than scenarios in one line,
before they start a daemon (they used to end in a traceback or, through a daemon that refused,
in "the daemon never held 11 minutes of samples")."""

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
    p = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{argv[0]}", *argv[1:]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.endswith("--gpus: at least 4, one for each of the 4 simulated scenarios"), p.stderr
