"""Simulated GPUs driven by a real job: each busy exactly while the job's train step runs.

The job (`gpumon bench --drive FILE`) appends one line per train step to FILE:

    # gpumon-drive v1 pid=PID          (one job on GPU 0; written again whenever a job starts)
    START -                            (a step began: busy from START until its END line)
    START END                          (the step's busy interval, CLOCK_MONOTONIC seconds)

and, for a data-parallel job (`gpumon bench --gpus N`), first its size, then each rank R on GPU R:

    # gpumon-drive v2 ranks=N          (the launcher, before the ranks start: N GPUs, no job yet)
    # gpumon-drive v2 pid=PID rank=R   (the rank's process)
    START - R [sync]                   (an interval began)
    START END R                        (busy computing)
    START END R sync                   (busy spinning in a collective, waiting for another rank:
                                        kernels run, at idle-level power, as NCCL's do)

An interval is written when it begins as well as when it ends: a driver sample is read once, as
soon as its period ends, and a step or a wait in the collective still going on then must count
as busy (a wait for a straggler lasts longer than a sample period). An interval's END line
replaces its begin line; a begin line never ended counts as busy until the next begin line.

Other lines starting with # (e.g. "# switch T") are notes for people and benchmarks. GPUs appear
as ranks do (the driver's GPU count grows), so the recorder may start before the job.

The file is read as any file a user names: only a regular file (a FIFO would block the sampler,
/dev/zero never ends), opened without waiting, MAX_READ_BYTES at most per read, a line at most
MAX_LINE_BYTES long. A line that is not UTF-8, too long, or does not parse is skipped (counted,
said once), and the next one is read. A file replaced by another one (or cut shorter) is read
from its start.

time.monotonic() is the same CLOCK_MONOTONIC in every process on Linux, so the daemon can place
the steps on its own clock. Each GPU reports its rank's PID as its compute process, and the host
side is read for real (psutil), so the detector sees the job's actual CPU and its real data-loader
workers, on a machine without a GPU. Everything that shows it says "simulated".
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import re
import time
from collections import Counter

from gpumon.core.clock import Clock
from gpumon.core.files import NotRegularFile, open_regular
from gpumon.core.problems import Problems
from gpumon.sim.fleet import Fleet, GpuModel, SimGpu
from gpumon.sim.scenarios import SCENARIOS, Phase, Scenario

log = logging.getLogger("gpumon.drive")

HEADER = re.compile(r"#\s*gpumon-drive v([12]) pid=([0-9]+)(?: rank=([0-9]+))?")
RANKS = re.compile(r"#\s*gpumon-drive v2 ranks=([0-9]+)")
DRIVEN_MODEL = GpuModel(name="Keras bench GPU (simulated)")
_JOB = Phase(stepped=True, mem_used_ratio=0.3)
_NO_JOB = Phase(has_job=False, stepped=True, mem_used_ratio=0.0)
SPIN_POWER_RATIO = 0.15
"""Power, as a share of the limit, while kernels spin in a collective: near idle (NCCL's wait
kernels keep the GPU "utilized" but draw little)."""
MAX_RANKS = 64
MAX_PID = 1 << 22
"""Linux's PID_MAX_LIMIT: a larger pid is no process (and os.kill cannot take a huge one)."""
MAX_LINE_BYTES = 4096
"""A drive line is under 100 bytes: a longer one is dropped (up to its newline), never buffered."""
MAX_READ_BYTES = 1 << 20
"""Read at most this much of the file per refresh: a backlog is taken in over the next ones."""


