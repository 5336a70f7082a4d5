"""What a fix buys, proved on real runs: gpumon's predicted speed-up against the measured one.

    .venv/bin/python -m benchmarks.advice [--out DIR] [--only PATTERN,...] [--offline] [--duration 40]
    .venv/bin/python -m benchmarks.advice --pair TRACE TRUTH AFTER_TRUTH   (a pair run on a real GPU)

The whole matrix, three runs of each setup, takes about 85 minutes on 2 cores; `--offline` re-reads it
in a second.

Each setup is a Keras bench job (`gpumon bench`, driving a simulated GPU; docs/benchmarks.md)
recorded by `gpumon record --drive`. For each setup, gpumon's prediction is read from its trace
exactly as `gpumon analyze` makes it (the worst starved episode's advice; for data-parallel
ranks, the straggler's): the predicted speed-up of the next candidate change (one loader worker
more), and the change it recommends. Then the job is run with that change, and its steps per
second (the median of the job's own 5 s truth windows, less the first) are compared with today's:
- error: |predicted - measured| / measured, over the setups with a number (not "cannot predict");
- "no gain" right: gpumon said one worker more gains nothing (under 1.10x), and it measured
  under 1.10x;
- the recommended change: its measured steps per second against today's (never slower is the goal);
  it is run too where it is not one of the matrix's runs, up to --max-workers workers.

Each job's GPU step is simulated: a sleep of --gpu-step-ms (default 100 ms), not the model's
arithmetic on the host's CPUs. A real GPU leaves those CPUs to the loader; arithmetic on them takes a
core from it, and its speed moves with the host's from run to run (the fed jobs of the first nine
matrices "gained" 1.25x from one reader more). The input side alone then decides what a change
buys. `--computed-step` runs the arithmetic as those matrices did. The step each --out was recorded
with is kept in its settings.json, and a run asking another is refused: the runs are reused.

Setups: starved-cpu, jpeg and starved-io with 1, 2 and 3 loader workers, with and without two CPU
hogs (CPU-bound neighbours, each in a session of its own: other users' jobs), and one straggling
rank of `--gpus 2`. A run of each worker count is shared by the setup it is the change of and the
setup it is. Runs of one pipeline and hog count follow each other, and with --repeats they are
recorded in rounds (1, 2, 3, 4 workers, then again), so that a host whose speed drifts moves a
setup's repeats and its change's alike. Runs found in --dir are reused (a second invocation
re-analyzes them); every run's trace, drive file and truth stay there. `--only 'jpeg-*'` runs
(and prints) the setups whose names match (shell-style patterns, comma-separated). Setups whose
repeats differ much can be given more: `--only 'jpeg-*-h2' --repeats 8` records the runs they lack,
and `--offline --all-repeats` then reads each setup's medians over every run of it found.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.driven import record_bench
from gpumon.analyze.trace_report import Analysis, analyze
from gpumon.core.errors import GpumonError
from gpumon.detect.evidence import Evidence
from gpumon.detect.remedies import NO_GAIN, WORKERS_KNOB, Advice, Kind

PIPELINES = ("starved-cpu", "jpeg", "starved-io")
WORKERS = (1, 2, 3)
HOGS = (0, 2)
RANK_PIPELINE = "starved-cpu"
STRAGGLER = 1
GPU_STEP_MS = 100.0
"""The simulated GPU step (`gpumon bench --gpu-step-ms`) unless --gpu-step-ms or --computed-step."""
REPEATS = 3
"""Runs of each setup: this VM's steps per second move 10-60% between runs of one setup."""
SETTINGS = "settings.json"
"""In --out: the GPU step its runs were recorded with."""
SETTINGS_MAX_BYTES = 4096
MAX_GPU_STEP_MS = 10_000.0
"""gpumon bench's own bound on --gpu-step-ms."""
MAX_DURATION_S = 3600.0


