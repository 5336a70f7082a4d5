"""Pick and open the sources a command samples: real GPUs, a simulated fleet, or a replayed trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumon.clock import Clock
from gpumon.sampler import GpuSource, HostSourceLike
from gpumon.sim.scenarios import Scenario

NVML_CALL_TIMEOUT_S = 1.0
"""The longest the sampler waits on the NVML calls of one GPU before marking it unavailable."""


@dataclass(frozen=True)
class SourceOptions:
    simulate: list[Scenario] | None = None
    gpus: int | None = None
    seed: int = 0
    sample_period_s: float = 1 / 6
    replay: str | None = None
    drive: str | None = None
    """A simulated GPU driven by a job writing this file (`gpumon bench --drive`)."""


@dataclass
class OpenedSources:
    gpu: GpuSource
    host: HostSourceLike | None
    description: dict[str, Any]
    """Goes into trace headers and the state API: what is being sampled."""
    exhausted: Callable[[], bool] | None = None
    close: Callable[[], None] = field(default=lambda: None)

    @property
    def simulated(self) -> bool:
        return self.description.get("kind") == "simulated"


def open_sources(
    opts: SourceOptions, clock: Clock, *, retry_nvml: bool = False, nvml_call_timeout_s: float | None = None
) -> OpenedSources:
    """`retry_nvml`: a daemon keeps trying a missing driver (with backoff) instead of failing."""
    if opts.replay is not None:
        from gpumon.sources.replay import ReplayHost, ReplaySource
        from gpumon.trace import read_trace

        trace = read_trace(opts.replay)
        replay = ReplaySource(trace)
        return OpenedSources(
            gpu=replay,
            host=ReplayHost(replay),
            description={
                "kind": "replay",
                "file": opts.replay,
                "recorded_from": trace.header.get("source", {}),
            },
            exhausted=lambda: replay.exhausted,
        )

    from gpumon.sources.host import HostSource
    from gpumon.sources.nvml import NvmlSource

    if opts.drive is not None:
        from gpumon.sim.driven import driven_fleet
        from gpumon.sources.host import load_psutil

        fleet = driven_fleet(opts.drive, clock, opts.sample_period_s)
        nvml = NvmlSource(fleet.nvml())
        nvml.open()
        # the GPU is simulated, the host is not: the job's real processes are read
        return OpenedSources(
            gpu=nvml,
            host=HostSource(load_psutil()),
            description={
                "kind": "simulated",
                "scenarios": ["driven"],
                "gpus": 1,
                "driven_by": opts.drive,
                "sample_period_s": round(opts.sample_period_s, 6),
            },
            close=nvml.close,
        )

    if opts.simulate is not None:
        from gpumon.sim.fleet import Fleet

        fleet = Fleet(opts.simulate, opts.gpus, opts.seed, clock, opts.sample_period_s)
        nvml = NvmlSource(fleet.nvml())
        nvml.open()
        return OpenedSources(
            gpu=nvml,
            host=HostSource(fleet.psutil()),
            description={
                "kind": "simulated",
                "scenarios": fleet.scenario_names,
                "gpus": len(fleet.gpus),
                "seed": opts.seed,
                "sample_period_s": round(opts.sample_period_s, 6),
            },
            close=nvml.close,
        )

    from gpumon.sources.host import load_psutil
    from gpumon.sources.nvml import load_pynvml

    # A real driver can hang a call (a GPU falling off the bus): never wait on one for long.
    nvml = NvmlSource(
        load_pynvml(), call_timeout_s=nvml_call_timeout_s or NVML_CALL_TIMEOUT_S, retry_init=retry_nvml
    )
    nvml.open()  # NoDriverError, with its one-line hint, when there is no driver (unless retrying)
    return OpenedSources(
        gpu=nvml, host=HostSource(load_psutil()), description={"kind": "nvml"}, close=nvml.close
    )
