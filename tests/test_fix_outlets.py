"""What a fix buys, where users see it: `gpumon analyze` (text and JSON), the state API, /metrics
(a few series per starved GPU, none for a fed one) and the training-log hook's lines."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpumon.analyze.trace_report import analyze, render_text, to_json
from gpumon.detect.remedies import Advice, Candidate, Kind, Limit, cannot
from gpumon.detect.vocabulary import Cause
from gpumon.integrations import Watch
from gpumon.serve.metrics import families
from gpumon.serve.snapshot import to_state_json
from gpumon.serve.textformat import render_text as render_exposition

from .conftest import gpumon
from .test_integrations import Stub, gpu, stub  # noqa: F401  (the stub daemon fixture)
from .test_serve import sample, simulated_daemon


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fix") / "t.jsonl"
    p = gpumon(
        "record",
        "--simulate",
        "starved-cpu,healthy,starved-host",
        "--speed",
        "max",
        "--duration",
        "45",
        "-o",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    return out


def test_analyze_names_the_change_its_speedup_and_says_nothing_for_a_fed_gpu(trace: Path) -> None:
    a = analyze(str(trace))
    starved, fed, host = a.gpus
    text = render_text(a)
    section = text.split("GPU 1 ")[0]
    fix = next(ln for ln in section.splitlines() if ln.startswith("  fix buys: "))
    assert fix.startswith(
        "  fix buys: raise loader workers (DataLoader(num_workers), PyDataset(workers)) 2 -> "
    )
    assert "x steps/s; beyond " in fix
    assert (
        "  fix buys: nothing on the input side: the GPU is the limit"
        in text.split("GPU 1 ")[1].split("GPU 2 ")[0]
    )
    assert "  fix buys: cannot predict what a fix buys (at most " in text.split("GPU 2 ")[1]
    doc = to_json(a)
    s, f, h = doc["gpus"]
    assert s["advice"]["kind"] == "predicted" and s["advice"]["best"]["workers"] > 2
    assert s["advice"]["best"]["speedup"] > 1.1 and s["advice"]["ceiling"] >= s["advice"]["best"]["speedup"]
    starved_episodes = [e for e in s["episodes"] if e["state"] == "starved"]
    assert starved_episodes and starved_episodes[-1]["advice"]["kind"] == "predicted"
    assert f["advice"] == {**f["advice"], "kind": "gpu-limit", "no_gain": True, "ceiling": None}
    assert h["advice"]["kind"] == "cannot-predict" and "host's counters" in h["advice"]["why"]
    assert starved.fix is not None and fed.fix is not None and host.fix is not None


def test_the_state_api_and_metrics_show_it_for_starved_gpus_only() -> None:
    d = simulated_daemon("starved-cpu,healthy,starved-host,idle", seconds=40)
    assert d.snapshot is not None
    state = to_state_json(d.snapshot, 0.0)
    starved, fed, host, idle = (g["advice"] for g in state["gpus"])
    assert (
        starved["kind"] == "predicted"
        and starved["ready"]
        and starved["line"].startswith("raise loader workers")
    )
    assert fed["kind"] == "gpu-limit" and fed["line"] == "nothing on the input side: the GPU is the limit"
    assert host["kind"] == "cannot-predict" and idle is None
    json.dumps(state)  # plain JSON all through
    text = d.render_metrics("")[0].decode()
    assert sample(text, "gpumon_gpu_input_speedup_ceiling", gpu="0") == pytest.approx(
        starved["ceiling"], abs=1e-3
    )
    assert sample(text, "gpumon_gpu_predicted_speedup", gpu="0", change="workers+1") > 1.0
    assert sample(text, "gpumon_gpu_predicted_speedup", gpu="0", change="recommended") > 1.1
    series = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_predicted_speedup{")]
    assert len(series) == 3 and all('gpu="0"' in ln for ln in series), series  # at most 3, starved GPUs only
    ceilings = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_input_speedup_ceiling{")]
    assert [('gpu="0"' in ln, 'gpu="2"' in ln) for ln in ceilings] == [(True, False), (False, True)], ceilings
    # a healthy GPU's advice, even a predicted one (a loader holding it under the fed line), has no
    # series: the speed-up series are a starved GPU's (docs/metrics.md)
    snap = d.snapshot
    key0, key1 = ((g.index, g.uuid) for g in snap.tick.gpus[:2])
    assert snap.verdict_for(*key1) is not None and snap.verdict_for(*key1).state == "healthy"  # type: ignore[union-attr]
    given = snap._replace(advice={**snap.advice, key1: snap.advice[key0]})
    text = render_exposition(families(given, 0.0)).decode()
    ceilings = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_input_speedup_ceiling{")]
    assert not any('gpu="1"' in ln for ln in ceilings) and any('gpu="0"' in ln for ln in ceilings), ceilings
    # a prediction made where NVML reads 0% and GPM sees kernels says no ceiling: its speed-ups are
    # on /metrics all the same (they were left out with the ceiling, a reviewer's find)
    hidden = snap.advice[key0]._replace(ceiling=None)
    assert hidden.kind == Kind.PREDICTED and hidden.candidates
    text = render_exposition(families(snap._replace(advice={**snap.advice, key0: hidden}), 0.0)).decode()
    assert sample(text, "gpumon_gpu_predicted_speedup", gpu="0", change="workers+1") > 1.0
    ceilings = [ln for ln in text.splitlines() if ln.startswith("gpumon_gpu_input_speedup_ceiling{")]
    assert not any('gpu="0"' in ln for ln in ceilings), ceilings


def advice_dict(ready: bool) -> dict[str, object]:
    if not ready:
        return cannot("only 2 window(s) of this episode so far", Cause.CPU, 4.0, 2).as_dict()
    best = Candidate("workers+2", 3, 2.4, Limit.GPU)
    return Advice(
        Kind.PREDICTED,
        Cause.CPU,
        4.2,
        1,
        (Candidate("workers+1", 2, 1.6, Limit.LOADER), best),
        best,
        windows=12,
    ).as_dict()


def test_the_hook_adds_what_a_fix_buys_once_the_daemon_can_say(stub: Stub) -> None:  # noqa: F811
    lines: list[str] = []
    w = Watch(stub.url, framework="torch", log=lines.append)
    t0, me = time.time(), os.getpid()
    early = {**gpu(0, "starved-cpu", [me], t0 + 5), "advice": advice_dict(ready=False)}
    stub.state = {"time_unix_s": t0 + 10, "gpus": [early]}
    w._poll()
    tip = "raise DataLoader(num_workers) or cache decoded samples"
    assert lines == [f"gpumon: GPU 0 starved (cpu) for 5 s, 62% idle: {tip}"]
    stub.state = {"time_unix_s": t0 + 25, "gpus": [{**early, "advice": advice_dict(ready=True)}]}
    w._poll()
    w._poll()
    assert lines[1:] == [
        "gpumon: GPU 0: what a fix buys: raise DataLoader(num_workers) 1 -> 3: about 2.4x steps/s; "
        "beyond 3, the GPU is the limit"
    ]
    # a new episode whose prediction is there at once: in its one line
    again = {**gpu(0, "starved-cpu", [me], t0 + 60), "advice": advice_dict(ready=True)}
    stub.state = {"time_unix_s": t0 + 90, "gpus": [again]}
    keras = Watch(stub.url, framework="keras", log=lines.append)
    keras._poll()
    assert lines[-1].endswith(
        "; what a fix buys: raise PyDataset(workers) 1 -> 3: about 2.4x steps/s; beyond 3, the GPU is "
        "the limit"
    )
    assert len(lines) == 3


def node_state(t0: float, ranks: list[list[tuple[float, float | None, str]]], advice: dict | None) -> dict:
    """A daemon's state with one GPU per rank of Slurm job 7, each with its episodes; the last
    rank's GPU carries `advice`."""
    gpus = []
    for index, episodes in enumerate(ranks):
        gpus.append(
            {
                **gpu(index, episodes[-1][2], [100 + index], t0),
                "jobs": [{"scheduler": "slurm", "job_id": "7", "user": "alice", "started_unix_s": t0}],
                "episodes": [
                    {"label": lb, "start_unix_s": t0 + a, "end_unix_s": None if b is None else t0 + b}
                    for a, b, lb in episodes
                ],
                "advice": advice if index == len(ranks) - 1 else None,
            }
        )
    return {"ready": True, "hostname": "node1", "time_unix_s": t0 + 120, "gpus": gpus}


