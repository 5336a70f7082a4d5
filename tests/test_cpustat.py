"""The cores' CPU times read from /proc/stat's text (gpumon.collect.sources.cpustat): the same
ratios as psutil's readings gave, cores matched by name, and anything else refused (the host source
then reads psutil's)."""

from __future__ import annotations

import os
import random
from collections import namedtuple
from pathlib import Path

import pytest

from gpumon.collect.sources import cpustat
from gpumon.collect.sources.host import HostSource, cpu_ratios
from tests.test_host_source import FakePsutil

T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
FIELDS = len(T._fields)
HZ = 100  # psutil's readings are the kernel's clock ticks over USER_HZ


def stat_text(cores: dict[int, list[int]]) -> bytes:
    """/proc/stat as Linux writes it: the machine's line, a line per core, then the rest."""
    whole = [sum(c[k] for c in cores.values()) for k in range(FIELDS)]
    lines = ["cpu  " + " ".join(map(str, whole))]
    lines += [f"cpu{n} " + " ".join(map(str, c)) for n, c in cores.items()]
    lines += ["intr 123456 " + " ".join("7" for _ in range(300)), "ctxt 1", "btime 1", "processes 9"]
    lines += ["procs_running 1", "procs_blocked 0", "softirq 1 2 3"]
    return ("\n".join(lines) + "\n").encode()


def as_psutil(cores: dict[int, list[int]]) -> list[T]:
    return [T(*(v / HZ for v in c)) for c in cores.values()]


def advance(rng: random.Random, before: dict[int, list[int]]) -> dict[int, list[int]]:
    after = {}
    for n, c in before.items():
        step = [rng.randrange(0, 60) for _ in range(FIELDS)]
        step[8] = rng.randrange(0, step[0] + 1)  # guest time is inside user time
        step[9] = rng.randrange(0, step[1] + 1)
        after[n] = [a + b for a, b in zip(c, step)]
    return after


def test_the_ratios_are_those_psutils_readings_give_across_many_cores() -> None:
    rng = random.Random(29)
    for n_cores in (1, 2, 7, 224):
        before = {n: [rng.randrange(10**6) for _ in range(FIELDS)] for n in range(n_cores)}
        after = advance(rng, before)
        after[0][4] = before[0][4] - 5  # Linux's iowait can go backwards on a core (proc(5))
        if n_cores > 2:
            after[1] = list(before[1])  # a core whose counters did not move: left out
            after[2] = list(before[2])  # its busy time went back (it counts as none), idle on
            after[2][0] -= 3
            after[2][3] += 90
        a, b = cpustat.parse(stat_text(before)), cpustat.parse(stat_text(after))
        assert a is not None and b is not None and len(a.names) == n_cores
        got = cpustat.ratios(a, b)
        want = cpu_ratios(as_psutil(before), as_psutil(after))
        assert got.cpu_ratio == pytest.approx(want.cpu_ratio, abs=1e-9)
        assert got.busiest_core_ratio == pytest.approx(want.busiest_core_ratio, abs=1e-9)
        assert got.iowait_ratio == pytest.approx(want.iowait_ratio, abs=1e-9)


def core(user: int = 0, idle: int = 0, iowait: int = 0) -> list[int]:
    return [user, 0, 0, idle, iowait, 0, 0, 0, 0, 0]


def test_a_core_taken_offline_between_readings_shifts_no_other() -> None:
    """cpu1 goes offline: cpu2 (idle) and cpu3 (pinned) keep their own readings, where pairing the
    lines by position would pair cpu3's with cpu2's."""
    before = {0: core(idle=1000), 1: core(idle=1000), 2: core(idle=1000), 3: core(user=5000, idle=10)}
    after = {0: core(idle=1100), 2: core(idle=1100), 3: core(user=5100, idle=10)}
    a, b = cpustat.parse(stat_text(before)), cpustat.parse(stat_text(after))
    assert a is not None and b is not None
    r = cpustat.ratios(a, b)
    assert r.busiest_core_ratio == pytest.approx(1.0)
    assert r.cpu_ratio == pytest.approx(100 / 300)


