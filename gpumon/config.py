"""`gpumon serve` configuration: a TOML file, environment variables and flags.

Precedence, highest first: command-line flags, environment variables (GPUMON_*), the TOML file
(--config, or GPUMON_CONFIG, or /etc/gpumon/gpumon.toml when it exists), built-in defaults.
docs/configuration.md lists every key; `gpumon serve --check-config` validates without starting.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpumon.detector.config import Thresholds
from gpumon.errors import EXIT_CONFIG, GpumonError

DEFAULT_PORT = 9877
"""No GPU exporter uses it (dcgm-exporter 9400, mindprince 9445, nvidia-smi exporter 9454,
nvidia_gpu_exporter 9835, nvitop-exporter 8000)."""
DEFAULT_CONFIG_PATH = "/etc/gpumon/gpumon.toml"


class ConfigError(GpumonError):
    exit_code = EXIT_CONFIG


@dataclass(frozen=True)
class Config:
    listen: str = f":{DEFAULT_PORT}"
    """HOST:PORT to serve on; an empty host means every interface."""
    interval_s: float = 1.0
    window_s: float = 300.0
    web_config_file: str | None = None
    """exporter-toolkit style YAML: tls_server_config, basic_auth_users (bcrypt hashes)."""
    simulate: str | None = None
    gpus: int | None = None
    seed: int = 0
    sample_period_s: float = 1 / 6
    replay: str | None = None
    drive: str | None = None
    """One simulated GPU driven by a job's train steps (`gpumon bench --drive FILE`)."""
    nvml_call_timeout_s: float = 1.0
    max_connections: int = 64
    request_timeout_s: float = 10.0
    log_level: str = "info"
    thresholds: Thresholds = field(default_factory=Thresholds)
    source_path: str | None = None
    """Where the file part came from (for messages)."""

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


_KEYS = {f.name for f in fields(Config)} - {"thresholds", "source_path"}
_ENV = {
    "GPUMON_LISTEN": "listen",
    "GPUMON_INTERVAL": "interval_s",
    "GPUMON_WEB_CONFIG_FILE": "web_config_file",
    "GPUMON_SIMULATE": "simulate",
    "GPUMON_LOG_LEVEL": "log_level",
}
_TYPES: dict[str, type] = {
    "listen": str,
    "interval_s": float,
    "window_s": float,
    "web_config_file": str,
    "simulate": str,
    "gpus": int,
    "seed": int,
    "sample_period_s": float,
    "replay": str,
    "nvml_call_timeout_s": float,
    "max_connections": int,
    "request_timeout_s": float,
    "log_level": str,
}


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ConfigError(
            f"listen: expected HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT} or :{DEFAULT_PORT}), got {text!r}"
        )
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"listen: port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"listen: port must be 0-65535, got {number}")
    return host, number


def _coerce(key: str, value: Any, where: str) -> Any:
    kind = _TYPES[key]
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise ConfigError(
        f"{where}: {key} must be {'a number' if kind is not str else 'a string'}, got {value!r}"
    )


def _validate(cfg: Config, where: str) -> Config:
    try:
        parse_listen(cfg.listen)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    for key, low in (
        ("interval_s", 0.05),
        ("window_s", 5.0),
        ("nvml_call_timeout_s", 0.05),
        ("request_timeout_s", 0.1),
    ):
        if getattr(cfg, key) < low:
            raise ConfigError(f"{where}: {key} must be >= {low:g}, got {getattr(cfg, key)}")
    if cfg.max_connections < 1:
        raise ConfigError(f"{where}: max_connections must be >= 1")
    if cfg.log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{where}: log_level must be debug, info, warning or error, got {cfg.log_level!r}")
    if cfg.simulate and cfg.replay:
        raise ConfigError(f"{where}: simulate and replay cannot both be set")
    if not 1 / 6 - 1e-9 <= cfg.sample_period_s <= 1.0:
        raise ConfigError(f"{where}: sample_period_s must be between 1/6 and 1")
    if cfg.web_config_file is not None and not os.path.isfile(cfg.web_config_file):
        raise ConfigError(f"{where}: web_config_file {cfg.web_config_file!r} does not exist")
    return cfg


def load(path: str | None, env: dict[str, str], flags: dict[str, Any]) -> Config:
    """File, then environment, then flags (each over the one before)."""
    explicit = path or env.get("GPUMON_CONFIG")
    file_path = explicit or (DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None)
    values: dict[str, Any] = {}
    thresholds: dict[str, Any] = {}
    if file_path is not None:
        try:
            with open(file_path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{file_path}: no such config file") from None
        except OSError as e:
            raise ConfigError(f"{file_path}: cannot read: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{file_path}: not valid TOML: {e}") from None
        for key, value in doc.items():
            if key == "thresholds":
                if not isinstance(value, dict):
                    raise ConfigError(f"{file_path}: [thresholds] must be a table")
                thresholds.update(value)
            elif key in _KEYS:
                values[key] = _coerce(key, value, file_path)
            else:
                raise ConfigError(
                    f"{file_path}: unknown key {key!r}; known: {', '.join(sorted(_KEYS))}, [thresholds]"
                )
    for name, key in _ENV.items():
        if env.get(name):
            values[key] = _coerce(key, env[name], f"environment {name}")
    for key, value in flags.items():
        if value is not None:
            values[key] = value
    where = file_path or "configuration"
    known = {f.name for f in fields(Thresholds)}
    for key in thresholds:
        if key not in known:
            raise ConfigError(f"{where}: unknown threshold {key!r}; known: {', '.join(sorted(known))}")
    try:
        th = Thresholds(**thresholds)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: [thresholds]: {e}") from None
    cfg = replace(Config(), **values, thresholds=th, source_path=file_path)
    return _validate(cfg, where)
