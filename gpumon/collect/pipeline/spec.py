"""What to sample, as one typed value: real GPUs (NVML), a simulated fleet, a replayed trace, or
a simulated GPU driven by a job. Commands and the daemon build a SourceSpec from their settings
(gpumon.config.sources); gpumon.collect.pipeline.sources opens it and describes what it opened
as a SourceDescription."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

SourceKind = Literal["nvml", "simulated", "replay", "driven"]


class AttributionSpec(NamedTuple):
    """Where the job holding each GPU is read from (gpumon.collect.sources.jobs); the pipeline's default."""

    jobs_dir: str | None = "/run/gpumon/jobs"
    dcgm_dir: str | None = None
    cgroups: bool = True
    kubelet_socket: str | None = None
    """Ask the kubelet (None: do not)."""
    kubelet_refresh_s: float = 10.0


class SourceSpec(NamedTuple):
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
        """From the settings of gpumon.config.settings (already checked there, one by one and together)."""
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


class SourceDescription(NamedTuple):
    """What is (or was) sampled. Trace headers and the state API carry it as JSON (`to_json`, the
    same keys as ever); a trace's header is read back with `from_json`, which keeps what it cannot
    type (a newer or edited trace) as `extra` instead of failing."""

    kind: str
    """`nvml` (this machine's GPUs), `simulated` (a simulated fleet, or a GPU driven by a job),
    `replay` (a recorded trace); anything else read from a foreign trace is kept as it was, and ""
    where a trace said nothing."""
    file: str | None = None
    """For a replay: the trace (or the recorder's directory, for a range)."""
    recorded_from: SourceDescription | None = None
    """For a replay: what the trace was recorded from."""
    scenarios: tuple[str, ...] = ()
    gpus: int | None = None
    seed: int | None = None
    driven_by: str | None = None
    """For a simulated GPU driven by a job: the file the job writes its steps to."""
    sample_period_s: float | None = None
    corpus_case: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    # -- built here, and only here --------------------------------------------------------------

    @classmethod
    def nvml(cls) -> SourceDescription:
        return cls("nvml")

    @classmethod
    def simulated(
        cls,
        scenarios: Sequence[str],
        gpus: int,
        seed: int,
        sample_period_s: float,
        corpus_case: str | None = None,
    ) -> SourceDescription:
        return cls(
            "simulated",
            scenarios=tuple(scenarios),
            gpus=gpus,
            seed=seed,
            sample_period_s=round(sample_period_s, 6),
            corpus_case=corpus_case,
        )

    @classmethod
    def driven(cls, drive_file: str, sample_period_s: float) -> SourceDescription:
        """One GPU at the start: one more per rank of a data-parallel job as it appears."""
        return cls(
            "simulated",
            scenarios=("driven",),
            gpus=1,
            driven_by=drive_file,
            sample_period_s=round(sample_period_s, 6),
        )

    @classmethod
    def replay(cls, file: str, header_source: Any) -> SourceDescription:
        return cls("replay", file=file, recorded_from=cls.from_json(header_source))

    # -- as JSON --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind} if self.kind else {}
        if self.file is not None:
            out["file"] = self.file
        if self.recorded_from is not None:
            out["recorded_from"] = self.recorded_from.to_json()
        if self.kind == "simulated" or self.scenarios:
            out["scenarios"] = list(self.scenarios)
        for key in ("gpus", "seed", "driven_by", "sample_period_s", "corpus_case"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, doc: Any) -> SourceDescription:
        """From a trace header's `source` (or a state API's): fields of the wrong type are left
        out, unknown ones kept in `extra`; never raises."""
        if not isinstance(doc, Mapping):
            return cls("")
        kind = doc.get("kind")
        known = {"kind", "file", "recorded_from", "scenarios", "gpus", "seed", "driven_by"}
        known |= {"sample_period_s", "corpus_case"}
        scenarios = doc.get("scenarios")
        return cls(
            kind if isinstance(kind, str) else "",
            file=_typed(doc.get("file"), str),
            recorded_from=cls.from_json(doc["recorded_from"]) if "recorded_from" in doc else None,
            scenarios=tuple(str(n) for n in scenarios) if isinstance(scenarios, list) else (),
            gpus=_typed(doc.get("gpus"), int),
            seed=_typed(doc.get("seed"), int),
            driven_by=_typed(doc.get("driven_by"), str),
            sample_period_s=_typed(doc.get("sample_period_s"), float),
            corpus_case=_typed(doc.get("corpus_case"), str),
            extra=tuple((k, v) for k, v in doc.items() if k not in known and isinstance(k, str)),
        )

    # -- as words -------------------------------------------------------------------------------

    @property
    def simulated_gpus(self) -> bool:
        """Anything but real GPUs (simulated, driven, replayed)."""
        return self.kind != "nvml"

    def phrase(self) -> str:
        """One phrase for what is (or was) sampled, used by every command, the landing page and
        `analyze`."""
        if self.kind == "simulated":
            if self.driven_by:
                return f"a simulated GPU driven by the job writing {self.driven_by}"
            names = ", ".join(sorted(set(self.scenarios)))
            return f"{self.gpus if self.gpus is not None else '?'} simulated GPU(s) ({names})"
        if self.kind == "replay":
            return f"a replay of {self.file}"
        if self.kind == "nvml":
            return "this machine's GPUs (NVML)"
        return "an unknown source"


def _typed(value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        return None
    if kind is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kind) else None
