"""HostSource through injected psutil functions: CPU, busiest core, iowait, disk reads, and the CPU
of each GPU process with its loader children."""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpumon.collect.sources.host import HostSource, cpu_ratios, rate

T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
TNoIowait = namedtuple("TNoIowait", "user system idle")


def core(user: float = 0, system: float = 0, idle: float = 0, iowait: float = 0, guest: float = 0) -> T:
    return T(user, 0.0, system, idle, iowait, 0.0, 0.0, 0.0, guest, 0.0)


class NoSuchProcess(Exception):
    pass


class AccessDenied(Exception):
    pass


class ZombieProcess(NoSuchProcess):
    pass


class Proc:
    def __init__(self, host: FakePsutil, pid: int) -> None:
        self.host, self.pid = host, pid

    def _alive(self) -> None:
        if self.pid not in self.host.cpu:
            raise NoSuchProcess(self.pid)

    def name(self) -> str:
        self._alive()
        return "python"

    def cpu_times(self) -> SimpleNamespace:
        self._alive()
        return SimpleNamespace(user=self.host.cpu[self.pid] * 0.75, system=self.host.cpu[self.pid] * 0.25)

    def children(self, recursive: bool = False) -> list[Proc]:
        self._alive()
        return [Proc(self.host, c) for c in self.host.children.get(self.pid, [])]

    def io_counters(self) -> SimpleNamespace:
        self._alive()
        if self.pid in self.host.hidden_io:
            raise AccessDenied(self.pid)
        return SimpleNamespace(read_bytes=self.host.read.get(self.pid, 0))


class FakePsutil:
    NoSuchProcess, AccessDenied, ZombieProcess = NoSuchProcess, AccessDenied, ZombieProcess

    def __init__(self) -> None:
        self.cores = [core(idle=100.0) for _ in range(4)]
        self.disk_read = 0
        self.cpu: dict[int, float] = {}
        self.children: dict[int, list[int]] = {}
        self.read: dict[int, int] = {}
        self.hidden_io: set[int] = set()

    def cpu_count(self) -> int:
        return len(self.cores)

    def cpu_times(self, percpu: bool = False) -> list[T]:
        return list(self.cores)

    def disk_io_counters(self) -> SimpleNamespace:
        return SimpleNamespace(read_bytes=self.disk_read)

    def getloadavg(self) -> tuple[float, float, float]:
        return (1.5, 1.0, 0.5)

    def Process(self, pid: int) -> Proc:
        if pid not in self.cpu:
            raise NoSuchProcess(pid)
        return Proc(self, pid)

    def spend(self, seconds: float, per_core_busy: list[float], iowait: float = 0.0) -> None:
        """Advance the counters: each core busy b, and waiting on I/O for up to `iowait` of the rest."""
        new = []
        for c, b in zip(self.cores, per_core_busy):
            io = min(1 - b, iowait)
            new.append(
                core(
                    user=c.user + seconds * b,
                    system=c.system,
                    idle=c.idle + seconds * (1 - b - io),
                    iowait=c.iowait + seconds * io,
                )
            )
        self.cores = new


def test_cpu_ratios_find_the_pinned_core_behind_a_half_idle_machine() -> None:
    """Under the GIL one feeder pins one core while the machine looks mostly idle."""
    prev = [core(idle=100) for _ in range(4)]
    cur = [core(user=1.0, idle=100), core(idle=101), core(idle=101), core(idle=101)]
    r = cpu_ratios(prev, cur)
    assert r.cpu_ratio == pytest.approx(0.25)
    assert r.busiest_core_ratio == pytest.approx(1.0)
    assert r.iowait_ratio == pytest.approx(0.0)


def test_cpu_ratios_count_iowait_as_not_busy_and_guest_once() -> None:
    prev = [core(idle=10)]
    cur = [core(user=0.5, guest=0.2, idle=10.2, iowait=0.3)]  # guest is part of user
    r = cpu_ratios(prev, cur)
    assert r.cpu_ratio == pytest.approx(0.5)
    assert r.iowait_ratio == pytest.approx(0.3)


def test_cpu_ratios_without_iowait_field_report_none() -> None:
    r = cpu_ratios([TNoIowait(0, 0, 10)], [TNoIowait(0.5, 0, 10.5)])
    assert r.iowait_ratio is None and r.cpu_ratio == pytest.approx(0.5)