class DrivenGpu(SimGpu):
    def __init__(self, rank: int, fleet: DrivenFleet, period_s: float) -> None:
        super().__init__(
            rank, Scenario("driven", f"driven by {fleet.path}", ((0.0, _JOB),)), 0, period_s, DRIVEN_MODEL
        )
        self._fleet = fleet
        self.pid = 0
        self._sync_starts: list[float] = []
        self._sync_ends: list[float] = []
        self.open: tuple[float, bool] | None = None
        """(start, sync) of an interval that has begun and not yet ended."""

    def begin(self, start: float, sync: bool) -> None:
        if not self._ends or start >= self._ends[-1]:
            self.open = (start, sync)

    def add(self, start: float, end: float, sync: bool) -> None:
        if self.open is not None and self.open[0] <= start:
            self.open = None
        if end > start and (not self._ends or start >= self._ends[-1]):
            self._starts.append(start)
            self._ends.append(end)
            if sync:
                self._sync_starts.append(start)
                self._sync_ends.append(end)

    def _generate(self, until_s: float) -> None:
        self._fleet.refresh()
        horizon = until_s - 130 * self.period_s
        for starts, ends in ((self._starts, self._ends), (self._sync_starts, self._sync_ends)):
            while ends and len(ends) > 4096 and ends[0] < horizon:
                del starts[:1024]
                del ends[:1024]

    def _open_share(self, a: float, b: float, sync_only: bool) -> float:
        if self.open is None or (sync_only and not self.open[1]):
            return 0.0
        return max(0.0, b - max(a, self.open[0])) / (b - a)

    def busy_share(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        return min(1.0, super().busy_share(a, b) + self._open_share(a, b, sync_only=False))

    def _sync_share(self, a: float, b: float) -> float:
        spin = self._open_share(a, b, sync_only=True) * (b - a)
        i = bisect.bisect_right(self._sync_ends, a)
        while i < len(self._sync_starts) and self._sync_starts[i] < b:
            spin += min(b, self._sync_ends[i]) - max(a, self._sync_starts[i])
            i += 1
        return spin / (b - a)

    def power_w(self, t_s: float) -> float:
        busy = self.busy_share(t_s - 1.0, t_s)  # power sensors average over about a second
        spin = min(busy, self._sync_share(t_s - 1.0, t_s))
        ph = self.phase(t_s)
        ratio = (
            ph.power_idle_ratio
            + (ph.power_busy_ratio - ph.power_idle_ratio) * (busy - spin)
            + (SPIN_POWER_RATIO - ph.power_idle_ratio) * spin
        )
        return round(self.model.power_limit_w * ratio, 3)

    def job_running(self) -> bool:
        if not self.pid:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def phase(self, t_s: float) -> Phase:
        if self.job_running():
            return _JOB
        self.open = None  # a job that has gone runs nothing, whatever it began
        return _NO_JOB

    def worker_pids(self, t_s: float) -> list[int]:
        return []


class DrivenFleet(Fleet):
    """The GPUs of the job writing `path`: GPU 0 from the start, one more per rank that appears."""

    def __init__(
        self, path: str, clock: Clock, sample_period_s: float, problems: Problems | None = None
    ) -> None:

        super().__init__([SCENARIOS["idle"]], 1, 0, clock, sample_period_s)
        self.path = path
        self.problems = problems if problems is not None else Problems(log)
        self._t0_mono = time.monotonic()  # monotonic time of the fleet's sim time 0
        self._offset = 0
        self._file_id: tuple[int, int] | None = None
        """(st_dev, st_ino) of the file read up to `_offset`: another file is read from its start."""
        self._partial = b""
        self._dropping = False
        """In a line longer than MAX_LINE_BYTES: what comes up to its newline is dropped."""
        self.skipped: Counter[str] = Counter()
        """Lines skipped, by why (each reason said once)."""
        self._driven: list[DrivenGpu] = [DrivenGpu(0, self, sample_period_s)]
        self.scenario_names = ["driven"]

    @property
    def gpus(self) -> list[SimGpu]:
        self.refresh()
        return list(self._driven)

    @gpus.setter
    def gpus(self, value: list[SimGpu]) -> None:
        pass  # Fleet.__init__'s idle placeholder: the driven GPUs are the fleet's own

    def _rank(self, rank: int) -> DrivenGpu | None:
        if not 0 <= rank < MAX_RANKS:
            return None
        while len(self._driven) <= rank:
            self._driven.append(DrivenGpu(len(self._driven), self, self.sample_period_s))
            self.scenario_names.append("driven")
        return self._driven[rank]

    def refresh(self) -> None:
        """Take in what the job wrote since the last read (a whole line at a time)."""
        chunk = self._read()
        if not chunk:
            return
        lines = chunk.split(b"\n")
        rest = lines.pop()  # an unfinished last line waits for the next read
        for i, raw in enumerate(lines):
            if i == 0:
                if self._dropping:  # the end of a line too long to keep
                    self._dropping = False
                    continue
                raw = self._partial + raw
                self._partial = b""
            if len(raw) > MAX_LINE_BYTES:
                self._skip(f"longer than {MAX_LINE_BYTES} bytes")
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                self._skip("not UTF-8 text")
                continue
            if not self._take(line):
                self._skip("not a drive line")
        if self._dropping:  # no newline yet: still in the line too long to keep
            return
        self._partial += rest
        if len(self._partial) > MAX_LINE_BYTES:
            self._skip(f"longer than {MAX_LINE_BYTES} bytes")
            self._partial = b""
            self._dropping = True

    def _read(self) -> bytes:
        """At most MAX_READ_BYTES of the file past what was read; b"" when there is none (no file
        yet, or something other than a regular file: said once, until it is one again)."""
        try:
            f = open_regular(self.path)
        except FileNotFoundError:
            return b""  # the job has not started yet (or its file is being replaced)
        except NotRegularFile as e:
            self.problems.note(
                "drive:file", f"drive: {self.path} is not read: not a regular file (a {e.kind})"
            )
            return b""
        except OSError as e:
            self.problems.note("drive:file", f"drive: cannot read {self.path}: {e.strerror}")
            return b""
        try:
            with f:
                st = os.fstat(f.fileno())
                file_id = (st.st_dev, st.st_ino)
                if file_id != self._file_id or st.st_size < self._offset:
                    # another file under the name, or this one cut shorter: read it from its start
                    self._file_id = file_id
                    self._offset = 0
                    self._partial = b""
                    self._dropping = False
                f.seek(self._offset)
                chunk = f.read(MAX_READ_BYTES)
        except OSError as e:
            self.problems.note("drive:file", f"drive: cannot read {self.path}: {e.strerror}")
            return b""
        self.problems.clear("drive:file")
        self._offset += len(chunk)
        return chunk

    def _skip(self, why: str) -> None:
        if not self.skipped[why]:
            log.warning("drive: %s: a line skipped (%s); later ones are counted, not logged", self.path, why)
        self.skipped[why] += 1

    def _take(self, line: str) -> bool:
        """One line of the file taken in; False when it is not a drive line (comments are)."""
        m = RANKS.match(line)
        if m:  # a data-parallel job is starting: its GPUs exist before its ranks run on them
            ranks = _small_int(m.group(1))
            if ranks is None:
                return False
            self._rank(min(ranks, MAX_RANKS) - 1)
            return True
        m = HEADER.match(line)
        if m:
            pid, rank = _small_int(m.group(2)), _small_int(m.group(3) or "0")
            if pid is None or rank is None or pid >= MAX_PID:
                return False
            gpu = self._rank(rank)
            if gpu is not None:
                gpu.pid = pid
            return True
        if line.startswith("#") or not line.strip():
            return True  # a note for people
        if not line.isascii():  # float() and int() read other scripts' digits ("١" is 1)
            return False
        parts = line.split()
        if not 2 <= len(parts) <= 4:
            return False
        try:
            start = float(parts[0]) - self._t0_mono
            end = None if parts[1] == "-" else float(parts[1]) - self._t0_mono
            rank = int(parts[2]) if len(parts) > 2 else 0
        except ValueError:
            return False
        if not math.isfinite(start) or (end is not None and not math.isfinite(end)):
            return False  # inf or nan: a step that never ends (or never was)
        gpu = self._rank(rank)
        if gpu is None:
            return True  # a rank over the limit: skipped, as documented
        sync = len(parts) == 4 and parts[3] == "sync"
        if end is None:
            gpu.begin(start, sync)
        else:
            gpu.add(start, end, sync)
        return True


def _small_int(digits: str) -> int | None:
    """ASCII digits as a number that fits a pid or a rank; None for a longer run of them."""
    return int(digits) if len(digits) <= 12 else None


def driven_fleet(
    path: str, clock: Clock, sample_period_s: float = 1 / 6, problems: Problems | None = None
) -> Fleet:
    """The GPUs driven by the job writing `path`. Real time only: the job's steps are stamped with
    time.monotonic(), which is anchored here to the fleet's time 0. A file that cannot be read is
    said in `problems` (once, until it can be)."""
    return DrivenFleet(path, clock, sample_period_s, problems)
