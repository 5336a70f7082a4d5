"""gpumon's settings, each defined once: its TOML key, type, range, default, flag and variable.

`Config` below is the one definition. The TOML loader, the environment variables, the command
line's flags (gpumon.cli.flags) and `gpumon serve --check-config` all read their types, ranges
and defaults from it, so a value is accepted or refused the same way wherever it comes from.

Precedence for `gpumon serve`, highest first: flags, environment variables (GPUMON_*), the TOML
file (--config, or GPUMON_CONFIG, or /etc/gpumon/gpumon.toml when it exists), the defaults.
docs/configuration.md lists every setting (a test keeps the two in step).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, TypeVar

from gpumon.core.errors import EXIT_CONFIG, GpumonError
from gpumon.core.files import NotRegularFile, read_regular
from gpumon.detect.thresholds import Thresholds, threshold_limits

DEFAULT_PORT = 9877
"""No GPU exporter uses it (dcgm-exporter 9400, mindprince 9445, nvidia-smi exporter 9454,
nvidia_gpu_exporter 9835, nvitop-exporter 8000)."""
DEFAULT_CONFIG_PATH = "/etc/gpumon/gpumon.toml"
MIN_INTERVAL_S = 0.05
"""The shortest sampling interval: 20 ticks a second already costs far more than the detector
gains (NVML's finest utilization period is 1/6 s)."""


class ConfigError(GpumonError):
    exit_code = EXIT_CONFIG


class SettingError(ValueError):
    """A value that does not fit its setting; the caller adds where it came from."""


class Spec(NamedTuple):
    """How one setting is given and checked (beside its type and default on the Config field)."""

    help: str
    flag: str | None = None
    env: str | None = None
    metavar: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""
    choices: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None
    """Raises SettingError(reason) for a value of the right type that is still wrong."""
    reloads: bool = False
    """`gpumon serve` applies a new value on SIGHUP; otherwise the value it started with holds
    until a restart (a reload that changes it says so in the log)."""


T = TypeVar("T")


def setting(default: T, spec: Spec) -> T:
    """A Config field: its default and its Spec, in one place."""
    return field(default=default, metadata={"spec": spec})


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); `[::1]:9877` for IPv6; an empty host means every interface.
    HOST is an IPv4 address, an IPv6 address in brackets, `*`, or a host name (RFC 1123)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise SettingError(
            f"expected HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT} or :{DEFAULT_PORT}), got {text!r}"
        )
    if host.startswith("[") != host.endswith("]"):
        raise SettingError(f"an IPv6 address goes in brackets, e.g. [::1]:{DEFAULT_PORT}; got {text!r}")
    bracketed = host.startswith("[")
    host = host.removeprefix("[").removesuffix("]")
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SettingError(
                f"not an IPv6 address in brackets: [{host}] (e.g. [::1]:{DEFAULT_PORT})"
            ) from None
    elif ":" in host:
        raise SettingError(f"an IPv6 address goes in brackets, e.g. [::1]:{DEFAULT_PORT}; got {text!r}")
    elif host and host != "*" and re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise SettingError(f"not an IPv4 address: {host!r}") from None
    elif host and host != "*":
        labels = host.removesuffix(".").split(".")
        if len(host) > 253 or not all(_HOST_LABEL.match(x) for x in labels) or labels[-1].isdigit():
            raise SettingError(f"not an address or a host name: {host!r}")
    if not (port.isascii() and port.isdigit()):
        raise SettingError(f"port must be a number, got {port!r}")
    number = int(port)
    if not 0 <= number <= 65535:
        raise SettingError(f"port must be 0-65535, got {number}")
    return host, number


def _check_listen(value: str) -> None:
    parse_listen(value)


def _check_directory(value: str) -> None:
    """A directory, or nothing yet (made later, by a prolog or the recorder)."""
    if os.path.exists(value) and not os.path.isdir(value):
        raise SettingError(f"{value}: not a directory")