def test_rate_handles_unknowns_and_counter_resets() -> None:
    assert rate(None, 10, 1.0) is None
    assert rate(10, 30, 2.0) == 10.0
    assert rate(30, 10, 1.0) == 0.0


def test_first_poll_is_a_baseline_then_rates_follow() -> None:
    ps = FakePsutil()
    src = HostSource(ps)
    assert src.poll(0.0) is None
    ps.spend(1.0, [1.0, 0.0, 0.0, 0.0], iowait=0.2)
    ps.disk_read += 300_000_000
    h = src.poll(1.0)
    assert h is not None
    assert h.cpu_count == 4
    assert h.cpu_ratio == pytest.approx(0.25)
    assert h.busiest_core_ratio == pytest.approx(1.0)
    assert h.iowait_ratio == pytest.approx(0.15)  # 0.2 on each of the three idle cores, of 4
    assert h.disk_read_bytes_per_s == pytest.approx(300e6)
    assert h.load1 == 1.5


def test_gpu_process_cpu_includes_loader_children() -> None:
    ps = FakePsutil()
    ps.cpu = {100: 10.0, 101: 5.0, 102: 5.0, 103: 1.0}
    ps.children = {100: [101, 102, 103]}
    ps.read = {100: 0, 101: 1000, 102: 0, 103: 0}
    src = HostSource(ps)
    src.poll(0.0, [100])
    ps.cpu.update({100: 11.0, 101: 6.0, 102: 6.0, 103: 1.5})  # main pinned, two workers pinned
    ps.read[101] += 2_000_000
    h = src.poll(1.0, [100])
    assert h is not None
    (p,) = h.processes
    assert p.pid == 100 and p.name == "python"
    assert p.cpu_ratio == pytest.approx(1.0)
    assert p.children_cpu_ratio == pytest.approx(2.5)
    assert p.busiest_child_cpu_ratio == pytest.approx(1.0)
    assert p.children == 3
    assert p.read_bytes_per_s == pytest.approx(2e6)


def test_child_born_during_the_tick_counts_in_full_and_gone_child_drops_out() -> None:
    ps = FakePsutil()
    ps.cpu = {100: 0.0, 101: 0.0}
    ps.children = {100: [101]}
    src = HostSource(ps, children_rescan_s=0)
    src.poll(0.0, [100])
    src.poll(1.0, [100])
    ps.cpu.update({104: 0.5})
    ps.children = {100: [104]}  # 101 exited, 104 was born
    h = src.poll(2.0, [100])
    assert h is not None
    assert h.processes[0].children_cpu_ratio == pytest.approx(0.5)
    assert h.processes[0].children == 1


def test_hidden_io_gives_none_not_zero_and_vanished_process_is_skipped() -> None:
    ps = FakePsutil()
    ps.cpu = {100: 0.0, 200: 0.0}
    ps.hidden_io = {200}
    src = HostSource(ps)
    src.poll(0.0, [100, 200])
    del ps.cpu[100]  # the job ended between ticks
    h = src.poll(1.0, [100, 200])
    assert h is not None
    assert [p.pid for p in h.processes] == [200]
    assert h.processes[0].read_bytes_per_s is None


def test_a_gpu_process_this_host_cannot_see_is_looked_up_less_and_less_often() -> None:
    """A container without the host's PID namespace never sees the GPU's processes: each look
    costs, so it backs off (5, 10, 20, 40, then every 60 s); one that shows up is read again."""
    ps = FakePsutil()
    looked: list[float] = []
    now = [0.0]
    real = FakePsutil.Process

    def counting(self: FakePsutil, pid: int) -> Proc:
        looked.append(now[0])
        return real(self, pid)

    ps.Process = counting.__get__(ps)  # type: ignore[method-assign]
    src = HostSource(ps, children_rescan_s=5.0)
    for t in range(0, 200):
        now[0] = float(t)
        src.poll(float(t), [4242])
    assert looked == [0.0, 5.0, 15.0, 35.0, 75.0, 135.0, 195.0]
    ps.cpu[4242] = 0.0  # there after all (e.g. the namespace was a race with its start)
    for t in range(200, 262):
        now[0] = float(t)
        ps.cpu[4242] += 0.25
        h = src.poll(float(t), [4242])
    assert [p.pid for p in h.processes] == [4242]
    assert h.processes[0].cpu_ratio == pytest.approx(0.25)
    looked.clear()
    del ps.cpu[4242]  # gone (its tree's read says so): the looks start from the short wait again
    for t in range(262, 280):
        now[0] = float(t)
        src.poll(float(t), [4242])
    assert looked == [267.0, 277.0]


