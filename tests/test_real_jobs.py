"""End to end with real training jobs (Keras bench, a plain PyTorch loop, Lightning): their train
steps drive a simulated GPU, their real processes are read from the host, and the detector is held
to the job's own measured ground truth; the training-log hooks say what the daemon says.

Every test that runs a real job lives here, in one module: scripts/test.sh runs the suite on
several workers, a module at a time on each (pytest-xdist's loadfile), so two training jobs never
share the two cores, and this module, the longest, starts first."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.analyze.trace_report import Analysis, analyze, render_text
from gpumon.analyze.truth import compare_truth

from .conftest import ROOT, free_port, start_serve
from .realjobs import (
    all_but_one,
    finish,
    gpumon,
    labels_while_training,
    main_label_while_training,
    record_jobs,
    require_bench,
    steps_span,
    truth_windows,
)


@pytest.fixture(scope="module", autouse=True)
def bench_installed() -> None:
    require_bench()


@pytest.fixture(scope="module", autouse=True)
def jobs_first_on_the_cpu() -> Iterator[None]:
    """The real jobs (and the daemons that watch them) run at nice -10, as a training job owns its
    node: the rest of the suite, on the other workers, and the CPU hogs that the flakiness check
    runs beside it (docs/testing.md) must not starve a job the test calls fed. A fed job on a CPU
    taken by others really is starved, and gpumon says so; the contended cases here make their
    contention themselves (`--cpu-hogs`), inside the job's priority. Children inherit the nice value
    of the thread that starts them (this one). Without the privilege, the jobs run at the
    default priority."""
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)  # a lower priority needs no privilege


# -- one job, fed and then starved (issue 17's change mid-run) -------------------------------------

STARVE_AFTER_S = 16


@pytest.fixture(scope="module")
def fed_then_starved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, Path, float]:
    """One job that trains fed, then its loader turns CPU-starved: the analysis, the truth and the
    moment of the change on the analysis's timeline."""
    tmp = tmp_path_factory.mktemp("fed-then-starved")
    trace, truth = record_jobs(
        tmp, [("--pipeline", "starved-cpu", "--starve-after", str(STARVE_AFTER_S), "--duration", "34")]
    )
    result = analyze(str(trace))
    notes = [line for line in (tmp / "drive").read_text().splitlines() if line.startswith("# switch")]
    to_unix = time.time() - time.monotonic()  # the job wrote its monotonic clock; same machine
    offset = result.unix(0.0)
    assert offset is not None
    return result, truth, float(notes[0].split()[2]) + to_unix - offset


def test_a_starved_keras_job_is_flagged_cpu_and_a_fed_one_is_not(
    fed_then_starved: tuple[Analysis, Path, float],
) -> None:
    result, truth, switch = fed_then_starved
    (gpu,) = result.gpus
    assert gpu.name.endswith("(simulated)")
    fed = labels_while_training(result, truth, until_s=switch)
    assert fed and not any(label.startswith("starved") for label in fed), ("the fed phase was flagged", fed)
    starved = labels_while_training(result, truth, since_s=switch)
    assert starved.most_common(1)[0][0] == "starved-cpu", starved
    report = compare_truth(result, str(truth))
    # windows inside the detector's settling time after each start (and the change) are not judged
    assert all_but_one(report.starved_flagged, report.starved_windows), report
    assert all_but_one(report.agreed, report.judged), report
    windows = truth_windows(truth)
    assert {w["pipeline"] for w in windows} == {"fed", "starved-cpu"}
    assert all(w["band"] != "highly" for w in windows if w["pipeline"] == "fed"), "the fed job was not fed"


