"""Named workload scenarios for simulated GPUs.

A scenario is a list of phases; each phase says how the job on one GPU behaves: how long a
training step computes (GPU busy) and waits (GPU idle), how regular that is, what the power draw
is, and what the host sees of it (CPU of the job and its loader workers, iowait, disk reads).
The simulator (`gpumon.sim.fleet`) turns phases into kernel timelines and NVML-like readings.
These definitions are the single place where a workload pattern is defined.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from gpumon.core.errors import UsageError


@dataclass(frozen=True, slots=True)
class Phase:
    has_job: bool = True
    """A process holds the GPU (memory, a process-list entry)."""
    stepped: bool = True
    """Discrete steps (busy then idle); False: a smooth duty cycle with no visible gaps."""
    compute_s: float = 0.09
    """Mean GPU-busy time per step."""
    wait_s: float = 0.004
    """Mean GPU-idle time per step (waiting for input)."""
    jitter: float = 0.1
    """Relative spread of step and wait times."""
    long_gap_p: float = 0.0
    """Chance that a wait is a long, irregular gap (storage stalls)."""
    long_gap_s: tuple[float, float] = (0.4, 1.2)
    duty: float = 0.0
    """For smooth phases: the share of time a kernel runs."""
    power_idle_ratio: float = 0.1
    power_busy_ratio: float = 0.85
    """Power draw as a share of the limit, at utilization 0 and 1."""
    mem_used_ratio: float = 0.6
    main_cpu: float = 0.6
    """Cores used by the training process itself."""
    workers: int = 4
    worker_cpu: float = 0.3
    """Cores used by each data-loader worker process."""
    iowait: float = 0.01
    """This job's contribution to host iowait (share of all CPU time)."""
    read_bytes_per_s: float = 20e6
    main_runq: float = 0.0
    worker_runq: float = 0.0
    """Time runnable but waiting for a CPU, per second, of the main process and of each worker: a
    CPU-bound loader on a saturated host runs part of each second and waits the rest."""
    main_blkio: float = 0.0
    worker_blkio: float = 0.0
    """Time waiting for block I/O, per second (what delayacct counts)."""
    other_cores: float = 0.0
    """Cores kept busy by other processes on the host (contention: not the job's)."""
    gpm: bool = False
    """The GPU has GPM (Hopper and newer): SM activity and the rest are read."""
    sm_fill: float = 0.85
    """With GPM: the share of SMs the job's kernels keep busy while they run."""
    clock_events: int = 0
    """Clock-event reasons (nvml.h bits) while a kernel runs: 0x4 power cap, 0x20/0x40 thermal."""
    mig: bool = False
    """The GPU as NVML shows a MIG instance: no utilization, no utilization samples, no power or
    temperature (the parent's), GPM only (set it on every phase of a scenario, with `gpm`)."""
    job: int = 0
    """Which job holds the GPU: a phase with another number is another job (other processes)."""
    started_before_s: float = 3600.0
    """How long before the job's first phase its processes started (a job already running when
    the simulation begins; 0: the job starts with the phase)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    phases: tuple[tuple[float, Phase], ...]
    """(start second, phase), sorted; the first starts at 0."""
    truth: tuple[tuple[float, str], ...] = field(default=())
    """(start second, expected detector state), for benchmarks and tests."""

    def phase_at(self, t_s: float) -> Phase:
        current = self.phases[0][1]
        for start, phase in self.phases:
            if start <= t_s:
                current = phase
            else:
                break
        return current

    def then(self, other: Scenario, at_s: float) -> Scenario:
        """This scenario until `at_s`, then `other`'s first phase."""
        return Scenario(
            name=f"{self.name}-then-{other.name}",
            summary=f"{self.name} for {at_s:g} s, then {other.name}",
            phases=(*self.phases, (at_s, other.phases[0][1])),
            truth=(*self.truth, (at_s, other.truth[0][1])),
        )