def test_children_are_looked_for_every_few_seconds_not_every_tick() -> None:
    """Finding descendants scans all of /proc; workers live long, so it runs every 5 s."""
    ps = FakePsutil()
    ps.cpu = {100: 0.0, 101: 0.0}
    ps.children = {100: [101]}
    scans = []
    real_children = Proc.children

    def counting(self, recursive=False):
        scans.append(self.pid)
        return real_children(self, recursive)

    Proc.children = counting  # type: ignore[method-assign]
    try:
        src = HostSource(ps, children_rescan_s=5.0)
        src.poll(0.0, [100])
        ps.cpu.update({105: 0.0})
        ps.children = {100: [101, 105]}  # a worker born at t=0.5
        for t in range(1, 5):
            ps.cpu[101] += 0.5
            h = src.poll(float(t), [100])
            assert h.processes[0].children == 1  # not seen yet: no scan since t=0
            assert h.processes[0].children_cpu_ratio == pytest.approx(0.5)  # known ones still read
        h = src.poll(5.0, [100])
        assert h.processes[0].children == 2
        assert len(scans) == 2
    finally:
        Proc.children = real_children  # type: ignore[method-assign]


@contextlib.contextmanager
def births(ps: FakePsutil, born: dict[int, float]) -> Iterator[HostSource]:
    """Processes born at these wall-clock times (psutil's create_time), and a host source that
    lists children every 5 s, at a wall clock long after them all."""
    Proc.create_time = lambda self: born[self.pid]  # type: ignore[attr-defined]
    try:
        src = HostSource(ps, children_rescan_s=5.0)
        src._wall = lambda: 1_000_000.0  # type: ignore[method-assign]
        yield src
    finally:
        del Proc.create_time  # type: ignore[attr-defined]


def test_a_worker_found_late_does_not_bring_its_whole_lifetime_into_one_tick() -> None:
    ps = FakePsutil()
    ps.cpu = {100: 0.0, 101: 0.0}
    ps.children = {100: [101]}
    born = {101: 0.0}  # wall-clock birth: long before gpumon's previous tick
    with births(ps, born) as src:
        src.poll(0.0, [100])
        ps.cpu[105] = 40.0  # a worker that has run for a while, found at the next scan
        born[105] = 10.0
        ps.children = {100: [101, 105]}
        for t in range(1, 6):
            h = src.poll(float(t), [100])
        assert h.processes[0].children == 2
        assert h.processes[0].busiest_child_cpu_ratio <= 1.0, "its 40 s of past CPU are not this tick's"
        ps.cpu[105] += 0.9
        h = src.poll(6.0, [100])
        assert h.processes[0].busiest_child_cpu_ratio == pytest.approx(0.9)


class FakeProcFs:
    """What ProcFs reads from /proc, set by the test: schedstat, block I/O delay, births."""

    def __init__(self, ps: FakePsutil) -> None:
        self.ps = ps
        self.runq: dict[int, float] = {}
        self.blkio: dict[int, float] | None = None  # None: the kernel does not count it
        self.newest = 1000
        self.calls = 0

    def sched(self, pid: int) -> tuple[float, float] | None:
        return (self.ps.cpu[pid], self.runq.get(pid, 0.0)) if pid in self.ps.cpu else None

    def blkio_s(self, pid: int) -> float | None:
        return None if self.blkio is None else self.blkio.get(pid, 0.0)

    def newest_pid(self) -> int | None:
        return self.newest

    def descendants(self, pid: int) -> list[int] | None:
        self.calls += 1
        return list(self.ps.children.get(pid, []))


def with_procfs() -> tuple[FakePsutil, FakeProcFs]:
    ps = FakePsutil()
    procfs = FakeProcFs(ps)
    ps.gpumon_procfs = procfs  # type: ignore[attr-defined]
    return ps, procfs


