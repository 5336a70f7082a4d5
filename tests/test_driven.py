"""The drive file: a real job's steps make simulated GPUs busy, one per rank of a data-parallel job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.core.clock import VirtualClock
from gpumon.sim.driven import SPIN_POWER_RATIO, DrivenFleet, DrivenGpu

from .conftest import ROOT


def fleet_with(tmp_path: Path, lines: list[str]) -> tuple[DrivenFleet, float]:
    """A fleet reading a drive file whose step times are given relative to the fleet's time 0."""
    path = tmp_path / "drive"
    path.write_text("")
    fleet = DrivenFleet(str(path), VirtualClock(0.0), 1 / 6)
    t0 = fleet._t0_mono
    out = []
    for line in lines:
        parts = line.split()
        if line.startswith("#") or not parts[0][0].isdigit():
            out.append(line)
            continue
        a = f"{float(parts[0]) + t0:.6f}"
        b = "-" if parts[1] == "-" else f"{float(parts[1]) + t0:.6f}"
        out.append(" ".join([a, b, *parts[2:]]))
    path.write_text("\n".join(out) + "\n")
    return fleet, t0


def test_a_single_job_drives_gpu_0_as_before(tmp_path: Path) -> None:
    fleet, _ = fleet_with(tmp_path, [f"# gpumon-drive v1 pid={os.getpid()}", "1.0 1.5", "2.0 2.5"])
    (gpu,) = fleet.gpus
    assert gpu.pid == os.getpid() and gpu.phase(2.0).has_job
    assert gpu.busy_share(1.0, 3.0) == pytest.approx(0.5)


def test_each_rank_drives_its_own_gpu_and_gpus_appear_as_ranks_do(tmp_path: Path) -> None:
    fleet, t0 = fleet_with(
        tmp_path,
        [
            f"# gpumon-drive v2 pid={os.getpid()} rank=1",
            "0.0 0.8 1 sync",  # rank 1 spins in the collective (waiting for rank 0's input)
            "0.8 1.0 1",
            f"# gpumon-drive v2 pid={os.getpid()} rank=0",
            "0.0 0.8 0 sync",
            "1.0 1.1 0",
            "garbage line",
            "1.2 1.3 99 sync",  # a rank beyond the limit is ignored, never a GPU
        ],
    )
    gpus = fleet.gpus
    assert [g.index for g in gpus] == [0, 1]
    spinning = gpus[1]
    assert isinstance(spinning, DrivenGpu)
    assert spinning.busy_share(0.0, 1.0) == pytest.approx(1.0)  # utilization reads busy throughout
    # ...at near-idle power while it spins, full power while it computes
    limit = spinning.model.power_limit_w
    assert spinning.power_w(0.8) / limit == pytest.approx(SPIN_POWER_RATIO, abs=0.01)
    computing = DrivenGpu(2, fleet, 1 / 6)
    computing.add(0.0, 1.0, sync=False)
    assert computing.power_w(1.0) / limit > 0.8
    # a rank whose line arrives later adds a GPU then
    with open(fleet.path, "a") as f:
        f.write(f"# gpumon-drive v2 pid={os.getpid()} rank=2\n{t0 + 2:.6f} {t0 + 2.5:.6f} 2\n")
    assert len(fleet.gpus) == 3 and fleet.gpus[2].busy_share(2.0, 3.0) == pytest.approx(0.5)


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    fleet, t0 = fleet_with(tmp_path, [f"# gpumon-drive v2 pid={os.getpid()} rank=0"])
    with open(fleet.path, "a") as f:
        f.write(f"{t0 + 1:.6f} {t0 + 1.5:.6f} 0 sy")
    assert fleet.gpus[0].busy_share(0.0, 2.0) == 0.0
    with open(fleet.path, "a") as f:
        f.write("nc\n")
    gpu = fleet.gpus[0]
    assert isinstance(gpu, DrivenGpu) and gpu.busy_share(0.0, 2.0) == pytest.approx(0.25)
    assert gpu._sync_share(1.0, 1.5) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpus", "2", "--straggler", "2"], "rank 2 is not one of the 2 ranks"),
        (["--gpus", "2", "--straggler", "x:starved-cpu"], "is not a rank number"),
        (["--gpus", "2", "--straggler", "1:fed"], "pipeline must be one of"),
        (["--straggler", "0"], "--straggler needs --gpus 2 or more"),
        (["--gpus", "0"], "--gpus must be between 1 and 64"),
        (["--gpus", "2", "--starve-after", "5"], "--starve-after is not supported with --gpus"),
        (["--gpus", "2", "--pipeline", "jpeg"], "every rank is fed"),
        (["--starve-after", "90", "--pipeline", "jpeg"], "--starve-after must be between 0 and --duration"),
        (["--starve-after", "5"], "--starve-after needs a starving --pipeline"),
    ],
)
def test_bench_flags_are_checked_in_one_line(args: list[str], says: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "bench", "--duration", "60", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_an_interval_still_going_on_counts_as_busy_when_its_sample_is_read(tmp_path: Path) -> None:
    """A driver sample is read once, as soon as its period ends: a wait in the collective that
    began before and ends after must already count (found: a rank waiting 0.4 s for a straggler
    read as gaps, since its line came only at the end, after the sample was taken)."""
    fleet, t0 = fleet_with(tmp_path, [f"# gpumon-drive v2 pid={os.getpid()} rank=0", "1.0 - 0 sync"])
    gpu = fleet.gpus[0]
    assert isinstance(gpu, DrivenGpu)
    assert gpu.busy_share(1.0, 1.5) == pytest.approx(1.0) and gpu._sync_share(1.0, 1.5) == pytest.approx(1.0)
    assert gpu.busy_share(0.5, 1.0) == pytest.approx(0.0, abs=1e-5)
    with open(fleet.path, "a") as f:  # it ends; the compute that follows begins
        f.write(f"{t0 + 1:.6f} {t0 + 1.6:.6f} 0 sync\n{t0 + 1.6:.6f} - 0\n")
    gpu = fleet.gpus[0]
    assert isinstance(gpu, DrivenGpu)
    assert gpu.busy_share(1.0, 2.0) == pytest.approx(1.0)
    assert gpu._sync_share(1.0, 2.0) == pytest.approx(0.6)


def test_a_data_parallel_job_announces_its_gpus_before_its_ranks_start(tmp_path: Path) -> None:
    """GPUs exist before a job runs on them: a rank's start-up (imports, process group) is then
    seen as start-up, not as a job already running that does not compute (found: GPU 1 of a fed
    2-rank run read starved-cpu for its first 5 s)."""
    fleet, _ = fleet_with(tmp_path, ["# gpumon-drive v2 ranks=3"])
    gpus = fleet.gpus
    assert len(gpus) == 3 and not any(g.phase(0.0).has_job for g in gpus)
    with open(fleet.path, "a") as f:
        f.write(f"# gpumon-drive v2 pid={os.getpid()} rank=2\n")
    assert fleet.gpus[2].phase(1.0).has_job and not fleet.gpus[1].phase(1.0).has_job