HEALTHY = Phase()
STARVED_CPU = Phase(
    compute_s=0.06,
    wait_s=0.19,
    jitter=0.12,
    main_cpu=0.3,  # a starved training process mostly waits for batches (an H200's read 0.14-0.16)
    workers=2,
    worker_cpu=0.99,
    read_bytes_per_s=5e6,
)
STARVED_IO = Phase(
    compute_s=0.06,
    wait_s=0.08,
    jitter=0.4,
    long_gap_p=0.3,
    main_cpu=0.15,
    workers=4,
    worker_cpu=0.06,
    iowait=0.3,
    read_bytes_per_s=420e6,
)
STARVED_HOST = Phase(
    compute_s=0.06,
    wait_s=0.3,
    jitter=0.5,
    main_cpu=0.3,
    workers=4,
    worker_cpu=0.05,
    read_bytes_per_s=0.0,
)
IDLE = Phase(
    has_job=False,
    stepped=False,
    duty=0.0,
    power_idle_ratio=0.08,
    mem_used_ratio=0.0,  # an idle H200 read 0-3 MiB in use (memory v2, the reserve apart)
    main_cpu=0.0,
    workers=0,
    worker_cpu=0.0,
    iowait=0.0,
    read_bytes_per_s=0.0,
)
STALLED = Phase(
    stepped=False,
    duty=0.0,
    power_idle_ratio=0.12,
    main_cpu=0.01,
    worker_cpu=0.0,
    iowait=0.0,
    read_bytes_per_s=0.0,
)
SYNC_STALL = Phase(
    stepped=False,
    duty=1.0,
    power_idle_ratio=0.14,
    power_busy_ratio=0.16,
    main_cpu=0.35,
    worker_cpu=0.02,
    iowait=0.0,
    read_bytes_per_s=0.0,
)
UNDERUTILIZED = Phase(
    stepped=False,
    duty=0.35,
    power_busy_ratio=0.6,
    main_cpu=0.5,
    workers=2,
    worker_cpu=0.15,
    read_bytes_per_s=2e6,
)

STARVED_CPU_CONTENDED = Phase(
    compute_s=0.06,
    wait_s=0.19,
    jitter=0.15,
    main_cpu=0.3,
    workers=6,
    worker_cpu=0.6,
    worker_runq=0.4,
    iowait=0.005,
    read_bytes_per_s=40e6,
    other_cores=4.6,
)
"""More JPEG-decoding loaders than cores on a host busy with other work: each gets 0.6 of a core and
waits for the rest, none is ever pinned, and they read 40 MB/s from a fast disk (issue 17)."""
STARVED_IO_CONTENDED = Phase(
    compute_s=0.06,
    wait_s=0.2,
    jitter=0.4,
    long_gap_p=0.3,
    main_cpu=0.15,
    workers=4,
    worker_cpu=0.08,
    worker_runq=0.03,
    worker_blkio=0.8,
    iowait=0.002,
    read_bytes_per_s=40e6,
    other_cores=7.2,
)
"""Loaders waiting on a slow disk while other work saturates the CPUs: iowait near 0 (the CPUs are
busy, not idle), the reads as modest as the contended CPU-bound case's."""

STARTING = replace(STALLED, main_cpu=0.9, worker_cpu=0.0, workers=0, started_before_s=0.0, job=1)
"""A job that has just opened the GPU and runs no kernel yet: importing, indexing its dataset,
compiling, loading a checkpoint (its main process busy on the CPU)."""
UNDERUTILIZED_BUSY_HOST = replace(UNDERUTILIZED, main_cpu=0.0, workers=0, worker_cpu=0.0, other_cores=60.0)
"""Steady low use whose only process sleeps, on a host whose CPUs other jobs keep saturated: the
neighbours are busy, this GPU is not starved by them (issue 25)."""
HEALTHY_BUSY_HOST = replace(HEALTHY, other_cores=60.0)

