"""The `gpumon` command line: parse, wire sources to the sampler and sinks, map errors to exit codes.

Every error a user can cause ends in one line on stderr and a documented exit code (README,
"Exit codes"); tracebacks are only shown with --debug.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from gpumon import __version__
from gpumon.clock import Clock, MonotonicClock, ScaledClock, SinceStart, VirtualClock
from gpumon.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    GpumonError,
    UsageError,
)
from gpumon.sampler import DEFAULT_INTERVAL_S, Sampler
from gpumon.sources.factory import OpenedSources, SourceOptions, open_sources

log = logging.getLogger("gpumon")


class Interrupted(Exception):
    """SIGINT or SIGTERM: stop cleanly, keep what was recorded."""


# -- argument types: each names what was wrong ---------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _period(text: str) -> float:
    value = _positive_float(text)
    if not 1 / 6 - 1e-9 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 1/6 and 1 second, got {text}")
    return value


def _gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1024, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _speed(text: str) -> float:
    if text == "max":
        return float("inf")
    return _positive_float(text)


def _add_source_flags(p: argparse.ArgumentParser, *, speed: bool, unset_defaults: bool = False) -> None:
    """`unset_defaults`: for `serve`, where a flag overrides the file and environment only when given."""
    g = p.add_argument_group("what to sample (default: this machine's GPUs through NVML)")
    which = g.add_mutually_exclusive_group()
    which.add_argument(
        "--simulate",
        metavar="SCENARIO[,SCENARIO...]",
        help="simulated GPUs following these scenarios, cycled over the GPUs (see 'gpumon scenarios')",
    )
    which.add_argument("--replay", metavar="FILE", help="play back a recorded trace")
    which.add_argument(
        "--drive",
        metavar="FILE",
        help="one simulated GPU, busy while a job's train steps run (gpumon bench --drive FILE)",
    )
    g.add_argument(
        "--gpus",
        type=_gpu_count,
        metavar="N",
        help="number of simulated GPUs (default: one per scenario given)",
    )
    g.add_argument(
        "--seed",
        type=_seed,
        default=0,
        metavar="S",
        help="seed of the simulation (default 0); the same seed gives the same run",
    )
    g.add_argument(
        "--sample-period",
        type=_period,
        default=1 / 6,
        metavar="SECONDS",
        help="simulated driver's utilization sample period, 1/6 to 1 (default 1/6)",
    )
    if speed:
        g.add_argument(
            "--speed",
            type=_speed,
            default=1.0,
            metavar="FACTOR|max",
            help="simulate or replay FACTOR times faster than real time, or 'max' "
            "for as fast as possible (default 1)",
        )


def _source_options(args: argparse.Namespace) -> SourceOptions:
    from gpumon.sim.scenarios import parse_scenarios

    if args.simulate is None and (args.gpus is not None):
        raise UsageError("--gpus needs --simulate (real GPUs are counted, not chosen)")
    return SourceOptions(
        simulate=parse_scenarios(args.simulate) if args.simulate is not None else None,
        gpus=args.gpus,
        seed=args.seed,
        sample_period_s=args.sample_period,
        replay=args.replay,
        drive=args.drive,
    )


def _clock(args: argparse.Namespace) -> Clock:
    speed = getattr(args, "speed", 1.0)
    if speed == 1.0:
        return MonotonicClock()
    if (args.simulate is None and args.replay is None) or getattr(args, "drive", None):
        raise UsageError("--speed needs --simulate or --replay: real GPUs and driven ones run in real time")
    return VirtualClock() if speed == float("inf") else ScaledClock(speed)


# -- commands ------------------------------------------------------------------------------------


def cmd_scenarios(args: argparse.Namespace) -> int:
    from gpumon.sim.scenarios import SCENARIOS

    width = max(len(n) for n in SCENARIOS)
    for name, scenario in SCENARIOS.items():
        print(f"{name:<{width}}  {scenario.summary}")
    return EXIT_OK


def cmd_devices(args: argparse.Namespace) -> int:
    clock = MonotonicClock()
    sources = open_sources(_source_options(args), clock)
    try:
        gpus = sources.gpu.poll(clock.now())
    finally:
        sources.close()
    rows = [
        {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "available": g.available,
            "mem_used_bytes": g.mem_used_bytes,
            "mem_total_bytes": g.mem_total_bytes,
            "util_ratio": g.util_ratio,
            "error": g.error,
        }
        for g in gpus
    ]
    if args.json:
        json.dump({"source": sources.description, "gpus": rows}, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no GPUs found")
        return EXIT_OK
    print(f"{'GPU':>3}  {'NAME':<36} {'UUID':<40} {'MEMORY USED/TOTAL':>19} {'UTIL':>5}")
    for r in rows:
        if not r["available"]:
            print(f"{r['index']:>3}  {r['name'] or '?':<36} {r['uuid'] or '?':<40} unavailable: {r['error']}")
            continue
        mem = f"{_gib(r['mem_used_bytes'])} / {_gib(r['mem_total_bytes'])} GiB"
        util = f"{r['util_ratio'] * 100:.0f}%" if r["util_ratio"] is not None else "n/a"
        print(f"{r['index']:>3}  {r['name']:<36} {r['uuid']:<40} {mem:>19} {util:>5}")
    if sources.simulated:
        print("(simulated GPUs: --simulate)")
    return EXIT_OK


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1024**3:.1f}"


def cmd_record(args: argparse.Namespace) -> int:
    from gpumon.trace import TraceWriter, make_header

    clock = SinceStart(_clock(args))
    sources = open_sources(_source_options(args), clock)
    header = make_header(sources.description, args.interval)
    writer = TraceWriter(args.output, header, force=args.force)
    sampler = Sampler(
        sources.gpu,
        sources.host,
        clock,
        interval_s=args.interval,
        window_s=args.interval * 4,
        on_tick=[writer.write_tick],
    )
    what = _describe(sources)
    until = f"for {args.duration:g} s" if args.duration else "until interrupted (Ctrl-C)"
    print(f"gpumon: recording {what} every {args.interval:g} s {until} to {args.output}", file=sys.stderr)
    reason = "duration"
    try:
        with _StopOnSignals():
            sampler.run(duration_s=args.duration, exhausted=sources.exhausted)
        if sources.exhausted is not None and sources.exhausted():
            reason = "replay-ended"
    except Interrupted:
        reason = "interrupted"
    finally:
        last = sampler.last_tick.t_s if sampler.last_tick else None
        writer.close(last, reason)
        sources.close()
    gpus = sampler.last_tick.gpus if sampler.last_tick else ()
    print(
        f"gpumon: wrote {writer.ticks} ticks of {len(gpus)} GPU(s) to {args.output} ({reason})",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED if reason == "interrupted" else EXIT_OK


def _thresholds(args: argparse.Namespace):
    from dataclasses import fields

    from gpumon.detector.config import Thresholds

    known = {f.name for f in fields(Thresholds)}
    overrides: dict[str, float] = {}
    for item in args.threshold or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise UsageError(f"--threshold {item!r}: expected KEY=VALUE, e.g. fed_duty=0.85")
        if key not in known:
            raise UsageError(f"--threshold: unknown key {key!r}; known: {', '.join(sorted(known))}")
        try:
            overrides[key] = float(value)
        except ValueError:
            raise UsageError(f"--threshold {key}: not a number: {value!r}") from None
    if "min_points" in overrides:
        overrides["min_points"] = int(overrides["min_points"])
    try:
        return Thresholds(**overrides)
    except ValueError as e:
        raise UsageError(f"--threshold: {e}") from None


def cmd_analyze(args: argparse.Namespace) -> int:
    from gpumon.analysis import analyze, render_text, to_json

    th = _thresholds(args)
    result = analyze(args.trace, th)
    if not result.trace.ticks:
        raise UsageError(f"{args.trace}: the trace holds no ticks to analyze")
    if args.plot:
        from gpumon.plot import plot

        plot(result, args.plot)
    truth = None
    if args.truth:
        from gpumon.analysis import compare_truth

        truth = compare_truth(result, args.truth)
    if args.json:
        doc = to_json(result)
        if truth is not None:
            doc["truth"] = {"file": args.truth, **truth.__dict__, "agreement": round(truth.agreement, 4)}
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print(render_text(result))
        if truth is not None:
            print(truth.render(args.truth))
        if args.plot:
            print(f"plot: {args.plot}")
    return EXIT_OK


_COLORS = {
    "healthy": "32",
    "starved": "1;31",
    "stalled": "1;35",
    "sync-stall": "1;35",
    "underutilized": "33",
    "idle": "2",
    "unknown": "2",
}


def cmd_watch(args: argparse.Namespace) -> int:
    from gpumon.live import DetectorSink

    th = _thresholds(args)
    clock = SinceStart(_clock(args))
    sources = open_sources(_source_options(args), clock)
    sampler = Sampler(
        sources.gpu, sources.host, clock, interval_s=args.interval, window_s=max(60.0, 2 * th.window_s)
    )
    writer = None
    if args.output:
        from gpumon.trace import TraceWriter, make_header

        writer = TraceWriter(args.output, make_header(sources.description, args.interval), force=args.force)
        sampler.on_tick.append(writer.write_tick)
    sink = DetectorSink(sampler, th)
    sampler.on_tick.append(sink)
    color = sys.stdout.isatty() and not args.no_color
    print(f"gpumon watch: {_describe(sources)}, every {args.interval:g} s (Ctrl-C to stop)", flush=True)
    print(
        f"{'TIME':>7} {'GPU':>3} {'UTIL':>5} {'DUTY':>5} {'MEM':>5} {'JOBCPU':>7}  "
        f"{'STATE':<14} {'CAUSE':<5} {'CONF':>4} {'SINCE':>6}",
        flush=True,
    )

    def show(tick, verdicts) -> None:
        for v in verdicts:
            g = next((x for x in tick.gpus if x.index == v.index and x.uuid == v.uuid), None)
            util = f"{g.util_ratio:.0%}" if g and g.util_ratio is not None else "-"
            mem = (
                f"{g.mem_used_bytes / g.mem_total_bytes:.0%}"
                if g and g.mem_used_bytes is not None and g.mem_total_bytes
                else "-"
            )
            ev = v.evidence
            duty = f"{ev.duty_cycle:.0%}" if ev.duty_cycle is not None else "-"
            cpu = f"{ev.job_cpu_cores:.1f}c" if ev.job_cpu_cores is not None else "-"
            state = v.state.upper() if v.state == "starved" else v.state
            text = f"{state:<14}"
            if color:
                text = f"\033[{_COLORS.get(v.state, '0')}m{text}\033[0m"
            print(
                f"{tick.t_s:7.1f} {v.index:>3} {util:>5} {duty:>5} {mem:>5} {cpu:>7}  {text} "
                f"{v.cause or '-':<5} {v.confidence:4.2f} {tick.t_s - v.since_s:5.0f}s",
                flush=True,
            )

    sink.on_verdicts.append(show)
    reason = "duration"
    try:
        with _StopOnSignals():
            sampler.run(duration_s=args.duration, exhausted=sources.exhausted)
    except Interrupted:
        reason = "interrupted"
    finally:
        if writer is not None:
            writer.close(sampler.last_tick.t_s if sampler.last_tick else None, reason)
        sources.close()
    for key, det in sorted(sink.fleet.gpus.items()):
        episodes = [
            e for e in det.close(sampler.last_tick.t_s if sampler.last_tick else 0.0) if e.state != "unknown"
        ]
        summary = ", ".join(f"{e.label} {e.start_s:.0f}-{e.end_s:.0f} s" for e in episodes) or "-"
        print(f"GPU {key[0]}: {summary}; wasted {det.wasted_gpu_s:.0f} GPU-s", flush=True)
    if writer is not None:
        print(f"trace: {args.output} ({writer.ticks} ticks)", flush=True)
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from gpumon import config as config_mod
    from gpumon.daemon import Daemon, run_forever

    flags = {
        "listen": args.listen,
        "interval_s": args.interval,
        "web_config_file": args.web_config_file,
        "simulate": args.simulate,
        "gpus": args.gpus,
        "seed": args.seed,
        "sample_period_s": args.sample_period,
        "replay": args.replay,
        "drive": args.drive,
    }

    def load() -> config_mod.Config:
        return config_mod.load(args.config, dict(os.environ), flags)

    cfg = load()
    if args.check_config:
        from gpumon.web import load_web_config

        load_web_config(cfg.web_config_file)
        host, port = cfg.host_port
        what = (
            f"simulate {cfg.simulate}" if cfg.simulate else f"replay {cfg.replay}" if cfg.replay else "NVML"
        )
        print(
            f"gpumon serve: configuration ok ({cfg.source_path or 'no file, defaults'}): "
            f"listen {host or '*'}:{port}, interval {cfg.interval_s:g} s, "
            f"{what}"
        )
        return EXIT_OK
    logging.getLogger().setLevel(cfg.log_level.upper())
    return run_forever(Daemon(cfg, reload=load))


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        from gpumon.bench.job import BenchOptions, run
    except ImportError as e:
        from gpumon.errors import MissingDependency

        raise MissingDependency(
            f"gpumon bench needs Keras 3 and a backend ({e.name} is missing): pip install "
            "'gpumon-datastall[bench]' torch (on machines without a GPU: torch==2.13.0, the CPU build)"
        ) from None
    result = run(
        BenchOptions(
            pipeline=args.pipeline,
            duration_s=args.duration,
            batch_size=args.batch_size,
            workers=args.workers,
            drive=args.drive,
            truth=args.truth,
            save=args.save,
            verbose=0 if args.quiet else 1,
        )
    )
    print(
        f"gpumon bench: {args.pipeline}: {result['steps']:.0f} steps in {result['seconds']:.0f} s "
        f"on {result['gpus']:.0f} device(s), batch {result['batch']:.0f}",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpumon.demo import run_demo

    return run_demo(args.phase_seconds, args.listen, Path(args.out))


def cmd_dstat_plugin(args: argparse.Namespace) -> int:
    from gpumon import dstat_install

    if args.action == "install":
        for path in dstat_install.install(args.system):
            print(f"installed {path}")
        print("try: dstat -c --gpu 5    (or: dool -c --gpu 5); GPUMON_URL points it at another daemon")
    else:
        removed = dstat_install.uninstall(args.system)
        print("\n".join(f"removed {p}" for p in removed) or "nothing to remove")
    return EXIT_OK


def _describe(sources: OpenedSources) -> str:
    d = sources.description
    if d["kind"] == "simulated":
        return f"{d['gpus']} simulated GPU(s) ({', '.join(sorted(set(d['scenarios'])))})"
    if d["kind"] == "replay":
        return f"a replay of {d['file']}"
    return "this machine's GPUs (NVML)"


class _StopOnSignals:
    """Turn SIGTERM into a clean stop like Ctrl-C, so a killed `record` still ends its file."""

    def __enter__(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            raise Interrupted(signal.Signals(signum).name)

        self._old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


# -- parser and main -----------------------------------------------------------------------------


def _add_common_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    # On the top level and on each command, so they work before or after the command's name.
    default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    p.add_argument(
        "--log-level",
        default=default("warning"),
        choices=["debug", "info", "warning", "error"],
        help="(default warning)",
    )
    p.add_argument(
        "--debug", action="store_true", default=default(False), help="show tracebacks of internal errors"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpumon",
        description="Catch GPUs starved by their input pipeline (CPU or storage).",
    )
    p.add_argument("--version", action="version", version=f"gpumon {__version__}")
    _add_common_flags(p, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_common_flags(common, top=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "devices", parents=[common], help="list GPUs: index, name, UUID, memory, utilization now"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    _add_source_flags(s, speed=False)
    s.set_defaults(func=cmd_devices)

    s = sub.add_parser("scenarios", parents=[common], help="list the simulated workload scenarios")
    s.set_defaults(func=cmd_scenarios)

    s = sub.add_parser("record", parents=[common], help="sample GPUs and host into a trace file")
    s.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    s.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="stop after this long (default: until Ctrl-C or SIGTERM)",
    )
    s.add_argument(
        "--interval",
        type=_positive_float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"time between ticks (default {DEFAULT_INTERVAL_S:g})",
    )
    s.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    _add_source_flags(s, speed=True)
    s.set_defaults(func=cmd_record)

    s = sub.add_parser(
        "analyze", parents=[common], help="classify each GPU of a recorded trace and report why it waited"
    )
    s.add_argument("trace", metavar="TRACE", help="a trace written by 'gpumon record'")
    s.add_argument(
        "--json", action="store_true", help="per-window verdicts and episodes as JSON (docs/detector.md)"
    )
    s.add_argument("--plot", metavar="FILE.png", help="also draw a timeline to this PNG file")
    s.add_argument(
        "--truth",
        metavar="FILE",
        help="ground truth from `gpumon bench --truth`: how well the detector agreed",
    )
    _add_threshold_flag(s)
    s.set_defaults(func=cmd_analyze)

    s = sub.add_parser(
        "watch", parents=[common], help="print each GPU's utilization and verdict every interval"
    )
    s.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="stop after this long (default: until Ctrl-C)",
    )
    s.add_argument(
        "--interval",
        type=_positive_float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"time between lines (default {DEFAULT_INTERVAL_S:g})",
    )
    s.add_argument("--no-color", action="store_true", help="never colour the state column")
    s.add_argument("-o", "--output", metavar="FILE", help="also record the samples to this trace file")
    s.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    _add_threshold_flag(s)
    _add_source_flags(s, speed=True)
    s.set_defaults(func=cmd_watch)

    s = sub.add_parser(
        "serve", parents=[common], help="the Prometheus exporter daemon: /metrics, /api/v1/state, /healthz"
    )
    s.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration (default: $GPUMON_CONFIG, else /etc/gpumon/gpumon.toml if present)",
    )
    s.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default :9877)")
    s.add_argument(
        "--interval", type=_positive_float, metavar="SECONDS", help="sampling interval (default 1)"
    )
    s.add_argument("--web-config-file", metavar="FILE", help="TLS and basic auth (exporter-toolkit format)")
    s.add_argument("--check-config", action="store_true", help="validate the configuration and exit")
    _add_source_flags(s, speed=False, unset_defaults=True)
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser(
        "demo",
        parents=[common],
        help="the product end to end without a GPU: a real Keras job, fed then starved",
    )
    s.add_argument(
        "--phase-seconds",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="length of the fed and of the starved phase (default 60)",
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:9877",
        metavar="HOST:PORT",
        help="where the exporter serves meanwhile (default 127.0.0.1:9877; :0 for any free port)",
    )
    s.add_argument(
        "--out",
        default="gpumon-demo",
        metavar="DIR",
        help="trace, ground truth and plot (default gpumon-demo/)",
    )
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser(
        "bench",
        parents=[common],
        help="a Keras training job, fed or starved on purpose (needs the bench extra)",
    )
    s.add_argument("--pipeline", choices=["fed", "starved-cpu", "starved-io"], default="fed")
    s.add_argument("--duration", type=_positive_float, default=60.0, metavar="SECONDS")
    s.add_argument("--batch-size", type=int, default=64, metavar="N")
    s.add_argument(
        "--workers", type=int, default=2, metavar="N", help="loader processes for the fed pipeline"
    )
    s.add_argument("--drive", metavar="FILE", help="write each step's busy interval, for a simulated GPU")
    s.add_argument("--truth", metavar="FILE", help="write the labeled input-bound timeline (ground truth)")
    s.add_argument("--save", metavar="FILE.keras", help="save the trained (template) model")
    s.add_argument("--quiet", action="store_true", help="no Keras progress bar")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser(
        "dstat-plugin", parents=[common], help="install or remove the `dstat --gpu` / `dool --gpu` plugin"
    )
    s.add_argument("action", choices=["install", "uninstall"])
    where = s.add_mutually_exclusive_group()
    where.add_argument(
        "--user",
        dest="system",
        action="store_false",
        default=False,
        help="for this user: ~/.dstat/ and ~/.local/share/dool/plugins/ (default)",
    )
    where.add_argument(
        "--system",
        dest="system",
        action="store_true",
        help="for everyone: /usr/local/share/dstat/ and /usr/local/share/dool/",
    )
    s.set_defaults(func=cmd_dstat_plugin)
    return p


def _add_threshold_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        action="append",
        metavar="KEY=VALUE",
        help="override a detector threshold, e.g. fed_duty=0.85 (repeatable; docs/detector.md lists them)",
    )


_SYSLOG_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class _JournalFormatter(logging.Formatter):
    """Under systemd, stderr goes to journald: a "<N>" prefix carries the priority, and journald
    already adds the time and the unit's name."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{record.getMessage()}"


def _stderr_is_journal() -> bool:
    import os

    stream = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if _stderr_is_journal():
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("gpumon: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2 here, as argparse does
    _setup_logging(args.log_level)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except UsageError as e:
        parser.exit(e.exit_code, f"gpumon {args.command}: error: {e}\n")
    except GpumonError as e:
        print(f"gpumon: error: {e}", file=sys.stderr)
        return e.exit_code
    except (KeyboardInterrupt, Interrupted):
        print("gpumon: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:
        if args.debug:
            raise
        print(
            f"gpumon: internal error: {type(e).__name__}: {e} (run with --debug for details)", file=sys.stderr
        )
        return EXIT_INTERNAL
    return EXIT_OK