def test_iowait_counts_as_waiting_not_busy() -> None:
    a = cpustat.parse(stat_text({0: core(idle=100)}))
    b = cpustat.parse(stat_text({0: core(user=50, idle=120, iowait=30)}))
    assert a is not None and b is not None
    r = cpustat.ratios(a, b)
    assert (r.cpu_ratio, r.iowait_ratio) == (pytest.approx(0.5), pytest.approx(0.3))


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"cpu  1 2 3 4 5 6 7 8\nintr 1\n",  # the machine's line only
        b"cpu  1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n",  # 7 columns: no steal time
        b"cpu  1 2 3 4 5 6 7 8 9\ncpu0 1 2 3 4 5 6 7 8 9\ncpu1 1 2 3 4 5 6 7 8\ncpu2 1 2 3 4 5 6 7 8 9 10\n",
        b"cpu  1 2 3 4 5 6 7 8 9 0\ncpu0 1 2 x 4 5 6 7 8 9 0\n",
        b"intr 1 2\ncpu0 1 2 3 4 5 6 7 8 9 0\n",
        b"\x00" * 100,
    ],
    ids=["empty", "no-cores", "few-columns", "ragged", "not-a-number", "no-machine-line", "binary"],
)
def test_anything_but_per_core_lines_is_refused(text: bytes) -> None:
    assert cpustat.parse(text) is None


def test_the_host_source_reads_the_cores_from_the_file(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_bytes(stat_text({0: core(idle=1000), 1: core(idle=1000)}))
    ps = FakePsutil()  # its own cores say idle: the file is what counts
    src = HostSource(ps, cpu_stat=str(stat))
    assert src.poll(0.0) is None
    stat.write_bytes(stat_text({0: core(user=100, idle=1000), 1: core(idle=1060, iowait=40)}))
    ps.spend(1.0, [0.0] * 4)
    s = src.poll(1.0)
    assert s is not None
    assert (s.cpu_ratio, s.busiest_core_ratio, s.iowait_ratio) == (0.5, 1.0, 0.2)


def test_a_file_it_cannot_read_leaves_the_cores_to_psutil(tmp_path: Path) -> None:
    bad = tmp_path / "stat"
    bad.write_bytes(b"cpu  1 2 3\n")
    for path in (bad, tmp_path / "missing", tmp_path):  # unreadable lines, no file, a directory
        ps = FakePsutil()
        src = HostSource(ps, cpu_stat=str(path))
        assert src.poll(0.0) is None
        ps.spend(1.0, [1.0, 0.0, 0.0, 0.0])
        s = src.poll(1.0)
        assert s is not None and (s.cpu_ratio, s.busiest_core_ratio) == (0.25, 1.0)


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="Linux only")
def test_this_machines_proc_stat_reads_a_line_per_online_core() -> None:
    r = cpustat.ProcStat().read()
    lines = [x for x in Path("/proc/stat").read_text().splitlines() if x[:3] == "cpu" and x[3].isdigit()]
    assert len(r.names) == len(lines) >= 1
    assert all(t >= b >= 0 for t, b in zip(r.total, r.busy))


def test_a_proc_file_is_read_to_its_end_and_no_further_than_the_bound(tmp_path: Path) -> None:
    """read_proc reads until the end (a /proc file of records, as diskstats, may come a page at a
    time), and never more than it was asked for."""
    from gpumon.collect.sources.procfile import read_proc

    f = tmp_path / "f"
    data = bytes(range(256)) * 1000  # 256 KB: four of its reads
    f.write_bytes(data)
    assert read_proc(str(f), 1 << 20) == data
    assert read_proc(str(f), 100_000) == data[:100_000]
    assert read_proc(str(f), 100, one_record=True) == data[:100]  # one read, of at most 100 bytes
    (tmp_path / "empty").write_bytes(b"")
    assert read_proc(str(tmp_path / "empty")) == b""
    with pytest.raises(FileNotFoundError):
        read_proc(str(tmp_path / "missing"))
    smaps = "/proc/self/smaps"  # a file of records the kernel hands over a page or so a read
    if Path(smaps).is_file():
        fd = os.open(smaps, os.O_RDONLY)
        try:
            one_read = len(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
        with open(smaps, "rb") as g:
            longer = len(g.read()) > one_read  # (a file longer than one read, as here)
        whole = read_proc(smaps, 1 << 20)
        if longer:
            assert len(whole) > one_read, "read to its end, not one read's worth"
            assert whole.rstrip().split(b"\n")[-1].startswith(b"VmFlags"), "to its last record"
