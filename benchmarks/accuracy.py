"""Detector accuracy on a labeled corpus of simulated traces (issue 4; not a timed test).

    .venv/bin/python -m benchmarks.accuracy [--cases 240] [--seed 0] [--keep DIR]

Each case is recorded to a trace file exactly as `gpumon record --simulate ... --speed max` does,
then analyzed exactly as `gpumon analyze` does; the per-second verdicts are scored against the
case's truth. Scoring rules:

- precision / recall / F1 per label (`starved-cpu` is a label of its own, as are the other causes),
  over every GPU-second except the first window + confirmation after the start, and the same span
  after each mid-run transition (that span is what the latency figures measure);
- latency: seconds from a transition to the first verdict naming the new label; and, for
  healthy -> starved changes, to the first verdict whose state is starved (whatever its cause),
  per sample period (issue 17's onset figure);
- false starvation alarms: starved episodes on fleets that are never starved (healthy, idle,
  underutilized), per GPU-hour.

Goals: macro-F1 >= 0.95; starvation flagged within 10 s of onset at p95; zero false starvation
alarms on never-starved traces.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.analyze.corpus import LABELS, NEVER_STARVED, Case, generate, record
from gpumon.analyze.trace_report import Analysis, analyze
from gpumon.detect.thresholds import Thresholds


@dataclass
class Score:
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)
    latencies: list[tuple[str, float | None]] = field(default_factory=list)
    """(new label, seconds to flag it or None if never flagged) per transition."""
    fed_to_starved: list[tuple[float, float | None]] = field(default_factory=list)
    """(sample period, seconds to the first starved verdict, any cause) per healthy -> starved change."""
    false_alarms: int = 0
    never_starved_gpu_s: float = 0.0
    gpu_seconds: float = 0.0

    def per_label(self) -> dict[str, tuple[float, float, float, int]]:
        out = {}
        labels = sorted({t for t, _ in self.confusion} | {p for _, p in self.confusion})
        for lab in labels:
            tp = self.confusion[(lab, lab)]
            fp = sum(n for (t, p), n in self.confusion.items() if p == lab and t != lab)
            fn = sum(n for (t, p), n in self.confusion.items() if t == lab and p != lab)
            support = tp + fn
            prec = tp / (tp + fp) if tp + fp else 0.0
            rec = tp / support if support else 0.0
            f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
            out[lab] = (prec, rec, f1, support)
        return out

    def macro_f1(self) -> float:
        rows = [r for lab, r in self.per_label().items() if lab in LABELS and r[3] > 0]
        return statistics.fmean(r[2] for r in rows) if rows else 0.0


def score_case(case: Case, analysis: Analysis, th: Thresholds, score: Score) -> None:
    grace = th.window_s + th.confirm_s + 1.0
    never = all(
        case.truth(i, 0) in NEVER_STARVED and all(lab in NEVER_STARVED for _, lab in case.transitions(i))
        for i in range(len(case.scenarios))
    )
    for rep in analysis.gpus:
        i = rep.index
        changes = [0.0] + [t for t, _ in case.transitions(i)]
        for v in rep.verdicts:
            if any(c <= v.t_s < c + grace for c in changes):
                continue
            score.confusion[(case.truth(i, v.t_s), v.label)] += 1
            score.gpu_seconds += 1
        for t_change, label in case.transitions(i):
            flagged = next((v.t_s for v in rep.verdicts if v.t_s >= t_change and v.label == label), None)
            score.latencies.append((label, None if flagged is None else flagged - t_change))
            if label.startswith("starved") and case.truth(i, t_change - 1.0) == "healthy":
                state = next(
                    (v.t_s for v in rep.verdicts if v.t_s >= t_change and v.state == "starved"), None
                )
                score.fed_to_starved.append((case.period_s, None if state is None else state - t_change))
        if never:
            score.never_starved_gpu_s += len(rep.verdicts)
            score.false_alarms += sum(1 for e in rep.episodes if e.state == "starved")


KINDS = ("no GPM", "GPM", "MIG (GPM only)")


def kind(case: Case) -> str:
    """Which GPUs the case runs on: without GPM, with GPM (Hopper), or as MIG instances."""
    phases = [ph for sc in case.scenarios for _, ph in sc.phases]
    if any(ph.mig for ph in phases):
        return KINDS[2]
    return KINDS[1] if any(ph.gpm for ph in phases) else KINDS[0]


def run(cases: list[Case], th: Thresholds, keep: str | None = None) -> tuple[Score, dict[str, Score]]:
    score = Score()
    by_kind = {k: Score() for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for case in cases:
            path = str(folder / f"{case.name}.jsonl")
            record(case, path)
            a = analyze(path, th)
            score_case(case, a, th, score)
            score_case(case, a, th, by_kind[kind(case)])
    return score, by_kind


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(
    cases: list[Case], score: Score, th: Thresholds, seconds: float, by_kind: dict[str, Score] | None = None
) -> str:
    gpus = sum(len(c.scenarios) for c in cases)
    periods = Counter("1/6 s" if c.period_s < 0.5 else "1 s" for c in cases)
    transitions = sum(len(c.transitions(i)) for c in cases for i in range(len(c.scenarios)))
    lines = [
        f"corpus: {len(cases)} traces, {gpus} GPUs (1-{max(len(c.scenarios) for c in cases)} per trace), "
        f"sample periods {dict(periods)}, {transitions} mid-run transitions, "
        f"{score.gpu_seconds:.0f} scored GPU-seconds; run in {seconds:.0f} s",
        "",
        f"{'label':<27} {'precision':>9} {'recall':>7} {'F1':>6} {'support':>8}",
    ]
    for lab, (p, r, f1, n) in score.per_label().items():
        lines.append(f"{lab:<27} {p:>9.3f} {r:>7.3f} {f1:>6.3f} {n:>8}")
    lines.append(
        f"macro-F1 over the {len([x for x in score.per_label() if x in LABELS])} labels: "
        f"{score.macro_f1():.3f}   (goal >= 0.95)"
    )
    lines.append("")
    lat_all = [s for _, s in score.latencies if s is not None]
    missed = sum(1 for _, s in score.latencies if s is None)
    starv = [s for lab, s in score.latencies if lab.startswith("starved") and s is not None]
    starv_missed = sum(1 for lab, s in score.latencies if lab.startswith("starved") and s is None)
    if lat_all:
        lines.append(
            f"transition -> new verdict, all ({len(score.latencies)}): median "
            f"{statistics.median(lat_all):.1f} s, p95 {_pct(lat_all, 0.95):.1f} s, never flagged {missed}"
        )
    if starv:
        lines.append(
            f"onset of starvation -> flagged ({len(starv) + starv_missed}): median "
            f"{statistics.median(starv):.1f} s, p95 {_pct(starv, 0.95):.1f} s (goal <= 10 s), "
            f"never flagged {starv_missed}"
        )
    for period, name in ((1 / 6, "1/6 s"), (1.0, "1 s")):
        runs = [x for p, x in score.fed_to_starved if abs(p - period) < 1e-3]
        got = [x for x in runs if x is not None]
        if got:
            lines.append(
                f"healthy -> starved, state only, at {name} ({len(runs)}): median "
                f"{statistics.median(got):.1f} s, p95 {_pct(got, 0.95):.1f} s, within 5 s "
                f"{sum(x <= 5.0 for x in got)}/{len(runs)}"
            )
    hours = score.never_starved_gpu_s / 3600
    rate = score.false_alarms / hours if hours else 0.0
    lines.append(
        f"false starvation alarms on never-starved traces: {score.false_alarms} in "
        f"{hours:.2f} GPU-hours ({rate:.2f}/h; goal 0)"
    )
    if by_kind:
        lines.append("")
        lines.append("by the GPUs the cases run on (issue 14):")
        for name, sc in by_kind.items():
            n = sum(1 for c in cases if kind(c) == name)
            starv = [x for lab, x in sc.latencies if lab.startswith("starved") and x is not None]
            onset = f"onset p95 {_pct(starv, 0.95):.1f} s ({len(starv)})" if starv else "no onsets"
            h = sc.never_starved_gpu_s / 3600
            lines.append(
                f"  {name:<15} {n:>3} cases, {sc.gpu_seconds:>6.0f} GPU-s: macro-F1 {sc.macro_f1():.3f}, "
                f"{onset}, false alarms {sc.false_alarms} in {h:.2f} GPU-h"
            )
    confusions = [(n, t, p) for (t, p), n in score.confusion.items() if t != p]
    if confusions:
        lines.append("")
        lines.append("most frequent confusions (truth -> verdict, GPU-seconds):")
        for n, t, p in sorted(confusions, reverse=True)[:8]:
            lines.append(f"  {t} -> {p}: {n}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=240)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="keep the generated traces in DIR")
    args = ap.parse_args()
    th = Thresholds()
    cases = generate(args.cases, args.seed)
    start = time.monotonic()
    score, by_kind = run(cases, th, args.keep)
    print(report(cases, score, th, time.monotonic() - start, by_kind))


if __name__ == "__main__":
    main()
