"""The host source's per-core CPU reading as a node's cores grow: psutil's against gpumon's own.

    .venv/bin/python -m benchmarks.host_cores [--cores 2,64,224,512] [--repeats 9]

For each core count, a /proc/stat as Linux writes it (a line per core, then ~300 interrupt
counts) is written to a temporary folder, two readings a second apart; then, alternately, the
CPU time (time.process_time, median of --repeats passes of 200 reads) of what the host source does
with it per tick:

  psutil   psutil.cpu_times(percpu=True) from that folder (psutil.PROCFS_PATH) and
           gpumon.collect.sources.host.cpu_ratios over two such readings (before this benchmark's
           change, what every tick did);
  gpumon   gpumon.collect.sources.cpustat: the file read, parsed by columns, and its ratios.

Both read the same file through the same page cache; the kernel's cost of making the real file
(the same for both, and for a peer that reads it) is not in it. A GPU server has 128-256 hardware
threads (two 56-core sockets, hyper-threaded: 224). Issue 29: cheaper at rest than every peer.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpumon.collect.sources import cpustat
from gpumon.collect.sources.host import cpu_ratios, load_psutil

FIELDS = 10
READS = 200


def stat_text(cores: list[list[int]]) -> str:
    whole = [sum(c[k] for c in cores) for k in range(FIELDS)]
    lines = ["cpu  " + " ".join(map(str, whole))]
    lines += [f"cpu{n} " + " ".join(map(str, c)) for n, c in enumerate(cores)]
    lines += ["intr 98765432 " + " ".join(str(random.randrange(10**6)) for _ in range(300))]
    lines += ["ctxt 123456789", "btime 1764000000", "processes 4242", "procs_running 2", "procs_blocked 0"]
    return "\n".join(lines) + "\n"


def folders(root: Path, n: int) -> tuple[Path, Path]:
    """Two readings of n cores, one second (100 clock ticks a core) apart."""
    before = [[random.randrange(10**7) for _ in range(FIELDS)] for _ in range(n)]
    after = []
    for c in before:
        busy = random.randrange(0, 101)
        step = [busy, 0, 0, 100 - busy, 0, 0, 0, 0, 0, 0]
        after.append([a + b for a, b in zip(c, step)])
    out = []
    for name, cores in (("a", before), ("b", after)):
        d = root / f"{n}-{name}"
        d.mkdir()
        (d / "stat").write_text(stat_text(cores))
        out.append(d)
    return out[0], out[1]


def cpu_us(fn: Callable[[], object]) -> float:
    t = time.process_time()
    for _ in range(READS):
        fn()
    return (time.process_time() - t) / READS * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", default="2,64,224,512")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    psutil = load_psutil()
    random.seed(29)
    head = f"{'cores':>6} {'psutil us/tick':>15} {'gpumon us/tick':>15} {'ratio':>7}"
    print(f"{head}   (median of {args.repeats})")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.cores.split(",")):
            a, b = folders(Path(tmp), n)

            # a tick: this second's reading, and the ratios against the last one
            psutil.PROCFS_PATH = str(a)
            prev = psutil.cpu_times(percpu=True)
            prev_times = cpustat.ProcStat(str(a / "stat")).read()
            reader = cpustat.ProcStat(str(b / "stat"))

            def with_psutil(b: Path = b, prev: object = prev) -> object:
                psutil.PROCFS_PATH = str(b)
                return cpu_ratios(prev, psutil.cpu_times(percpu=True))  # type: ignore[arg-type]

            def with_gpumon(
                reader: cpustat.ProcStat = reader, prev: cpustat.CoreTimes = prev_times
            ) -> object:
                return cpustat.ratios(prev, reader.read())

            old, new = [], []
            for _ in range(args.repeats):  # alternated, so both see the same moments of the machine
                old.append(cpu_us(with_psutil))
                new.append(cpu_us(with_gpumon))
            o, m = statistics.median(old), statistics.median(new)
            print(f"{n:>6} {o:>15.1f} {m:>15.1f} {m / o:>7.2f}")
    psutil.PROCFS_PATH = "/proc"


if __name__ == "__main__":
    main()
