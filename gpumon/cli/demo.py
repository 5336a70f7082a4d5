"""`gpumon demo`: the product end to end on a machine without a GPU.

It serves the exporter on one simulated GPU driven by a real Keras job (gpumon bench), runs a fed
phase and then a CPU-starved one, prints the live verdicts, and ends with the episodes, the
agreement with the job's own ground truth, the /metrics URL it served, and a plot.
The GPU is simulated and every line says so; the job, its processes and their CPU are real.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from gpumon.cli import flags
from gpumon.core.errors import MissingDependency
from gpumon.core.extras import install_hint
from gpumon.detect.tracker import Verdict


def _check_bench() -> None:
    import importlib.util

    missing = [m for m in ("keras", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(
            f"gpumon demo runs a Keras job and needs {', '.join(missing)}: "
            f"{install_hint('bench', 'torch')} (./scripts/run.sh does this)"
        )


def run_demo(phase_s: float, listen: str, out: Path) -> int:
    _check_bench()
    # what the demo runs, loaded when it runs (as every command's: `gpumon --help` loads none)
    from gpumon.config.settings import Config
    from gpumon.core.clock import MonotonicClock, SinceStart
    from gpumon.serve.daemon import Daemon
    from gpumon.trace.records import make_header
    from gpumon.trace.writer import TraceWriter

    out.mkdir(parents=True, exist_ok=True)
    drive, truth, trace = out / "drive.txt", out / "truth.jsonl", out / "trace.jsonl"
    for f in (drive, truth):
        f.unlink(missing_ok=True)
    drive.touch()  # the daemon waits on it; the job appends its steps
    clock = SinceStart(MonotonicClock())
    daemon = Daemon(Config(drive=str(drive), listen=listen), clock=clock)
    writer = TraceWriter(str(trace), make_header(daemon.pipeline.description.to_json(), 1.0), force=True)
    daemon.pipeline.on_tick(writer.write_tick)
    port = daemon.start()
    url = f"http://{listen.rpartition(':')[0] or '127.0.0.1'}:{port}"
    daemon.wait_ready(30)
    print(
        f"gpumon demo: a real Keras training job on a SIMULATED GPU (no GPU here): the GPU is busy\n"
        f"exactly while the job's train steps run; the job's processes and CPU are read for real.\n"
        f"Metrics: {url}/metrics   state: {url}/api/v1/state\n"
        f"Each phase trains for {phase_s:.0f} s, after the job's few seconds of start-up (Keras, its\n"
        f"loader workers). Every 3 s, per GPU: the time since the demo began; the duty cycle (the\n"
        f"share of the last {daemon.detector.thresholds.window_s:g} s in which a kernel ran); the "
        f"busiest job process's CPU;\nthe verdict, with the detector's confidence in it (0 to 1).\n",
        flush=True,
    )
    marks: list[tuple[float, str]] = []
    job: subprocess.Popen[str] | None = None
    try:
        for pipeline, story in (
            ("fed", "fed: loader workers keep up"),
            ("starved-cpu", "starved: heavy Python augmentation in one loader process"),
        ):
            began = clock.now()
            if pipeline != "fed":
                marks.append((began, "demo: the starved job starts"))
            print(f"== phase {pipeline} at {began:.0f} s ({phase_s:.0f} s of training): {story}", flush=True)
            job = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpumon",
                    "bench",
                    "--pipeline",
                    pipeline,
                    "--duration",
                    str(phase_s),
                    "--drive",
                    str(drive),
                    "--truth",
                    str(truth),
                    "--quiet",
                ],
                env=dict(os.environ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            while job.poll() is None:
                time.sleep(min(3.0, max(0.1, phase_s)))
                for v in daemon.detector.latest:
                    print(_live_line(clock.now(), v), flush=True)
            print(
                f"   phase {pipeline} ended at {clock.now():.0f} s: {phase_s:.0f} s of training after "
                f"{clock.now() - began - phase_s:.0f} s of start-up",
                flush=True,
            )
            if job.returncode != 0:
                err = job.stderr.read() if job.stderr else ""
                print(f"gpumon demo: the {pipeline} job failed: {err[-500:]}", file=sys.stderr)
                return 1
            job = None
    finally:
        if job is not None and job.poll() is None:  # interrupted (Ctrl-C, SIGTERM): no orphan
            job.terminate()
            job.wait(30)
        daemon.stop()
        writer.finish("duration")
    from gpumon.analyze.trace_report import analyze, render_text, render_warnings
    from gpumon.analyze.truth import compare_truth

    result = analyze(str(trace))
    print("\n" + render_text(result))
    if result.warnings:
        print(render_warnings(result), file=sys.stderr)
    print(compare_truth(result, str(truth)).render(str(truth)))
    png = out / "demo.png"
    try:
        from gpumon.analyze.plot import plot

        plot(result, str(png), tuple(marks))
        print(f"plot: {png}")
    except MissingDependency as e:
        print(f"no plot: {e}")
    print(f"served {url}/metrics while it ran (stopped now); trace: {trace}")
    return 0


def _live_line(t_s: float, v: Verdict) -> str:
    ev = v.evidence
    duty = f"{ev.duty_cycle:4.0%}" if ev.duty_cycle is not None else "   -"
    cpu = f"{ev.busiest_job_core:4.0%}" if ev.busiest_job_core is not None else "   -"
    state = v.label.upper() if v.state == "starved" else v.label
    return (
        f"  {t_s:5.0f} s  GPU {v.index} (simulated)  duty {duty}  busiest job process {cpu} of a core"
        f"  ->  {state:<14} confidence {v.confidence:.2f}"
    )


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "demo",
        parents=[common],
        help="the product end to end without a GPU: a real Keras job, fed then starved",
    )
    flags.add_setting(
        s,
        flags.DURATION,
        flag="--phase-seconds",
        dest="phase_seconds",
        default=60.0,
        help="length of the fed and of the starved phase (default 60 s)",
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:9877",
        metavar="HOST:PORT",
        help="where the exporter serves meanwhile (default 127.0.0.1:9877; :0 for any free port)",
    )
    s.add_argument(
        "--out",
        default="gpumon-demo",
        metavar="DIR",
        help="trace, ground truth and plot (default gpumon-demo/)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_demo(args.phase_seconds, args.listen, Path(args.out))
