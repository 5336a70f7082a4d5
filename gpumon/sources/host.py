"""Host CPU, iowait, disk reads, and the CPU of each GPU process tree, through `psutil`.

The psutil-like object is injected (the real `psutil`, or the simulator's `gpumon.sim.fakehost`).
Reading (cumulative counters) is split from computing rates (`cpu_ratios`, `rate`), which are
pure and what the tests hit. Rates need two readings: the first `poll` only takes a baseline and
returns None.

Known limits, said plainly: descendants that exit between two ticks take their CPU time with them
(it is not counted); GPU processes in another PID namespace (containers) cannot be looked up and
are left out; Linux iowait is unreliable on many cores (proc(5)), so disk read bytes come along.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpumon.model import HostSample, ProcessCpu
from gpumon.problems import Problems

log = logging.getLogger("gpumon.host")


def load_psutil() -> ModuleType:
    import psutil

    return psutil  # type: ignore[no-any-return]  # untyped: seen as Any


@dataclass(frozen=True, slots=True)
class CpuRatios:
    cpu_ratio: float
    busiest_core_ratio: float
    iowait_ratio: float | None


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


CHILDREN_RESCAN_S = 5.0
"""How often the descendants of a GPU process are looked for. Finding them scans every process
in /proc (the costliest thing the host source does); loader workers live long, so between scans
only the known ones are read. A worker born in between is counted from the next scan."""


YOUNG_TREE_S = 30.0
"""A job's loader workers usually start some seconds after the job (after the model is built): for
this long after a GPU process is first seen, it is rescanned every tick until workers show up."""


@dataclass
class _Tree:
    proc: Any
    name: str
    cpu_s: float
    children_cpu_s: dict[int, float] = field(default_factory=dict)
    read_bytes: int | None = None
    children: list[Any] = field(default_factory=list)
    scanned_t_s: float = float("-inf")
    born_before: dict[int, bool] = field(default_factory=dict)
    first_t_s: float = 0.0
    """Per child found by the last scan: whether it existed before the previous tick."""


DISKSTATS = "/proc/diskstats"


class DiskStats:
    """Bytes read from whole disks, from /proc/diskstats (as psutil counts them: a partition's
    reads are its disk's too, so only names under /sys/block are summed). Which names are whole
    disks is looked up once a minute, not on every read."""

    RECHECK_S = 60.0

    def __init__(self, path: str, sys_block: str = "/sys/block") -> None:
        self._path = path
        self._sys_block = sys_block
        self._disks: frozenset[str] = frozenset()
        self._checked = -float("inf")

    def read_bytes(self) -> int:
        with open(self._path, "rb") as f:
            lines = f.read().split(b"\n")
        now = time.monotonic()
        if now - self._checked >= self.RECHECK_S:
            self._disks = (
                frozenset(os.listdir(self._sys_block)) if os.path.isdir(self._sys_block) else frozenset()
            )
            self._checked = now
        total = 0
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and fields[2].decode() in self._disks:
                total += int(fields[5]) * 512  # sectors read; a sector is 512 bytes here, whatever the disk
        return total


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


class HostSource:
    name = "host"

    def __init__(
        self,
        psutil: ModuleType | Any,
        problems: Problems | None = None,
        children_rescan_s: float = CHILDREN_RESCAN_S,
    ) -> None:
        self._ps = psutil
        self._rescan_s = children_rescan_s
        self._problems = problems or Problems(log)
        self._cpu_count = int(psutil.cpu_count() or 1)
        self._prev_t: float | None = None
        self._prev_cpu: list[Any] | None = None
        self._prev_disk: int | None = None
        self._trees: dict[int, _Tree] = {}
        self._unseen: dict[int, float] = {}
        """GPU processes this host cannot see (another PID namespace), by when that was found:
        looked up again only every `children_rescan_s`, not every tick."""
        self._prev_wall: float | None = None
        self._wall = time.time
        # On Linux, /proc/diskstats read directly: psutil's disk_io_counters checks /sys for every
        # disk on every call, a quarter of what the host side costs per tick.
        real = getattr(psutil, "__name__", "") == "psutil" and os.path.exists(DISKSTATS)
        self._diskstats = DiskStats(DISKSTATS) if real else None
        self._gone = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)

    def poll(self, t_s: float, gpu_pids: Iterable[int] = ()) -> HostSample | None:
        cur_cpu = list(self._ps.cpu_times(percpu=True))
        disk = self._read_disk()
        procs = self._processes(sorted(set(gpu_pids)), t_s)
        prev_t, prev_cpu, prev_disk = self._prev_t, self._prev_cpu, self._prev_disk
        self._prev_t, self._prev_cpu, self._prev_disk = t_s, cur_cpu, disk
        self._prev_wall = self._wall()
        if prev_t is None or prev_cpu is None:
            return None  # baseline only: rates need two readings
        dt = t_s - prev_t
        ratios = cpu_ratios(prev_cpu, cur_cpu)
        return HostSample(
            t_s=t_s,
            cpu_count=self._cpu_count,
            cpu_ratio=round(ratios.cpu_ratio, 4),
            busiest_core_ratio=round(ratios.busiest_core_ratio, 4),
            iowait_ratio=round(ratios.iowait_ratio, 4) if ratios.iowait_ratio is not None else None,
            load1=round(float(self._ps.getloadavg()[0]), 2),
            disk_read_bytes_per_s=_round(rate(prev_disk, disk, dt)),
            processes=procs,
        )

    def _read_disk(self) -> int | None:
        try:
            if self._diskstats is not None:
                value: int | None = self._diskstats.read_bytes()
            else:
                io = self._ps.disk_io_counters()
                value = None if io is None else int(io.read_bytes)
        except Exception as e:  # containers without /proc/diskstats
            self._problems.note("host:disk", f"host disk counters: {e}")
            return None
        if self._problems.any_active:
            self._problems.clear("host:disk")
        return value

    def _processes(self, pids: list[int], t_s: float) -> tuple[ProcessCpu, ...]:
        dt = t_s - self._prev_t if self._prev_t is not None else 0.0
        out = []
        for pid in pids:
            unseen = self._unseen.get(pid)
            if unseen is not None and t_s - unseen < self._rescan_s:
                continue
            try:
                out_one = self._process(pid, t_s, dt)
            except self._gone:
                self._trees.pop(pid, None)
                self._unseen[pid] = t_s
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
            tree = _Tree(proc=proc, name=proc.name(), cpu_s=_cpu_s(proc), first_t_s=t_s)
            tree.children_cpu_s, tree.read_bytes = self._snapshot(tree, t_s)
            self._trees[pid] = tree
            return None  # baseline
        cpu_s = _cpu_s(tree.proc)
        children, read_bytes = self._snapshot(tree, t_s)
        # A child first seen now counts in full only if it was born during the tick; one found late
        # (children are looked for every few seconds) would bring its whole lifetime into one tick.
        born_before = tree.born_before
        deltas = [
            max(0.0, c - tree.children_cpu_s.get(cpid, c if born_before.get(cpid) else 0.0))
            for cpid, c in children.items()
        ]
        main = max(0.0, cpu_s - tree.cpu_s)
        read_rate = rate(tree.read_bytes, read_bytes, dt)
        tree.cpu_s, tree.children_cpu_s, tree.read_bytes = cpu_s, children, read_bytes
        if dt <= 0:
            return None
        return ProcessCpu(
            pid=pid,
            name=tree.name,
            cpu_ratio=round(main / dt, 4),
            children_cpu_ratio=round(sum(deltas) / dt, 4),
            busiest_child_cpu_ratio=round(max(deltas, default=0.0) / dt, 4),
            children=len(children),
            read_bytes_per_s=_round(read_rate),
        )

    def _snapshot(self, tree: _Tree, t_s: float) -> tuple[dict[int, float], int | None]:
        """CPU seconds of each descendant, and read bytes of the whole tree (None if hidden)."""
        young_and_alone = not tree.children and t_s - tree.first_t_s < YOUNG_TREE_S
        if t_s - tree.scanned_t_s >= self._rescan_s or young_and_alone:
            known = set(tree.children_cpu_s)
            tree.children = tree.proc.children(recursive=True)
            tree.born_before = {
                int(c.pid): self._older_than_last_tick(c) for c in tree.children if int(c.pid) not in known
            }
            tree.scanned_t_s = t_s
        cpu: dict[int, float] = {}
        read_bytes: int | None = self._io_read(tree.proc)
        alive = []
        for child in tree.children:
            try:
                cpu[int(child.pid)] = _cpu_s(child)
                child_read = self._io_read(child) if read_bytes is not None else None
            except self._gone:
                continue  # exited: dropped from the list below
            alive.append(child)
            read_bytes = None if child_read is None else read_bytes + child_read  # type: ignore[operator]
        tree.children = alive
        return cpu, read_bytes

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
