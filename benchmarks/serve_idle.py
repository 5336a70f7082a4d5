"""What `gpumon serve` costs when nobody scrapes it, beside a peer exporter in the same run.

    .venv/bin/python -m benchmarks.serve_idle [--peer nvitop-exporter] [--seconds 60] [--rounds 3]
                                              [--gpus 8] [--starts 9] [--driver-init-ms 0]

Real processes on the stand-in libnvidia-ml.so.1 (tests/fakenvml, 8 GPUs, driver samples every
1/6 s on the real clock), so the real pynvml path runs as on a GPU machine, with the real host
source (psutil) and the flight recorder on (the default for GPUs; its segments go to a temporary
folder), 1 s cadence for both exporters.

- Idle: in each of --rounds rounds both exporters are started afresh and run side by side; after
  --warmup, each one's CPU time over --seconds (the kernel's exact per-thread run time,
  /proc/PID/task/*/schedstat) gives its share of a core, with its wake-ups per second (voluntary
  context switches). Medians over the rounds, and the ratio gpumon/peer.
- Where gpumon's share goes: each of its threads' median share (by the kernel's thread name), and
  beside it, in each round, a Python process with one thread that wakes once a second and does
  nothing: the floor, on this machine, of a periodic thread such as gpumon's supervisor and XID
  thread (each wake-up a thread switch, the interpreter's lock taken, the caches cold again). The
  absolute goal is printed against gpumon's median.
- First sample: spawn to the first answer of /metrics that carries a GPU series, each exporter
  started --starts times, alternately; medians and the ratio.

Both start as installed: by their console scripts, from compiled bytecode. pip compiles a wheel's
modules when it installs them; an editable install under PYTHONDONTWRITEBYTECODE (set on some CI
and development machines) never writes gpumon's, and would compile its sources at every start
(~30 ms here), so gpumon's are compiled first, as pip would have.

--driver-init-ms makes the stand-in's nvmlInit take that long, as a driver without persistence
mode does while it sets its GPUs up (on the order of a second on a multi-GPU host; with
nvidia-persistenced, milliseconds): gpumon opens the driver while it imports the rest of itself.

Goals (issue 29): idle ratio <= 0.5 and <= 0.15% of a core; first-sample ratio <= 1.0.
--scenarios idle: the stand-in's GPUs at rest (no job, no memory in use), as the lent H200 was:
gpumon then stops asking for their samples after 30 s (warm up past it, --warmup 35).
Without --peer, gpumon alone. The peer is in the dev extra (`pip install -e '.[dev]'`).

--real: the machine's own GPUs through its driver, not the stand-in (benchmarks/gpu_check.sh; --gpus
does not apply). During each round it also prints what each exporter holds on the GPU: whether
nvidia-smi lists it as a compute process (a CUDA context and its GPU memory would show there), and
which libcuda file is mapped into its process, if any (on the H200 the driver's own
libcuda.so.580.159.04 was, in both exporters', NVML loading it, while nvidia-smi listed neither as
a compute process: docs/gpu-check.md).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the first line of each exporter's exposition that carries a GPU's figure
FIRST_SERIES = {"gpumon": "gpumon_gpu_utilization_ratio{", "nvitop-exporter": "gpu_utilization_Percentage{"}


def run_ns(pid: int) -> int:
    """The process's threads' exact CPU time so far, in ns (sum of their schedstat run times)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between the listing and the read
    return total


def thread_ns(pid: int) -> dict[str, int]:
    """Each thread's exact CPU time so far, in ns, by its kernel name (threads of one name summed)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            out[name] = out.get(name, 0) + int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


WAKER = """
import threading
done = threading.Event()
def wake():
    while not done.wait(1.0):
        pass
threading.Thread(target=wake, daemon=True).start()
done.wait()
"""
"""The floor of a periodic thread here: a Python thread that wakes once a second and does nothing,
as gpumon's supervisor and XID threads do while nothing happens (each wake-up is a thread switch,
the interpreter's lock and the caches gone cold since the last one)."""


