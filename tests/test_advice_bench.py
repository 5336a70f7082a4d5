"""benchmarks/advice.py's matrix and summary, on made-up runs (the real runs take half an hour:
docs/benchmarks.md): the figures the issue's goal is judged by must come out of the rows right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.advice import Run, Setup, next_change, render, setups
from gpumon.detect.remedies import Advice, Candidate, Kind, Limit, cannot, fed
from gpumon.detect.vocabulary import Cause


def advice(next_speedup: float, best: tuple[int, float] | None) -> Advice:
    step = Candidate("workers+1", 2, next_speedup, Limit.CPU)
    named = None if best is None else Candidate("workers+x", best[0], best[1], Limit.GPU)
    return Advice(Kind.PREDICTED, Cause.CPU, 4.0, 1, (step,), named, None, "", 20)


def run(rate: float, a: Advice | None, others: float = 0.1) -> Run:
    return Run(rate, a, "starved-cpu", next_change(a), 0.0, others)


def test_the_matrix_has_the_issues_setups() -> None:
    names = [s.name for s in setups()]
    assert len(names) >= 12 and len(set(names)) == len(names)
    for pipeline in ("starved-cpu", "jpeg", "starved-io"):
        for workers in (1, 2, 3):
            for hogs in (0, 2):
                assert f"{pipeline}-w{workers}-h{hogs}" in names
    assert any(s.ranks == 2 for s in setups())
    assert Setup("jpeg", 2, 2).with_workers(3).bench_args(40) == [
        "--pipeline",
        "jpeg",
        "--workers",
        "3",
        "--cpu-hogs",
        "2",
        "--duration",
        "40",
    ]
    assert Setup("starved-cpu", 1, 0, ranks=2).bench_args(30)[:4] == [
        "--gpus",
        "2",
        "--straggler",
        "1:starved-cpu",
    ]


def test_the_next_change_is_one_worker_more_fed_is_no_gain_and_cannot_is_no_number() -> None:
    assert next_change(advice(1.5, (3, 2.0))) == 1.5
    assert next_change(fed()) == 1.0
    assert next_change(cannot("hidden", Cause.CPU, 4.0, 20)) is None
    assert next_change(None) is None


def test_the_summary_gives_median_and_worst_error_no_gain_hits_and_a_slower_recommendation(
    tmp_path: Path,
) -> None:
    a, b, c, d = (Setup("starved-cpu", w) for w in (1, 2, 3, 4))
    rows = [
        # predicted 1.5, measured 2.0: 25% off; the recommended 1 -> 3 measured 2.4x
        (a, run(2.0, advice(1.5, (3, 2.0))), 1.5, 2.0, (3, 2.0, 2.4), 0.0, run(4.0, None)),
        # "no gain" said (1.0), measured 1.05: right; 5% off
        (b, run(4.0, advice(1.0, None)), 1.0, 1.05, None, 0.0, run(4.2, None)),
        # "no gain" said, measured 1.25: wrong; 20% off; the neighbour's load moved (flagged *)
        (c, run(4.0, advice(1.0, None), 1.0), 1.0, 1.25, None, 0.0, run(5.0, None, 0.1)),
        # cannot predict: no error counted; a recommended change measured slower than today
        (d, run(4.0, cannot("hidden", Cause.CPU, 4.0, 20)), None, 1.0, (6, 1.3, 0.9), 0.0, run(4.0, None)),
    ]
    text = render(rows, tmp_path)
    summary = next(ln for ln in text.splitlines() if ln.startswith("summary: "))
    assert summary == (
        'summary: 4 setups, 3 predicted (1 cannot predict): median error 20%, worst 25%; "no gain" '
        "right 1 of 2 (50%); recommended change never slower: no (1 slower) (slowest 0.90x of "
        "today's steps/s, 2 run)"
    )
    assert "starved-cpu-w3-h0" in text and "1.0>0.1*" in text
    assert "cannot predict" in text and "1 -> 3 (2.00x, 2.40x)" in text
    steady = next(ln for ln in text.splitlines() if ln.startswith("where other processes' CPU"))
    assert "(2 setups; * marks the others): median error 15%, worst 25%" in steady


def test_repeats_are_recorded_in_rounds_so_a_drifting_host_moves_a_setup_and_its_change_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a VM whose speed drifts 30-40% over twenty minutes, a setup's three runs then its
    change's three compared one period with another; in rounds, each round holds both."""
    import benchmarks.advice as advice_bench

    order: list[str] = []
    monkeypatch.setattr(
        advice_bench, "run_once", lambda folder, *a, **kw: order.append(folder.name) or folder
    )
    chosen = [Setup("jpeg", 1, 2), Setup("jpeg", 2, 2), Setup("starved-io", 3)]
    advice_bench.record_in_rounds(tmp_path, chosen, 2, 40.0, 100.0)
    assert order == [
        "jpeg-w1-h2", "jpeg-w2-h2", "jpeg-w3-h2", "jpeg-w1-h2-r2", "jpeg-w2-h2-r2", "jpeg-w3-h2-r2",
        "starved-io-w3-h0", "starved-io-w4-h0", "starved-io-w3-h0-r2", "starved-io-w4-h0-r2",
    ]  # fmt: skip
    assert Setup("jpeg", 1).bench_args(40, 100.0)[-2:] == ["--gpu-step-ms", "100"]


