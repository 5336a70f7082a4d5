"""CPU time per tick of gpumon's NVML source on 8 stand-in GPUs, against the floor and the peers.

    .venv/bin/python -m benchmarks.nvml_cost [--ticks 300] [--repeats 5]

All in one process, on the stand-in libnvidia-ml.so.1 (tests/fakenvml/) replaying 8 simulated
GPUs through the real pynvml; the script re-runs itself with the stand-in loaded. CPU time is
time.process_time (sleeps do not count), median of --repeats runs of --ticks ticks:

  floor            the same pynvml calls gpumon makes, in a bare loop (handles cached,
                   last-seen sample timestamps tracked), each value read once into a tuple:
                   the least any program must do to get these numbers. Since 2026-12-04 the
                   samples in one driver call into a kept buffer and PCIe from the byte counters,
                   as gpumon reads them (before: pynvml's two-call wrapper, and the driver's 20 ms
                   PCIe window, which blocked 21 ms a call on an H200: docs/gpu-check.md)
  gpumon           NvmlSource.poll as every command runs it on real GPUs: each call that may
                   hang bracketed by the guard (gpumon.core.guard), on a thread a supervisor watches
                   with a 1 s deadline (the whole measurement runs on that thread)
  gpumon, no guard NvmlSource.poll without the guard (what simulated GPUs run)
  gpumon, GPM off  NvmlSource.poll with GPM not read (the stand-in's GPUs are Hopper-like: GPM
                   supported; issue 14's goal: GPM adds at most 50% to the NVML side)
  gpustat          gpustat.new_query(), gpustat's Python API for one query of all GPUs
  nvitop           [d.as_snapshot() for d in Device.all()], nvitop's API snapshot

Goals (issue 29): gpumon within 1.3x of the floor with GPM off (the floor makes the pre-GPM
calls) and 1.6x with GPM on, on both stand-ins (--driver both, the default: the project's own and
a second one written apart from it, tests/nvml2; the two ratios must agree within 0.2x); at least
5x cheaper per sample than gpustat (issue 3). Each contender's ticks are a second of driver time
apart (the stand-in's timeline is moved between ticks, outside the measured time), so every poll
reads 6 new utilization samples per GPU, as a daemon's 1 s tick does.

    python -m benchmarks.nvml_cost --real [--ticks 30]   (on a machine with NVIDIA GPUs)
    python -m benchmarks.nvml_cost --mig 7               (one H100 in MIG mode, 7 instances)

--mig: the cost of a second on the stand-in with one GPU in MIG mode: one tick plus the
sampler's four GPM steps between ticks (gpm.ACTIVITY_HZ = 5), against the same tick with GPM off.

measures the same contenders on the machine's own GPUs (no peers), ticks 0.11 s apart so that
each GPM read takes a sample (NVML's samples must be more than 100 ms apart).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GPUS = int(os.environ.get("NVML_COST_GPUS", "8"))
RATIO_LINE = "gpumon (GPM off) vs the floor: "


SPACING_S = float(os.environ.get("NVML_COST_SPACING_S", "0"))
"""Sleep between ticks (not counted: process time): 0.11 s on real GPUs, for GPM's 100 ms rule."""

CLOCK_VAR = os.environ.get("NVML_COST_CLOCK_VAR", "")
"""The stand-in's timeline variable (FAKENVML_NOW_US, NVML2_NOW_US): each contender's tick comes
a second of driver time after its last, as a daemon's do, so every poll reads a second of new
utilization samples (6 per GPU) and every GPM read computes metrics. Empty on real GPUs."""

_timeline: dict[str, int] = {}


def _advance(name: str) -> None:
    """Move the stand-in's timeline to this contender's next second (outside the measured time)."""
    if CLOCK_VAR:
        _timeline[name] = _timeline.get(name, 10_000_000) + 1_000_000
        os.environ[CLOCK_VAR] = str(_timeline[name])