def test_a_contended_loader_wants_a_whole_core_though_it_gets_part_of_one() -> None:
    ps, procfs = with_procfs()
    ps.cpu = {100: 0.0, 101: 0.0, 102: 0.0}
    ps.children = {100: [101, 102]}
    src = HostSource(ps)
    src.poll(0.0, [100])
    for t in (1.0, 2.0):
        ps.cpu[100] += 0.2
        for w in (101, 102):
            ps.cpu[w] += 0.6  # runs 0.6 of a second...
            procfs.runq[w] = procfs.runq.get(w, 0.0) + 0.4  # ...and waits for a CPU the rest
        h = src.poll(t, [100])
    (p,) = h.processes
    assert p.busiest_child_cpu_ratio == pytest.approx(0.6)
    assert p.busiest_demand_ratio == pytest.approx(1.0)
    assert p.runq_wait_ratio == pytest.approx(0.8)
    assert p.blkio_wait_ratio is None, "the kernel does not count block I/O delay: unknown, not 0"
    procfs.blkio = {101: 0.0, 102: 0.0}
    src.poll(3.0, [100])
    procfs.blkio = {101: 0.7, 102: 0.9}
    (p,) = src.poll(4.0, [100]).processes
    assert p.blkio_wait_ratio == pytest.approx(1.6)


def test_a_worker_is_found_the_tick_it_is_born_whatever_the_jobs_age() -> None:
    """A birth anywhere moves /proc/loadavg's newest PID: only then are the job's children looked
    for (through the cheap children files), so a new worker of an old job shows within a tick."""
    ps, procfs = with_procfs()
    ps.cpu = {100: 0.0}
    src = HostSource(ps, children_rescan_s=5.0)
    src.poll(0.0, [100])
    for t in range(1, 120):  # two minutes: the job is old
        h = src.poll(float(t), [100])
    looked = procfs.calls
    assert looked <= 1 + 119 // 5 + 1, "nothing born: looked for only every 5 s"
    ps.cpu[107] = 0.0
    ps.children = {100: [107]}
    procfs.newest = 107
    ps.cpu[107] += 0.5
    h = src.poll(120.0, [100])
    assert h.processes[0].children == 1


def test_a_worker_found_late_brings_none_of_its_past_reads() -> None:
    ps = FakePsutil()
    ps.cpu = {100: 0.0}
    with births(ps, {105: 10.0}) as src:
        src.poll(0.0, [100])
        ps.cpu[105] = 40.0
        ps.read[105] = 9_000_000_000  # 9 GB read over its life, found at the next scan
        ps.children = {100: [105]}
        for t in range(1, 6):
            h = src.poll(float(t), [100])
        assert h.processes[0].children == 1
        assert h.processes[0].read_bytes_per_s == 0.0, "its past 9 GB are not this tick's"
        ps.read[105] += 45_000_000
        h = src.poll(6.0, [100])
        assert h.processes[0].read_bytes_per_s == pytest.approx(45e6)


def test_procfs_reads_this_machines_kernel() -> None:
    """The real /proc: schedstat for a process, its children without scanning /proc, a birth."""
    import os
    import subprocess
    import sys

    from gpumon.collect.sources.host import ProcFs

    procfs = ProcFs()
    on_cpu, waited = procfs.sched(os.getpid())
    assert on_cpu > 0 and waited >= 0
    before = procfs.newest_pid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        assert procfs.newest_pid() != before
        assert child.pid in (procfs.descendants(os.getpid()) or [])
        with open("/proc/sys/kernel/task_delayacct") as f:
            counted = f.read().strip() == "1"
        assert (procfs.blkio_s(child.pid) is None) == (not counted)
    finally:
        child.kill()
        child.wait()


