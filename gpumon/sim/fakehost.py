"""A psutil look-alike for the simulated host, so simulated runs take the real host code path.

Cumulative counters (per-core CPU times, per-process CPU seconds, disk read bytes) are integrated
from each GPU's scenario phase: a CPU-starved job pins its main process and loader workers to whole
cores; a storage-starved job raises iowait and disk reads; a stalled job's processes sit quiet.
"""

from __future__ import annotations

import heapq
from collections import namedtuple
from typing import Any

from gpumon.sim.fleet import Fleet, unit_noise

scputimes = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")
pcputimes = namedtuple("pcputimes", "user system children_user children_system")
sdiskio = namedtuple("sdiskio", "read_count write_count read_bytes write_bytes")
pio = namedtuple("pio", "read_count write_count read_bytes write_bytes")

BACKGROUND_CORE_LOAD = 0.02
MIN_STEP_S = 0.05


class Error(Exception):
    pass


class NoSuchProcess(Error):
    def __init__(self, pid: int) -> None:
        self.pid = pid
        super().__init__(f"process no longer exists (pid={pid})")


class AccessDenied(Error):
    pass


class ZombieProcess(NoSuchProcess):
    pass


SIM_EPOCH_UNIX_S = 1_800_000_000.0
"""The simulated host's wall clock at the fleet's start (process start times are on it)."""


class FakeHost:
    NoSuchProcess = NoSuchProcess
    AccessDenied = AccessDenied
    ZombieProcess = ZombieProcess

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.cores = max(8, min(128, 8 * len(fleet.gpus)))
        self._t = fleet.sim_time()
        self._core = [[0.0] * 4 for _ in range(self.cores)]  # user, system, idle, iowait seconds
        self._disk_read = 0.0
        self._proc_cpu: dict[int, float] = {}
        self._proc_read: dict[int, float] = {}
        self._proc_runq: dict[int, float] = {}
        self._proc_blkio: dict[int, float] = {}
        self._waits: tuple[dict[int, float], dict[int, float], float] = ({}, {}, 0.0)
        self._load = 0.0
        self.gpumon_procfs = FakeProcFs(self)
        """What gpumon's host source reads from /proc on Linux (schedstat, delayacct)."""
        self.gpumon_wall = lambda: SIM_EPOCH_UNIX_S + self.fleet.sim_time()
        """The simulated host's wall clock, which process start times are on."""

    # -- integration ---------------------------------------------------------------------------

    def _loads(self, t: float) -> tuple[dict[int, float], dict[int, float], float]:
        """Per-pid cores used and read bytes/s, and the host iowait share, at fleet time t (also
        per-pid run-queue and block I/O waits, and other processes' cores, in self._waits)."""
        cpu: dict[int, float] = {}
        read: dict[int, float] = {}
        runq: dict[int, float] = {}
        blkio: dict[int, float] = {}
        other = 0.0
        iowait = 0.0
        slot = int(t * 4)
        for gpu in self.fleet.gpus:
            ph = gpu.phase(t)
            if not ph.has_job:
                continue

            def jitter(key: int, index: int = gpu.index) -> float:
                return 1 + self.fleet.noise * unit_noise(self.fleet.seed, index, slot, key)

            def load(cores: float, key: int, index: int = gpu.index) -> float:
                if cores >= 0.9:  # a saturated thread reads 95-100% of its core, never much less
                    return min(1.0, cores) - 0.04 * abs(unit_noise(self.fleet.seed, index, slot, key))
                return min(1.0, cores * jitter(key))

            main = gpu.pid_at(t)
            cpu[main] = load(ph.main_cpu, 0)
            runq[main], blkio[main] = ph.main_runq * jitter(97), ph.main_blkio * jitter(96)
            workers = gpu.worker_pids(t)
            for n, pid in enumerate(workers):
                cpu[pid] = load(ph.worker_cpu, n + 1)
                runq[pid] = ph.worker_runq * jitter(n + 200)
                blkio[pid] = ph.worker_blkio * jitter(n + 300)
            other += ph.other_cores
            readers = workers or [main]
            for pid in readers:
                read[pid] = ph.read_bytes_per_s * jitter(99) / len(readers)
            iowait += ph.iowait * jitter(98)
        self._waits = (runq, blkio, other)
        return cpu, read, min(0.9, iowait)

    def _advance(self) -> None:
        t = self.fleet.sim_time()
        dt = t - self._t
        # Rates are constant between updates: integrating every 50 ms at most loses nothing, and
        # keeps a real-time fleet of 64 GPUs (hundreds of process reads per tick) cheap.
        if dt <= 0 or (self._t > 0 and dt < MIN_STEP_S):
            return
        cpu, read, iowait = self._loads(t)
        runq, blkio, other = self._waits
        core_busy = [BACKGROUND_CORE_LOAD] * self.cores
        freest = [(BACKGROUND_CORE_LOAD, c) for c in range(self.cores)]  # a heap: the freest core first
        loads = dict(cpu)
        whole, part = int(other), other - int(other)  # other work: whole cores, then a part of one
        loads.update({-1 - n: 1.0 for n in range(whole)})
        if part:
            loads[-1 - whole] = part
        for pid in sorted(loads, key=lambda p: -loads[p]):  # greedy: each process to the freest core
            _, c = heapq.heappop(freest)
            core_busy[c] = min(1.0, core_busy[c] + loads[pid])
            heapq.heappush(freest, (core_busy[c], c))
        for c, busy in enumerate(core_busy):
            io = min(1.0 - busy, iowait)
            acc = self._core[c]
            acc[0] += dt * busy * 0.85
            acc[1] += dt * busy * 0.15
            acc[2] += dt * (1.0 - busy - io)
            acc[3] += dt * io
        for pid, cores in cpu.items():
            self._proc_cpu[pid] = self._proc_cpu.get(pid, 0.0) + cores * dt
        for pid, wait in runq.items():
            self._proc_runq[pid] = self._proc_runq.get(pid, 0.0) + wait * dt
        for pid, wait in blkio.items():
            self._proc_blkio[pid] = self._proc_blkio.get(pid, 0.0) + wait * dt
        for pid, rate in read.items():
            self._proc_read[pid] = self._proc_read.get(pid, 0.0) + rate * dt
        self._disk_read += (sum(read.values()) + 1e6) * dt
        self._load = sum(core_busy) + iowait * self.cores
        self._t = t

    # -- psutil API ----------------------------------------------------------------------------

    def cpu_count(self, logical: bool = True) -> int:
        return self.cores

    def cpu_times(self, percpu: bool = False) -> Any:
        self._advance()
        rows = [scputimes(u, 0.0, s, i, w, 0.0, 0.0, 0.0, 0.0, 0.0) for u, s, i, w in self._core]
        if percpu:
            return rows
        return scputimes(*(sum(col) for col in zip(*rows)))

    def disk_io_counters(self) -> Any:
        self._advance()
        return sdiskio(0, 0, int(self._disk_read), 0)

    def getloadavg(self) -> tuple[float, float, float]:
        self._advance()
        return (self._load, self._load, self._load)

    def Process(self, pid: int) -> FakeProcess:
        if not self._alive(pid):
            raise NoSuchProcess(pid)
        return FakeProcess(self, pid)

    def _alive(self, pid: int) -> bool:
        t = self.fleet.sim_time()
        for gpu in self.fleet.gpus:
            if gpu.phase(t).has_job and (pid == gpu.pid_at(t) or pid in gpu.worker_pids(t)):
                return True
        return False


