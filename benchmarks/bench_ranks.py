"""Data-parallel ranks of the Keras bench against gpumon's verdicts, per rank (issue 18).

    .venv/bin/python -m benchmarks.bench_ranks [--runs 5] [--ranks 2] [--duration 40]

Each run records the simulated GPUs driven by `gpumon bench --gpus N` (torch DDP over gloo on
this CPU-only machine: rank R drives GPU R) with `gpumon record --drive`, alternately with rank
N-1 starved (`--straggler N-1:starved-cpu`) and with no straggler. Per rank it reports what the
rank measured itself (input wait and time blocked in the all-reduce, shares of its step time),
gpumon's main label over the run's settled part (after the detector's window and confirmation),
the share of the settled seconds whose verdict is what the rank's truth expects, and the truth
windows agreed (`gpumon analyze --truth`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.driven import record_bench
from gpumon.analyze.trace_report import analyze
from gpumon.analyze.truth import compare_truth


def one_run(folder: Path, ranks: int, straggler: int | None, duration: int) -> dict[str, Any]:
    extra = ("--straggler", f"{straggler}:starved-cpu") if straggler is not None else ()
    trace, _, truth = record_bench(folder, "--gpus", str(ranks), *extra, "--duration", str(duration))
    result = analyze(str(trace))
    th = result.thresholds
    records = [json.loads(line) for line in truth.read_text().splitlines()]
    out: dict[str, Any] = {"straggler": straggler}
    for gpu in sorted(result.gpus, key=lambda g: g.index):
        mine = [r for r in records if r["gpu"] == gpu.index]
        if not mine:
            continue
        first_step = min(r["start_unix_s"] for r in mine) - result.header["started_unix_s"]
        last_step = max(r["end_unix_s"] for r in mine) - result.header["started_unix_s"]
        settled = [v for v in gpu.verdicts if first_step + th.window_s + th.confirm_s <= v.t_s <= last_step]
        labels = Counter(v.label for v in settled)
        expected = "healthy" if straggler is None else "starved" if gpu.index == straggler else "sync-stall"
        agree = sum(v.state == expected for v in settled) / len(settled) if settled else 0.0
        out[f"gpu{gpu.index}"] = {
            "input_share": round(statistics.mean(r["input_share"] for r in mine), 3),
            "sync_share": round(statistics.mean(r["sync_share"] for r in mine), 3),
            "main_label": labels.most_common(1)[0][0] if labels else None,
            "agreement": round(agree, 3),
        }
    report = compare_truth(result, str(truth))
    out["truth"] = f"{report.agreed}/{report.judged}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--duration", type=int, default=40)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpumon-ranks-") as tmp:
        for run in range(args.runs):
            for straggler in (args.ranks - 1, None):
                folder = Path(tmp) / f"{run}-{straggler}"
                folder.mkdir()
                row = one_run(folder, args.ranks, straggler, args.duration)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'straggler':>9} {'gpu':>3} {'input':>6} {'sync':>6} {'main label (runs)':<32} {'agree':>6}")
    for straggler in (args.ranks - 1, None):
        mine = [r for r in rows if r["straggler"] == straggler]
        for g in range(args.ranks):
            cells = [r[f"gpu{g}"] for r in mine if f"gpu{g}" in r]
            if not cells:
                continue
            labels = Counter(c["main_label"] for c in cells)
            print(
                f"{straggler!s:>9} {g:>3} "
                f"{statistics.median(c['input_share'] for c in cells):>6.0%} "
                f"{statistics.median(c['sync_share'] for c in cells):>6.0%} "
                f"{', '.join(f'{k} ({n})' for k, n in labels.items()):<32} "
                f"{statistics.median(c['agreement'] for c in cells):>6.0%}"
            )
        print(f"{'':>9} truth windows agreed: {', '.join(str(r['truth']) for r in mine)}")


if __name__ == "__main__":
    main()
