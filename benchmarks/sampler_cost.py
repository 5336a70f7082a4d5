"""CPU time of the sampler per GPU-sample, for 8 and 64 GPUs (not a timed test).

    .venv/bin/python -m benchmarks.sampler_cost [--ticks 300] [--repeats 5]

Three measurements, each the median of --repeats runs of --ticks ticks on a virtual clock (so
nothing sleeps and only CPU is counted, with time.process_time):

  gpumon overhead  NvmlSource + sampler over a canned driver whose calls cost ~nothing, so what is
                   left is gpumon's own Python (the real driver adds ~0.4-5 µs per call in C);
                   6 new sub-second samples per GPU per tick, as NVML gives at its finest period.
  + host (psutil)  the same, plus HostSource reading this machine's /proc for real.
  + detector       the same, plus the starvation detector fed every tick (what `serve` runs).
  simulator        the whole path over the simulated fleet, i.e. what `--simulate` costs; the
                   simulator itself is most of it, and it is not what runs on a GPU machine.
  job trees        (8 GPUs) each GPU's process a real process with 4 loader workers, read per
                   process from /proc (CPU, schedstat, block-I/O delay when counted): quiet, and
                   with a birth on the host before every tick, so the trees are listed again
                   every tick (issue 17: new workers found within a tick; the worst case).

Goal (issue 2): at a 1 s cadence on 8 GPUs, under 0.1% of one core, i.e. < 1 ms CPU per tick.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from types import SimpleNamespace

from gpumon.collect.pipeline import OpenedSources, Pipeline, SourceDescription, SourceSpec
from gpumon.collect.sources.host import HostSource, load_psutil
from gpumon.collect.sources.nvml.source import NvmlSource
from gpumon.core.clock import VirtualClock
from gpumon.core.problems import Problems


class CannedNvml:
    """A driver that answers instantly with fixed values; samples advance with its clock."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self, n: int, clock: VirtualClock) -> None:
        self.n, self.clock = n, clock
        self.util = SimpleNamespace(gpu=42, memory=10)
        self.mem = SimpleNamespace(total=80 << 30, used=40 << 30, free=40 << 30)
        self.procs = [SimpleNamespace(pid=os.getpid(), usedGpuMemory=1 << 30)]
        self.per_gpu: list[list[SimpleNamespace]] | None = None
        """Each GPU's own processes (job trees), instead of this process on every GPU."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetName(self, h: int) -> str:
        return "canned"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return self.util

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return self.mem

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 300_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTemperature(self, h: int, s: int) -> int:
        return 50

    def nvmlDeviceGetFieldValues(self, h: int, fields: tuple[int, ...]) -> list:
        now_us = int(self.clock.now() * 1e6)
        return [
            SimpleNamespace(fieldId=f, nvmlReturn=0, timestamp=now_us, value=SimpleNamespace(ullVal=now_us))
            for f in fields
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        return self.per_gpu[h] if self.per_gpu is not None else self.procs

    def nvmlDeviceGetSamples(self, h: int, kind: int, last: int) -> tuple[int, list]:
        now_us = int(self.clock.now() * 1e6)
        return 1, [
            SimpleNamespace(timeStamp=now_us - k * 166_667, sampleValue=SimpleNamespace(uiVal=40))
            for k in range(5, -1, -1)
        ]


def cpu_per_tick(make: Callable[[], Pipeline], ticks: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        pipeline = make()
        pipeline.run(duration_s=5)  # warm up: baselines, handles, caches
        t0 = time.process_time()
        pipeline.run(duration_s=ticks)
        runs.append((time.process_time() - t0) / ticks)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    problems = Problems(logging.getLogger("bench"))

    trees: list[int] = []

    def canned(
        n: int, with_host: bool, with_detector: bool = False, jobs: bool = False, births: bool = False
    ) -> Callable[[], Pipeline]:
        def make() -> Pipeline:
            clock = VirtualClock()
            nvml = CannedNvml(n, clock)
            if jobs:
                nvml.per_gpu = [[SimpleNamespace(pid=pid, usedGpuMemory=1 << 30)] for pid in trees[:n]]
            src = NvmlSource(nvml)
            src.open()
            host = HostSource(load_psutil()) if with_host else None
            if host is not None and births:
                born = itertools.count(1 << 30)
                host._procfs.newest_pid = lambda: next(born)
            sources = OpenedSources(gpu=src, host=host, description=SourceDescription.nvml())
            pipeline = Pipeline(SourceSpec("nvml"), clock, sources=sources, problems=problems)
            if with_detector:
                pipeline.on_verdicts(lambda tick, verdicts: None)  # a listener: the detector runs
            return pipeline

        return make

    def simulated(n: int) -> Callable[[], Pipeline]:
        def make() -> Pipeline:
            spec = SourceSpec("simulated", ("healthy", "starved-cpu", "starved-io", "underutilized"), n)
            return Pipeline(spec, VirtualClock(), problems=problems)

        return make

    print(
        f"sampler CPU cost, median of {args.repeats} runs x {args.ticks} ticks "
        f"(1 s cadence: share of one core = ms per tick / 10)"
    )
    print(f"{'GPUs':>4}  {'measurement':<18} {'ms/tick':>9} {'µs/GPU-sample':>14} {'core @1s':>9}")
    # 8 job trees: a process per GPU with 4 loader workers each, as a data-parallel job has. Not
    # this process's descendants (started through a shell that exits), or every row would count
    # them as the canned GPU process's (this process's) loader workers.
    for _ in range(8):
        tree = "for i in 1 2 3 4; do sleep 3600 & done; wait"
        out = subprocess.run(["sh", "-c", f"sh -c '{tree}' >/dev/null 2>&1 & echo $!"], capture_output=True)
        trees.append(int(out.stdout))
    time.sleep(0.5)
    try:
        for n in (8, 64):
            for label, make in (
                ("gpumon overhead", canned(n, False)),
                ("+ host (psutil)", canned(n, True)),
                ("+ detector", canned(n, True, True)),
                ("simulator", simulated(n)),
                *(
                    (("+ host, job trees", canned(n, True, jobs=True)),
                     ("+ host, births", canned(n, True, jobs=True, births=True)))
                    if n == 8 else ()
                ),
            ):  # fmt: skip
                per_tick = cpu_per_tick(make, args.ticks, args.repeats)
                print(
                    f"{n:>4}  {label:<18} {per_tick * 1e3:>9.3f} {per_tick / n * 1e6:>14.1f} "
                    f"{per_tick * 100:>8.3f}%"
                )
    finally:
        for pid in trees:
            subprocess.run(["pkill", "-P", str(pid)], check=False)
            subprocess.run(["kill", str(pid)], check=False)


if __name__ == "__main__":
    main()
