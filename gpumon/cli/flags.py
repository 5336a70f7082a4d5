"""The flags several commands share, built from the one definition of each setting
(gpumon.config.settings): the same types, ranges and messages as the TOML file and the environment."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from gpumon.cli import terminated_early
from gpumon.collect.pipeline import AttributionSpec, Pipeline, SourceSpec
from gpumon.config import sources as config_sources
from gpumon.config.settings import (
    LOG_LEVELS,
    SETTINGS,
    CombinationError,
    Config,
    Setting,
    SettingError,
    Spec,
    check_sources,
    make_thresholds,
    parse_threshold,
)
from gpumon.core import timepoints
from gpumon.core.clock import Clock, MonotonicClock, ScaledClock, VirtualClock
from gpumon.core.errors import UsageError
from gpumon.detect.thresholds import Thresholds

SOURCE_KEYS = ("simulate", "replay", "drive", "gpus", "seed", "sample_period_s")

# Flags of the command line only (not serve settings), defined the same way.
DURATION = Setting(
    "duration",
    float,
    None,
    Spec(
        "stop after this long (default: until Ctrl-C or SIGTERM)",
        "--duration",
        metavar="SECONDS",
        minimum=0.001,
        maximum=10 * 365 * 86400.0,
        unit="s",
    ),
)
SPEED = Setting(
    "speed",
    float,
    1.0,
    Spec(
        "simulate or replay FACTOR times faster than real time, or 'max' for as fast as possible",
        "--speed",
        metavar="FACTOR|max",
        minimum=0.001,
        maximum=1e6,
    ),
)


def setting_type(s: Setting) -> Callable[[str], Any]:
    """An argparse type: the setting's own parser; argparse names the flag in its error (exit 2)."""

    def parse(text: str) -> Any:
        try:
            return s.parse(text)
        except SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = s.key  # what argparse calls the value in its messages
    return parse


def add_setting(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    s: Setting,
    *,
    from_config: bool = False,
    flag: str | None = None,
    **kw: Any,
) -> None:
    """A flag for setting `s`, parsed by the setting itself. `from_config`: for `serve`, where a
    flag overrides the file and environment only when given (its default is None)."""
    spec = s.spec
    name = flag or spec.flag
    assert name is not None, s.key
    kw.setdefault("dest", s.key)
    kw.setdefault("default", None if from_config else s.default)
    kw.setdefault("type", setting_type(s))
    kw.setdefault("metavar", spec.metavar)
    if "help" not in kw:
        shown = f" (default {s.default:g})" if isinstance(s.default, float) else ""
        kw["help"] = spec.help + (f"; {s.describe_range()}" if s.describe_range() else "") + shown
    p.add_argument(name, **kw)


def add_common(p: argparse.ArgumentParser, *, top: bool) -> None:
    """On the top level and on each command, so they work before or after the command's name."""
    default: Any = None if top else argparse.SUPPRESS
    p.add_argument("--log-level", default=default, choices=LOG_LEVELS, help="(default warning; serve: info)")
    p.add_argument(
        "--debug",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="show tracebacks of internal errors",
    )


def add_source_flags(p: argparse.ArgumentParser, *, speed: bool, from_config: bool = False) -> None:
    g = p.add_argument_group("what to sample (default: this machine's GPUs through NVML)")
    which = g.add_mutually_exclusive_group()
    for key in ("simulate", "replay", "drive"):
        add_setting(which, SETTINGS[key], from_config=from_config)
    for key in ("gpus", "seed", "sample_period_s"):
        add_setting(g, SETTINGS[key], from_config=from_config)
    if speed:
        add_setting(
            g,
            SPEED,
            help="simulate or replay FACTOR times faster than real time (0.001 to 1e6), or 'max' "
            "for as fast as possible (default 1)",
            type=_speed_type,
        )


def _speed_type(text: str) -> float:
    if text == "max":
        return float("inf")
    return setting_type(SPEED)(text)  # type: ignore[no-any-return]


def add_interval(
    p: argparse.ArgumentParser, *, from_config: bool = False, what: str = "time between ticks"
) -> None:
    s = SETTINGS["interval_s"]
    add_setting(p, s, from_config=from_config, help=f"{what}; {s.describe_range()} (default {s.default:g})")


def add_duration(p: argparse.ArgumentParser) -> None:
    add_setting(p, DURATION)


def add_threshold(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        action="append",
        type=_threshold_item,
        metavar="KEY=VALUE",
        help="override a detector threshold, e.g. fed_duty=0.85 (repeatable; docs/detector.md lists them)",
    )


def _threshold_item(text: str) -> tuple[str, float | int]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. fed_duty=0.85; got {text!r}")
    try:
        return parse_threshold(key, value)
    except SettingError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_threshold_item.__name__ = "threshold"