def interleaved(contenders: dict[str, tuple[Callable[[], object], int]], repeats: int) -> dict[str, float]:
    """Median CPU seconds per tick of each contender; each round runs every contender once, so a
    slow spell of the shared machine hits all of them alike."""
    for name, (tick, _) in contenders.items():
        for _ in range(5):
            _advance(name)
            tick()  # warm up: handles, caches, first-call costs
            time.sleep(SPACING_S)
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    own: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, (tick, ticks) in contenders.items():
            spent = mine = 0.0
            for _ in range(ticks):
                _advance(name)
                t0, m0 = time.process_time(), time.thread_time()
                tick()
                spent += time.process_time() - t0
                mine += time.thread_time() - m0
                if SPACING_S:
                    time.sleep(SPACING_S)
            runs[name].append(spent / ticks)
            own[name].append(mine / ticks)
    THREAD_CPU.update({name: statistics.median(values) for name, values in own.items()})
    return {name: statistics.median(values) for name, values in runs.items()}


THREAD_CPU: dict[str, float] = {}
"""The same medians, of the measuring thread's own CPU only (printed with --real: on the H200 the
bare calls with nvmlDeviceGetPcieThroughput cost 94.5 ms of the process's CPU a tick, against
2 x 0.87 ms measured call by call; on a later H200 the bare calls took 10.4 ms of the process's
CPU a tick and 3.6 ms of the measuring thread's: the rest is other threads, the driver's or the
kept sources' XID waits, which this does not tell apart)."""


