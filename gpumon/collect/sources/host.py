"""Host CPU, iowait, disk reads, and the CPU of each GPU process tree.

The psutil-like object is injected (the real `psutil`, or the simulator's `gpumon.sim.fakehost`).
On Linux, the cores' times (gpumon.collect.sources.cpustat), disk reads (DiskStats) and each job
process's counters (ProcFs.counts) are read from /proc directly: psutil's cost grows with the
cores, disks and processes, theirs hardly; psutil still finds the processes and their children. Reading
(cumulative counters) is split from computing rates (`cpu_ratios`, `rate`), which are pure and
what the tests hit. Rates need two readings: the first `poll` only takes a baseline and
returns None.

Known limits, said plainly: descendants that exit between two ticks take their CPU time with them
(it is not counted); GPU processes in another PID namespace (containers) cannot be looked up and
are left out; Linux iowait is unreliable on many cores (proc(5)), so disk read bytes come along.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpumon.collect.sources.cpustat import CoreTimes, CpuRatios, ProcStat
from gpumon.collect.sources.cpustat import ratios as core_ratios
from gpumon.collect.sources.procfile import ProcFile, read_proc
from gpumon.core.model import MAX_HOST_PROCESSES, HostSample, ProcessCpu
from gpumon.core.problems import Problems

log = logging.getLogger("gpumon.host")


def load_psutil() -> ModuleType:
    # here, not at the top: the real host only (a simulated run never loads it)
    import psutil

    return psutil  # type: ignore[no-any-return]  # untyped: seen as Any


def _busy_idle(t: Any) -> tuple[float, float, float]:
    """(busy, total, iowait) seconds of one cpu_times reading. Guest time is inside user time."""
    idle = t.idle
    iowait = getattr(t, "iowait", None)
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
    waiting = idle + (iowait or 0.0)
    return total - waiting, total, (iowait if iowait is not None else float("nan"))


def cpu_ratios(prev: Sequence[Any], cur: Sequence[Any]) -> CpuRatios:
    """Ratios over the interval between two per-core `cpu_times(percpu=True)` readings."""
    busy_sum = total_sum = iowait_sum = 0.0
    busiest = 0.0
    has_iowait = True
    for a, b in zip(prev, cur):
        busy_a, total_a, io_a = _busy_idle(a)
        busy_b, total_b, io_b = _busy_idle(b)
        d_total = total_b - total_a
        d_busy = max(0.0, busy_b - busy_a)
        if d_total <= 0:
            continue
        busiest = max(busiest, min(1.0, d_busy / d_total))
        busy_sum += d_busy
        total_sum += d_total
        if io_a != io_a or io_b != io_b:  # NaN: this OS has no iowait
            has_iowait = False
        else:
            iowait_sum += max(0.0, io_b - io_a)
    if total_sum <= 0:
        return CpuRatios(0.0, 0.0, 0.0 if has_iowait else None)
    return CpuRatios(
        cpu_ratio=min(1.0, busy_sum / total_sum),
        busiest_core_ratio=busiest,
        iowait_ratio=min(1.0, iowait_sum / total_sum) if has_iowait else None,
    )


def rate(prev: float | None, cur: float | None, dt_s: float) -> float | None:
    """Per-second rate of a cumulative counter; None when unknown; 0 after a counter reset."""
    if prev is None or cur is None or dt_s <= 0:
        return None
    return max(0.0, cur - prev) / dt_s


UNSEEN_MAX_S = 60.0
"""The longest a GPU process this host could not see waits before it is looked up again."""
CHILDREN_RESCAN_S = 5.0
"""How often the descendants of a GPU process are looked for when nothing says a process was born.
Where /proc tells (Linux: the newest PID in /proc/loadavg), a birth anywhere on the host triggers a
look at once, through the cheap /proc/PID/task/TID/children files: a loader worker is found within
the tick it appears, whatever the job's age."""