SMALL_KERNELS = Phase(compute_s=0.05, wait_s=0.002, gpm=True, sm_fill=0.25, power_busy_ratio=0.45)
"""A batch too small for the GPU: kernels back to back (NVML reads ~97% busy), each filling a
quarter of the SMs. Only GPM can tell it from a fed job."""
HEALTHY_HOPPER = replace(HEALTHY, gpm=True)
HEALTHY_POWER_CAPPED = replace(HEALTHY, gpm=True, clock_events=0x4, power_busy_ratio=1.0)
STARVED_CPU_MIG = replace(STARVED_CPU, gpm=True, mig=True)

SWITCH_S = 30.0
"""When `healthy-then-starved` turns starved, in seconds from the start of the run."""

# -- what a healthy training loop does now and then (tests/test_false_alarms_loops.py) -----------
# A fed job's loop pauses for its own work: none of these is starvation, and none has an input-side
# remedy. Not listed in SCENARIOS (build them with `periodic`).

CHECKPOINT = replace(
    STALLED, main_cpu=1.0, workers=4, worker_cpu=0.01, mem_used_ratio=0.6, started_before_s=3600.0
)
"""Writing a checkpoint: nothing on the GPU while the training process serializes (one core) and
writes (write bytes are no reads); the loader's workers idle, their queues full."""
CHECKPOINT_GATHER = replace(
    CHECKPOINT, stepped=True, compute_s=0.04, wait_s=0.4, jitter=0.3, power_busy_ratio=0.4
)
"""A sharded model's full checkpoint: short gather and copy kernels while the training process
serializes."""
EPOCH_START = replace(STALLED, main_cpu=0.3, workers=4, worker_cpu=0.99, read_bytes_per_s=60e6, iowait=0.02)
"""An epoch's first seconds with DataLoader(persistent_workers=False): fresh workers fork, import
and open their files, each pinning a core, while the GPU waits for the first batches."""
EVALUATION_METRICS = Phase(
    compute_s=0.03,
    wait_s=0.03,
    jitter=0.2,
    power_busy_ratio=0.55,
    main_cpu=0.97,
    workers=6,
    worker_cpu=0.15,
    read_bytes_per_s=5e6,
)
"""A validation pass: light forward-only steps, per-batch metrics in the training process, the
evaluation loader's workers keeping up."""


def periodic(
    name: str,
    base: Phase,
    every_s: float,
    pause: tuple[tuple[float, Phase], ...],
    until_s: float,
    jitter: float = 0.0,
    seed: int = 0,
) -> Scenario:
    """`base`, with the phases of `pause` ((seconds, phase), in order) after every `every_s` seconds
    of it, until `until_s`: a loop that checkpoints, evaluates or flushes its logs now and then.
    `jitter`: the relative spread of each interval and pause (seeded)."""
    rng = random.Random(seed)

    def spread(s: float) -> float:
        return s * (1 + jitter * rng.uniform(-1.0, 1.0))

    phases: list[tuple[float, Phase]] = [(0.0, base)]
    t = spread(every_s)
    while t < until_s:
        for seconds, phase in pause:
            phases.append((t, phase))
            t += spread(seconds)
        phases.append((t, base))
        t += spread(every_s)
    return Scenario(name, f"{name}: every {every_s:g} s", tuple(phases), ((0.0, "healthy"),))


