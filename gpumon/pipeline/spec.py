"""What to sample, as one typed value: real GPUs (NVML), a simulated fleet, a replayed trace, or
a simulated GPU driven by a job. Commands and the daemon build a SourceSpec from their settings;
gpumon.pipeline.sources opens it; `describe_source` renders what was opened, in one wording."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

SourceKind = Literal["nvml", "simulated", "replay", "driven"]


@dataclass(frozen=True)
class AttributionSpec:
    """Where the job holding each GPU is read from (gpumon.sources.jobs); the pipeline's default."""

    jobs_dir: str | None = "/run/gpumon/jobs"
    dcgm_dir: str | None = None
    cgroups: bool = True
    kubelet_socket: str | None = None
    """Ask the kubelet (None: do not)."""
    kubelet_refresh_s: float = 10.0


@dataclass(frozen=True)
class SourceSpec:
    kind: SourceKind = "nvml"
    scenarios: tuple[str, ...] = ()
    """For `simulated`: the scenario names, cycled over the GPUs."""
    gpus: int | None = None
    """For `simulated`: how many GPUs (default: one per scenario)."""
    seed: int = 0
    sample_period_s: float = 1 / 6
    """For `simulated` and `driven`: the simulated driver's utilization sample period."""
    file: str | None = None
    """For `replay`: the trace; for `driven`: the file the job writes its steps to."""
    gpm: bool = True
    """For `nvml`: read GPM where the GPU has it (Hopper and newer)."""

    @classmethod
    def from_settings(
        cls,
        *,
        simulate: str | None = None,
        gpus: int | None = None,
        seed: int = 0,
        sample_period_s: float = 1 / 6,
        replay: str | None = None,
        drive: str | None = None,
        gpm: bool = True,
    ) -> SourceSpec:
        """From the settings of gpumon.config (already checked there, one by one and together)."""
        if replay is not None:
            return cls("replay", file=replay)
        if drive is not None:
            return cls("driven", sample_period_s=sample_period_s, file=drive)
        if simulate is not None:
            names = tuple(n.strip() for n in simulate.split(","))
            return cls("simulated", names, gpus, seed, sample_period_s)
        return cls("nvml", gpm=gpm)

    @property
    def real_gpus(self) -> bool:
        """NVML on this machine's GPUs; everything else (simulated, driven, replayed) is not."""
        return self.kind == "nvml"

    @property
    def real_time_only(self) -> bool:
        """Real GPUs and a GPU driven by a live job cannot run faster than real time."""
        return self.kind in ("nvml", "driven")


def is_simulated(description: Mapping[str, Any]) -> bool:
    """From a source description (trace header, state API): anything but real GPUs."""
    return description.get("kind") != "nvml"


def describe_source(description: Mapping[str, Any]) -> str:
    """One phrase for what is (or was) sampled, from the description that traces and the state
    API carry: used by every command, the landing page and `analyze`."""
    kind = description.get("kind")
    if kind == "simulated":
        if description.get("driven_by"):
            return f"a simulated GPU driven by the job writing {description['driven_by']}"
        names = ", ".join(sorted({str(n) for n in description.get("scenarios") or []}))
        return f"{description.get('gpus', '?')} simulated GPU(s) ({names})"
    if kind == "replay":
        return f"a replay of {description.get('file')}"
    if kind == "nvml":
        return "this machine's GPUs (NVML)"
    return "an unknown source"