@dataclass(frozen=True)
class Setup:
    pipeline: str
    workers: int
    hogs: int = 0
    ranks: int = 1

    @property
    def name(self) -> str:
        ranks = f"-ranks{self.ranks}" if self.ranks > 1 else ""
        return f"{self.pipeline}-w{self.workers}-h{self.hogs}{ranks}"

    def with_workers(self, n: int) -> Setup:
        return Setup(self.pipeline, n, self.hogs, self.ranks)

    def bench_args(self, duration_s: float, gpu_step_ms: float | None = None) -> list[str]:
        args = ["--workers", str(self.workers), "--cpu-hogs", str(self.hogs), "--duration", f"{duration_s:g}"]
        if gpu_step_ms is not None:
            args += ["--gpu-step-ms", f"{gpu_step_ms:g}"]
        if self.ranks > 1:
            return ["--gpus", str(self.ranks), "--straggler", f"{STRAGGLER}:{self.pipeline}", *args]
        return ["--pipeline", self.pipeline, *args]


def setups() -> list[Setup]:
    out = [Setup(p, w, h) for h in HOGS for p in PIPELINES for w in WORKERS]
    return [*out, Setup(RANK_PIPELINE, 1, 0, ranks=2)]


@dataclass
class Run:
    steps_per_s: float
    """The median of the repeats' steps per second."""
    advice: Advice | None
    """What gpumon said of the repeat whose next-change prediction is the median's (the first
    repeat's where none predicted): the recommended change and its "no gain" follow the same
    repeat as the predicted column."""
    label: str
    predicted: float | None = None
    """The median over the repeats of the next change's predicted speed-up (None: cannot predict)."""
    spread: float = 0.0
    """The repeats' steps per second, highest over lowest, less 1: the run-to-run noise."""
    others_cores: float | None = None
    """Other processes' CPU while the job trained (host busy less the job's), median: what
    changes under a prediction when other users' load comes or goes between two runs."""


class NotRecorded(Exception):
    """--offline, and a run that is not in --dir."""


def run_once(
    folder: Path, setup: Setup, duration_s: float, offline: bool = False, gpu_step_ms: float | None = None
) -> Path:
    """The setup's run in `folder` (recorded now unless it is there already)."""
    if not (folder / "truth.jsonl").exists() or not (folder / "trace.jsonl").exists():
        if offline:
            raise NotRecorded(folder.name)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        record_bench(folder, *setup.bench_args(duration_s, gpu_step_ms))
        print(f"  recorded {setup.name}", file=sys.stderr, flush=True)
    return folder


def folder_of(base: Path, setup: Setup, repeat: int) -> Path:
    return base / (setup.name if repeat == 0 else f"{setup.name}-r{repeat + 1}")


def repeats_found(base: Path, setup: Setup, at_least: int) -> int:
    """How many runs of `setup` --dir holds in a row from the first (`--all-repeats`), and at least
    `at_least`: a setup whose repeats differ much may have been given more (`--only` with a larger
    --repeats records only the runs it lacks)."""
    n = 0
    while (folder_of(base, setup, n) / "truth.jsonl").exists():
        n += 1
    return max(n, at_least)


def record_in_rounds(
    base: Path, chosen: list[Setup], repeats: int, duration_s: float, gpu_step_ms: float | None
) -> None:
    """Record the runs the chosen setups compare (each one's workers and one more), a pipeline and
    hog count at a time, in rounds: 1, 2, 3, 4 workers, then 1, 2, 3, 4 again. A host whose speed
    drifts over minutes (a VM's neighbours: 30-40% here between runs 20 minutes apart) then moves
    every worker count's repeats alike, instead of one setup's repeats and its change's apart."""
    groups: dict[tuple[str, int, int], set[int]] = {}
    for s in chosen:
        groups.setdefault((s.pipeline, s.hogs, s.ranks), set()).update((s.workers, s.workers + 1))
    for (pipeline, hogs, ranks), workers in groups.items():
        for r in range(repeats):
            for w in sorted(workers):
                setup = Setup(pipeline, w, hogs, ranks)
                run_once(folder_of(base, setup, r), setup, duration_s, gpu_step_ms=gpu_step_ms)


def step_text(gpu_step_ms: float | None) -> str:
    return "--computed-step" if gpu_step_ms is None else f"--gpu-step-ms {gpu_step_ms:g}"


