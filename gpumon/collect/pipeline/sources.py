"""Open what a SourceSpec names. This sits above both gpumon.collect.sources and gpumon.sim (the
sources never import the simulator): here the simulator's look-alikes are put behind the real
NvmlSource and HostSource, so simulated runs take the same code paths as real GPUs. The bindings
themselves (pynvml, psutil) load only when real GPUs are opened (load_pynvml, load_psutil)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumon.collect.pipeline.spec import SourceDescription, SourceSpec
from gpumon.collect.sampler import GpuSource, HostSourceLike
from gpumon.collect.sources.host import HostSource, load_psutil
from gpumon.collect.sources.nvml.source import NvmlSource, load_pynvml
from gpumon.core.clock import Clock
from gpumon.core.errors import TraceError
from gpumon.core.guard import CallGuard
from gpumon.core.model import HostSample
from gpumon.core.problems import Problems

if TYPE_CHECKING:
    from gpumon.trace.reader import Trace

# The simulator and the trace reader are imported by the kinds that use them, in the functions
# below: a daemon on real GPUs starts without them (its first sample comes sooner).


@dataclass(eq=False)  # state, not a value: equal only to itself
class OpenedSources:
    """The sources a run reads, once opened, and how to close them."""

    gpu: GpuSource
    host: HostSourceLike | None
    description: SourceDescription
    """Goes into trace headers and the state API: what is being sampled."""
    exhausted: Callable[[], bool] | None = None
    close: Callable[[], None] = field(default=lambda: None)
    guard: CallGuard | None = None
    """Set when the GPU source can hang (real NVML): the pipeline then runs its loop supervised."""
    start: Callable[[], None] | None = None
    """What opens the GPU source, when the pipeline must do it under supervision (nvmlInit)."""
    next_data: Callable[[], float | None] | None = None
    """For a replay: when its next data falls due, so the sampler skips a gap in time proportional
    to the data, not to the gap."""


class HostOnFirstPoll:
    """The real host's source, made at its first poll: psutil (~7 ms to import) and the source's
    own set-up then come after the daemon's first sample, whose tick leaves the host out
    (Sampler.start), not before it."""

    name = HostSource.name
    first_reading_is_baseline = HostSource.first_reading_is_baseline

    def __init__(self, problems: Problems) -> None:
        self._problems = problems
        self._source: HostSource | None = None

    def poll(self, t_s: float, gpu_pids: Iterable[int] = ()) -> HostSample | None:
        if self._source is None:
            self._source = HostSource(load_psutil(), self._problems)
        return self._source.poll(t_s, gpu_pids)


def open_sources(
    spec: SourceSpec,
    clock: Clock,
    problems: Problems,
    *,
    retry_nvml: bool = False,
) -> OpenedSources:
    """`retry_nvml`: a daemon keeps trying a missing driver (with backoff) instead of failing."""
    if spec.kind == "replay":
        return _replay(spec)
    if spec.kind == "driven":
        return _driven(spec, clock, problems)
    if spec.kind == "simulated":
        # the simulator, for simulated GPUs only
        from gpumon.sim.fleet import Fleet
        from gpumon.sim.scenarios import SCENARIOS

        fleet = Fleet(
            [SCENARIOS[n] for n in spec.scenarios], spec.gpus, spec.seed, clock, spec.sample_period_s
        )
        description = SourceDescription.simulated(
            fleet.scenario_names, len(fleet.gpus), spec.seed, spec.sample_period_s
        )
        return simulated(fleet, description, problems)
    return _nvml(problems, retry_nvml, spec.gpm)


def simulated(fleet: Any, description: SourceDescription, problems: Problems) -> OpenedSources:
    """A simulated fleet behind the real NvmlSource and HostSource (also for the corpus)."""
    # the simulator, for simulated GPUs only
    from gpumon.sim.fakehost import FakeHost
    from gpumon.sim.fakenvml import FakeNvml

    nvml = NvmlSource(FakeNvml(fleet), problems)
    nvml.open()
    return OpenedSources(
        gpu=nvml, host=HostSource(FakeHost(fleet), problems), description=description, close=nvml.close
    )


def _replay(spec: SourceSpec) -> OpenedSources:
    from gpumon.trace.reader import read_trace  # replays only

    assert spec.file is not None
    return replayed(read_trace(spec.file))


def replayed(trace: Trace) -> OpenedSources:
    """A trace already read, played back (also what `analyze` runs the detector over). A trace
    with no ticks is refused here, the one rule for `analyze` and every replay."""
    from gpumon.collect.sources.replay import ReplayHost, ReplaySource  # replays only

    if not trace.ticks:
        raise TraceError(
            trace.path, None, "the trace holds no ticks (a header only): nothing to analyze or replay"
        )
    replay = ReplaySource(trace)
    return OpenedSources(
        gpu=replay,
        host=ReplayHost(replay),
        description=SourceDescription.replay(trace.path, trace.header.get("source")),
        exhausted=lambda: replay.exhausted,
        next_data=replay.next_data_s,
    )


def _driven(spec: SourceSpec, clock: Clock, problems: Problems) -> OpenedSources:
    # the simulator, for a driven GPU only
    from gpumon.sim.driven import driven_fleet
    from gpumon.sim.fakenvml import FakeNvml

    assert spec.file is not None
    fleet = driven_fleet(spec.file, clock, spec.sample_period_s, problems)  # (its file's, said too)
    nvml = NvmlSource(FakeNvml(fleet), problems)
    nvml.open()
    # the GPU is simulated, the host is not: the job's real processes are read
    return OpenedSources(
        gpu=nvml,
        host=HostOnFirstPoll(problems),
        description=SourceDescription.driven(spec.file, spec.sample_period_s),
        close=nvml.close,
    )


def _nvml(problems: Problems, retry: bool, gpm: bool = True) -> OpenedSources:

    # A real driver can hang a call (a GPU falling off the bus): every call that may hang is
    # bracketed by the guard, and the pipeline supervises the thread that makes it.
    guard = CallGuard()
    nvml = NvmlSource(load_pynvml(), problems, guard=guard, retry_init=retry, gpm=gpm)
    return OpenedSources(
        gpu=nvml,
        host=HostOnFirstPoll(problems),
        description=SourceDescription.nvml(),
        close=nvml.close,
        guard=guard,
        start=nvml.open,
    )