YOUNG_TREE_S = 30.0
"""Without /proc to say when a process is born: for this long after a GPU process is first seen,
it is rescanned every tick until workers show up."""


@dataclass(eq=False)  # state, not a value: equal only to itself
class _Counts:
    """Cumulative counters of one process, as last read (None: not available)."""

    cpu_s: float
    read_b: int | None
    runq_s: float | None
    blkio_s: float | None


@dataclass(eq=False)  # state, not a value: equal only to itself
class _Tree:
    """A GPU process and its descendants, with their counters as last read."""

    proc: Any
    name: str
    counts: dict[int, _Counts] = field(default_factory=dict)
    """The GPU process and each descendant, by PID."""
    children: list[Any] = field(default_factory=list)
    scanned_t_s: float = float("-inf")
    born_before: dict[int, bool] = field(default_factory=dict)
    """Per child found by the last scan: whether it existed before the previous tick."""
    first_t_s: float = 0.0
    age_at_first_s: float | None = None
    """The process's age when first seen (its start time against the wall clock): ages after that
    follow the sampler's clock, so a simulated host at full speed ages with its samples."""

    def age(self, t_s: float) -> float | None:
        return None if self.age_at_first_s is None else round(self.age_at_first_s + t_s - self.first_t_s, 1)


SMALL = 4096
"""A process's stat, io and schedstat, and loadavg, are a few hundred bytes at most."""
MAX_BIRTHS_READ = 64
"""PIDs handed out since the last tick whose parents are read (ProcFs.parents_of); more than this,
and every job's tree is looked through instead."""


