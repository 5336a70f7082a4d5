"""False alarms where fleets live (issue 25; not a timed test): busy neighbours, job start-ups, job
changes, ranks waiting in a collective, on the labeled corpus and through the real pynvml on the
stand-in libnvidia-ml.so.1 with real processes of this host.

    .venv/bin/python -m benchmarks.false_alarms [--cases 240] [--seconds 90] [--keep DIR]

An alarm is an episode (not `unknown`) whose state is `starved` or `stalled`; it is false when the
truth at its middle is not that state (start-up, `starting`, is no stall). Reported per GPU-hour,
beside the starved cases' recall (the share of truly starved GPU-seconds flagged starved) and the
onset of starvation, so that silence is not bought with blindness.

Stand-in cases (each `gpumon record` through the real pynvml for --seconds, all at once):
- busy-neighbours: GPU 0's process (a real one) pins a core; GPUs 1-4 steady at 35-96% with
  sleeping real processes; a neighbour on no GPU keeps another core busy;
- start-up: a job (a real process started now) holds the GPU with no kernel for 60 s, then trains
  fed (the simulated `starting-then-healthy`);
- job-change: a starved-cpu job hands the GPU to another, which starts up and trains starved;
- waiting-ranks: GPUs spinning in a collective at low power beside a fed one.

Goal: 0 false alarms in every case; the corpus's recall and onset as before (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.analyze.trace_report import Analysis, analyze
from gpumon.sim.scenarios import SCENARIOS, Scenario
from tests.fakenvml import driver

ALARMS = ("starved", "stalled")


@dataclass
class Tally:
    gpu_s: float = 0.0
    false_alarms: int = 0
    alarms: int = 0
    starved_s: float = 0.0
    starved_flagged_s: float = 0.0
    false_ones: list[str] = field(default_factory=list)
    """Each false alarm: its GPU, state, span and the truth at its middle."""

    def add(self, other: Tally) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def line(self, name: str) -> str:
        hours = self.gpu_s / 3600
        rate = self.false_alarms / hours if hours else 0.0
        recall = f"{self.starved_flagged_s / self.starved_s:.3f}" if self.starved_s else "  n/a"
        return (
            f"{name:<22} {hours:7.3f} GPU-h  alarms {self.alarms:3d}  false {self.false_alarms:3d} "
            f"({rate:5.2f}/GPU-h)  starved recall {recall}"
        )


def truth_at(scenario: Scenario, t_s: float) -> str:
    label = scenario.truth[0][1]
    for start, lab in scenario.truth:
        if start <= t_s:
            label = lab
    return label


def score(a: Analysis, scenarios: list[Scenario], settle_s: float = 11.0) -> Tally:
    """Alarms against the truth; verdicts within `settle_s` after the start or a change of the
    truth are not scored (the detector's window and confirmation)."""
    out = Tally()
    for g, sc in zip(a.gpus, scenarios, strict=False):
        changes = [start for start, _ in sc.truth]
        for v in g.verdicts:
            if v.t_s - max(c for c in changes if c <= v.t_s) < settle_s:
                continue
            out.gpu_s += 1.0
            if truth_at(sc, v.t_s).startswith("starved"):
                out.starved_s += 1.0
                out.starved_flagged_s += v.state == "starved"
        for e in g.episodes:
            if e.state not in ALARMS:
                continue
            end = e.end_s if e.end_s is not None else a.end_s
            if end - e.start_s < 1.0:
                continue
            out.alarms += 1
            middle = truth_at(sc, (e.start_s + end) / 2)
            if not middle.startswith(e.state):
                out.false_alarms += 1
                out.false_ones.append(
                    f"GPU {g.index} ({sc.name}): {e.state} {e.start_s:.1f}-{end:.1f} s, the truth {middle}"
                )
    return out


def corpus(cases: int) -> Tally:
    from gpumon.analyze.corpus import generate, record

    total = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        for case in generate(cases):
            path = str(Path(tmp) / f"{case.name}.jsonl")
            record(case, path)
            total.add(score(analyze(path), list(case.scenarios)))
    return total


STANDIN = {
    "busy-neighbours": "starved-cpu,underutilized,underutilized,healthy,healthy",
    "start-up": "starting-then-healthy",
    "job-change": "job-change",
    "waiting-ranks": "sync-stall,sync-stall,healthy",
}


def standin(seconds: int, keep: str | None = None) -> dict[str, Tally]:
    """The stand-in cases, all at once; their traces kept in `keep` (else a temporary folder)."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs: list[subprocess.Popen[bytes]] = []
    runs: dict[str, tuple[subprocess.Popen[str], Path, list[Scenario]]] = {}
    folder_cm = contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()
    with folder_cm as tmp:
        try:
            for name, scenarios in STANDIN.items():
                names = scenarios.split(",")
                real = []
                for i, _ in enumerate(names):  # a real process per GPU (its age is the job's)
                    pinned = name == "busy-neighbours" and i == 0
                    procs.append(subprocess.Popen(spin if pinned else ["sleep", str(seconds + 60)]))
                    real.append(procs[-1].pid)
                sims = [40000 + 100 * i for i in range(len(names))]
                pid_map = dict(zip(sims, real, strict=True))
                for job in range(1, 3):  # another job on the GPU: other processes
                    for i in range(len(names)):
                        procs.append(subprocess.Popen(["sleep", str(seconds + 60)]))
                        pid_map[40000 + 100 * i + 200_000 * job] = procs[-1].pid
                folder = Path(tmp) / name
                config = driver.simulated_config(folder, scenarios, seconds=seconds + 30, pid_map=pid_map)
                out = folder / "trace.jsonl"
                cmd = [sys.executable, "-m", "gpumon", "record", "--duration", str(seconds), "-o", str(out)]
                env = driver.environment(config)
                rec = subprocess.Popen(
                    cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
                runs[name] = (rec, out, [SCENARIOS[n] for n in names])
            procs.append(subprocess.Popen(spin))  # the neighbour: on no GPU, a core kept busy
            results = {}
            for name, (rec, out, scens) in runs.items():
                _, err = rec.communicate(timeout=seconds + 120)
                if rec.returncode != 0:
                    raise SystemExit(f"{name}: gpumon record failed: {err.strip()[-300:]}")
                results[name] = score(analyze(str(out)), scens)
            return results
        finally:
            for p in procs:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=240, help="corpus cases (0: none)")
    ap.add_argument("--seconds", type=int, default=90, help="each stand-in case, in real time (0: none)")
    ap.add_argument("--keep", metavar="DIR", help="keep the stand-in cases' traces in DIR/CASE/trace.jsonl")
    args = ap.parse_args()
    rows: list[tuple[str, Tally]] = []
    if args.seconds:
        rows += list(standin(args.seconds, args.keep).items())
    if args.cases:
        rows.append((f"corpus ({args.cases} cases)", corpus(args.cases)))
    total = Tally()
    for name, t in rows:
        print(t.line(name))
        total.add(t)
    print(total.line("all"))
    for line in total.false_ones:
        print(f"  false alarm: {line}")
    print(f"false alarms: {total.false_alarms} (goal 0)")


if __name__ == "__main__":
    main()