def wakeups(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Exporter:
    name: str
    argv: Callable[[int, Path], list[str]]


def console_script(name: str) -> str | None:
    """The installed entry point, in this interpreter's environment first."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def exporters(peer: str | None) -> list[Exporter]:
    gpumon = console_script("gpumon")
    start = [gpumon] if gpumon is not None else [sys.executable, "-m", "gpumon"]
    out = [
        Exporter(
            "gpumon",
            lambda port, tmp: [
                *start,
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--record-dir",
                str(tmp / f"rec-{port}"),
            ],
        )
    ]
    if peer == "nvitop-exporter":
        exe = console_script("nvitop-exporter")
        if exe is None:
            sys.exit("serve_idle: nvitop-exporter is not installed here: pip install -e '.[dev]'")
        out.append(
            Exporter(peer, lambda port, tmp: [exe, "--bind-address", "127.0.0.1", "--port", str(port)])
        )
    elif peer is not None:
        sys.exit(f"serve_idle: --peer {peer}: only nvitop-exporter is known")
    return out


def footprint(pid: int) -> str:
    """What the process holds on the GPU, as the driver and the kernel see it (--real)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    # which file: on the H200 (2026-12-04) "libcuda" was in gpumon's maps, no file named
    mapped = sorted({line.split()[-1] for line in maps.splitlines() if "libcuda" in line})
    cuda = f"mapped: {', '.join(mapped)}" if mapped else "no libcuda mapped"
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cuda}; nvidia-smi failed: {e}"
    mine = [line for line in listed.stdout.splitlines() if line.split(",")[0].strip() == str(pid)]
    return f"{cuda}; " + (f"nvidia-smi lists it: {mine}" if mine else "not a compute process in nvidia-smi")