def thresholds(args: argparse.Namespace) -> Thresholds:
    """The detector's thresholds with the --threshold overrides (parsed by argparse already)."""
    try:
        return make_thresholds(dict(args.threshold or []))
    except SettingError as e:
        raise UsageError(f"--threshold: {e}") from None


def _flag_name(key: str) -> str:
    return SETTINGS[key].flag or key


def source_spec(args: argparse.Namespace) -> SourceSpec:
    """The source flags, checked together as the serve configuration is."""
    values = {k: getattr(args, k) for k in SOURCE_KEYS if getattr(args, k, None) is not None}
    try:
        cfg = Config(**values)
        check_sources(cfg, name=_flag_name)
    except CombinationError as e:
        raise UsageError(str(e)) from None
    return config_sources.source_spec(cfg)


def clock_for(args: argparse.Namespace, spec: SourceSpec) -> Clock:
    speed = getattr(args, "speed", 1.0)
    if speed == 1.0:
        return MonotonicClock()
    if spec.real_time_only:
        raise UsageError("--speed needs --simulate or --replay: real GPUs and driven ones run in real time")
    return VirtualClock() if speed == float("inf") else ScaledClock(speed)


class Interrupted(Exception):
    """SIGINT or SIGTERM: stop cleanly, keep what was recorded."""


@dataclass
class RunResult:
    """How a command's run ended."""

    interrupted: bool


def run_until_done(pipeline: Pipeline, duration_s: float | None) -> RunResult:
    """Run the pipeline on its own thread while this one waits for it, or for Ctrl-C or SIGTERM;
    a signal stops the loop between ticks (never in the middle of one), so every sink (a trace
    file) ends whole."""
    if terminated_early():  # SIGTERM during start-up, its exception swallowed on the way
        return RunResult(True)
    stop = threading.Event()
    _RUNNING.append(stop)
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            pipeline.run(duration_s, stop)
        except BaseException as e:  # raised again in the main thread
            errors.append(e)

    worker = threading.Thread(target=loop, name="gpumon-loop", daemon=True)
    interrupted = False
    with _RaiseOnSignals():
        worker.start()
        try:
            while worker.is_alive():
                worker.join(3600)  # interruptible: a signal's handler raises here
        except Interrupted:
            interrupted = True
    _RUNNING.remove(stop)
    interrupted = interrupted or stop.is_set()
    if interrupted:
        stop.set()
        worker.join(10)
    if errors:
        raise errors[0]
    return RunResult(interrupted)


_RUNNING: list[threading.Event] = []


def note_swallowed(signal_name: str) -> None:
    """A signal whose Interrupted was raised inside a finalizer and swallowed there (gpumon.cli's
    unraisable hook calls this): stop the running loop as the signal asked, and exit 130."""
    _LATE_SIGNALS.append(signal_name)
    for stop in list(_RUNNING):
        stop.set()


_LATE_SIGNALS: list[str] = []


def interrupted_late() -> bool:
    """Whether SIGINT or SIGTERM came after the loop ended, while the command was closing its
    files: noted (the file is ended whole, not cut by a KeyboardInterrupt), and the command then
    exits 130 as if it had come a moment earlier."""
    return bool(_LATE_SIGNALS)


class _RaiseOnSignals:
    """While the loop runs, a signal raises Interrupted in the waiting thread; once it ends, a
    signal is only noted (interrupted_late), so what follows (closing a trace) is never cut."""

    def __enter__(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            raise Interrupted(signal.Signals(signum).name)

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, handler)

    def __exit__(self, *exc: object) -> None:
        def note(signum: int, frame: FrameType | None) -> None:
            _LATE_SIGNALS.append(signal.Signals(signum).name)

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, note)


def time_point(text: str) -> float:
    """An argparse type: a point in time (gpumon.core.timepoints), its message on a bad one."""
    try:
        return timepoints.time_point(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def attribution() -> AttributionSpec:
    """Where commands other than `serve` read which job holds which GPU: the serve settings'
    defaults, and the same variables (GPUMON_JOBS_DIR, GPUMON_DCGM_JOB_MAPPING_DIR); never the
    kubelet (only the daemon keeps a connection to it)."""

    cfg = Config(
        jobs_dir=os.environ.get("GPUMON_JOBS_DIR") or str(SETTINGS["jobs_dir"].default),
        dcgm_job_mapping_dir=os.environ.get("GPUMON_DCGM_JOB_MAPPING_DIR") or None,
        kubernetes="off",
    )
    spec = config_sources.attribution_spec(cfg)
    assert spec is not None  # job_attribution is on by default
    return spec


def add_trace_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        dest="trace_format",
        type=int,
        choices=[1, 2, 3],
        default=None,
        help="trace format version (docs/trace-format.md): 3, compact and gzipped (default), 2, as 3 "
        "with field names in full (for gpumon 0.1 before 2026-12), or 1, plain JSON Lines (the default "
        "for a FILE ending in .jsonl)",
    )
