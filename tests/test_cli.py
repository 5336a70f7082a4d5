"""The command line as a user meets it: output, exit codes, one-line errors, no tracebacks, and
nothing recorded is lost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumon import __version__
from gpumon.trace.reader import read_trace

from .conftest import ROOT, gpumon, nvidia_driver_present


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_version() -> None:
    p = gpumon("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"gpumon {__version__}"


def test_scenarios_lists_each_with_one_line() -> None:
    p = gpumon("scenarios")
    names = [ln.split()[0] for ln in p.stdout.splitlines()]
    for required in [
        "healthy",
        "starved-cpu",
        "starved-io",
        "idle",
        "stalled",
        "sync-stall",
        "underutilized",
        "healthy-then-starved",
    ]:
        assert required in names
    assert all(len(ln.split(maxsplit=1)) == 2 for ln in p.stdout.splitlines())


def test_devices_json_lists_the_simulated_gpus() -> None:
    p = gpumon("devices", "--simulate", "healthy", "--gpus", "4", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    assert len({g["uuid"] for g in doc["gpus"]}) == 4
    assert all(g["mem_used_bytes"] < g["mem_total_bytes"] and 0 <= g["util_ratio"] <= 1 for g in doc["gpus"])
    assert doc["source"]["kind"] == "simulated"


def test_devices_table_says_it_is_simulated() -> None:
    p = gpumon("devices", "--simulate", "starved-cpu,idle")
    assert p.returncode == 0
    rows = [ln for ln in p.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(rows) == 2 and all("GPU-" in r and "GiB" in r and "%" in r for r in rows)
    assert "simulated" in p.stdout


@pytest.mark.skipif(nvidia_driver_present(), reason="this machine has an NVIDIA driver")
def test_devices_without_a_driver_fails_cleanly() -> None:
    p = gpumon("devices")
    assert p.returncode == 3
    line = one_line_error(p)
    assert "libnvidia-ml.so.1" in line and "--simulate" in line


@pytest.mark.parametrize(
    "args,needle",
    [
        (["devices", "--simulate", "healthy", "--gpus", "0"], "--gpus"),
        (["devices", "--simulate", "healthy", "--gpus", "two"], "--gpus"),
        (["devices", "--simulate", "nope"], "unknown scenario 'nope'"),
        (["devices", "--gpus", "2"], "--gpus needs --simulate"),
        (["devices", "--simulate", "healthy,idle", "--gpus", "1"], "fewer than the 2 scenarios"),
        (["record", "--simulate", "healthy", "-o", "x", "--sample-period", "2"], "--sample-period"),
        (["record", "--simulate", "healthy", "-o", "x", "--duration", "-1"], "--duration"),
        (["record", "--simulate", "healthy", "-o", "x", "--interval", "0"], "--interval"),
        (["record", "-o", "x", "--speed", "10"], "--speed needs --simulate or --replay"),
        (["record", "--simulate", "healthy", "--replay", "t"], "not allowed with"),
        (["record", "--simulate", "healthy"], "-o/--output"),
        (["frobnicate"], "invalid choice"),
        # dates no recording holds, which Python cannot write in UTC either (once an internal error)
        (
            [
                "analyze",
                "--from",
                ".",
                "--since",
                "9999-12-31T12:00-01:00",
                "--until",
                "9999-12-31T23:59-01:00",
            ],
            "argument --since",
        ),
        (
            ["analyze", "--from", ".", "--since", "2026-12-01T00:00Z", "--until", "9999-12-31T23:59:59.9Z"],
            "argument --until",
        ),
        (["report", "--job", "1", "--since", "0001-01-01T00:00Z"], "argument --since"),
        (["report", "--job", ""], "--job: expected a job id"),  # (once "job : no GPU...", exit 9)
        (["report", "--job", "7\n77"], "--job: expected a job id"),  # (once a two-line error)
    ],
)
def test_bad_flags_are_usage_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "t").write_text("")  # a file for --replay: the flags are wrong, not the file
    p = gpumon(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert needle in one_line_error(p)
    assert not (tmp_path / "x").exists(), "a refused command writes nothing"


def test_record_writes_a_trace_that_replays(tmp_path: Path) -> None:
    t = tmp_path / "t"
    p = gpumon(
        "record",
        "--simulate",
        "starved-cpu",
        "--gpus",
        "2",
        "--duration",
        "4",
        "--speed",
        "max",
        "-o",
        str(t),
    )
    assert p.returncode == 0, p.stderr
    trace = read_trace(str(t))
    assert len(trace.ticks) == 4 and trace.gpu_count == 2 and trace.end["reason"] == "duration"
    assert trace.header["source"]["scenarios"] == ["starved-cpu", "starved-cpu"]
    again = tmp_path / "again"
    p = gpumon("record", "--replay", str(t), "--speed", "max", "-o", str(again))
    assert p.returncode == 0, p.stderr
    replayed = read_trace(str(again))
    assert [[g.util_ratio for g in x.gpus] for x in replayed.ticks] == [
        [g.util_ratio for g in x.gpus] for x in trace.ticks
    ]
    assert replayed.end["reason"] == "replay-ended"
    p = gpumon("devices", "--replay", str(t), "--json")
    assert len(json.loads(p.stdout)["gpus"]) == 2


def test_record_in_real_time_takes_its_duration(tmp_path: Path) -> None:
    t = tmp_path / "t"
    start = time.monotonic()
    p = gpumon("record", "--simulate", "healthy", "--duration", "2", "-o", str(t))
    assert p.returncode == 0 and time.monotonic() - start >= 1.9  # real time: never sooner
    assert len(read_trace(str(t)).ticks) == 2


def test_record_never_overwrites_a_recording(tmp_path: Path) -> None:
    t = tmp_path / "t"
    t.write_text("yesterday's recording\n")
    p = gpumon("record", "--simulate", "healthy", "--duration", "1", "-o", str(t))
    assert p.returncode == 5
    assert "already exists" in one_line_error(p) and "--force" in p.stderr
    assert t.read_text() == "yesterday's recording\n"


def test_record_into_a_missing_directory_names_the_file(tmp_path: Path) -> None:
    t = tmp_path / "no" / "such" / "dir" / "t"
    p = gpumon("record", "--simulate", "healthy", "--duration", "1", "-o", str(t))
    assert p.returncode == 5 and str(t) in one_line_error(p)


def test_corrupt_trace_is_refused_with_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"  # version 1, plain JSON Lines (tests/test_trace_v2.py: version 2)
    gpumon("record", "--simulate", "healthy", "--duration", "5", "--speed", "max", "-o", str(good))
    lines = good.read_text().splitlines(keepends=True)
    lines[3] = re.sub(r'"t_s":[0-9.]+', '"t_s":"soon"', lines[3], count=1)
    bad = tmp_path / "bad"
    bad.write_text("".join(lines))
    for args in (
        ["devices", "--replay", str(bad)],
        ["record", "--replay", str(bad), "-o", str(tmp_path / "out")],
    ):
        p = gpumon(*args)
        assert p.returncode == 4
        line = one_line_error(p)
        assert f"{bad}:4:" in line and "t_s" in line
    assert not (tmp_path / "out").exists()


def _wait_for_lines(path: Path, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines")


def _start_record(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon",
            "record",
            "--simulate",
            "starved-io,healthy",
            "--speed",
            "20",
            "-o",
            str(out),
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill_9_loses_at_most_the_tick_in_progress(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    proc = _start_record(out)
    try:
        _wait_for_lines(out, 6)
    finally:
        proc.kill()
        proc.wait()
    lines_on_disk = out.read_bytes().count(b"\n")
    trace = read_trace(str(out))
    assert len(trace.ticks) >= 5 and len(trace.ticks) >= lines_on_disk - 1
    assert trace.end is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_ends_the_file_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "t.jsonl"
    proc = _start_record(out)
    _wait_for_lines(out, 4)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and "Traceback" not in err
    trace = read_trace(str(out))
    assert trace.end is not None and trace.end["reason"] == "interrupted"
    assert trace.end["ticks"] == len(trace.ticks) >= 3


def test_python_dash_m_and_console_script_agree() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert p.returncode == 0 and "devices" in p.stdout and "record" in p.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["serve", "--help"]])
def test_help_to_a_full_disk_is_one_line_and_exit_5(args: list[str]) -> None:
    """issue 28: `gpumon --help >/dev/full` printed a traceback."""
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "gpumon", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
    assert p.returncode == 5, p.stderr
    assert one_line_error(p) == "gpumon: error: cannot write to standard output: No space left on device"


@pytest.mark.parametrize("module", ["gpumon.sim.fakenvml", "gpumon.detect.stage", "gpumon.trace.writer"])
def test_sigterm_while_record_is_still_starting_is_130(tmp_path: Path, module: str) -> None:
    """SIGTERM at start-up (README: 130) used to kill `gpumon record` by the signal (143) or,
    raised inside an import that swallowed it, leave it recording for ever. The moment is driven
    by the process itself: `-X importtime` says on stderr when each module is in."""
    out = str(tmp_path / "t.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "gpumon", "record", "--simulate", "healthy", "-o", out],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if line.rstrip().endswith(module):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=60)[1]
    said = "\n".join(ln for ln in rest.splitlines() if not ln.startswith("import time:"))
    assert proc.returncode == 130, (proc.returncode, said[-3000:])
    assert "Traceback" not in rest and "interrupted" in rest, said[-3000:]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A Python script that drives gpumon's command line from inside (a signal at a chosen point)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


SIGTERM_IN_A_FINALIZER = """
import signal, sys
from importlib.abc import MetaPathFinder