class ProcFs:
    """What psutil does not read, from /proc: each process's run-queue wait (schedstat) and
    block I/O delay (delayacct), whether a process was born, and a process's children; and, on
    every tick, a job process's counters all at once (`counts`)."""

    DELAYACCT_RECHECK_S = 60.0

    def __init__(self, root: str = "/proc") -> None:
        self.root = root
        self.load1: float | None = None
        """The 1-minute load of the last newest_pid() read."""
        self.running: int | None = None
        """The threads runnable at the last newest_pid() read (this one included)."""
        self._tck = float(os.sysconf("SC_CLK_TCK"))
        self._loadavg = ProcFile(f"{root}/loadavg", SMALL, one_record=True)
        self._delayacct = False
        self._checked = -float("inf")

    def sched(self, pid: int) -> tuple[float, float] | None:
        """(seconds on a CPU, seconds runnable but waiting for one) since the process began."""
        try:
            with open(f"{self.root}/{pid}/schedstat", "rb") as f:
                on_ns, wait_ns, _ = f.read().split(maxsplit=2)
            return int(on_ns) / 1e9, int(wait_ns) / 1e9
        except (OSError, ValueError):
            return None

    def delayacct(self) -> bool:
        """Whether the kernel counts block I/O delay per task (kernel.task_delayacct)."""
        now = time.monotonic()
        if now - self._checked >= self.DELAYACCT_RECHECK_S:
            self._checked = now
            try:
                with open(f"{self.root}/sys/kernel/task_delayacct", "rb") as f:
                    self._delayacct = f.read().strip() == b"1"
            except OSError:
                self._delayacct = False
        return self._delayacct

    def blkio_s(self, pid: int) -> float | None:
        """Seconds the process waited for block I/O (stat field 42), when the kernel counts it."""
        if not self.delayacct():
            return None
        try:
            with open(f"{self.root}/{pid}/stat", "rb") as f:
                stat = f.read()
            return int(stat[stat.rfind(b")") + 2 :].split()[39]) / self._tck
        except (OSError, ValueError, IndexError):
            return None

    def counts(self, pid: int) -> _Counts:
        """A process's CPU time (user and system, all its threads), bytes read from storage,
        run-queue wait and block I/O delay: what psutil's cpu_times and io_counters read (stat,
        io) with schedstat, without their layers, each file in three system calls (about half of
        a job process's cost a tick: benchmarks/sampler_cost.py). ProcessLookupError when the
        process is gone."""
        base = f"{self.root}/{pid}/"
        try:
            stat = read_proc(base + "stat", SMALL, one_record=True)
            fields = stat[stat.rfind(b")") + 2 :].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / self._tck
            blkio = int(fields[39]) / self._tck if len(fields) > 39 and self.delayacct() else None
        except (OSError, ValueError, IndexError):
            raise ProcessLookupError(pid) from None  # gone (or no process's stat: as good as gone)
        read_b: int | None = None
        try:  # another user's process, without the capability to read it: unknown, not zero
            io = read_proc(base + "io", SMALL, one_record=True)
            at = io.find(b"\nread_bytes:")
            if at >= 0:
                end = io.find(b"\n", at + 1)
                read_b = int(io[at + 12 : end if end > 0 else len(io)])
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessLookupError(pid) from None  # it exited between the reads: gone, as psutil said
        except (OSError, ValueError):
            pass
        runq: float | None = None
        try:
            runq = int(read_proc(base + "schedstat", SMALL, one_record=True).split()[1]) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessLookupError(pid) from None
        except (OSError, ValueError, IndexError):
            pass
        return _Counts(cpu_s=cpu_s, read_b=read_b, runq_s=runq, blkio_s=blkio)

    def newest_pid(self) -> int | None:
        """The PID most recently handed out on the host (/proc/loadavg): it changes when any process
        is born (namespaced PIDs aside). The same read leaves the 1-minute load in `load1` (None
        where it could not be read), so that the tick reads the file once."""
        self.load1 = self.running = None
        try:
            fields = self._loadavg.read().split()
            self.load1 = float(fields[0])
            self.running = int(fields[3].split(b"/")[0])
            return int(fields[-1])
        except (OSError, ValueError, IndexError):
            return None

    def parents_of(self, first: int, last: int) -> frozenset[int] | None:
        """The parents of the processes with PIDs `first` to `last` (those handed out since the
        last look, threads' included: a thread's is its process's parent); None where there are
        more than MAX_BIRTHS_READ of them or they wrapped around: look at every tree. One gone
        already is no one's child now."""
        count = last - first + 1
        if not 0 <= count <= MAX_BIRTHS_READ:
            return None
        out = set()
        for pid in range(first, last + 1):
            try:
                stat = read_proc(f"{self.root}/{pid}/stat", SMALL, one_record=True)
            except OSError:
                continue
            try:  # "pid (comm) state ppid ...": the name may hold spaces and parentheses
                out.add(int(stat[stat.rindex(b")") + 2 :].split(maxsplit=2)[1]))
            except (ValueError, IndexError):
                return None
        return frozenset(out)

    def descendants(self, pid: int) -> list[int] | None:
        """Every descendant's PID, from the children files of each thread (no scan of /proc); None
        where the kernel has no such files."""
        out: list[int] = []
        todo = [pid]
        first = True
        while todo:
            current = todo.pop()
            try:
                tids = os.listdir(f"{self.root}/{current}/task")
            except OSError:
                if first:
                    return None
                continue
            for tid in tids:
                try:
                    # (a file of records: read to its end; ~8 bytes a child)
                    kids = [
                        int(x)
                        for x in read_proc(f"{self.root}/{current}/task/{tid}/children", 1 << 20).split()
                    ]
                except FileNotFoundError:
                    if first:
                        return None
                    continue
                except (OSError, ValueError):
                    continue
                out += kids
                todo += kids
            first = False
        return out


DISKSTATS = "/proc/diskstats"
MAX_DISKSTATS = 1 << 20
"""~100 bytes a block device: some 10,000 of them."""