def test_a_job_that_starves_mid_run_is_flagged_from_the_change(
    fed_then_starved: tuple[Analysis, Path, float],
) -> None:
    """Issue 17: the fed past in the window must not hold the verdict back. The benchmark
    (benchmarks/bench_onset.py) holds the 5 s goal over repeated runs; this guards against the
    window-lag behaviour (6-12 s) coming back, with a second of slack. Times are the trace's."""
    result, _, switch = fed_then_starved
    (gpu,) = result.gpus
    first = next(v for v in gpu.verdicts if v.t_s >= switch and v.state == "starved")
    assert first.t_s - switch <= 6.0, (first.t_s - switch, first.raw.reason)
    assert abs(first.since_s - switch) <= 2.0  # the episode starts at the change, not at the verdict
    assert not any(v.state == "starved" for v in gpu.verdicts if v.t_s < switch)
    episode = next(e for e in gpu.episodes if e.state == "starved")
    assert episode.cause == "cpu", episode.causes


def test_analyze_names_what_a_fix_buys_and_its_ceiling_is_the_jobs_own(
    fed_then_starved: tuple[Analysis, Path, float],
) -> None:
    """Issue 26: on a real job starved by one pinned loader worker, analyze names the change to
    make and its predicted speed-up, and the ceiling it rests on (1 / duty: steps per second with
    input for free) is the one the job measured (1 / its compute share of step time). Whether the
    predicted speed-up comes true takes a second run: benchmarks/advice.py (docs/benchmarks.md)."""
    result, truth, _ = fed_then_starved
    (gpu,) = result.gpus
    fix = gpu.fix
    assert fix is not None and fix.kind == "predicted", fix
    assert fix.workers == 1 and fix.candidates and fix.candidates[0].workers == 2
    line = next(ln for ln in render_text(result).splitlines() if ln.startswith("  fix buys: "))
    assert re.match(
        r"  fix buys: (raise loader workers .* 1 -> \d+: about \d+\.\dx steps/s|more loader)", line
    ), line
    starved = [w for w in truth_windows(truth) if w["pipeline"] == "starved-cpu" and w["band"] == "highly"]
    busy = statistics.median(1 - float(w["input_share"]) for w in starved)  # type: ignore[arg-type]
    assert fix.ceiling is not None and abs(fix.ceiling * busy - 1) <= 0.25, (fix.ceiling, 1 / busy)


def test_demo_flags_the_starved_phase_and_not_the_fed_one(tmp_path: Path) -> None:
    """The README's run command on a machine without a GPU, with shorter phases."""
    demo = gpumon("demo", "--phase-seconds", "18", "--listen", "127.0.0.1:0", "--out", str(tmp_path))
    out, err = finish(demo, 300)
    p = subprocess.CompletedProcess(demo.args, demo.returncode, out, err)
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
    trace, truth = record_jobs(tmp_path, [("--pipeline", "starved-io", "--duration", "20")])
    result = analyze(str(trace))
    assert main_label_while_training(result, truth) == "starved-io", labels_while_training(result, truth)
    report = compare_truth(result, str(truth))
    assert report.starved_windows >= 1 and report.agreement == 1.0, report


def test_a_contended_jpeg_loader_is_starved_cpu_not_io(tmp_path: Path) -> None:
    """Issue 17's case: JPEGs read from storage (page cache dropped) and decoded by more loader
    workers than cores, with two CPU-bound processes beside the job. Each worker gets part of a
    core and waits in the run queue for the rest, while the job reads from a fast disk: cpu."""
    trace, truth = record_jobs(
        tmp_path, [("--pipeline", "jpeg", "--duration", "22", "--workers", "3", "--cpu-hogs", "2")]
    )
    result = analyze(str(trace))
    # the job's start-up (its first window: one slow step, the loader's first batches queued) may
    # read starting and healthy for as long as its starved part on a loaded machine: the label
    # judged is the starved part's, and the truth's windows are judged below
    seen = labels_while_training(result, truth)
    starved = {label: n for label, n in seen.items() if label.startswith("starved")}
    assert starved and max(starved, key=starved.__getitem__) == "starved-cpu", seen
    (gpu,) = result.gpus
    _, last = steps_span(result, truth)
    starved = [e for e in gpu.episodes if e.state == "starved" and e.start_s < last]
    assert starved and all(e.cause == "cpu" for e in starved), [(e.label, e.causes) for e in starved]
    report = compare_truth(result, str(truth))
    assert all_but_one(report.starved_flagged, report.starved_windows), report