def check_args(repeats: int, duration_s: float, gpu_step_ms: float | None) -> str | None:
    """Why these flags cannot make a matrix (None: they can), before anything is written."""
    if repeats < 1:
        return f"--repeats {repeats}: 1 or more"
    if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_DURATION_S):
        return f"--duration {duration_s:g}: seconds, more than 0 and at most {MAX_DURATION_S:g}"
    if gpu_step_ms is not None and not (math.isfinite(gpu_step_ms) and 0 < gpu_step_ms <= MAX_GPU_STEP_MS):
        return f"--gpu-step-ms {gpu_step_ms:g}: more than 0 and at most {MAX_GPU_STEP_MS:g} (as gpumon bench)"
    return None


def check_settings(base: Path, gpu_step_ms: float | None) -> str | None:
    """Why the runs in `base` cannot be extended with this GPU step (None: they can). Runs are
    reused by name, so a folder of 100 ms runs extended with computed ones would compare two
    machines' worth of CPU. A folder with runs but no settings.json (recorded before it was kept)
    has an unknown step and is refused too; an empty one is given this invocation's step.
    (--offline re-analyzes any folder: it records nothing, and never comes here.)"""
    path = base / SETTINGS
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return f"{path}: not a regular file (remove it, or use another --out)"
    if not path.exists():
        if any(base.glob("*/truth.jsonl")):
            return (
                f"{base} holds runs of an unknown GPU step (recorded before {SETTINGS} was kept): write "
                f'{path} as {{"gpu_step_ms": 100}} (or null: --computed-step) if you know it, or use '
                "another --out"
            )
        path.write_text(json.dumps({"gpu_step_ms": gpu_step_ms}) + "\n", encoding="utf-8")
        return None
    known, kept = _kept_step(path)
    if not known:
        return f"{path}: not a settings file of benchmarks.advice (remove it, or use another --out)"
    same = (kept is None and gpu_step_ms is None) or (
        kept is not None and gpu_step_ms is not None and math.isclose(kept, gpu_step_ms, rel_tol=1e-9)
    )
    if not same:
        return (
            f"{base} holds runs recorded with {step_text(kept)}; this run asks {step_text(gpu_step_ms)}: "
            "use another --out, or ask for the same step"
        )
    return None