class FakeProcess:
    def __init__(self, host: FakeHost, pid: int) -> None:
        self._host = host
        self.pid = pid

    def _live(self) -> None:
        if not self._host._alive(self.pid):
            raise NoSuchProcess(self.pid)
        self._host._advance()

    def name(self) -> str:
        self._live()
        return "python"

    def cpu_times(self) -> Any:
        self._live()
        s = self._host._proc_cpu.get(self.pid, 0.0)
        return pcputimes(s * 0.8, s * 0.2, 0.0, 0.0)

    def io_counters(self) -> Any:
        self._live()
        return pio(0, 0, int(self._host._proc_read.get(self.pid, 0.0)), 0)

    def create_time(self) -> float:
        """When the process started, on the simulated host's wall clock (FakeHost.gpumon_wall)."""
        self._live()
        t = self._host.fleet.sim_time()
        for gpu in self._host.fleet.gpus:
            if self.pid == gpu.pid_at(t) or self.pid in gpu.worker_pids(t):
                return SIM_EPOCH_UNIX_S + gpu.job_started_s(t)
        raise NoSuchProcess(self.pid)

    def children(self, recursive: bool = False) -> list[FakeProcess]:
        self._live()
        t = self._host.fleet.sim_time()
        for gpu in self._host.fleet.gpus:
            if gpu.pid_at(t) == self.pid:
                return [FakeProcess(self._host, p) for p in gpu.worker_pids(t)]
        return []


class FakeProcFs:
    """gpumon.collect.sources.host.ProcFs over the simulated host: run-queue and block I/O waits as the
    scenario's phase sets them (the simulated kernel counts block I/O delay)."""

    def __init__(self, host: FakeHost) -> None:
        self._host = host

    def sched(self, pid: int) -> tuple[float, float] | None:
        if not self._host._alive(pid):
            return None
        self._host._advance()
        return self._host._proc_cpu.get(pid, 0.0), self._host._proc_runq.get(pid, 0.0)

    def blkio_s(self, pid: int) -> float | None:
        if not self._host._alive(pid):
            return None
        self._host._advance()
        return self._host._proc_blkio.get(pid, 0.0)

    def newest_pid(self) -> int | None:
        return None  # cannot tell: the host source looks for workers every tick (they are cheap here)

    def descendants(self, pid: int) -> list[int] | None:
        return None  # the look-alike's Process.children answers instead