class DropsDuringImport(MetaPathFinder):
    # the first import of gpumon.trace.writer frees an object whose __del__ takes the SIGTERM
    def find_spec(self, name, path, target=None):
        if name == "gpumon.trace.writer":
            sys.meta_path.remove(self)
            Finalized()
        return None

class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)
        sum(range(10))  # the handler runs here, inside the finalizer

sys.meta_path.insert(0, DropsDuringImport())
sys.argv = ["gpumon", "record", "--simulate", "healthy", "-o", sys.argv[1]]
from gpumon.cli import main
sys.exit(main())
"""


def test_sigterm_taken_inside_a_finalizer_is_130_without_a_traceback(tmp_path: Path) -> None:
    """A SIGTERM whose handler ran inside a finalizer during the imports (gc freeing a cycle at
    that moment, beside two CPU hogs) was swallowed there and printed as "Exception ignored in:
    ... Traceback"; the signal is noted all the same, so the report is dropped."""
    p = run_script(SIGTERM_IN_A_FINALIZER, str(tmp_path / "t.jsonl"))
    assert p.returncode == 130, p.stderr
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert "(interrupted)" in p.stderr


SIGTERM_IN_SET_NAME = """
import signal, sys
from importlib.abc import MetaPathFinder

class SetName:
    def __set_name__(self, owner, name):
        signal.raise_signal(signal.SIGTERM)  # the handler raises here: Python 3.11 wraps it
        sum(range(10))

TARGET = sys.argv[2]

class BuildsAClassDuringImport(MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == TARGET:
            sys.meta_path.remove(self)
            type("Built", (), {"field": SetName()})
        return None

sys.meta_path.insert(0, BuildsAClassDuringImport())
sys.argv = ["gpumon", "record", "--simulate", "healthy", "-o", sys.argv[1]]
from gpumon.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("module", ["gpumon.cli.app", "gpumon.trace.writer"])
def test_sigterm_wrapped_by_the_code_it_interrupted_is_130_without_a_traceback(
    tmp_path: Path, module: str
) -> None:
    """A SIGTERM taken while a class is built at import (a dataclass's fields) reaches gpumon as
    "RuntimeError: Error calling __set_name__ ...", its cause the SIGTERM: it printed a traceback
    and exit 1 (beside two CPU hogs, a few runs in a hundred). It is an interruption: exit 130."""
    p = run_script(SIGTERM_IN_SET_NAME, str(tmp_path / "t.jsonl"), module)
    assert p.returncode == 130, p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    assert "interrupted" in p.stderr


def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_loop() -> None:
    """While a command's loop runs, Ctrl-C raises Interrupted in the waiting thread; raised inside
    a finalizer instead, it is swallowed, and the loop used to run on. Now it stops, exit 130."""
    import threading

    from gpumon import cli
    from gpumon.cli import flags

    saved = sys.unraisablehook
    stop = threading.Event()
    flags._RUNNING.append(stop)
    try:
        cli._quiet_when_swallowed()

        class Finalized:
            def __del__(self) -> None:
                raise flags.Interrupted("SIGINT")

        Finalized()
        assert stop.is_set() and flags.interrupted_late()
    finally:
        sys.unraisablehook = saved
        flags._RUNNING.remove(stop)
        flags._LATE_SIGNALS.clear()


LOADER_POOL = """
import multiprocessing, signal, sys, threading, time
sys.argv = ["gpumon", "scenarios"]  # the command line's own process, as `gpumon bench` is
from gpumon.cli import main
assert main() == 0
fork = multiprocessing.get_context("fork")
started = fork.Semaphore(0)

def load(_):  # a worker busy making a batch when the pool ends
    started.release()
    time.sleep(60)

def keras_like():  # Keras forks its PyDataset pool from a thread of its own
    pool = fork.Pool(2)
    for i in range(2):
        pool.apply_async(load, (i,))
    for _ in range(2):
        started.acquire(timeout=30)
    workers = list(pool._pool)
    pool.terminate()  # what the end of fit() does: SIGTERM to each worker, then wait for it
    print("workers ended by:", sorted(w.exitcode for w in workers))

t = threading.Thread(target=keras_like)
t.start()
t.join()
ours = signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
print("the command's SIGTERM:", "gpumon's" if ours else "default")
"""


def test_a_loader_worker_forked_by_a_gpumon_command_dies_of_sigterm_quietly() -> None:
    # with the command's handler, each worker ran Python on SIGTERM: a traceback per worker at the
    # end of every bench, and now and then one waiting forever on a lock copied at fork
    p = run_script(LOADER_POOL)
    assert p.returncode == 0, p.stderr
    assert f"workers ended by: [{-signal.SIGTERM}, {-signal.SIGTERM}]" in p.stdout, p.stdout
    assert "the command's SIGTERM: gpumon's" in p.stdout, p.stdout
    assert "Traceback" not in p.stderr, p.stderr


def test_sigterm_ends_watch_with_130_after_its_summary() -> None:
    """README "Exit codes": `timeout -s TERM 3 gpumon watch ...` exited 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "watch", "--simulate", "healthy"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "(simulated)" in line or re.match(r"\s+\d+\.\d\s+0 ", line):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "GPU 0:" in out and "wasted" in out and "Traceback" not in err


def test_plot_without_matplotlib_says_how_to_add_it_to_this_install(tmp_path: Path) -> None:
    """issue 27: the hint was `pip install 'gpumon-datastall[plot]'`, which no package index has."""
    trace = tmp_path / "t.jsonl"
    p = gpumon("record", "--simulate", "starved-cpu", "--duration", "5", "--speed", "max", "-o", str(trace))
    assert p.returncode == 0, p.stderr
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    p = subprocess.run(
        [sys.executable, "-m", "gpumon", "analyze", str(trace), "--plot", str(tmp_path / "t.png")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=f"{hide}:{ROOT}"),
    )
    assert p.returncode == 6
    line = one_line_error(p)
    assert f"{sys.executable} -m pip install" in line and "[plot]" in line, line
    assert "'gpumon-datastall[plot]'" not in line


@pytest.mark.parametrize(
    ("direct_url", "prefix", "hint"),
    [
        (
            '{"url": "file:///src/gpumon", "dir_info": {"editable": true}}',
            "/venv",
            "-m pip install -e '/src/gpumon[plot]'",
        ),
        ('{"url": "file:///src/gpumon", "dir_info": {}}', "/venv", "-m pip install '/src/gpumon[plot]'"),
        (None, "/venv", "-m pip install 'gpumon-datastall[plot]'"),  # from a package index
        (
            '{"url": "file:///src/gpumon", "dir_info": {}}',
            "/root/.local/pipx/venvs/gpumon-datastall",
            "pipx inject gpumon-datastall matplotlib",
        ),
    ],
)
def test_the_install_hint_follows_how_gpumon_was_installed(
    monkeypatch: pytest.MonkeyPatch, direct_url: str | None, prefix: str, hint: str
) -> None:
    from importlib import metadata

    from gpumon.core import extras

    class Dist:
        def read_text(self, name: str) -> str | None:
            return direct_url if name == "direct_url.json" else None

        def locate_file(self, path: str) -> str:
            return "/venv/lib/python3.11/site-packages"  # installed, not an egg-info in a clone

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist())
    monkeypatch.setattr(sys, "prefix", prefix)
    assert hint in extras.install_hint("plot")


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_an_output_that_is_not_a_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """`record -o FIFO --force` (and `trace convert` to one) waited for a reader forever, saying
    nothing (found by a hostile-input pass)."""
    import os
    import socket

    out = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(out)
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(out))
    p = gpumon("record", "--simulate", "healthy", "--duration", "2", "-o", str(out), "--force", timeout=60)
    assert p.returncode == 5, p.stderr
    assert f"not a regular file (a {'FIFO' if kind == 'fifo' else 'socket'})" in one_line_error(p)


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--gpu-step-ms", "0"], {}, "between 1 and 10000"),
        (["--gpu-step-ms", "nan"], {}, "between 1 and 10000"),
        (["--gpu-step-ms", "20000"], {}, "between 1 and 10000"),
        (["--gpu-step-ms", "100", "--save", "m.keras"], {}, "--save"),
        (["--gpu-step-ms", "100"], {"KERAS_BACKEND": "jax"}, "torch backend"),
        (["--gpu-step-ms", "100", "--gpus", "2"], {"KERAS_BACKEND": "jax"}, "torch backend"),
        (["--gpu-step-ms", "100", "--model", "gpu"], {}, "no model computes"),
    ],
)
def test_a_simulated_gpu_step_out_of_range_is_refused_before_anything_starts(
    args: list[str], env: dict[str, str], names: str
) -> None:
    """`bench --gpu-step-ms`: a step of 0 ms or hours, a model to save when nothing trains, or a
    backend whose training step it cannot replace: one line naming the flag, usage's exit code."""
    p = gpumon("bench", "--duration", "5", *args, env=env)
    assert p.returncode == 2, p.stderr
    line = one_line_error(p)
    assert "--gpu-step-ms" in line and names in line


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["serve", "--check-config", "--simulate", "healthy", "--interval", "0.01"], "--interval"),
        (["record", "--simulate", "healthy", "--duration", "1"], "-o/--output"),
        (["analyze", "--no-such-flag", "x.jsonl"], "--no-such-flag"),
        (["serve", "--bogus"], "--bogus"),
        (["bogus"], "'bogus'"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_flag_and_exit_2(args: list[str], named: str) -> None:
    """Not argparse's usage block of every flag before it (6-9 lines that buried the one to fix)."""
    p = gpumon(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and named in lines[0], p.stderr
    command = args[0] if args[0] in ("serve", "record", "analyze") else None
    where = f"(see: gpumon {command} --help)" if command else "(see: gpumon --help)"
    assert lines[0].endswith(where), "the list of the flags the command takes"