def _check_scenarios(value: str) -> None:
    from gpumon.sim.scenarios import SCENARIOS  # only when --simulate is given

    names = [n.strip() for n in value.split(",")]
    if not value.strip() or not all(names):
        raise SettingError(f"empty scenario name in {value!r}; see 'gpumon scenarios'")
    for n in names:
        if n not in SCENARIOS:
            raise SettingError(f"unknown scenario {n!r}; known: {', '.join(SCENARIOS)}")


def _check_readable_file(value: str) -> None:
    if not os.path.exists(value):
        raise SettingError(f"{value}: no such file")
    if not os.path.isfile(value):
        raise SettingError(f"{value}: not a regular file")
    if not os.access(value, os.R_OK):
        raise SettingError(f"{value}: not readable (permission denied)")


def _check_drive_file(value: str) -> None:
    if not os.path.exists(value):
        raise SettingError(
            f"{value}: no such file: start the job first (gpumon bench --drive {value}), "
            f"or create it empty to wait for one (touch {value})"
        )
    _check_readable_file(value)
    try:
        head = read_regular(value, 64)[:64]
    except OSError as e:
        raise SettingError(f"{value}: cannot read: {e.strerror}") from None
    if head and not head.startswith((b"# gpumon-drive v1", b"# gpumon-drive v2")):  # v2: ranks
        raise SettingError(f"{value}: not a drive file (written by gpumon bench --drive)")


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Config:
    """The daemon's settings, from the file, the environment and the flags (`load`), each checked."""

    listen: str = setting(
        f":{DEFAULT_PORT}",
        Spec(
            "where to serve, HOST:PORT; an empty host is every interface (IPv4 and IPv6), "
            f"[::1]:{DEFAULT_PORT} an IPv6 address",
            flag="--listen",
            env="GPUMON_LISTEN",
            metavar="HOST:PORT",
            check=_check_listen,
        ),
    )
    interval_s: float = setting(
        1.0,
        Spec(
            "sampling interval",
            flag="--interval",
            env="GPUMON_INTERVAL",
            metavar="SECONDS",
            minimum=MIN_INTERVAL_S,
            maximum=3600.0,
            unit="s",
        ),
    )
    window_s: float = setting(
        300.0,
        Spec(
            "history kept per GPU (at least twice the detector's window)",
            env="GPUMON_WINDOW",
            minimum=10.0,
            maximum=86400.0,
            unit="s",
        ),
    )
    web_config_file: str | None = setting(
        None,
        Spec(
            "TLS and basic auth, in Prometheus exporter-toolkit's format",
            flag="--web-config-file",
            env="GPUMON_WEB_CONFIG_FILE",
            metavar="FILE",
            check=_check_readable_file,
            reloads=True,
        ),
    )
    simulate: str | None = setting(
        None,
        Spec(
            "simulated GPUs following these scenarios, cycled over the GPUs (see 'gpumon scenarios')",
            flag="--simulate",
            env="GPUMON_SIMULATE",
            metavar="SCENARIO[,SCENARIO...]",
            check=_check_scenarios,
        ),
    )
    gpus: int | None = setting(
        None,
        Spec(
            "number of simulated GPUs (default: one per scenario given)",
            flag="--gpus",
            env="GPUMON_GPUS",
            metavar="N",
            minimum=1,
            maximum=1024,
        ),
    )
    seed: int = setting(
        0,
        Spec(
            "seed of the simulation; the same seed gives the same run",
            flag="--seed",
            env="GPUMON_SEED",
            metavar="S",
            minimum=0,
            maximum=2**63 - 1,
        ),
    )
    sample_period_s: float = setting(
        1 / 6,
        Spec(
            "simulated driver's utilization sample period, as NVML's: 1/6 to 1",
            flag="--sample-period",
            env="GPUMON_SAMPLE_PERIOD",
            metavar="SECONDS",
            minimum=1 / 6,
            maximum=1.0,
            unit="s",
        ),
    )
    replay: str | None = setting(
        None,
        Spec(
            "play back a recorded trace",
            flag="--replay",
            env="GPUMON_REPLAY",
            metavar="FILE",
            check=_check_readable_file,
        ),
    )
    drive: str | None = setting(
        None,
        Spec(
            "one simulated GPU, busy while a job's train steps run (gpumon bench --drive FILE)",
            flag="--drive",
            env="GPUMON_DRIVE",
            metavar="FILE",
            check=_check_drive_file,
        ),
    )
    gpm: bool = setting(
        True,
        Spec(
            "read GPM (SM activity, occupancy, tensor, DRAM, ...; Hopper and newer) where the GPU "
            "supports it; false leaves GPM's counters to profilers (Nsight Compute, DCGM profiling) "
            "and MIG instances without activity",
            env="GPUMON_GPM",
        ),
    )
    job_attribution: bool = setting(
        True,
        Spec(
            "name the job holding each GPU (docs/fleet.md): from jobs_dir, dcgm_job_mapping_dir and "
            "the GPU processes' cgroups",
            env="GPUMON_JOB_ATTRIBUTION",
        ),
    )
    jobs_dir: str = setting(
        "/run/gpumon/jobs",
        Spec(
            "where gpumon's Slurm prolog writes which job holds which GPU",
            env="GPUMON_JOBS_DIR",
            metavar="DIR",
            check=_check_directory,
        ),
    )
    dcgm_job_mapping_dir: str | None = setting(
        None,
        Spec(
            "dcgm-exporter's --hpc-job-mapping-dir (files named by GPU index, a job id per line), "
            "for sites whose prolog already writes it",
            env="GPUMON_DCGM_JOB_MAPPING_DIR",
            metavar="DIR",
            check=_check_directory,
        ),
    )
    kubernetes: str = setting(
        "auto",
        Spec(
            "pod attribution through the kubelet's pod-resources API: auto (when its socket exists "
            "at start), on, or off",
            env="GPUMON_KUBERNETES",
            choices=("auto", "on", "off"),
        ),
    )
    kubelet_socket: str = setting(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        Spec("the kubelet's pod-resources socket", env="GPUMON_KUBELET_SOCKET", metavar="PATH"),
    )
    kubelet_refresh_s: float = setting(
        10.0,
        Spec(
            "how often the kubelet is asked which pod holds which GPU (on a timer, never on a scrape)",
            env="GPUMON_KUBELET_REFRESH",
            minimum=1.0,
            maximum=3600.0,
            unit="s",
        ),
    )
    nvml_call_timeout_s: float = setting(
        1.0,
        Spec(
            "longest wait on one GPU's NVML calls before it is marked unavailable",
            env="GPUMON_NVML_CALL_TIMEOUT",
            minimum=0.05,
            maximum=60.0,
            unit="s",
        ),
    )
    nvml_stale_s: float = setting(
        60.0,
        Spec(
            "NVML without fresh data this long: /healthz fails; if it had given data (a hang, a lost "
            "driver), the systemd watchdog pings stop too, so the service is restarted",
            env="GPUMON_NVML_STALE",
            minimum=1.0,
            maximum=86400.0,
            unit="s",
            reloads=True,
        ),
    )
    max_connections: int = setting(
        4096,
        Spec(
            "open HTTP connections; at the limit, the one that has waited longest without sending a "
            "whole request is closed to make room",
            env="GPUMON_MAX_CONNECTIONS",
            minimum=1,
            maximum=65536,
        ),
    )
    request_timeout_s: float = setting(
        10.0,
        Spec(
            "the deadline for a request's whole head (and a TLS handshake, and a new connection's "
            "first request)",
            env="GPUMON_REQUEST_TIMEOUT",
            minimum=0.1,
            maximum=3600.0,
            unit="s",
        ),
    )
    keepalive_timeout_s: float = setting(
        75.0,
        Spec(
            "how long a connection that has been served may wait idle for its next request (a "
            "scraper's keep-alive: Prometheus reuses its connection between scrapes)",
            env="GPUMON_KEEPALIVE_TIMEOUT",
            minimum=0.1,
            maximum=3600.0,
            unit="s",
        ),
    )
    record: str = setting(
        "auto",
        Spec(
            "the flight recorder: every sample kept on disk, compressed, for `gpumon analyze --from` "
            "(docs/recorder.md): auto (on for real GPUs; for simulated or replayed ones only when "
            "record_dir is set), on, or off",
            flag="--record",
            env="GPUMON_RECORD",
            choices=("auto", "on", "off"),
        ),
    )
    record_dir: str | None = setting(
        None,
        Spec(
            "where the recorder writes its segments (default: $STATE_DIRECTORY/recordings under "
            "systemd, else /var/lib/gpumon/recordings as root, else ~/.local/state/gpumon/recordings)",
            flag="--record-dir",
            env="GPUMON_RECORD_DIR",
            metavar="DIR",
            check=_check_directory,
        ),
    )
    record_segment_s: float = setting(
        3600.0,
        Spec(
            "the recorder starts a new segment file this often (of the samples' time)",
            env="GPUMON_RECORD_SEGMENT",
            minimum=10.0,
            maximum=86400.0,
            unit="s",
        ),
    )
    record_max_age_s: float = setting(
        7 * 86400.0,
        Spec(
            "segments whose samples are all older than this are deleted, oldest first",
            env="GPUMON_RECORD_MAX_AGE",
            minimum=60.0,
            maximum=366 * 86400.0,
            unit="s",
        ),
    )
    record_max_bytes: int = setting(
        2_000_000_000,
        Spec(
            "the recorder's segments together stay under this many bytes: the oldest go first",
            env="GPUMON_RECORD_MAX_BYTES",
            minimum=1_000_000,
            maximum=2**50,
        ),
    )
    analysis_max_range_s: float = setting(
        86400.0,
        Spec(
            "the longest range /api/v1/analysis analyzes in one request (gpumon analyze --from has no limit)",
            env="GPUMON_ANALYSIS_MAX_RANGE",
            minimum=60.0,
            maximum=366 * 86400.0,
            unit="s",
            reloads=True,
        ),
    )
    analysis_timeout_s: float = setting(
        120.0,
        Spec(
            "an /api/v1/analysis request that takes longer is stopped (it runs niced, in its own process)",
            env="GPUMON_ANALYSIS_TIMEOUT",
            minimum=1.0,
            maximum=3600.0,
            unit="s",
            reloads=True,
        ),
    )
    log_level: str = setting(
        "info",
        Spec("how much to log", flag="--log-level", env="GPUMON_LOG_LEVEL", choices=LOG_LEVELS, reloads=True),
    )
    thresholds: Thresholds = field(default_factory=Thresholds)
    source_path: str | None = field(default=None, compare=False)
    """Where the file part came from (for messages)."""

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