def test_data_parallel_ranks_without_a_straggler_are_never_flagged_starved(tmp_path: Path) -> None:
    """Also the origin's batch rules: a global batch of 63 over 2 ranks becomes 62, 31 per rank,
    every batch full; and the saved model is the template (the Keras model), not the DDP wrapper.
    Two fed ranks on two cores wait on each other some of the time (how much depends on the
    machine's load): wherever the truth decides, the detector agrees with it, and neither GPU is
    ever called starved while the ranks train."""
    saved = tmp_path / "model.keras"
    job = ("--gpus", "2", "--duration", "22", "--batch-size", "63", "--save", str(saved))
    trace, truth = record_jobs(tmp_path, [job])
    assert "global batch 62 (31 per rank)" in (tmp_path / "bench.err").read_text()
    records = truth_windows(truth)
    assert records and all(r["batch"] == 31 and r["full_batches"] for r in records)
    import zipfile

    with zipfile.ZipFile(saved) as z:  # a .keras file: its config names a Keras Sequential model
        config = json.loads(z.read("config.json"))
    assert config["class_name"] == "Sequential", config["class_name"]
    result = analyze(str(trace))
    assert sorted(g.index for g in result.gpus) == [0, 1]
    fed = all(r["expected"] != "starved" for r in records)
    for gpu in result.gpus:
        seen = labels_while_training(result, truth, gpu.index)
        assert seen, gpu.index
        if fed:
            assert not [label for label in seen if label.startswith("starved")], (gpu.index, seen)
    report = compare_truth(result, str(truth))
    assert report.agreed == report.judged, report


SERIES = re.compile(r"^(gpumon_gpu_job_info|gpumon_gpu_state|gpumon_gpu_starvation_cause)\{(.*)\} (\S+)$")


def _on(found: list[tuple[str, str, str]], name: str, *labels: str) -> bool:
    return any(n == name and float(v) == 1 and all(x in ls for x in labels) for n, ls, v in found)


@pytest.fixture(scope="module")
def straggler(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[tuple[str, str, str]], Analysis, Path, Path]]:
    """Issue 18: two data-parallel ranks (torch DDP over gloo on this CPU-only machine), rank 1's
    input pipeline starved, both GPUs held by one Slurm job (the shipped prolog's mapping). One run,
    watched two ways at once: `gpumon serve --drive` (the series it served once GPU 0 read
    sync-stall beside GPU 1 starved by cpu) and `gpumon record --drive` (the whole run)."""
    from .conftest import free_port, start_serve
    from .realjobs import wait_until_recorded
    from .test_fleet import prolog

    tmp = tmp_path_factory.mktemp("straggler")
    jobs, drive = tmp / "jobs", tmp / "drive"
    truth, trace = tmp / "truth.jsonl", tmp / "trace.jsonl"
    prolog(jobs, "7", "alice", "0,1")
    drive.touch()
    conf = tmp / "gpumon.toml"
    conf.write_text(f'jobs_dir = "{jobs}"\n')
    port = free_port()
    serve = start_serve("--config", str(conf), "--drive", str(drive), port=port)
    # the recorder reads the same job mapping as the daemon: both GPUs are job 7's, so a rank that
    # waits for its starved peer reads sync-stall however much of the cores the straggler gets
    recorder = gpumon(
        "record",
        "--drive",
        str(drive),
        "--duration",
        "900",
        "-o",
        str(trace),
        env={"GPUMON_JOBS_DIR": str(jobs)},
    )
    job = gpumon(
        "bench", "--gpus", "2", "--straggler", "1:starved-cpu", "--duration", "36",
        "--drive", str(drive), "--truth", str(truth), "--quiet",
    )  # fmt: skip
    lines: list[tuple[str, str, str]] = []
    try:
        while job.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                body = ""
            found = [m.groups() for m in map(SERIES.match, body.splitlines()) if m]
            spinning = _on(found, "gpumon_gpu_state", 'gpu="0"', 'state="sync-stall"')
            if spinning and _on(found, "gpumon_gpu_starvation_cause", 'gpu="1"', 'cause="cpu"'):
                lines = found
                break
            time.sleep(0.5)  # the daemon's verdicts move once a second
        _, err = finish(job, 300)
        assert job.returncode == 0, err
        ended = max(float(w["end_unix_s"]) for w in truth_windows(truth))  # type: ignore[arg-type]
        wait_until_recorded(trace, ended + 2.0, recorder)
    finally:
        for p in (job, recorder, serve):
            if p.poll() is None:
                p.terminate()
        for p in (job, recorder, serve):
            p.wait(timeout=120)
    yield lines, analyze(str(trace)), truth, tmp


