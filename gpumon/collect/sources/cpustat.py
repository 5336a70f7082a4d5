"""Per-core CPU time from Linux's /proc/stat, read in a few passes over its columns in C, not an
object per core: what the host source needs of it (each core's busy, total and iowait time).

psutil's `cpu_times(percpu=True)` builds a named tuple of ten floats per core, and the ratios then
walked them in Python: ~3 µs per core and tick, 0.7 ms a tick on a 224-thread node (a GPU server's
two 56-core sockets, hyper-threaded), more than all the rest of an idle daemon's tick; a peer
reading only the whole machine's line pays nothing per core. Here: tens of µs whatever the cores
(benchmarks/host_cores.py, docs/benchmarks.md). The kernel's own cost of making the file is the
same either way.

Pure parsing and arithmetic (`parse`, `ratios`), the file read apart (`ProcStat`), so tests feed
text. The units are the kernel's clock ticks: ratios need no conversion."""

from __future__ import annotations

import itertools
import operator
from typing import NamedTuple

from gpumon.collect.sources.procfile import ProcFile

MAX_BYTES = 1 << 20
"""At most this much of /proc/stat is read: its per-core lines come first (~100 bytes a core, so
some 10,000 cores); the interrupt counts after them, which can be large, are not needed."""
COLUMNS = 8
"""The columns used: user nice system idle iowait irq softirq steal (Linux >= 2.6.11). Guest time,
after them, is already inside user and nice time."""

_add, _sub = operator.add, operator.sub


class CpuRatios(NamedTuple):
    cpu_ratio: float
    busiest_core_ratio: float
    iowait_ratio: float | None


class CoreTimes(NamedTuple):
    """One reading of every core, in the kernel's clock ticks, in the file's order."""

    names: tuple[bytes, ...]
    busy: list[int]
    total: list[int]
    iowait: list[int]


def parse(data: bytes) -> CoreTimes | None:
    """The per-core lines (`cpuN user nice system idle iowait irq softirq steal ...`) of /proc/stat's
    text; None where there are none, or they do not all have the same columns, at least COLUMNS."""
    if not data.startswith(b"cpu "):
        return None
    first = data.find(b"\n") + 1  # after the whole machine's line
    last = data.rfind(b"\ncpu")  # the last core's line (no other line has "cpu" at its start)
    if first <= 0 or last < first - 1:
        return None
    end = data.find(b"\n", last + 1)
    block = data[first : end + 1 if end >= 0 else len(data)]
    lines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
    tokens = block.split()
    width = len(tokens) // lines if lines else 0
    if width < COLUMNS + 1 or width * lines != len(tokens):
        return None
    names = tuple(tokens[0::width])
    if b" ".join(names).count(b"cpu") != lines:  # every line's first token is a core's name
        return None
    try:
        user, nice, system, idle, iowait, irq, softirq, steal = (
            list(map(int, tokens[c::width])) for c in range(1, COLUMNS + 1)
        )
    except ValueError:
        return None
    most = map(_add, map(_add, user, nice), map(_add, system, irq))
    busy = list(map(_add, most, map(_add, softirq, steal)))
    total = list(map(_add, map(_add, busy, idle), iowait))
    return CoreTimes(names, busy, total, iowait)


_ZERO = itertools.repeat(0)


def ratios(prev: CoreTimes, cur: CoreTimes) -> CpuRatios:
    """The whole machine's busy and iowait shares and the busiest core's, over the interval between
    two readings, as `host.cpu_ratios` has them: a core that did not move (or went backwards) is
    left out, busy and iowait time that went backwards count as none. Cores are matched by name,
    so a core taken offline between the readings shifts no other."""
    if prev.names != cur.names:
        prev, cur = _common(prev, cur)
    d_total = list(map(_sub, cur.total, prev.total))
    d_busy = list(map(max, _ZERO, map(_sub, cur.busy, prev.busy)))
    d_io = list(map(max, _ZERO, map(_sub, cur.iowait, prev.iowait)))
    if d_total and min(d_total) <= 0:
        kept = [i for i, t in enumerate(d_total) if t > 0]
        d_total = [d_total[i] for i in kept]
        d_busy = [d_busy[i] for i in kept]
        d_io = [d_io[i] for i in kept]
    total = sum(d_total)
    if total <= 0:
        return CpuRatios(0.0, 0.0, 0.0)
    return CpuRatios(
        cpu_ratio=min(1.0, sum(d_busy) / total),
        busiest_core_ratio=min(1.0, max(map(operator.truediv, d_busy, d_total))),
        iowait_ratio=min(1.0, sum(d_io) / total),
    )


def _common(prev: CoreTimes, cur: CoreTimes) -> tuple[CoreTimes, CoreTimes]:
    """The two readings cut to the cores both have, in the same order."""
    where = {n: i for i, n in enumerate(prev.names)}
    pairs = [(where[n], i) for i, n in enumerate(cur.names) if n in where]

    def pick(r: CoreTimes, at: list[int]) -> CoreTimes:
        names = tuple(r.names[i] for i in at)
        return CoreTimes(names, [r.busy[i] for i in at], [r.total[i] for i in at], [r.iowait[i] for i in at])

    return pick(prev, [p for p, _ in pairs]), pick(cur, [c for _, c in pairs])


class ProcStat:
    """Reads /proc/stat (at most MAX_BYTES of it) into CoreTimes."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._file = ProcFile(path, MAX_BYTES)

    def read(self) -> CoreTimes:
        """ValueError where the file has no per-core lines this module can read; OSError as opened."""
        found = parse(self._file.read())
        if found is None:
            raise ValueError(f"{self.path}: no per-core lines of {COLUMNS} columns or more")
        return found