def _base_type(hint: Any) -> type:
    """`float`, `int | None` -> float, int."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(inner)
    assert isinstance(hint, type), hint
    return hint


class Setting(NamedTuple):
    key: str
    kind: type
    default: Any
    spec: Spec

    @property
    def flag(self) -> str | None:
        return self.spec.flag

    def describe_range(self) -> str:
        s = self.spec
        unit = f" {s.unit}" if s.unit else ""
        if s.minimum is not None and s.maximum is not None:
            return f"between {_fmt(s.minimum)} and {_fmt(s.maximum)}{unit}"
        if s.minimum is not None:
            return f">= {_fmt(s.minimum)}{unit}"
        if self.kind is bool:
            return "true or false"
        return ""

    def parse(self, value: Any) -> Any:
        """A value from TOML (typed) or from a flag or variable (text) -> the setting's type.
        Raises SettingError(reason)."""
        kind, s = self.kind, self.spec
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in (
                "true",
                "1",
                "yes",
                "on",
                "false",
                "0",
                "no",
                "off",
            ):
                return value.strip().lower() in ("true", "1", "yes", "on")
            raise SettingError(f"must be true or false, got {value!r}")
        if kind is str:
            if not isinstance(value, str):
                raise SettingError(f"must be a string, got {value!r}")
            if s.choices and value not in s.choices:
                raise SettingError(f"must be {', '.join(s.choices[:-1])} or {s.choices[-1]}, got {value!r}")
            if not value.strip():
                raise SettingError("must not be empty")
        else:
            value = _number(value, kind)
            if not math.isfinite(value):
                raise SettingError(f"must be a finite number, got {value}")
            low, high = s.minimum, s.maximum
            if (low is not None and value < low - 1e-12) or (high is not None and value > high + 1e-12):
                raise SettingError(f"must be {self.describe_range()}, got {_fmt(value)}")
        if s.check is not None:
            s.check(value)
        return value


def _number(value: Any, kind: type) -> Any:
    what = "a whole number" if kind is int else "a number"
    if isinstance(value, bool):
        raise SettingError(f"must be {what}, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii():  # int() and float() read other scripts' digits: "١" is 1
            raise SettingError(f"must be {what} in ASCII digits, got {value!r}")
        try:
            if kind is int:
                return int(text)
            if "/" in text:  # 1/6, as the sample period is usually written
                num, _, den = text.partition("/")
                return float(num) / float(den)
            return float(text)
        except (ValueError, ZeroDivisionError, OverflowError):
            raise SettingError(f"must be {what}, got {value!r}") from None
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            raise SettingError(f"must be a finite number, got {value}") from None
    raise SettingError(f"must be {what}, got {value!r}")


def _fmt(x: float) -> str:
    if isinstance(x, float) and abs(x - 1 / 6) < 1e-9:
        return "1/6"
    if isinstance(x, int):
        return str(x)
    return f"{x:g}"


def _settings() -> dict[str, Setting]:
    hints = typing.get_type_hints(Config)
    out = {}
    for f in fields(Config):
        spec = f.metadata.get("spec")
        if spec is not None:
            out[f.name] = Setting(f.name, _base_type(hints[f.name]), f.default, spec)
    return out


SETTINGS: Mapping[str, Setting] = _settings()
"""Every setting by TOML key, in the order of Config's fields."""
BY_ENV: Mapping[str, Setting] = {s.spec.env: s for s in SETTINGS.values() if s.spec.env}