def test_report_says_the_stragglers_fix_is_the_jobs_and_a_moving_straggler_is_data_loading(
    stub: Stub,  # noqa: F811
) -> None:
    from gpumon.analyze.job_report import from_daemons, render, to_json

    t0 = time.time() - 120
    best = Candidate("workers+1", 2, 1.7, Limit.CPU)
    advice = Advice(Kind.PREDICTED, Cause.CPU, 5.0, 1, (best,), best, windows=30).as_dict()
    stub.state = node_state(t0, [[(0, None, "sync-stall")], [(0, None, "starved-cpu")]], advice)
    rep = from_daemons("7", [stub.url], None, None)
    text = render(rep)
    assert (
        "job fix: the whole job waits for node1 GPU 1: its fix is the job's: raise loader workers 1 -> 2: "
        "about 1.7x steps/s" in text
    ), text
    assert "moves between ranks" not in text
    assert "  fix buys: raise loader workers 1 -> 2" in text
    assert to_json(rep)["gpus"][1]["advice"]["best"]["workers"] == 2
    # the straggler moves from rank to rank between episodes: SPDL's rule
    moving = [
        [(0, 40, "sync-stall"), (40, 80, "starved-cpu"), (80, None, "sync-stall")],
        [(0, 40, "starved-cpu"), (40, 80, "sync-stall"), (80, None, "starved-cpu")],
    ]
    stub.state = node_state(t0, moving, advice)
    fix = to_json(from_daemons("7", [stub.url], None, None))["fix"]
    assert any(
        "the straggler moves between ranks (node1 GPU 1, node1 GPU 0): data loading" in ln for ln in fix
    ), fix