def test_all_repeats_reads_every_run_a_setup_has_and_at_least_the_asked(tmp_path: Path) -> None:
    """A noisy setup given more repeats (--only ... --repeats 8) is read over all of them."""
    from benchmarks.advice import folder_of, repeats_found

    noisy, quiet = Setup("jpeg", 1, 2), Setup("jpeg", 1)
    for r in range(8):
        folder_of(tmp_path, noisy, r).mkdir()
        (folder_of(tmp_path, noisy, r) / "truth.jsonl").write_text("{}\n")
    for r in (0, 1, 2, 4):  # a gap: the fifth run is not one of a row
        folder_of(tmp_path, quiet, r).mkdir()
        (folder_of(tmp_path, quiet, r) / "truth.jsonl").write_text("{}\n")
    assert repeats_found(tmp_path, noisy, 3) == 8
    assert repeats_found(tmp_path, quiet, 1) == 3
    assert repeats_found(tmp_path, Setup("jpeg", 3), 3) == 3  # none yet: what --repeats asks


def test_the_recommended_change_is_the_typical_repeats_not_the_firsts() -> None:
    """Eight runs of a setup beside CPU hogs: gpumon recommends 1 -> 2 (1.12x) in the first and
    says no gain in most; the setup's row follows the run whose prediction is the median's."""
    from benchmarks.advice import representative

    first = run(1.9, advice(1.12, (2, 1.12)))
    others = [run(2.0, advice(p, None)) for p in (1.0, 1.03, 1.02, 1.04)]
    typical = representative([first, *others], 1.03)
    assert typical is others[1] and typical.advice is not None and typical.advice.best is None
    assert representative([first, *others], None) is first
    assert representative([run(2.0, None), first], 1.12) is first  # a repeat without a number is passed


def test_runs_recorded_with_one_gpu_step_are_not_extended_with_another(tmp_path: Path) -> None:
    """Runs are reused by name: a folder of sleeping-step runs must not gain computed-step ones."""
    from benchmarks.advice import check_settings

    assert check_settings(tmp_path, 100.0) is None  # a new folder takes this run's step
    assert check_settings(tmp_path, 100.0) is None
    refused = check_settings(tmp_path, None)
    assert refused is not None and "--gpu-step-ms 100" in refused and "--computed-step" in refused
    assert "--gpu-step-ms 50" in (check_settings(tmp_path, 50.0) or "")
    (tmp_path / "settings.json").write_text("{not json")
    assert "not a settings file" in (check_settings(tmp_path, 100.0) or "")
    for garbage in ('"100"', '{"gpu_step_ms": "100"}', '{"gpu_step_ms": [1]}', '{"gpu_step_ms": true}', "[]"):
        (tmp_path / "settings.json").write_text(garbage)
        assert "not a settings file" in (check_settings(tmp_path, 100.0) or ""), garbage
    (tmp_path / "settings.json").write_text('{"gpu_step_ms": 100, "pad": "' + "x" * 5000 + '"}')
    assert "not a settings file" in (check_settings(tmp_path, 100.0) or "")  # read bounded
    (tmp_path / "settings.json").unlink()
    (tmp_path / "settings.json").mkdir()
    assert "not a regular file" in (check_settings(tmp_path, 100.0) or "")
    (tmp_path / "settings.json").rmdir()
    (tmp_path / "settings.json").symlink_to(tmp_path / "elsewhere.json")  # dangling: not written through
    assert "not a regular file" in (check_settings(tmp_path, 100.0) or "")
    assert not (tmp_path / "elsewhere.json").exists()
    (tmp_path / "settings.json").unlink()
    (tmp_path / "jpeg-w1-h0").mkdir()
    (tmp_path / "jpeg-w1-h0" / "truth.jsonl").write_text("{}\n")
    unknown = check_settings(tmp_path, 100.0)  # runs recorded before the step was kept: not mixed
    assert unknown is not None and "unknown GPU step" in unknown and not (tmp_path / "settings.json").exists()