class DiskStats:
    """Bytes read from whole disks, from /proc/diskstats (as psutil counts them: a partition's
    reads are its disk's too, so only names under /sys/block are summed). Which names are whole
    disks is looked up once a minute, not on every read."""

    RECHECK_S = 60.0

    def __init__(self, path: str, sys_block: str = "/sys/block") -> None:
        self._path = path
        self._file = ProcFile(path, MAX_DISKSTATS)
        self._sys_block = sys_block
        self._disks: frozenset[str] = frozenset()
        self._checked = -float("inf")

    def read_bytes(self) -> int:
        return self.read()[0]

    def read(self) -> tuple[int, dict[str, int]]:
        """Bytes read from whole disks, and each whole disk's milliseconds spent doing I/O
        (io_ticks, the 10th statistic: what iostat's %util is made of)."""
        lines = self._file.read().split(b"\n")
        now = time.monotonic()
        if now - self._checked >= self.RECHECK_S:
            self._disks = (
                frozenset(os.listdir(self._sys_block)) if os.path.isdir(self._sys_block) else frozenset()
            )
            self._checked = now
        total = 0
        busy: dict[str, int] = {}
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and (name := fields[2].decode()) in self._disks:
                total += int(fields[5]) * 512  # sectors read; a sector is 512 bytes here, whatever the disk
                if len(fields) >= 13:
                    busy[name] = int(fields[12])
        return total, busy


def busiest_disk_ratio(prev: dict[str, int] | None, cur: dict[str, int] | None, dt_s: float) -> float | None:
    """The busiest whole disk's share of the interval spent doing I/O (iostat's %util), 0-1; None
    without two readings. A device at 1.0 is saturated if it serves one request at a time (a disk,
    a network volume); SSDs and RAID serve many at once and read 1.0 well before their limit."""
    if not prev or not cur or dt_s <= 0:
        return None
    shares = [max(0, cur[k] - prev[k]) / (dt_s * 1000.0) for k in cur if k in prev]
    return round(min(1.0, max(shares)), 4) if shares else None


def _core_reader(path: str | None) -> ProcStat | None:
    """A reader of the cores' times from `path`, if it reads (else psutil's are used)."""
    if path is None:
        return None
    reader = ProcStat(path)
    try:
        reader.read()
    except (OSError, ValueError) as e:
        log.info("host: per-core CPU times from psutil (%s)", e)
        return None
    return reader


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