def first_series(port: int, prefix: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return False
    return any(line.startswith(prefix) for line in body.splitlines())


def spawn(e: Exporter, env: dict[str, str], tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        e.argv(port, tmp), cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def time_to_first(e: Exporter, env: dict[str, str], tmp: Path, limit_s: float = 30.0) -> float:
    began = time.monotonic()
    proc, port = spawn(e, env, tmp)
    try:
        while time.monotonic() - began < limit_s:
            if first_series(port, FIRST_SERIES[e.name]):
                return time.monotonic() - began
            if proc.poll() is not None:
                sys.exit(f"serve_idle: {e.name} exited with {proc.returncode} before its first sample")
            time.sleep(0.005)
        sys.exit(f"serve_idle: no GPU series from {e.name} within {limit_s:g} s")
    finally:
        stop(proc)


BUSY = "healthy,starved-cpu,starved-io,underutilized"
"""The stand-in's GPUs by default: all busy, each with a job (issue 29's idle is "nobody scrapes")."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=["nvitop-exporter"], help="run this exporter beside gpumon")
    ap.add_argument("--seconds", type=float, default=60, help="each round's measured window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--starts", type=int, default=9, help="spawns per exporter for the first sample")
    ap.add_argument(
        "--driver-init-ms", type=float, default=0.0, help="the stand-in's nvmlInit takes this long"
    )
    ap.add_argument("--real", action="store_true", help="the machine's own GPUs, not the stand-in")
    ap.add_argument(
        "--scenarios",
        default=BUSY,
        help=f"what the stand-in's GPUs do, in turn (default {BUSY}; `idle`: a node at rest)",
    )
    args = ap.parse_args()
    if args.real and args.driver_init_ms:
        ap.error("--driver-init-ms: the stand-in's; not with --real")
    if args.real and args.scenarios != BUSY:
        ap.error("--scenarios: the stand-in's; not with --real")
    sys.path.insert(0, str(ROOT))
    from gpumon.core.errors import UsageError
    from gpumon.sim.scenarios import parse_scenarios

    try:
        parse_scenarios(args.scenarios)
    except UsageError as e:
        ap.error(f"--scenarios: {str(e).removeprefix('--simulate: ')}")

    # as pip does at install (a no-op where the bytecode is current)
    compileall.compile_dir(ROOT / "gpumon", quiet=1)

    who = exporters(args.peer)
    share: dict[str, list[float]] = {e.name: [] for e in who}
    wakes: dict[str, list[float]] = {e.name: [] for e in who}
    first: dict[str, list[float]] = {e.name: [] for e in who}
    threads: dict[str, list[float]] = {}
    """gpumon's share of a core per thread name, one entry per round (0 where absent)."""
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if args.real:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        else:
            from tests.fakenvml import driver

            config = driver.simulated_config(
                tmp,
                args.scenarios,
                gpus=args.gpus,
                seconds=300,
                faults=(f"init_delay_us {round(args.driver_init_ms * 1000)}",) if args.driver_init_ms else (),
            )
            env = driver.environment(config, PYTHONPATH=str(ROOT))
            env.pop("FAKENVML_NOW_US", None)  # the driver's timeline on the real clock
        for r in range(args.rounds):
            order = who if r % 2 == 0 else who[::-1]
            procs = [(e, spawn(e, env, tmp)[0]) for e in order]
            waker = subprocess.Popen([sys.executable, "-c", WAKER])
            try:
                time.sleep(args.warmup)
                c0 = {e.name: (run_ns(p.pid), wakeups(p.pid)) for e, p in procs}
                ours = next(p for x, p in procs if x.name == "gpumon")
                t0_threads, t0_waker = thread_ns(ours.pid), run_ns(waker.pid)
                t0 = time.monotonic()
                time.sleep(args.seconds)
                dt = time.monotonic() - t0
                for e, p in procs:
                    if p.poll() is not None:
                        sys.exit(f"serve_idle: {e.name} exited with {p.returncode} during the round")
                    share[e.name].append((run_ns(p.pid) - c0[e.name][0]) / 1e9 / dt)
                    wakes[e.name].append((wakeups(p.pid) - c0[e.name][1]) / dt)
                floor.append((run_ns(waker.pid) - t0_waker) / 1e9 / dt)
                for name, ns in thread_ns(ours.pid).items():
                    threads.setdefault(name, [0.0] * r).append((ns - t0_threads.get(name, 0)) / 1e9 / dt)
                for shares in threads.values():
                    if len(shares) == r:  # a thread gone before this round's end
                        shares.append(0.0)
                if args.real:
                    for e, p in procs:
                        print(f"round {r + 1}: {e.name} on the GPU: {footprint(p.pid)}")
            finally:
                for _, p in procs:
                    stop(p)
                stop(waker)
            print(
                f"round {r + 1}: "
                + "; ".join(f"{n} {share[n][-1] * 100:.3f}% ({wakes[n][-1]:.1f} wake-ups/s)" for n in share),
                flush=True,
            )
        for k in range(args.starts):
            for e in who if k % 2 == 0 else who[::-1]:
                first[e.name].append(time_to_first(e, env, tmp))
    med = statistics.median
    init = f", nvmlInit {args.driver_init_ms:g} ms" if args.driver_init_ms else ""
    gpus = "the machine's GPUs" if args.real else f"{args.gpus} stand-in GPUs"
    print(f"{gpus}{init}, 1 s cadence, no scraper; medians of {args.rounds} x {args.seconds:g} s:")
    for e in who:
        n = e.name
        idle = (
            f"idle {med(share[n]) * 100:.3f}% of a core, {med(wakes[n]):.1f} wake-ups/s; " if share[n] else ""
        )
        first_s = (
            f"first GPU series {med(first[n]):.3f} s after spawn "
            f"(median of {args.starts}; {min(first[n]):.3f}-{max(first[n]):.3f})"
            if first[n]
            else ""
        )
        print(f"  {n:16s} {idle}{first_s}")
    if threads:
        split = sorted(((med(v), k) for k, v in threads.items()), reverse=True)
        print("  gpumon by thread: " + ", ".join(f"{k} {v * 100:.3f}%" for v, k in split if v > 0))
        print(
            f"  a Python thread that wakes once a second and does nothing: {med(floor) * 100:.3f}% of a core "
            "here (gpumon's supervisor and XID threads wake so while nothing happens)"
        )
        print(f"gpumon: idle {med(share['gpumon']) * 100:.3f}% of a core (goal <= 0.15%)")
    if args.peer:
        ratios = []
        if args.rounds:
            ratios.append(f"idle CPU {med(share['gpumon']) / med(share[args.peer]):.2f} (goal <= 0.5)")
        if args.starts:
            ratios.append(f"first sample {med(first['gpumon']) / med(first[args.peer]):.2f} (goal <= 1.0)")
        print(f"gpumon/{args.peer}: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