def test_a_straggler_rank_starves_and_the_other_waits_in_sync_stall(
    straggler: tuple[list[tuple[str, str, str]], Analysis, Path, Path],
) -> None:
    _, result, truth, _ = straggler
    assert sorted(g.index for g in result.gpus) == [0, 1]
    assert main_label_while_training(result, truth, 1) == "starved-cpu", labels_while_training(
        result, truth, 1
    )
    assert main_label_while_training(result, truth, 0) == "sync-stall", labels_while_training(
        result, truth, 0
    )
    (waiting,) = [g for g in result.gpus if g.index == 0]
    assert any(v.evidence.waiting_for_gpu == 1 for v in waiting.verdicts), (
        "rank 0 is judged beside its starved peer (the job's mapping reaches the recorder)"
    )
    records = truth_windows(truth)
    assert {r["gpu"] for r in records} == {0, 1}
    assert all(r["pipeline"] == ("starved-cpu" if r["gpu"] == 1 else "fed") for r in records)
    report = compare_truth(result, str(truth))
    # the waiting rank's share of waiting moves with the straggler's slice of the cores (which
    # other work takes: 2 of 4 windows beside two CPU hogs); the straggler's starvation does not
    assert report.sync_windows >= 1 and 2 * report.sync_flagged >= report.sync_windows, report
    assert all_but_one(report.starved_flagged, report.starved_windows), report


def test_a_straggler_through_serve_is_the_one_the_job_straggler_alert_names(
    straggler: tuple[list[tuple[str, str, str]], Analysis, Path, Path],
) -> None:
    """The shipped rules, evaluated by promtool over the series the daemon served (held for 3
    minutes), name GPU 1 as the job's straggler, starved by cpu, and GPU 0 not."""
    from .conftest import promtool_rule_test, served_labels, shipped_rule

    lines, _, _, tmp = straggler
    assert lines, "GPU 0 never read sync-stall with GPU 1 starved by cpu"
    instance = 'instance="node1:9877",job="gpumon"'
    info1 = next(labels for name, labels, _ in lines if name == "gpumon_gpu_job_info" and 'gpu="1"' in labels)
    info1 = served_labels(info1)
    test = {
        "input_series": [
            {"series": f"{name}{{{labels},{instance}}}", "values": f"{float(v):g}x12"}
            for name, labels, v in lines
        ],
        "promql_expr_test": [
            {
                "expr": shipped_rule("GpumonJobStraggler")["expr"],
                "eval_time": "2m",
                "exp_samples": [{"labels": f'{{{info1},{instance},cause="cpu"}}', "value": 1}],
            }
        ],
    }
    promtool_rule_test(tmp, "straggler", test)


# -- end to end: real jobs, one daemon ---------------------------------------------------------------


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    drive = tmp_path_factory.mktemp("drive") / "drive"
    drive.touch()
    port = free_port()
    proc = start_serve("--drive", str(drive), port=port)
    url = f"http://127.0.0.1:{port}"
    yield url, drive
    proc.terminate()
    proc.wait(10)


