"""The only traces this project has from a real driver (an H200, 2026-12-04, docs/gpu-check.md):
gpumon's reader and detector must keep reading them as what they were. Each holds the Keras bench
fed, then starved, with the bench's small model: a GPU idle ~95% of the time in both runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.analyze.trace_report import analyze
from gpumon.trace.reader import read_trace

from .conftest import ROOT

TRACES = sorted((ROOT / "docs" / "gpu-check").glob("2026-12-04-run*-trace.jsonl"))


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_a_real_h200_trace_reads_whole_with_gpm_on_every_tick_but_the_first(trace: Path) -> None:
    ticks = read_trace(str(trace)).ticks
    assert len(ticks) > 100
    assert {g.name for t in ticks for g in t.gpus} == {"NVIDIA H200"}
    with_gpm = [t.gpus[0].gpm is not None for t in ticks]
    assert not with_gpm[0] and all(with_gpm[1:]), "GPM needs a pair of samples: all but the first tick"
    assert all(len(t.gpus[0].util_history) >= 4 for t in ticks[1:]), "the driver's samples, 1/6 s apart"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_a_host_bound_job_on_a_real_gpu_is_flagged_and_its_loop_named(trace: Path) -> None:
    """The fed run trains at ~100 steps/s, its input ready, while the H200 idles ~95%: the training
    loop's own CPU work is the limit. gpumon flags it and says more loader workers would not help;
    neither job is read healthy, and the starved one is never `stalled` (its loader works)."""
    a = analyze(str(trace))
    episodes = [e for e in a.gpus[0].episodes if e.state != "unknown"]
    assert episodes[0].label == "idle" and episodes[0].job is None  # Keras importing, not on the GPU yet
    jobs = [e for e in episodes if e.job is not None]
    fed = jobs[0]
    assert fed.label == "starved-cpu", [e.label for e in episodes]
    assert "training process runs at" in fed.reason and "loader workers at most" in fed.reason
    fix = a.gpus[0].advice_for(fed)
    assert fix is not None and "more workers would not change it" in fix.line()
    assert not {e.label for e in episodes} & {"healthy", "stalled"}, [e.label for e in episodes]
    assert len({e.job for e in jobs}) == 2, "two jobs, one after the other"