def test_the_busiest_disk_utilization_comes_from_diskstats_io_ticks(tmp_path: Path) -> None:
    """What a fix buys needs to know whether storage has room for more reads: iostat's %util of the
    busiest whole disk, from the io_ticks of /proc/diskstats (partitions and unknown devices out)."""
    from gpumon.collect.sources.host import DiskStats, busiest_disk_ratio

    root = tmp_path
    (root / "block" / "sda").mkdir(parents=True)
    (root / "block" / "nvme0n1").mkdir(parents=True)
    stats = root / "diskstats"

    def write(sda_ticks: int, nvme_ticks: int, part_ticks: int) -> None:
        stats.write_text(
            f"   8       0 sda 10 0 2000 5 0 0 0 0 0 {sda_ticks} 9 0 0 0 0\n"
            f"   8       1 sda1 10 0 2000 5 0 0 0 0 0 {part_ticks} 9 0 0 0 0\n"
            f" 259       0 nvme0n1 10 0 4000 5 0 0 0 0 0 {nvme_ticks} 9 0 0 0 0\n"
        )

    disks = DiskStats(str(stats), sys_block=str(root / "block"))
    write(1000, 5000, 0)
    read_bytes, before = disks.read()
    write(1250, 5900, 990_000)  # over 2 s: sda busy 250 ms (12.5%), nvme 900 ms (45%)
    _, after = disks.read()
    assert read_bytes == (2000 + 4000) * 512
    assert busiest_disk_ratio(before, after, 2.0) == pytest.approx(0.45)
    assert busiest_disk_ratio(None, after, 2.0) is None  # one reading: no rate yet


BURN = """
import os, sys, threading, time
def burn():
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
w = threading.Thread(target=burn)
w.start(); w.join()
with open(sys.argv[1], "rb") as f:
    f.read()
print("ready", flush=True)
time.sleep(60)
"""