def job(url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    p = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), GPUMON_URL=url, KERAS_BACKEND="torch"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a job that hangs is killed with its loader workers (finish)
    )
    out, err = finish(p, timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


STARVED = "gpumon: GPU 0 starved (cpu)"


def test_the_keras_bench_job_says_when_it_starves(driven: tuple[str, Path]) -> None:
    """And that it is fed when it is: the fed job's log is judged with its start-up (below)."""
    url, drive = driven
    common = ["-m", "gpumon", "bench", "--drive", str(drive), "--watch", "--quiet"]
    seen: list[dict[str, object]] = []
    done = threading.Event()

    def watch() -> None:  # what the daemon read, for a failure's message (once: starved-host)
        while not done.wait(2.0):
            try:
                state = json.loads(urllib.request.urlopen(url + "/api/v1/state", timeout=5).read(2**20))
                seen.extend(g for g in state.get("gpus", []) if g.get("index") == 0)
            except (OSError, ValueError):
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    starved = job(url, *common, "--pipeline", "starved-cpu", "--duration", "22")
    done.set()
    watcher.join(10)
    assert starved.returncode == 0, starved.stderr[-2000:]
    said = [ln for ln in starved.stderr.splitlines() if ln.startswith(STARVED)]
    read = "\n".join(f"{g.get('label')}: {g.get('reason')} {g.get('evidence')}" for g in seen[-6:])
    assert len(said) == 1 and "PyDataset(workers=N, use_multiprocessing=True)" in said[0], (
        starved.stderr + "\nthe daemon's last readings:\n" + read
    )
    summary = [ln for ln in starved.stderr.splitlines() if ln.startswith("gpumon: this run on GPU 0")]
    assert len(summary) == 1 and "starved-cpu" in summary[0] and "GPU-hours wasted" in summary[0]


def test_a_plain_torch_loop_says_so_in_its_starved_phase_only(driven: tuple[str, Path]) -> None:
    url, drive = driven
    p = job(url, "tests/jobs/torch_loop.py", str(drive), "16", "22")
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    fed = out.split("== phase fed", 1)[1].split("== phase starved", 1)[0]
    starved = out.split("== phase starved", 1)[1]
    assert "starved" not in fed, out
    assert STARVED in starved and "DataLoader(num_workers)" in starved, out
    assert "gpumon: this run on GPU 0:" in out.split("== done", 1)[1]


def test_the_lightning_callback_says_so_too(driven: tuple[str, Path]) -> None:
    url, drive = driven
    p = job(url, "tests/jobs/lightning_loop.py", str(drive), "24")
    assert p.returncode == 0, p.stderr[-2000:]
    assert STARVED in p.stdout, p.stdout + p.stderr[-2000:]
    assert "gpumon: this run on GPU 0:" in p.stdout


def test_a_job_that_prepares_before_training_is_starting_then_healthy_and_never_a_hang(
    driven: tuple[str, Path],
) -> None:
    """Issue 25: the job holds the GPU for a while before its first step (imports, data,
    compiling: --start-delay), then trains fed. The daemon says `starting`, then `healthy`; never
    `stalled`; and the training log has no "hang" line."""
    import json
    import threading

    url, drive = driven
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                state = json.loads(urllib.request.urlopen(url + "/api/v1/state", timeout=5).read())
                seen.extend(g["label"] for g in state.get("gpus", []) if g.get("index") == 0)
            except (OSError, ValueError):
                pass
            done.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    common = ["-m", "gpumon", "bench", "--drive", str(drive), "--watch", "--quiet"]
    p = job(url, *common, "--pipeline", "fed", "--start-delay", "15", "--duration", "18")
    done.set()
    watcher.join(10)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "hang" not in p.stderr and "stalled" not in p.stderr, p.stderr
    # a fed Keras job's training log says so, and never that it starved
    assert "gpumon: GPU 0 starved" not in p.stderr, p.stderr
    assert "gpumon: this run on GPU 0: healthy" in p.stderr, p.stderr
    labels = [label for n, label in enumerate(seen) if n == 0 or seen[n - 1] != label]
    assert "starting" in labels and "stalled" not in labels, labels
    assert labels.index("starting") < labels.index("healthy"), labels
