"""What the daemon publishes after each tick: an immutable snapshot that sinks (the exporter, the
state API) read without ever touching a source. A hung GPU cannot stall a scrape."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from gpumon.collect.pipeline.spec import SourceDescription
from gpumon.collect.sampler import SourceStats
from gpumon.core.model import Tick, clock_reasons
from gpumon.detect.remedies import Advice
from gpumon.detect.tracker import Episode, Verdict
from gpumon.detect.vocabulary import Cause, State
from gpumon.trace.recorder import RecorderStats

SCHEMA = "gpumon-state/1"


class GpuCounters(NamedTuple):
    """Totals since the daemon started, per GPU (Prometheus counters)."""

    seconds_in_state: dict[State, float]
    starved_seconds_by_cause: dict[Cause, float]
    episodes_started: dict[str, int]
    wasted_gpu_s: float
    episodes: tuple[Episode, ...] = ()
    """The most recent episodes, oldest first, the one going on last (the state API's)."""


class Snapshot(NamedTuple):
    t_s: float
    """Sampler clock of the tick."""
    tick: Tick
    verdicts: tuple[Verdict, ...]
    counters: dict[tuple[int, str], GpuCounters]
    sources: dict[str, SourceStats]
    ticks: int
    skipped_ticks: int
    source_description: SourceDescription
    problems: tuple[str, ...] = ()
    """The messages of the problems going on now."""
    problem_totals: Mapping[str, int] = MappingProxyType({})
    """Problems noted per source since start."""
    unix_offset_s: float = 0.0
    """Add to a sampler-clock time to get Unix time (for episodes in the state API)."""
    hostname: str = ""
    recorder: RecorderStats | None = None
    """The flight recorder's state, when it runs."""
    advice: Mapping[tuple[int, str], Advice] = MappingProxyType({})
    """What a fix buys, per GPU with something to say (starved, or fed: detect/advisor.py)."""

    def verdict_for(self, index: int, uuid: str) -> Verdict | None:
        for v in self.verdicts:
            if v.index == index and v.uuid == uuid:
                return v
        return None


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def to_state_json(s: Snapshot, age_s: float) -> dict[str, Any]:
    """The `/api/v1/state` document (docs/metrics.md, "State API")."""
    from gpumon.trace.records import job_to_dict  # the state API's: loaded by its first request

    host = s.tick.host
    gpus = []
    for g in s.tick.gpus:
        v = s.verdict_for(g.index, g.uuid)
        c = s.counters.get((g.index, g.uuid))
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "available": g.available,
                "error": g.error,
                "util_ratio": g.util_ratio,
                "mem_used_bytes": g.mem_used_bytes,
                "mem_total_bytes": g.mem_total_bytes,
                "mem_used_ratio": _r(g.mem_used_bytes / g.mem_total_bytes)
                if g.mem_used_bytes is not None and g.mem_total_bytes
                else None,
                "power_w": g.power_w,
                "power_limit_w": g.power_limit_w,
                "temp_c": g.temp_c,
                "processes": len(g.processes),
                "pids": [p.pid for p in g.processes],
                "state": v.state if v else State.UNKNOWN,
                "cause": v.cause if v else None,
                "label": v.label if v else State.UNKNOWN,
                "confidence": v.confidence if v else 0.0,
                "since_s": _r(s.t_s - v.since_s, 3) if v else None,
                "reason": v.reason if v else None,
                "evidence": v.evidence.as_dict() if v else None,
                "wasted_gpu_s": _r(c.wasted_gpu_s, 3) if c else 0.0,
                "seconds_in_state": {k: _r(v, 3) for k, v in c.seconds_in_state.items() if v} if c else {},
                "starved_seconds_by_cause": {k: _r(v, 3) for k, v in c.starved_seconds_by_cause.items() if v}
                if c
                else {},
                "episodes": [_episode_json(e, s.unix_offset_s) for e in c.episodes] if c else [],
                "advice": _advice_json(s.advice.get((g.index, g.uuid))),
                "jobs": [job_to_dict(j) for j in g.jobs],
                "unattributed": g.unattributed,
                "mig": g.mig,
                "gpm": None if g.gpm is None else {k: v for k, v in g.gpm._asdict().items() if v is not None},
                "clock_event_reasons": None
                if g.clock_events is None
                else list(clock_reasons(g.clock_events)),
                "clock_event_seconds": {k: _r(v, 3) for k, v in g.clock_event_s},
                "xids": {str(x.xid): x.seen for x in g.xids},
                "last_xid": None
                if g.last_xid is None
                else {"xid": g.last_xid[0], "time_unix_s": round(g.last_xid[1], 3)},
            }
        )
    return {
        "schema": SCHEMA,
        "hostname": s.hostname,
        "time_unix_s": round(s.t_s + s.unix_offset_s, 3),
        "age_s": round(age_s, 3),
        "ticks": s.ticks,
        "source": s.source_description.to_json(),
        "simulated": s.source_description.simulated_gpus,
        "host": None
        if host is None
        else {
            "cpu_count": host.cpu_count,
            "cpu_ratio": host.cpu_ratio,
            "busiest_core_ratio": host.busiest_core_ratio,
            "iowait_ratio": host.iowait_ratio,
            "load1": host.load1,
            "disk_read_bytes_per_s": host.disk_read_bytes_per_s,
        },
        "gpus": gpus,
        "sources": {
            name: {
                "up": st.last_success,
                "failures": st.failures,
                "duration_s": round(st.last_duration_s, 6),
                "error": st.last_error,
            }
            for name, st in s.sources.items()
        },
        "problems": list(s.problems),
        "attribution": {a.source: {"up": a.up, "reason": a.reason} for a in s.tick.attribution},
        "recorder": None if s.recorder is None else _recorder_json(s.recorder),
    }


def _recorder_json(r: RecorderStats) -> dict[str, Any]:
    return {
        "directory": r.directory,
        "up": r.up,
        "paused_reason": r.paused_reason,
        "segments": r.segments,
        "disk_bytes": r.disk_bytes,
        "written_bytes": r.bytes_written,
        "oldest_unix_s": r.oldest_unix_s,
        "newest_unix_s": r.newest_unix_s,
        "errors": r.errors,
        "dropped_ticks": r.dropped_ticks,
    }


def _episode_json(e: Episode, offset: float) -> dict[str, Any]:
    return {
        "label": e.label,
        "start_unix_s": round(e.start_s + offset, 3),
        "end_unix_s": None if e.end_s is None else round(e.end_s + offset, 3),
        "job": e.job,
        "wasted_gpu_s": e.wasted_gpu_s,
        "mean_duty": e.mean_duty,
        "reason": e.reason,
        "causes": [{"from_unix_s": round(t + offset, 3), "cause": c} for t, c in e.causes],
        "causes_dropped": e.causes_dropped,
    }


def _advice_json(a: Advice | None) -> dict[str, Any] | None:
    return None if a is None else a.as_dict()
