"""What a fix buys a whole job (`gpumon report --job`): a data-parallel job steps at its slowest
rank, so the straggler's fix is the job's fix, and the job's predicted speed-up is the
straggler's (docs/detector.md, "What a fix buys"); a straggler that moves from rank to rank is a
data-loading problem (SPDL's rule), not a slow GPU.

Reads the reports' plain fields (a GPU's node, index, label, episodes and the state API's advice),
so it serves reports from daemons and from Prometheus alike."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from gpumon.detect.stragglers import StragglerHistory, history


class GpuOfJob(Protocol):
    node: str
    index: int
    episodes: list[dict[str, Any]]
    advice: dict[str, Any] | None

    @property
    def main_label(self) -> str: ...


def _name(g: GpuOfJob) -> str:
    return f"{g.node} GPU {g.index}"


def _speedup(advice: dict[str, Any] | None) -> float | None:
    """The predicted speed-up of the advice's named change (1.0: no gain); None: no number."""
    if not isinstance(advice, dict) or advice.get("kind") != "predicted":
        return None
    best = advice.get("best")
    return float(best["speedup"]) if isinstance(best, dict) else 1.0


def straggler_history(gpus: Sequence[GpuOfJob], now_unix_s: float) -> StragglerHistory[Hashable]:
    """Who straggled when, from each GPU's episodes (the state API's, with Unix times)."""
    timelines: dict[Hashable, list[tuple[float, float, str]]] = {}
    for g in gpus:
        spans = []
        for e in g.episodes:
            start, end = e.get("start_unix_s"), e.get("end_unix_s")
            if isinstance(start, (int, float)):
                spans.append(
                    (
                        float(start),
                        float(end) if isinstance(end, (int, float)) else now_unix_s,
                        str(e["label"]),
                    )
                )
        timelines[_name(g)] = spans
    return history(timelines)


def job_fix_lines(
    gpus: Sequence[GpuOfJob], stragglers: Sequence[GpuOfJob], moving: StragglerHistory[Hashable] | None
) -> list[str]:
    """The job's lines: what fixing its straggler (or every starved rank) buys the whole job, and
    whether its straggler moves."""
    lines = []
    if stragglers:
        speeds = [_speedup(g.advice) for g in stragglers]
        names = ", ".join(_name(g) for g in stragglers)
        advice = stragglers[0].advice
        if all(s is not None for s in speeds) and isinstance(advice, dict):
            job = min(s for s in speeds if s is not None)
            several = len(stragglers) > 1 and job >= 1.1  # the job steps at the slowest of them
            lines.append(
                f"job fix: the whole job waits for {names}: its fix is the job's: {advice['line']}"
                + (f" (fixing all of them: the whole job about {job:.1f}x steps/s)" if several else "")
            )
        elif isinstance(advice, dict) and advice.get("line"):
            lines.append(f"job fix: the whole job waits for {names}: {advice['line']}")
    else:
        starved = [g for g in gpus if g.main_label.startswith("starved")]
        speeds = [_speedup(g.advice) for g in starved]
        if starved and len(starved) == len(gpus) and all(s is not None for s in speeds) and len(gpus) > 1:
            job = min(s for s in speeds if s is not None)
            lines.append(
                f"job fix: every rank is starved: fixing each as its GPU's line says buys the job about "
                f"{job:.1f}x steps/s (it steps at its slowest rank)"
            )
    said = moving.diagnosis("") if moving is not None and moving.moving else None
    if said:
        lines.append(f"job fix: {said}")
    return lines


def gpu_fix_line(g: GpuOfJob) -> str | None:
    advice = g.advice
    if isinstance(advice, dict) and advice.get("line") and advice.get("ready", True):
        return f"  fix buys: {advice['line']}"
    return None