@pytest.mark.parametrize(
    ("repeats", "duration", "step", "flag"),
    [
        (0, 40.0, 100.0, "--repeats"),
        (3, float("nan"), 100.0, "--duration"),
        (3, float("inf"), 100.0, "--duration"),
        (3, 0.0, 100.0, "--duration"),
        (3, 40.0, float("nan"), "--gpu-step-ms"),
        (3, 40.0, -5.0, "--gpu-step-ms"),
        (3, 40.0, 0.0, "--gpu-step-ms"),
        (3, 40.0, 1e9, "--gpu-step-ms"),
    ],
)
def test_flags_no_job_could_run_are_refused_before_the_folder_is_touched(
    tmp_path: Path, repeats: int, duration: float, step: float, flag: str
) -> None:
    from benchmarks.advice import check_args

    assert check_args(3, 40.0, 100.0) is None and check_args(1, 40.0, None) is None
    problem = check_args(repeats, duration, step)
    assert problem is not None and problem.startswith(flag)


def test_the_default_run_sleeps_its_gpu_step_three_times_a_setup_and_refuses_a_mixed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import benchmarks.advice as bench

    recorded: list[tuple[int, float | None]] = []
    monkeypatch.setattr(bench, "record_in_rounds", lambda _b, _c, r, _d, step: recorded.append((r, step)))
    monkeypatch.setattr("sys.argv", ["advice", "--out", str(tmp_path), "--only", "nothing-matches*"])
    with pytest.raises(SystemExit):  # no setup matches: refused before anything is recorded
        bench.main()
    assert recorded == []
    monkeypatch.setattr("sys.argv", ["advice", "--out", str(tmp_path), "--only", "jpeg-w1-h0"])
    monkeypatch.setattr(bench, "run_once", lambda *a, **k: (_ for _ in ()).throw(bench.NotRecorded("x")))
    bench.main()  # (nothing was recorded: the setup is left out of the matrix)
    assert recorded == [(3, 100.0)]
    monkeypatch.setattr("sys.argv", ["advice", "--out", str(tmp_path), "--computed-step"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert "--computed-step" in str(e.value) and "use another --out" in str(e.value)
    assert recorded == [(3, 100.0)]


def test_offline_reads_a_folder_of_one_run_a_setup_as_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Folders recorded with --repeats 1 (the default before 2026-12-04) still re-analyze."""
    import benchmarks.advice as bench

    for name in ("jpeg-w1-h0", "jpeg-w2-h0"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "truth.jsonl").write_text("{}\n")
        (tmp_path / name / "trace.jsonl").write_text("{}\n")
    read: list[str] = []

    def measure(folder: Path, s: Setup) -> Run:
        read.append(folder.name)
        return run(2.0 if s.workers == 2 else 1.0, advice(2.0, (2, 2.0)))

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr("sys.argv", ["advice", "--offline", "--out", str(tmp_path), "--only", "jpeg-w1-h0"])
    bench.main()
    assert read == ["jpeg-w1-h0", "jpeg-w2-h0"]
    out = capsys.readouterr()
    assert "summary: 1 setups" in out.out and "1 run(s) of 3 asked" in out.err


def test_a_real_gpu_pair_holds_the_prediction_to_the_measured_gain_of_the_same_pipeline(
    tmp_path: Path,
) -> None:
    """benchmarks/gpu_check.sh's pair (`--pair`): the starved run's truth shares its file with the
    fed run before it, whose faster windows must not count as "before"; each run's first window
    (the warm-up) does not count either."""
    from benchmarks.advice import pair
    from gpumon.analyze.corpus import Case, record
    from gpumon.analyze.trace_report import analyze
    from gpumon.sim.scenarios import parse_scenarios

    trace = tmp_path / "trace.jsonl"
    case = Case("pair", 0, 1 / 6, 90, 0.05, tuple(parse_scenarios("starved-cpu")))
    record(case, str(trace))
    predicted = next_change(analyze(str(trace)).gpus[0].fix)
    assert predicted is not None and predicted > 1.1

    def truth(path: Path, *windows: tuple[str, float]) -> Path:
        path.write_text("".join(json.dumps({"pipeline": p, "steps_per_s": r}) + "\n" for p, r in windows))
        return path

    before = truth(tmp_path / "truth.jsonl", ("fed", 1.0), ("fed", 20.0), ("fed", 20.0),
                   ("starved-cpu", 9.0), ("starved-cpu", 2.0), ("starved-cpu", 2.0))  # fmt: skip
    after = truth(tmp_path / "after.jsonl", ("starved-cpu", 9.0), ("starved-cpu", 3.0), ("starved-cpu", 3.0))
    text = pair(trace, before, after)
    assert "measured: 2.00 -> 3.00 steps/s with one loader worker more: 1.50x" in text, text
    err = abs(predicted - 1.5) / 1.5
    assert f"predicted for one worker more: {predicted:.2f}x; error {err:.0%}" in text, text
    assert text.startswith("gpumon on the starved-cpu run (starved-cpu): raise"), text

    fed_only = truth(tmp_path / "fed.jsonl", ("fed", 1.0), ("fed", 20.0))
    assert pair(trace, fed_only, after) == f"{fed_only}: no starved-cpu truth windows with steps per second"