def _kept_step(path: Path) -> tuple[bool, float | None]:
    """(whether the file says a step, the step: None for the computed one), read bounded."""
    try:
        with path.open("rb") as f:
            raw = f.read(SETTINGS_MAX_BYTES + 1)
        if len(raw) > SETTINGS_MAX_BYTES:
            return False, None
        kept = json.loads(raw)["gpu_step_ms"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False, None
    if kept is None:
        return True, None
    if isinstance(kept, bool) or not isinstance(kept, int | float) or not math.isfinite(kept):
        return False, None
    return True, float(kept)


def representative(repeats: list[Run], predicted: float | None) -> Run:
    """The repeat whose next-change prediction is nearest the repeats' median (the first of equals;
    the first repeat where no median was predicted): its advice stands for the setup's, so that
    the recommended change is not one repeat's while the predicted speed-up is all of theirs."""
    if predicted is None:
        return repeats[0]
    best, gap = repeats[0], math.inf
    for r in repeats:
        p = next_change(r.advice)
        if p is not None and abs(p - predicted) < gap:
            best, gap = r, abs(p - predicted)
    return best


def measure(folder: Path, setup: Setup) -> Run:
    windows = [json.loads(x) for x in (folder / "truth.jsonl").read_text().splitlines() if x.strip()]
    if setup.ranks > 1:
        windows = [w for w in windows if w.get("gpu") == 0]  # the ranks step together
    rates = [w["steps_per_s"] for w in windows[1:] if w.get("steps_per_s")]  # the first: warm-up
    if not rates:
        sys.exit(f"{folder}: no truth windows with steps per second")
    a = analyze(str(folder / "trace.jsonl"))
    gpu = STRAGGLER if setup.ranks > 1 else 0
    report = next(g for g in a.gpus if g.index == gpu)
    return Run(statistics.median(rates), report.fix, report.main_label, others_cores=_others(a))


def _others(a: Analysis) -> float | None:
    """The median, over the ticks where every GPU's job is seen, of the host's busy cores less the
    jobs' (the ranks' together)."""
    by_t: dict[float, list[Evidence]] = {}
    for g in a.gpus:
        for v in g.verdicts:
            by_t.setdefault(v.t_s, []).append(v.evidence)
    found = []
    for evs in by_t.values():
        e = evs[0]
        jobs = [x.job_cpu_cores for x in evs if x.has_job]
        if not jobs or any(j is None for j in jobs) or e.host_cpu_ratio is None or not e.cpu_count:
            continue
        found.append(e.host_cpu_ratio * e.cpu_count - sum(j for j in jobs if j is not None))
    return statistics.median(found) if found else None


def next_change(advice: Advice | None) -> float | None:
    """The predicted speed-up of one loader worker more: 1.0 where gpumon says nothing on the
    input side can gain (fed); None where it cannot predict."""
    if advice is None or advice.kind == Kind.CANNOT:
        return None
    if advice.kind == Kind.GPU_LIMIT or not advice.candidates:
        return 1.0
    return advice.candidates[0].speedup


TRUTH_MAX_BYTES = 16 * 2**20
"""A bench job's truth file holds a window every 5 s (~200 bytes): hours of them fit many times over."""


def truth_rate(path: Path, pipeline: str | None = None) -> tuple[float, str] | None:
    """The median steps per second of a truth file's windows (of `pipeline`'s only, when given),
    less the first of them (the warm-up), and the pipeline they are of; None: no such windows."""
    windows = []
    with path.open("rb") as f:
        text = f.read(TRUTH_MAX_BYTES + 1)
    if len(text) > TRUTH_MAX_BYTES:
        raise ValueError(f"{path}: over {TRUTH_MAX_BYTES // 2**20} MiB: not a bench job's truth file")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            w = json.loads(line)
        except ValueError:
            w = None
        if not isinstance(w, dict) or not isinstance(w.get("steps_per_s", 0), int | float | None):
            raise ValueError(f"{path}:{n}: not a truth window (bench --truth writes a JSON object a line)")
        windows.append(w)
    mine = [w for w in windows if pipeline is None or w.get("pipeline") == pipeline]
    rates = [w["steps_per_s"] for w in mine[1:] if w.get("steps_per_s")]
    if not rates:
        return None
    return statistics.median(rates), str(mine[0].get("pipeline"))


def pair(trace: Path, truth: Path, after: Path) -> str:
    """A run recorded on a real GPU (`trace`, with its job's `truth`) and the same job with one loader
    worker more (`after`'s truth): gpumon's predicted speed-up against the measured one
    (benchmarks/gpu_check.sh). The prediction is what `gpumon analyze` says of GPU 0 (its worst
    starved episode's advice); `truth` may hold other runs (a fed one first): only the windows of
    `after`'s pipeline are read."""
    measured_after = truth_rate(after)
    if measured_after is None:
        return f"{after}: no truth windows with steps per second"
    rate_after, pipeline = measured_after
    measured_before = truth_rate(truth, pipeline)
    if measured_before is None:
        return f"{truth}: no {pipeline} truth windows with steps per second"
    rate_before = measured_before[0]
    report = next((g for g in analyze(str(trace)).gpus if g.index == 0), None)
    if report is None:
        return f"{trace}: no GPU 0"
    advice = report.fix
    predicted = next_change(advice)
    gain = rate_after / rate_before
    said = advice.line(WORKERS_KNOB) if advice is not None else "no advice (no starved episode)"
    lines = [
        f"gpumon on the {pipeline} run ({report.main_label}): {said}",
        f"measured: {rate_before:.2f} -> {rate_after:.2f} steps/s with one loader worker more: {gain:.2f}x",
    ]
    if predicted is None:
        lines.append("predicted: none (cannot predict)")
    else:
        err = abs(predicted - gain) / gain
        lines.append(f"predicted for one worker more: {predicted:.2f}x; error {err:.0%}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair",
        nargs=3,
        type=Path,
        metavar=("TRACE", "TRUTH", "AFTER_TRUTH"),
        help="no runs: gpumon's prediction in TRACE (its job's TRUTH) against the speed-up measured in "
        "AFTER_TRUTH, the same job with one loader worker more (the real-GPU check)",
    )
    ap.add_argument("--duration", type=float, default=40.0, help="seconds each job trains (default 40)")
    ap.add_argument(
        "--out", "--dir", dest="dir", help="where runs are kept and reused (default: a temporary folder)"
    )
    ap.add_argument(
        "--only",
        "--setups",
        dest="setups",
        help="only the setups whose names (as printed) match these shell-style patterns, comma-separated",
    )
    ap.add_argument(
        "--max-workers",
        type=int,
        default=9,
        help="run a recommended change up to this many workers (default 9); beyond, 'not run'",
    )
    ap.add_argument(
        "--offline",
        action="store_true",
        help="record nothing: analyze the runs in --dir again (with this gpumon), leaving out setups "
        "without runs",
    )
    step = ap.add_mutually_exclusive_group()
    step.add_argument(
        "--gpu-step-ms",
        type=float,
        metavar="MS",
        default=GPU_STEP_MS,
        help=f"each job's step a sleep of MS ms (default {GPU_STEP_MS:g}; gpumon bench --gpu-step-ms: a "
        "simulated GPU that leaves the cores to the loader)",
    )
    step.add_argument(
        "--computed-step",
        action="store_const",
        const=None,
        dest="gpu_step_ms",
        help="each job's step the model's arithmetic, on the host's CPUs where no GPU is (the matrices "
        "before 2026-12-03)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help=f"runs of each setup (default {REPEATS}): steps per second and predictions are their medians",
    )
    ap.add_argument(
        "--all-repeats",
        action="store_true",
        help="each setup's medians over every run of it in --dir (at least --repeats): noisier setups "
        "may have been given more repeats with --only",
    )
    args = ap.parse_args()
    if args.pair:
        for f in args.pair:
            if not f.is_file():
                ap.error(f"--pair: {f}: no such file")
        try:
            print(pair(*args.pair))
        except ValueError as e:
            ap.error(f"--pair: {e}")
        except GpumonError as e:  # a trace gpumon cannot read: its own line and exit code
            print(f"advice: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        return
    if problem := check_args(args.repeats, args.duration, args.gpu_step_ms):
        sys.exit(f"advice: {problem}")
    chosen = setups()
    if args.setups:
        patterns = [p for p in args.setups.split(",") if p]
        chosen = [s for s in chosen if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]
        if not chosen:
            sys.exit(f"no setup matches {args.setups!r}: " + ", ".join(s.name for s in setups()))
    if args.offline and not args.dir:
        sys.exit("advice: --offline re-analyzes the runs of an --out folder: name it")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gpumon-advice-"))
    if not args.offline:
        base.mkdir(parents=True, exist_ok=True)
        if problem := check_settings(base, args.gpu_step_ms):
            sys.exit(f"advice: {problem}")
    runs: dict[Setup, Run] = {}
    if not args.offline:
        record_in_rounds(base, chosen, args.repeats, args.duration, args.gpu_step_ms)

    def get(s: Setup) -> Run:
        if s not in runs:
            repeats = []
            if args.offline:  # what was recorded: a folder of one run a setup reads as one
                found = repeats_found(base, s, 0)
                n = found if args.all_repeats else min(found, args.repeats)
                if n < args.repeats:
                    print(f"  {s.name}: {n} run(s) of {args.repeats} asked", file=sys.stderr)
                if n == 0:
                    raise NotRecorded(s.name)
            else:
                n = repeats_found(base, s, args.repeats) if args.all_repeats else args.repeats
            for r in range(n):
                folder = folder_of(base, s, r)
                repeats.append(measure(run_once(folder, s, args.duration, args.offline, args.gpu_step_ms), s))
            rates = [x.steps_per_s for x in repeats]
            said = [p for p in (next_change(x.advice) for x in repeats) if p is not None]
            others = [x.others_cores for x in repeats if x.others_cores is not None]
            predicted = statistics.median(said) if len(said) * 2 > len(repeats) else None
            typical = representative(repeats, predicted)
            runs[s] = Run(
                statistics.median(rates),
                typical.advice,
                typical.label,
                predicted,
                max(rates) / min(rates) - 1,
                statistics.median(others) if others else None,
            )
        return runs[s]

    rows = []
    for s in chosen:
        try:
            today = get(s)
            after = get(s.with_workers(s.workers + 1))
        except NotRecorded as e:
            print(f"  {s.name}: no run {e} in {base} (--offline): left out", file=sys.stderr)
            continue
        predicted = today.predicted
        measured = after.steps_per_s / today.steps_per_s
        best = today.advice.best if today.advice is not None else None
        rec: tuple[int, float, float | None] | None = None
        missing = (
            best is not None and args.offline and not (base / s.with_workers(best.workers or 0).name).exists()
        )
        if best is not None and best.workers is not None and best.workers <= args.max_workers and not missing:
            rec = (
                best.workers,
                best.speedup,
                get(s.with_workers(best.workers)).steps_per_s / today.steps_per_s,
            )
        elif best is not None and best.workers is not None:
            rec = (best.workers, best.speedup, None)
        rows.append((s, today, predicted, measured, rec, max(today.spread, after.spread), after))
        print(
            json.dumps({"setup": s.name, "predicted": predicted, "measured": round(measured, 3)}), flush=True
        )
    print(render(rows, base))


Row = tuple[Setup, Run, float | None, float, tuple[int, float, float | None] | None, float, Run]
OTHERS_CHANGED = 0.3
"""Other processes' CPU (cores) moving this much between a setup's run and its change's: the host
changed under the prediction (another user's work came or went)."""


def render(rows: list[Row], base: Path) -> str:
    lines = [
        f"{'setup':28} {'steps/s':>7} {'gpumon says':14} {'+1 worker: predicted':>20} {'measured':>8} "
        f"{'error':>6} {'noise':>6} {'others':>9}  recommended (predicted, measured)"
    ]
    errors, no_gain, rec_ratios, cannot, steady = [], [], [], 0, []
    for s, today, predicted, measured, rec, noise, after in rows:
        before_o, after_o = today.others_cores, after.others_cores
        changed = before_o is None or after_o is None or abs(after_o - before_o) >= OTHERS_CHANGED
        others = "?" if before_o is None or after_o is None else f"{before_o:.1f}>{after_o:.1f}"
        if predicted is None:
            cannot += 1
            pred, err = "cannot predict", ""
        else:
            error = abs(predicted - measured) / measured
            errors.append(error)
            if not changed:
                steady.append(error)
            pred, err = f"{predicted:.2f}x", f"{error:.0%}"
            if predicted < NO_GAIN:
                no_gain.append(measured < NO_GAIN)
        if rec is None:
            rtext = "none (no gain)" if today.advice is not None and today.advice.no_gain else "-"
        else:
            w, p, m = rec
            rtext = f"{s.workers} -> {w} ({p:.2f}x, " + ("not run" if m is None else f"{m:.2f}x") + ")"
            if m is not None:
                rec_ratios.append(m)
        rate = f"{today.steps_per_s:7.2f}"
        spread = f"{noise:.0%}" if noise else "-"
        lines.append(
            f"{s.name:28} {rate} {today.label:14} {pred:>20} {measured:7.2f}x {err:>6} {spread:>6} "
            f"{others + ('*' if changed else ''):>9}  {rtext}"
        )
    med = statistics.median(errors) if errors else float("nan")
    worst = max(errors) if errors else float("nan")
    hit = f"{sum(no_gain)} of {len(no_gain)}" + (f" ({sum(no_gain) / len(no_gain):.0%})" if no_gain else "")
    slowest = f"{min(rec_ratios):.2f}x" if rec_ratios else "n/a"
    slower = sum(m < 1.0 for m in rec_ratios)
    never = "n/a" if not rec_ratios else "yes" if not slower else f"no ({slower} slower)"
    lines.append("")
    lines.append(
        f"summary: {len(rows)} setups, {len(errors)} predicted ({cannot} cannot predict): "
        f'median error {med:.0%}, worst {worst:.0%}; "no gain" right {hit}; '
        f"recommended change never slower: {never} (slowest {slowest} of today's steps/s, "
        f"{len(rec_ratios)} run)"
    )
    if steady:
        lines.append(
            f"where other processes' CPU moved less than {OTHERS_CHANGED:g} cores between the two runs "
            f"({len(steady)} setups; * marks the others): median error {statistics.median(steady):.0%}, "
            f"worst {max(steady):.0%}"
        )
    lines.append(f"runs kept in {base}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