def test_procfs_counts_a_process_as_psutil_does_with_all_its_threads(tmp_path: Path) -> None:
    """ProcFs.counts (every job process, every tick) reads what psutil's cpu_times and io_counters
    do: the CPU time of all the process's threads (schedstat's is its first thread's only), the
    bytes it read from storage; and says when the process is gone."""
    import subprocess
    import sys

    from gpumon.collect.sources.host import ProcFs, load_psutil

    psutil = load_psutil()
    data = tmp_path / "data"
    data.write_bytes(b"x" * 65536)
    child = subprocess.Popen([sys.executable, "-c", BURN, str(data)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"  # it sleeps now
        procfs = ProcFs()
        before = procfs.sched(child.pid)  # (its first thread may still run on, into its sleep)
        got = procfs.counts(child.pid)
        times = psutil.Process(child.pid).cpu_times()
        assert got.cpu_s == pytest.approx(times.user + times.system, abs=1e-9)
        assert got.cpu_s >= 0.3, "the burning thread's time is the process's"
        first_thread = procfs.sched(child.pid)
        assert first_thread is not None and first_thread[0] < got.cpu_s
        assert got.read_b == psutil.Process(child.pid).io_counters().read_bytes
        assert before is not None and before[1] <= got.runq_s <= first_thread[1], (before, got, first_thread)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ProcessLookupError):
        ProcFs().counts(child.pid)


def test_procfs_counts_a_process_that_exits_between_its_files_as_gone(tmp_path: Path) -> None:
    """A loader worker that exits after its stat was read and before its io: gone, as psutil said
    (read as unknown I/O, it blanked the whole tree's read rate for the tick: found in review);
    an io file it may not read is unknown I/O, not a gone process."""
    from gpumon.collect.sources.host import ProcFs

    stat = "123 (python) S " + " ".join(["0"] * 10) + " 250 50 " + " ".join(["0"] * 40) + "\n"
    (tmp_path / "123").mkdir()
    (tmp_path / "123" / "stat").write_text(stat)
    procfs = ProcFs(root=str(tmp_path))
    with pytest.raises(ProcessLookupError):
        procfs.counts(123)  # no io file: it has exited
    (tmp_path / "123" / "io").mkdir()  # there, but not readable as a file
    (tmp_path / "123" / "schedstat").write_text("1000 2000000000 5\n")
    got = procfs.counts(123)
    assert got.read_b is None and got.runq_s == pytest.approx(2.0)
    assert got.cpu_s == pytest.approx(300 / procfs._tck)


class ParentsProcFs(FakeProcFs):
    """A /proc that tells the parents of the PIDs handed out since the last look, as Linux's does."""

    def __init__(self, ps: FakePsutil) -> None:
        super().__init__(ps)
        self.parent: dict[int, int] = {}
        self.parent_reads = 0

    def parents_of(self, first: int, last: int) -> frozenset[int] | None:
        self.parent_reads += 1
        if not 0 <= last - first < 64:
            return None
        return frozenset(self.parent[p] for p in range(first, last + 1) if p in self.parent)


def test_a_birth_outside_the_job_does_not_send_gpumon_through_its_trees() -> None:
    """A busy node starts processes on most ticks; only a birth to one of the job's processes
    (or more births than can be read one by one) makes its tree be looked through again."""
    ps = FakePsutil()
    procfs = ParentsProcFs(ps)
    ps.gpumon_procfs = procfs  # type: ignore[attr-defined]
    ps.cpu = {100: 0.0, 101: 0.0}
    ps.children = {100: [101]}
    src = HostSource(ps, children_rescan_s=3600.0)
    src.poll(0.0, [100])
    src.poll(1.0, [100])
    looked = procfs.calls
    for t in range(2, 30):  # a shell or a probe elsewhere each second
        procfs.newest += 1
        procfs.parent[procfs.newest] = 1
        src.poll(float(t), [100])
    assert procfs.calls == looked, "births elsewhere: the job's tree was looked through again"
    procfs.newest += 1  # the job's worker starts a process of its own
    procfs.parent[procfs.newest] = 101
    ps.cpu[procfs.newest] = 0.0
    ps.children = {100: [101, procfs.newest]}
    h = src.poll(30.0, [100])
    assert procfs.calls == looked + 1
    assert h.processes[0].children == 2
    procfs.newest += 500  # more births than are read one by one: every tree is looked through
    src.poll(31.0, [100])
    assert procfs.calls == looked + 2


def test_births_are_not_read_while_no_job_process_is_visible() -> None:
    """In a container without the host's PID namespace the GPU's processes are never in /proc:
    there is no tree a birth could belong to, so the newborns' parents are not read each tick;
    once a job process is seen, they are."""
    ps = FakePsutil()
    procfs = ParentsProcFs(ps)
    ps.gpumon_procfs = procfs  # type: ignore[attr-defined]
    src = HostSource(ps, children_rescan_s=3600.0)
    for t in range(10):
        procfs.newest += 1
        procfs.parent[procfs.newest] = 1
        src.poll(float(t), [4242])  # NVML's process, not in this /proc
    assert procfs.parent_reads == 0
    ps.cpu = {100: 0.0}
    src.poll(10.0, [4242, 100])
    procfs.newest += 1
    procfs.parent[procfs.newest] = 100
    ps.cpu[procfs.newest] = 0.0
    ps.children = {100: [procfs.newest]}
    h = src.poll(11.0, [4242, 100])
    assert procfs.parent_reads == 1 and h is not None and h.processes[0].children == 1


def test_the_load_comes_from_the_loadavg_read_for_births(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/loadavg is read once a tick: for the newest PID, the 1-minute load and the threads
    runnable now (the host's `runnable`)."""
    from gpumon.collect.sources.host import ProcFs

    (tmp_path / "loadavg").write_text("3.25 1.00 0.50 2/300 4242\n")
    procfs = ProcFs(root=str(tmp_path))
    assert procfs.newest_pid() == 4242 and procfs.load1 == 3.25 and procfs.running == 2
    (tmp_path / "loadavg").write_text("garbage\n")
    assert procfs.newest_pid() is None and procfs.load1 is None and procfs.running is None

    import psutil

    def no(*_: object) -> None:
        raise AssertionError("getloadavg called: /proc/loadavg read twice a tick")

    src = HostSource(psutil)
    monkeypatch.setattr(psutil, "getloadavg", no)
    src.poll(0.0, [])
    h = src.poll(1.0, [])
    assert h is not None and h.load1 >= 0
    assert h.runnable is not None and h.runnable >= 1  # the reading thread, at least


def test_procfs_names_the_parents_of_new_processes() -> None:
    """The real /proc: the parent of a process born since a look, whatever its name holds."""
    import os
    import subprocess
    import sys

    from gpumon.collect.sources.host import MAX_BIRTHS_READ, ProcFs

    procfs = ProcFs()
    before = procfs.newest_pid()
    assert before is not None
    named = (  # a name with a space and a parenthesis (prctl PR_SET_NAME)
        "import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'a) b', 0, 0, 0); "
        "sys.stdout.write('x'); sys.stdout.flush(); time.sleep(10)"
    )
    child = subprocess.Popen([sys.executable, "-c", named], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.read(1) == b"x"
        with open(f"/proc/{child.pid}/comm") as f:
            assert f.read().strip() == "a) b"
        after = procfs.newest_pid()
        assert after is not None and after >= child.pid
        # the births from the child's on (the suite's other workers may have started more than
        # MAX_BIRTHS_READ threads and processes since: a range ending at `after` missed the child)
        last = min(after, child.pid + MAX_BIRTHS_READ - 1)
        parents = procfs.parents_of(max(before + 1, child.pid), last)
        assert parents is not None and os.getpid() in parents
        assert procfs.parents_of(after + 1, after) == frozenset(), "nothing born: no parent"
        assert procfs.parents_of(after, after - 10) is None, "PIDs wrapped around: cannot tell"
        assert procfs.parents_of(1, 1 + MAX_BIRTHS_READ) is None, "too many to read one by one"
    finally:
        child.kill()
        child.wait()


def test_more_gpu_processes_than_a_trace_holds_are_cut_to_the_lowest_pids(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hostile driver listing more processes than a trace reader takes (16 full GPUs' worth) must
    not make the recorder write ticks no reader accepts: the host follows the lowest pids, says so
    once, and says when it is over."""
    import gpumon.collect.sources.host as host
    from gpumon.trace import records

    assert host.MAX_HOST_PROCESSES == records.MAX_HOST_PROCESSES  # the bound is the reader's
    monkeypatch.setattr(host, "MAX_HOST_PROCESSES", 3)
    ps = FakePsutil()
    ps.cpu = {pid: 0.0 for pid in (500, 100, 400, 200, 300)}
    src = HostSource(ps)
    src.poll(0.0, [500, 100, 400, 200, 300])
    with caplog.at_level("INFO"):
        h = src.poll(1.0, [500, 100, 400, 200, 300, 100])
        h2 = src.poll(2.0, [500, 100, 400, 200, 300])
        src.poll(3.0, [400, 500])  # now followed: a baseline for their rates
        h4 = src.poll(4.0, [400, 500])
    assert h is not None and h2 is not None and h4 is not None
    assert [p.pid for p in h.processes] == [p.pid for p in h2.processes] == [100, 200, 300]
    assert [p.pid for p in h4.processes] == [400, 500]
    said = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("5 GPU processes, more than 3") for m in said) == 1, said  # once
    assert any(m.startswith("recovered") and "more than 3" in m for m in said), said


def test_a_proc_file_kept_open_reads_the_file_made_afresh_each_time(tmp_path: Path) -> None:
    """/proc/stat, /proc/loadavg and /proc/diskstats are opened once and read again from their
    start each tick: what each read says must be the kernel's now, as a fresh open's would be."""
    import os
    import subprocess
    import sys

    from gpumon.collect.sources.procfile import ProcFile, read_proc

    loadavg = ProcFile("/proc/loadavg", one_record=True)
    before = int(loadavg.read().split()[-1])
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # a birth moves the newest PID
    assert int(loadavg.read().split()[-1]) != before
    stat = ProcFile("/proc/stat", 1 << 20)
    ticks = sum(map(int, stat.read().split(b"\n", 1)[0].split()[1:]))
    t = os.times().elapsed
    while os.times().elapsed - t < 0.05:  # the machine's clock ticks (10 ms) move on
        pass
    assert sum(map(int, stat.read().split(b"\n", 1)[0].split()[1:])) > ticks
    assert ProcFile("/proc/diskstats", 1 << 20).read().count(b"\n") == read_proc(
        "/proc/diskstats", 1 << 20
    ).count(b"\n")
    gone = tmp_path / "gone"
    gone.write_text("1\n")
    kept = ProcFile(str(gone))
    assert kept.read() == b"1\n"
    gone.unlink()
    assert kept.read() == b"1\n"  # (an open file outlives its name, as in /proc it never goes)
    kept.close()
    with pytest.raises(OSError):
        kept.read()  # closed: opened again, and the name is gone
