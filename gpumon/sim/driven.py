"""A simulated GPU driven by a real job: busy exactly while the job's train step runs.

The job (`gpumon bench --drive FILE`) appends one line per train step to FILE:

    # gpumon-drive v1 pid=PID          (written again whenever a job starts)
    START END                          (the step's busy interval, CLOCK_MONOTONIC seconds)

time.monotonic() is the same CLOCK_MONOTONIC in every process on Linux, so the daemon can place
the steps on its own clock. The GPU reports the job's PID as its compute process, and the host
side is read for real (psutil), so the detector sees the job's actual CPU and its real data-loader
workers, on a machine without a GPU. Everything that shows it says "simulated".
"""

from __future__ import annotations

import os
import re

from gpumon.clock import Clock
from gpumon.sim.fleet import Fleet, GpuModel, SimGpu
from gpumon.sim.scenarios import Phase, Scenario

HEADER = re.compile(r"#\s*gpumon-drive v1 pid=(\d+)")
DRIVEN_MODEL = GpuModel(name="Keras bench GPU (simulated)")
_JOB = Phase(stepped=True, mem_used_ratio=0.3)
_NO_JOB = Phase(has_job=False, stepped=True, mem_used_ratio=0.006)


class DrivenGpu(SimGpu):
    def __init__(self, path: str, clock_t0: float, period_s: float) -> None:
        super().__init__(
            0, Scenario("driven", f"driven by {path}", ((0.0, _JOB),)), 0, period_s, DRIVEN_MODEL
        )
        self.path = path
        self._t0 = clock_t0  # monotonic time of the fleet's sim time 0
        self._offset = 0
        self.pid = 0
        self._partial = ""

    def _read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next read
        for line in lines:
            m = HEADER.match(line)
            if m:
                self.pid = int(m.group(1))
                continue
            try:
                start, end = (float(x) - self._t0 for x in line.split())
            except ValueError:
                continue
            if end > start and (not self._ends or start >= self._ends[-1]):
                self._starts.append(start)
                self._ends.append(end)

    def _generate(self, until_s: float) -> None:
        self._read()
        horizon = until_s - 130 * self.period_s
        while self._ends and len(self._ends) > 4096 and self._ends[0] < horizon:
            del self._starts[:1024]
            del self._ends[:1024]

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
        return _JOB if self.job_running() else _NO_JOB

    def worker_pids(self, t_s: float) -> list[int]:
        return []


def driven_fleet(path: str, clock: Clock, sample_period_s: float = 1 / 6) -> Fleet:
    """One GPU driven by the job writing `path`. Real time only: the job's steps are stamped with
    time.monotonic(), which is anchored here to the fleet's time 0."""
    import time

    from gpumon.sim.scenarios import SCENARIOS

    fleet = Fleet([SCENARIOS["idle"]], 1, 0, clock, sample_period_s)
    fleet.gpus = [DrivenGpu(path, time.monotonic(), sample_period_s)]
    fleet.scenario_names = ["driven"]
    return fleet
