"""Simulated GPUs: kernel timelines that follow a scenario, read the way NVML reports them.

Each GPU runs a step loop: busy for a compute time, idle for an input wait, with seeded jitter.
The driver's view is emulated: a utilization sample at every sample-period boundary is the share
of that period in which a kernel ran (an integer percent), samples are buffered (newest 120), and
`utilization_now` is the last full period. Smooth phases (idle, stalled, sync-stall,
underutilized) have no gaps at any resolution. Everything is a pure function of the seed and time,
whatever order the readings are taken in.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from dataclasses import dataclass

from gpumon.core.clock import Clock
from gpumon.core.errors import UsageError
from gpumon.sim.scenarios import Phase, Scenario

GIB = 1024**3
BUFFER_SAMPLES = 120
BOOT_S = 1000.0
"""Sample timestamps count µs from a made-up boot, as NVML's own clock does, not sampler time."""
HISTORY_S = 10.0
"""The job has been running this long when the simulation starts."""
MIN_PERIOD_S, MAX_PERIOD_S = 1 / 6, 1.0


def unit_noise(*key: int) -> float:
    """A deterministic number in [-1, 1) from integers: noise that does not depend on call order."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**63 - 1.0


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str = "NVIDIA H100 80GB HBM3 (simulated)"
    mem_total_bytes: int = 80 * GIB
    power_limit_w: float = 700.0


JOB_PID_STRIDE = 200_000
"""Processes of another job on the same GPU: its pids this far apart (every GPU's fit between)."""


class SimGpu:
    def __init__(
        self, index: int, scenario: Scenario, seed: int, period_s: float, model: GpuModel = GpuModel()
    ) -> None:
        self.index = index
        self.scenario = scenario
        self.seed = seed
        self.period_s = period_s
        self.model = model
        self.uuid = "GPU-" + _uuid_body(seed, index)
        self.pid = 40000 + 100 * index
        self._rng = random.Random(seed * 1_000_003 + index)
        self._starts: list[float] = []  # busy intervals, sorted, non-overlapping
        self._ends: list[float] = []
        self._generated_to = -HISTORY_S
        # sample boundaries are offset per GPU, as real drivers' are not aligned with anything
        self._phase_s = (unit_noise(seed, index, 7) + 1) / 2 * period_s
        self._cache: dict[int, int] = {}

    # -- kernel timeline -----------------------------------------------------------------------

    def _generate(self, until_s: float) -> None:
        t = self._generated_to
        rng = self._rng
        while t < until_s:
            ph = self.scenario.phase_at(max(t, 0.0))
            if not ph.stepped:
                # smooth phases are a flat duty cycle: step forward in slices, nothing to draw
                nxt = self._next_phase_start(t)
                t = min(until_s + 1.0, nxt) if nxt is not None else until_s + 1.0
                continue
            busy = max(0.002, rng.gauss(ph.compute_s, ph.compute_s * ph.jitter))
            wait = max(0.0005, rng.gauss(ph.wait_s, ph.wait_s * ph.jitter))
            if ph.long_gap_p and rng.random() < ph.long_gap_p:
                wait = rng.uniform(*ph.long_gap_s)
            self._starts.append(t)
            self._ends.append(t + busy)
            t += busy + wait
        self._generated_to = t
        # bounded memory: keep only what the sample buffer can still ask about
        horizon = until_s - (BUFFER_SAMPLES + 2) * self.period_s
        drop = bisect.bisect_left(self._ends, horizon)
        if drop > 512:
            del self._starts[:drop]
            del self._ends[:drop]

    def _next_phase_start(self, t: float) -> float | None:
        for start, _ in self.scenario.phases:
            if start > t:
                return start
        return None

    def busy_share(self, a: float, b: float) -> float:
        """Share of [a, b) in which a kernel ran; windows are split where the phase changes."""
        if b <= a:
            return 0.0
        cuts = [a] + [s for s, _ in self.scenario.phases if a < s < b] + [b]
        busy = 0.0
        for x, y in itertools.pairwise(cuts):
            ph = self.scenario.phase_at(max(x, 0.0))
            if not ph.stepped:
                busy += ph.duty * (y - x)
                continue
            self._generate(y)
            i = bisect.bisect_right(self._ends, x)
            while i < len(self._starts) and self._starts[i] < y:
                busy += min(y, self._ends[i]) - max(x, self._starts[i])
                i += 1
        return min(1.0, max(0.0, busy / (b - a)))

    # -- NVML view -----------------------------------------------------------------------------

    def _boundary(self, k: int) -> float:
        return k * self.period_s + self._phase_s

    def sample_percent(self, k: int) -> int:
        """The driver's utilization sample for period k (an integer percent, as NVML gives)."""
        value = self._cache.get(k)
        if value is None:
            b = self._boundary(k)
            share = self.busy_share(b - self.period_s, b)
            ph = self.scenario.phase_at(max(b, 0.0))
            if not ph.stepped and 0.0 < ph.duty < 1.0:
                share += 0.03 * unit_noise(self.seed, self.index, k)  # small, gap-free wobble
            value = round(min(1.0, max(0.0, share)) * 100)
            self._cache[k] = value
            if len(self._cache) > 4 * BUFFER_SAMPLES:
                for old in sorted(self._cache)[: 2 * BUFFER_SAMPLES]:
                    del self._cache[old]
        return value

    def last_k(self, t_s: float) -> int:
        return int((t_s - self._phase_s) // self.period_s)

    def samples_since(self, last_seen_us: int, t_s: float) -> list[tuple[int, int]]:
        """(timestamp µs, percent) of buffered samples newer than last_seen_us, oldest first."""
        newest = self.last_k(t_s)
        oldest = newest - BUFFER_SAMPLES + 1
        if last_seen_us:
            first_k = int(((last_seen_us / 1e6 - BOOT_S) - self._phase_s) // self.period_s) + 1
            oldest = max(oldest, first_k)
        out = []
        for k in range(oldest, newest + 1):
            ts = round((BOOT_S + self._boundary(k)) * 1e6)
            if ts > last_seen_us:
                out.append((ts, self.sample_percent(k)))
        return out

    def utilization_now(self, t_s: float) -> int:
        return self.sample_percent(self.last_k(t_s))

    def phase(self, t_s: float) -> Phase:
        return self.scenario.phase_at(max(t_s, 0.0))

    def power_w(self, t_s: float) -> float:
        ph = self.phase(t_s)
        util = self.busy_share(t_s - 1.0, t_s)  # power sensors average over about a second
        ratio = ph.power_idle_ratio + (ph.power_busy_ratio - ph.power_idle_ratio) * util
        ratio *= 1 + 0.02 * unit_noise(self.seed, self.index, self.last_k(t_s), 11)
        return round(self.model.power_limit_w * ratio, 3)

    def mem_used_bytes(self, t_s: float) -> int:
        return int(self.model.mem_total_bytes * self.phase(t_s).mem_used_ratio)

    def pid_at(self, t_s: float) -> int:
        """The job's main process on this GPU: another job (Phase.job) runs as other processes."""
        return self.pid + JOB_PID_STRIDE * self.phase(t_s).job

    def worker_pids(self, t_s: float) -> list[int]:
        ph = self.phase(t_s)
        pid = self.pid_at(t_s)
        return [pid + 1 + w for w in range(ph.workers)] if ph.has_job else []

    def job_started_s(self, t_s: float) -> float:
        """When (fleet time) the job now on the GPU started its processes: its first phase's start,
        less that phase's `started_before_s`."""
        job = self.phase(t_s).job
        first = None
        for start, ph in self.scenario.phases:
            if start > t_s:
                break
            if ph.job != job or not ph.has_job:
                first = None
            elif first is None:
                first = start - ph.started_before_s
        return first if first is not None else t_s


def _uuid_body(seed: int, index: int) -> str:
    h = hashlib.blake2b(f"gpumon-sim/{seed}/{index}".encode(), digest_size=16).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class Fleet:
    """N simulated GPUs on one simulated host, read through `nvml()` and `psutil()` look-alikes."""

    def __init__(
        self,
        scenarios: list[Scenario],
        gpus: int | None,
        seed: int,
        clock: Clock,
        sample_period_s: float = 1 / 6,
        noise: float = 0.05,
    ) -> None:
        n = len(scenarios) if gpus is None else gpus
        if n < 1 or n > 1024:
            raise UsageError(f"--gpus: must be between 1 and 1024, got {n}")
        if n < len(scenarios):
            raise UsageError(f"--gpus {n} is fewer than the {len(scenarios)} scenarios given to --simulate")
        if not MIN_PERIOD_S - 1e-9 <= sample_period_s <= MAX_PERIOD_S:
            raise UsageError(
                f"--sample-period: must be between 1/6 s and 1 s (NVML's range), got {sample_period_s:g}"
            )
        self.clock = clock
        self.seed = seed
        self.noise = noise
        self.sample_period_s = sample_period_s
        self.scenario_names = [scenarios[i % len(scenarios)].name for i in range(n)]
        self.gpus = [SimGpu(i, scenarios[i % len(scenarios)], seed, sample_period_s) for i in range(n)]
        self._t0 = clock.now()

    def sim_time(self) -> float:
        """Seconds since the fleet started (the scenario's clock)."""
        return self.clock.now() - self._t0