# -- loading -------------------------------------------------------------------------------------


MAX_CONFIG_BYTES = 1024 * 1024
"""gpumon's whole configuration is a few KB: a larger file is not one (/dev/zero never ends)."""


def _read_toml(path: str) -> dict[str, Any]:
    try:
        # a regular file only: a FIFO would block the start (and a SIGHUP, and the SIGTERM after)
        data = read_regular(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except NotRegularFile as e:
        raise ConfigError(f"{path}: a {e.kind}, not a config file (name a TOML file)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB: not a gpumon config file")
    if b"\0" in data:
        raise ConfigError(f"{path}: a binary file, not a TOML config file")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a BOM, as some editors write: as YAML's
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (TOML files are UTF-8)") from None
    import tomllib  # only when there is a file: most daemons start without one

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a gpumon config file: nested too deeply") from None


def parse_threshold(key: str, value: Any) -> tuple[str, float | int]:
    """One threshold override (TOML or `--threshold K=V`) -> (name, typed value). Raises
    SettingError naming the key when it is unknown or its value does not fit."""
    limits = threshold_limits()
    name = key.strip().replace("-", "_")
    if name not in limits:
        raise SettingError(f"unknown threshold {key!r}; known: {', '.join(sorted(limits))}")
    kind, low, high = limits[name]
    try:
        number = _number(value, kind)
    except SettingError as e:
        raise SettingError(f"threshold {name} {e}") from None
    if not math.isfinite(number):
        raise SettingError(f"threshold {name} must be a finite number, got {number}")
    if not low <= number <= high:
        raise SettingError(
            f"threshold {name} must be between {_fmt(low)} and {_fmt(high)}, got {_fmt(number)}"
        )
    return name, number


def make_thresholds(overrides: Mapping[str, Any]) -> Thresholds:
    """Thresholds with these overrides (raw values, parsed here); SettingError names the key."""
    values: dict[str, Any] = dict(parse_threshold(k, v) for k, v in overrides.items())
    try:
        return Thresholds(**values)
    except ValueError as e:
        raise SettingError(str(e)) from None


def load(path: str | None, env: Mapping[str, str], flags: Mapping[str, Any]) -> Config:
    """File, then environment, then flags (each over the one before), then the checks that span
    several settings. Flags must already be parsed (argparse does it with the same Settings);
    a flag left out is None or absent."""
    explicit = path or env.get("GPUMON_CONFIG")
    file_path = explicit or (DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    thresholds: dict[str, Any] = {}
    if file_path is not None:
        for key, value in _read_toml(file_path).items():
            if key == "thresholds":
                if not isinstance(value, dict):
                    raise ConfigError(f"{file_path}: [thresholds] must be a table")
                thresholds.update(value)
                continue
            s = SETTINGS.get(key)
            if s is None:
                known = ", ".join(SETTINGS)
                raise ConfigError(f"{file_path}: unknown key {key!r}; known: {known}, [thresholds]")
            try:
                values[key] = s.parse(value)
            except SettingError as e:
                raise ConfigError(f"{file_path}: {key}: {e}") from None
            origin[key] = f"{file_path}: {key}"
    for name, s in BY_ENV.items():
        text = env.get(name)
        if text:
            try:
                values[s.key] = s.parse(text)
            except SettingError as e:
                raise ConfigError(f"environment {name} ({s.key}): {e}") from None
            origin[s.key] = f"environment {name} ({s.key})"
    for key, value in flags.items():
        if value is not None:
            values[key] = value
            origin[key] = f"flag {SETTINGS[key].flag}"
    where = file_path or "configuration"
    try:
        th = make_thresholds(thresholds)
    except SettingError as e:
        raise ConfigError(f"{where}: [thresholds]: {e}") from None
    cfg = Config(**values, thresholds=th, source_path=file_path)
    try:
        check_sources(cfg, name=lambda key: key)
    except CombinationError as e:
        raise ConfigError(f"{origin.get(e.key, where)}: {e}") from None
    if cfg.window_s < 2 * cfg.thresholds.window_s:
        raise ConfigError(
            f"{origin.get('window_s', where)}: window_s {cfg.window_s:g} must be at least twice the "
            f"detector's window ({cfg.thresholds.window_s:g} s)"
        )
    return cfg


class CombinationError(SettingError):
    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def check_sources(cfg: Config, name: Callable[[str], str]) -> None:
    """The rules that span the source settings. `name` renders a setting as the user gave it
    (the key in a file, the flag on the command line); CombinationError says which one is wrong."""
    chosen = [k for k in ("simulate", "replay", "drive") if getattr(cfg, k) is not None]
    if len(chosen) > 1:
        raise CombinationError(chosen[1], f"{name(chosen[0])} and {name(chosen[1])} cannot both be set")
    if cfg.gpus is not None:
        if cfg.simulate is None:
            raise CombinationError(
                "gpus", f"{name('gpus')} needs {name('simulate')} (real GPUs are counted, not chosen)"
            )
        n = len(cfg.simulate.split(","))
        if cfg.gpus < n:
            raise CombinationError(
                "gpus", f"{name('gpus')} {cfg.gpus} is fewer than the {n} scenarios of {name('simulate')}"
            )