class HostSource:
    name = "host"
    first_reading_is_baseline = True
    """Its first reading gives no sample (rates need two): a first tick taken at once leaves it out
    and reads it a little after (Sampler.start)."""

    def __init__(
        self,
        psutil: ModuleType | Any,
        problems: Problems | None = None,
        children_rescan_s: float = CHILDREN_RESCAN_S,
        cpu_stat: str | None = None,
    ) -> None:
        """`cpu_stat`: a /proc/stat to read the cores' times from (gpumon.collect.sources.cpustat);
        by default Linux's own where `psutil` is the real one and the file reads, else psutil's
        cpu_times."""
        self._ps = psutil
        self._rescan_s = children_rescan_s
        self._problems = problems or Problems(log)
        self._cpu_count = int(psutil.cpu_count() or 1)
        self._prev_t: float | None = None
        self._prev_cpu: list[Any] | CoreTimes | None = None
        self._prev_disk: int | None = None
        self._disk_busy: dict[str, int] | None = None
        self._prev_disk_busy: dict[str, int] | None = None
        self._trees: dict[int, _Tree] = {}
        self._unseen: dict[int, tuple[float, float]] = {}
        """GPU processes this host cannot see (another PID namespace): when each is looked up again,
        and the wait before that look. Not every tick: after `children_rescan_s`, then twice as long
        each time it is still not seen, up to UNSEEN_MAX_S (a process in another namespace never
        shows here; each look cost ~11 us, most of a container's host tick)."""
        self._prev_wall: float | None = None
        # the wall clock process start times are on (a simulated host has its own)
        self._wall: Callable[[], float] = getattr(psutil, "gpumon_wall", None) or time.time
        # On Linux, /proc/diskstats read directly: psutil's disk_io_counters checks /sys for every
        # disk on every call, a quarter of what the host side costs per tick.
        real = getattr(psutil, "__name__", "") == "psutil" and os.path.exists(DISKSTATS)
        self._diskstats = DiskStats(DISKSTATS) if real else None
        self._cores = _core_reader(cpu_stat or ("/proc/stat" if real else None))
        self._gone = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError)
        # run-queue and I/O delay per process: from /proc on Linux, from the simulator's host in a
        # simulation (it models them), else not at all
        self._procfs: Any = getattr(psutil, "gpumon_procfs", None) or (
            ProcFs() if real and os.path.exists("/proc/self/schedstat") else None
        )
        self._procfs_counts = isinstance(self._procfs, ProcFs)
        """A job process's counters read by ProcFs.counts (Linux's /proc), not psutil's."""
        self._newest_pid: int | None = None
        self._born = True
        """A process was born on the host since the last tick (or we cannot tell)."""
        self._born_to: frozenset[int] | None = None
        """The parents of the processes born since the last tick, where /proc tells them (None: any
        process may be a parent): only a tree holding one of them is looked through again."""

    def poll(self, t_s: float, gpu_pids: Iterable[int] = ()) -> HostSample | None:
        if self._procfs is not None:
            newest, prev = self._procfs.newest_pid(), self._newest_pid
            self._born = newest is None or newest != prev
            self._newest_pid = newest
            # Who the newborns' parents are, where few were born: a busy node starts processes on
            # most ticks (shells, probes, cron), and each birth made every job tree be looked
            # through again (a listing and a read per thread of each process: ~500 reads a tick
            # for a job of 8 ranks). Not where /proc cannot say (a simulated host's).
            parents_of = getattr(self._procfs, "parents_of", None)
            # With no job tree yet there is no one to look through again (a new tree is looked
            # through whole): a node whose job processes are not in /proc (a container) reads none.
            self._born_to = (
                parents_of(prev + 1, newest)
                if self._born
                and self._trees
                and parents_of is not None
                and newest is not None
                and prev is not None
                else None
            )
        cur_cpu = self._cores.read() if self._cores is not None else list(self._ps.cpu_times(percpu=True))
        disk = self._read_disk()
        procs = self._processes(self._followed(gpu_pids), t_s)
        prev_t, prev_cpu, prev_disk = self._prev_t, self._prev_cpu, self._prev_disk
        self._prev_t, self._prev_cpu, self._prev_disk = t_s, cur_cpu, disk
        prev_busy, self._prev_disk_busy = self._prev_disk_busy, self._disk_busy
        self._prev_wall = self._wall()
        if prev_t is None or prev_cpu is None:
            return None  # baseline only: rates need two readings
        dt = t_s - prev_t
        ratios = (
            core_ratios(prev_cpu, cur_cpu)
            if isinstance(cur_cpu, CoreTimes) and isinstance(prev_cpu, CoreTimes)
            else cpu_ratios(prev_cpu, cur_cpu)
        )
        return HostSample(
            t_s=t_s,
            cpu_count=self._cpu_count,
            cpu_ratio=round(ratios.cpu_ratio, 4),
            busiest_core_ratio=round(ratios.busiest_core_ratio, 4),
            iowait_ratio=round(ratios.iowait_ratio, 4) if ratios.iowait_ratio is not None else None,
            load1=round(self._load1(), 2),
            disk_read_bytes_per_s=_round(rate(prev_disk, disk, dt)),
            disk_busy_ratio=busiest_disk_ratio(prev_busy, self._disk_busy, dt),
            processes=procs,
            runnable=self._procfs.running if self._procfs_counts else None,
        )

    def _load1(self) -> float:
        """The 1-minute load: from the /proc/loadavg this tick read already, where it did."""
        load1 = getattr(self._procfs, "load1", None) if self._procfs_counts else None
        return float(self._ps.getloadavg()[0]) if load1 is None else load1

    def _read_disk(self) -> int | None:
        try:
            if self._diskstats is not None:
                value: int | None
                value, self._disk_busy = self._diskstats.read()
            else:
                io = self._ps.disk_io_counters()
                value = None if io is None else int(io.read_bytes)
        except Exception as e:  # containers without /proc/diskstats
            self._problems.note("host:disk", f"host disk counters: {e}")
            return None
        if self._problems.any_active:
            self._problems.clear("host:disk")
        return value

    def _followed(self, gpu_pids: Iterable[int]) -> list[int]:
        """The GPU processes to follow this tick: all of them, up to MAX_HOST_PROCESSES (the lowest
        pids; a trace reader refuses a longer list, and no node runs that many GPU contexts)."""
        pids = sorted(set(gpu_pids))
        if len(pids) <= MAX_HOST_PROCESSES:
            if self._problems.any_active:
                self._problems.clear("host:processes")
            return pids
        self._problems.note(
            "host:processes",
            f"{len(pids)} GPU processes, more than {MAX_HOST_PROCESSES}: following the lowest pids only",
        )
        return pids[:MAX_HOST_PROCESSES]

    def _processes(self, pids: list[int], t_s: float) -> tuple[ProcessCpu, ...]:
        dt = t_s - self._prev_t if self._prev_t is not None else 0.0
        out = []
        for pid in pids:
            unseen = self._unseen.get(pid)
            if unseen is not None and t_s < unseen[0]:
                continue
            try:
                out_one = self._process(pid, t_s, dt)
            except self._gone:
                self._trees.pop(pid, None)
                wait = self._rescan_s if unseen is None else max(self._rescan_s, unseen[1] * 2)
                wait = min(UNSEEN_MAX_S, wait)
                self._unseen[pid] = (t_s + wait, wait)
                continue
            self._unseen.pop(pid, None)
            if out_one is not None:
                out.append(out_one)
        for pid in set(self._trees) - set(pids):  # no longer on any GPU
            del self._trees[pid]
        for pid in set(self._unseen) - set(pids):
            del self._unseen[pid]
        return tuple(out)

    def _process(self, pid: int, t_s: float, dt: float) -> ProcessCpu | None:
        tree = self._trees.get(pid)
        if tree is None:
            proc = self._ps.Process(pid)
            tree = _Tree(proc=proc, name=proc.name(), first_t_s=t_s, age_at_first_s=self._age(proc))
            self._rescan(tree, t_s)
            tree.counts = self._read_tree(tree)
            self._trees[pid] = tree
            return None  # baseline
        if self._should_rescan(tree, t_s):
            self._rescan(tree, t_s)
        counts = self._read_tree(tree)
        prev, born_before = tree.counts, tree.born_before
        tree.counts = counts
        if dt <= 0 or pid not in counts:
            return None

        def delta(key: int, attr: str) -> float | None:
            """What a process did this tick. A child first seen now counts in full only if it was
            born during the tick; one found late would bring its whole life into one tick."""
            cur = getattr(counts[key], attr)
            if cur is None:
                return None
            old = prev.get(key)
            if old is None:
                return 0.0 if key != pid and born_before.get(key) else float(cur)
            before = getattr(old, attr)
            return max(0.0, cur - before) if before is not None else 0.0

        kids = [c for c in counts if c != pid]
        cpu = {k: delta(k, "cpu_s") or 0.0 for k in counts}
        runq = {k: delta(k, "runq_s") for k in counts}
        reads = [delta(k, "read_b") for k in counts]
        blkio = [delta(k, "blkio_s") for k in counts]
        child_cpu = [cpu[k] for k in kids]
        has_runq = all(v is not None for v in runq.values())
        demand = max((cpu[k] + (runq[k] or 0.0)) for k in counts) if has_runq else None
        return ProcessCpu(
            pid=pid,
            name=tree.name,
            cpu_ratio=round(cpu[pid] / dt, 4),
            children_cpu_ratio=round(sum(child_cpu) / dt, 4),
            busiest_child_cpu_ratio=round(max(child_cpu, default=0.0) / dt, 4),
            children=len(kids),
            read_bytes_per_s=None if any(r is None for r in reads) else _round(sum(reads) / dt),  # type: ignore[arg-type]
            busiest_demand_ratio=None if demand is None else round(demand / dt, 4),
            runq_wait_ratio=round(sum(v or 0.0 for v in runq.values()) / dt, 4) if has_runq else None,
            blkio_wait_ratio=None if any(b is None for b in blkio) else round(sum(blkio) / dt, 4),  # type: ignore[arg-type]
            age_s=tree.age(t_s),
        )

    def _should_rescan(self, tree: _Tree, t_s: float) -> bool:
        if t_s - tree.scanned_t_s >= self._rescan_s:
            return True
        if self._procfs is not None:  # a process was born somewhere: is it one of ours?
            if not self._born:
                return False
            return self._born_to is None or not self._born_to.isdisjoint(tree.counts)
        return not tree.children and t_s - tree.first_t_s < YOUNG_TREE_S

    def _rescan(self, tree: _Tree, t_s: float) -> None:
        known = set(tree.counts)
        found = self._procfs.descendants(int(tree.proc.pid)) if self._procfs is not None else None
        if found is None:
            tree.children = tree.proc.children(recursive=True)
        else:
            by_pid = {int(c.pid): c for c in tree.children}
            tree.children = []
            for cpid in found:
                child = by_pid.get(cpid)
                if child is None:
                    try:
                        child = self._ps.Process(cpid)
                    except self._gone:
                        continue
                tree.children.append(child)
        tree.born_before = {
            int(c.pid): self._older_than_last_tick(c) for c in tree.children if int(c.pid) not in known
        }
        tree.scanned_t_s = t_s

    def _read_tree(self, tree: _Tree) -> dict[int, _Counts]:
        """The counters of the GPU process and its live descendants (the exited are dropped)."""
        out: dict[int, _Counts] = {}
        alive = []
        for n, proc in enumerate([tree.proc, *tree.children]):
            try:
                counts = self._counts(proc)
            except self._gone:
                if n == 0:
                    raise
                continue
            if n:
                alive.append(proc)
            out[int(proc.pid)] = counts
        tree.children = alive
        return out

    def _counts(self, proc: Any) -> _Counts:
        pid = int(proc.pid)
        if self._procfs_counts:
            return self._procfs.counts(pid)  # type: ignore[no-any-return]
        sched = self._procfs.sched(pid) if self._procfs is not None else None
        return _Counts(
            cpu_s=_cpu_s(proc),
            read_b=self._io_read(proc),
            runq_s=sched[1] if sched is not None else None,
            blkio_s=self._procfs.blkio_s(pid) if self._procfs is not None else None,
        )

    def _age(self, proc: Any) -> float | None:
        """Seconds since the process started; None where the host does not say."""
        create_time = getattr(proc, "create_time", None)
        if create_time is None:
            return None
        try:
            return max(0.0, self._wall() - float(create_time()))
        except Exception:  # gone, hidden, or a look-alike that does not say: the age is optional
            return None

    def _older_than_last_tick(self, child: Any) -> bool:
        """Whether the child was born before the previous poll (psutil's create_time, wall clock)."""
        create_time = getattr(child, "create_time", None)
        if create_time is None or self._prev_wall is None:
            return False
        try:
            return float(create_time()) < self._prev_wall
        except self._gone:
            return False

    def _io_read(self, proc: Any) -> int | None:
        try:
            return int(proc.io_counters().read_bytes)
        except (AttributeError, self._ps.AccessDenied):  # hidden: not ours, or not on this OS
            return None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