def child(ticks: int, repeats: int, peers: bool) -> None:
    import pynvml

    from gpumon.collect.pipeline.supervisor import Supervisor
    from gpumon.collect.sources.nvml.source import NvmlSource
    from gpumon.core.guard import CallGuard

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    assert len(handles) == GPUS
    last_seen = [0] * GPUS

    pcie = (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
    try:  # as gpumon, the PCIe byte counters only where the driver has them (asked once)
        pynvml.nvmlDeviceGetFieldValues(handles[0], pcie)
        counters = True
    except pynvml.NVMLError:
        counters = False

    get_samples = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
    buffer = (pynvml.c_nvmlSample_t * 128)()
    kind, count = ctypes.c_uint(0), ctypes.c_uint(0)
    kind_ref, count_ref = ctypes.byref(kind), ctypes.byref(count)
    utilization = ctypes.c_uint(pynvml.NVML_GPU_UTILIZATION_SAMPLES)

    def floor() -> list[tuple]:
        # The same calls, and each value read once (getting a value costs its attribute read).
        out = []
        pynvml.nvmlDeviceGetCount()
        for i, h in enumerate(handles):
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            values = [
                u.gpu,
                u.memory,
                m.used,
                m.total,
                pynvml.nvmlDeviceGetPowerUsage(h),
                pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
                pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                [
                    (v.nvmlReturn, v.timestamp, v.value.ullVal)
                    for v in (pynvml.nvmlDeviceGetFieldValues(h, pcie) if counters else ())
                ],
                pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                [(p.pid, p.usedGpuMemory) for p in procs],
            ]
            # the samples in one driver call into a kept buffer, as gpumon reads them (pynvml's
            # wrapper makes two: the count, then the samples)
            count.value = len(buffer)
            if not get_samples(h, utilization, ctypes.c_ulonglong(last_seen[i]), kind_ref, count_ref, buffer):
                samples = buffer[0 : count.value]
                last_seen[i] = samples[-1].timeStamp
                values.append([(s.timeStamp, s.sampleValue.uiVal) for s in samples])
            out.append(tuple(values))
        return out

    # Each poll a second after the last on gpumon's side, so every GPM read takes a sample and
    # computes metrics (within 100 ms of the last it takes nothing: cheaper than a real tick).
    ticks_done = [0.0, 0.0, 0.0]

    def clock(k: int) -> float:
        ticks_done[k] += 1.0
        return ticks_done[k]

    guard = CallGuard()
    guarded = NvmlSource(pynvml, guard=guard)
    guarded.open()
    direct = NvmlSource(pynvml)
    direct.open()
    no_gpm = NvmlSource(pynvml, guard=CallGuard(), gpm=False)
    no_gpm.open()
    supervisor = Supervisor(guard, 1.0)

    contenders: dict[str, tuple[Callable[[], object], int]] = {
        "floor (bare pynvml calls)": (floor, ticks),
        "gpumon": (lambda: guarded.poll(clock(0)), ticks),
        "gpumon, no guard": (lambda: direct.poll(clock(1)), ticks),
        "gpumon, GPM off": (lambda: no_gpm.poll(clock(2)), ticks),
    }
    results = supervisor.call(lambda: interleaved(contenders, repeats))
    gpm_share = results["gpumon"] / results["gpumon, GPM off"] - 1
    base = results["floor (bare pynvml calls)"]
    gpm_line = (
        f"GPM adds {gpm_share:+.0%} to the NVML side; gpumon with GPM {results['gpumon'] / base:.2f}x "
        f"the floor (goal: at most 1.6x)\n"
        f"{RATIO_LINE}{results['gpumon, GPM off'] / base:.2f}x (goal: at most 1.3x)"
    )
    if not peers:
        base = results["floor (bare pynvml calls)"]
        for name, value in results.items():
            own = f"  (this thread {THREAD_CPU[name] * 1e3:.3f} ms)" if SPACING_S else ""
            ratio = f"{value / base:>5.2f}x the floor"
            print(f"{GPUS} GPUs  {name:<28} {value * 1e3:>8.3f} ms/tick  {ratio}{own}")
        print(gpm_line)
        return
    # Imported only now: gpustat replaces pynvml.nvmlDeviceGetMemoryInfo when imported.
    import gpustat
    from nvitop import Device

    results.update(
        interleaved(
            {
                "gpustat new_query()": (gpustat.new_query, max(20, ticks // 10)),
                "nvitop as_snapshot()": (lambda: [d.as_snapshot() for d in Device.all()], ticks),
            },
            repeats,
        )
    )
    base = results["floor (bare pynvml calls)"]
    ours = results["gpumon"]
    print(
        f"NVML source CPU cost on {GPUS} stand-in GPUs, median of {repeats} runs "
        f"({ticks} ticks; gpustat {max(20, ticks // 10)}: it sleeps 0.1 s per GPU)"
    )
    print(f"{'':<28} {'ms/tick':>8} {'µs/GPU-sample':>14} {'vs floor':>9} {'vs gpumon':>10}")
    for name, value in results.items():
        print(
            f"{name:<28} {value * 1e3:>8.3f} {value / GPUS * 1e6:>14.1f} {value / base:>8.2f}x "
            f"{value / ours:>9.2f}x"
        )
    print(f"goal: at least 5x cheaper than gpustat: {results['gpustat new_query()'] / ours:.1f}x")
    print(gpm_line)


def mig_child(ticks: int, repeats: int) -> None:
    import pynvml

    from gpumon.collect.pipeline.supervisor import Supervisor
    from gpumon.collect.sources.nvml.source import NvmlSource
    from gpumon.core.guard import CallGuard

    guard = CallGuard()
    with_fast = NvmlSource(pynvml, guard=guard)
    with_fast.open()
    tick_only = NvmlSource(pynvml, guard=CallGuard(), gpm=False)
    tick_only.open()
    t = [0.0, 0.0]

    def second(src: NvmlSource, k: int, fast: bool) -> None:
        for step in range(1, 5):
            if fast:
                src.sample_activity(t[k] + 0.2 * step)
        t[k] += 1.0
        src.poll(t[k])

    results = Supervisor(guard, 1.0).call(
        lambda: interleaved(
            {
                "GPM, MIG at 5 Hz": (lambda: second(with_fast, 0, True), ticks),
                "GPM off": (lambda: second(tick_only, 1, False), ticks),
            },
            repeats,
        )
    )
    units = len(with_fast.poll(t[0] + 1.0))
    for name, value in results.items():
        print(f"{units} units (GPUs and MIG instances)  {name:<20} {value * 1e3:>8.3f} ms per second")
    gpm = results["GPM, MIG at 5 Hz"] / results["GPM off"] - 1
    print(f"GPM, with MIG instances sampled 5 times a second, adds {gpm:+.0%} to the NVML side")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpus", type=int, default=8, help="stand-in GPUs (at most 64)")
    ap.add_argument("--no-peers", action="store_true", help="skip gpustat and nvitop (slow at 64 GPUs)")
    ap.add_argument("--real", action="store_true", help="the machine's own GPUs, not the stand-in")
    ap.add_argument(
        "--driver",
        choices=["fakenvml", "nvml2", "both"],
        default="both",
        help="which stand-in: the project's (tests/fakenvml), the second, independent one "
        "(tests/nvml2; no peers, no MIG), or both one after the other (default)",
    )
    ap.add_argument("--mig", type=int, default=0, help="MIG instances on one stand-in GPU (at most 7)")
    ap.add_argument("--mig-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.ticks, args.repeats, not args.no_peers)
        return
    if args.mig_child:
        mig_child(args.ticks, args.repeats)
        return
    if args.real:
        import pynvml

        pynvml.nvmlInit()
        global GPUS, SPACING_S
        GPUS, SPACING_S = pynvml.nvmlDeviceGetCount(), 0.11
        pynvml.nvmlShutdown()
        child(args.ticks, args.repeats, False)
        return
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    from tests.fakenvml import driver

    if args.mig:
        with tempfile.TemporaryDirectory() as tmp:
            kinds = ",".join(["starved-cpu", "healthy"] * 4)
            config = driver.mig_config(Path(tmp), "healthy,idle", ",".join(kinds.split(",")[: args.mig]))
            env = driver.environment(config, PYTHONPATH=str(root))
            cmd = [sys.executable, "-m", "benchmarks.nvml_cost", "--mig-child", "--ticks", str(args.ticks)]
            os.execve(sys.executable, [*cmd, "--repeats", str(args.repeats)], env)
    child_argv = [sys.executable, "-m", "benchmarks.nvml_cost", "--child"]
    child_argv += ["--ticks", str(args.ticks), "--repeats", str(args.repeats)]
    gpm_off: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.driver in ("fakenvml", "both"):
            config = driver.simulated_config(
                Path(tmp), "healthy,starved-cpu,starved-io,underutilized", gpus=args.gpus, seconds=300
            )
            shares = " ".join(map(str, driver.GPM_SHARES))
            with config.open("a") as f:  # Hopper-like GPUs: GPM supported on every one
                f.writelines(f"gpm {i} {shares}\n" for i in range(args.gpus))
            env = driver.environment(
                config,
                PYTHONPATH=str(root),
                NVML_COST_GPUS=str(args.gpus),
                NVML_COST_CLOCK_VAR="FAKENVML_NOW_US",
                FAKENVML_NOW_US="10000000",
            )
            print("stand-in 1 (tests/fakenvml):", flush=True)
            gpm_off["stand-in 1"] = _run_child([*child_argv, *(["--no-peers"] if args.no_peers else [])], env)
        if args.driver in ("nvml2", "both"):
            from tests.nvml2 import build as nvml2

            env = nvml2.environment(
                args.gpus,
                now_us=10_000_000,
                PYTHONPATH=str(root),
                NVML_COST_GPUS=str(args.gpus),
                NVML_COST_CLOCK_VAR="NVML2_NOW_US",
            )
            print("stand-in 2 (tests/nvml2, written apart from the first; no peers):", flush=True)
            gpm_off["stand-in 2"] = _run_child([*child_argv, "--no-peers"], env)
    if len(gpm_off) == 2:
        a, b = gpm_off["stand-in 1"], gpm_off["stand-in 2"]
        print(
            f"gpumon (GPM off) vs the floor: {a:.2f}x on stand-in 1, {b:.2f}x on stand-in 2 "
            f"(they must agree within 0.2x: {abs(a - b):.2f}x apart)"
        )


def _run_child(argv: list[str], env: dict[str, str]) -> float:
    """Run one child, echo its lines, return its "gpumon, GPM off" ratio to the floor."""
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.exit(f"nvml_cost: the child failed ({out.returncode}):\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        if line.startswith(RATIO_LINE):
            return float(line[len(RATIO_LINE) :].split("x")[0])
    sys.exit("nvml_cost: the child printed no ratio")


if __name__ == "__main__":
    main()