def _one(name: str, summary: str, phase: Phase, state: str) -> Scenario:
    return Scenario(name, summary, ((0.0, phase),), ((0.0, state),))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _one(
            "healthy", "fed training: ~96% busy in 90 ms steps, short regular input waits", HEALTHY, "healthy"
        ),
        _one(
            "starved-cpu",
            "CPU-bound input pipeline: 60 ms bursts, 190 ms gaps, feeders pinned",
            STARVED_CPU,
            "starved-cpu",
        ),
        _one(
            "starved-io",
            "storage-bound input: bursts between irregular gaps, iowait and disk reads",
            STARVED_IO,
            "starved-io",
        ),
        _one(
            "starved-host",
            "bursts and gaps with quiet CPU and disks: input from the network or a remote service",
            STARVED_HOST,
            "starved-host",
        ),
        _one("idle", "no job on the GPU: nothing runs, idle power, no processes", IDLE, "idle"),
        _one(
            "stalled",
            "a job holds GPU memory but nothing runs and its CPU is quiet (hang)",
            STALLED,
            "stalled",
        ),
        _one(
            "sync-stall",
            "ranks spinning in a collective: ~100% utilization at idle-level power",
            SYNC_STALL,
            "sync-stall",
        ),
        _one(
            "starved-cpu-contended",
            "more CPU-bound loaders than cores on a busy host, reading 40 MB/s: each waits for a CPU",
            STARVED_CPU_CONTENDED,
            "starved-cpu",
        ),
        _one(
            "starved-io-contended",
            "loaders waiting on storage on a host whose CPUs other work keeps busy",
            STARVED_IO_CONTENDED,
            "starved-io",
        ),
        _one(
            "underutilized",
            "steady, gap-free ~35% use: batch or model too small for the GPU",
            UNDERUTILIZED,
            "underutilized",
        ),
        _one(
            "small-kernels",
            "Hopper (GPM): ~97% busy to NVML, but the kernels fill a quarter of the SMs",
            SMALL_KERNELS,
            "underutilized-small-kernels",
        ),
        _one("healthy-hopper", "fed training on a GPU with GPM (SM activity 85%)", HEALTHY_HOPPER, "healthy"),
        _one(
            "starved-cpu-mig",
            "starved-cpu on a MIG instance as NVML shows one: no utilization or power, GPM only",
            STARVED_CPU_MIG,
            "starved-cpu",
        ),
        _one(
            "healthy-power-capped",
            "fed training on a GPU with GPM whose clocks the power cap holds down: slower, still fed",
            HEALTHY_POWER_CAPPED,
            "healthy",
        ),
    )
}
SCENARIOS["starting-then-healthy"] = Scenario(
    "starting-then-healthy",
    "a job opens the GPU, prepares for 60 s (no kernel yet), then trains fed",
    ((0.0, STARTING), (60.0, replace(HEALTHY, job=1, started_before_s=0.0))),
    ((0.0, "starting"), (60.0, "healthy")),
)
SCENARIOS["job-change"] = Scenario(
    "job-change",
    "one job trains starved-cpu, then another job takes the GPU, starts up, and trains starved too",
    (
        (0.0, STARVED_CPU),
        (40.0, replace(STARTING, job=2)),
        (55.0, replace(STARVED_CPU, job=2, started_before_s=0.0)),
    ),
    ((0.0, "starved-cpu"), (40.0, "starting"), (55.0, "starved-cpu")),
)
for _name, _summary, _phase, _state in (
    (
        "underutilized-busy-host",
        "steady ~35% use, its process asleep, beside neighbours that saturate the host's CPUs",
        UNDERUTILIZED_BUSY_HOST,
        "underutilized",
    ),
    (
        "healthy-busy-host",
        "fed training beside neighbours that saturate the host's CPUs",
        HEALTHY_BUSY_HOST,
        "healthy",
    ),
):
    SCENARIOS[_name] = _one(_name, _summary, _phase, _state)
SCENARIOS["healthy-then-starved"] = replace(
    SCENARIOS["healthy"].then(SCENARIOS["starved-cpu"], SWITCH_S),
    name="healthy-then-starved",
    summary=f"healthy for {SWITCH_S:g} s, then CPU-starved (a transition mid-run)",
)


def parse_scenarios(text: str) -> list[Scenario]:
    """`"starved-cpu,healthy"` -> scenarios; a usage error names the unknown one."""
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise UsageError(f"--simulate: empty scenario name in {text!r}; see 'gpumon scenarios'")
    out = []
    for n in names:
        if n not in SCENARIOS:
            known = ", ".join(SCENARIOS)
            raise UsageError(f"--simulate: unknown scenario {n!r}; known: {known}")
        out.append(SCENARIOS[n])
    return out
