"""`gpumon serve`: the Prometheus exporter daemon. Its settings come from the file, the
environment and these flags (gpumon.config.settings); `--check-config` runs every check the start runs."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from gpumon.cli import flags
from gpumon.collect.pipeline.spec import SourceDescription
from gpumon.config import settings as config_mod
from gpumon.config.settings import SETTINGS, Config, ConfigError
from gpumon.core.errors import EXIT_OK, GpumonError

FLAG_KEYS = (
    "listen",
    "interval_s",
    "web_config_file",
    "record",
    "record_dir",
    *flags.SOURCE_KEYS,
    "log_level",
)


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "serve",
        parents=[common],
        help="the Prometheus exporter daemon: /metrics, /api/v1/state, /healthz",
        allow_abbrev=False,  # --record must never be read as --record-dir
    )
    s.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration (default: $GPUMON_CONFIG, else /etc/gpumon/gpumon.toml if present)",
    )
    flags.add_setting(s, SETTINGS["listen"], from_config=True)
    flags.add_interval(s, from_config=True, what="sampling interval")
    flags.add_setting(s, SETTINGS["web_config_file"], from_config=True)
    s.add_argument(
        "--check-config",
        action="store_true",
        help="run every check the start runs (file, environment, flags, web config, trace or drive "
        "file), then exit",
    )
    flags.add_setting(s, SETTINGS["record"], from_config=True)
    flags.add_setting(s, SETTINGS["record_dir"], from_config=True)
    flags.add_source_flags(s, speed=True, from_config=True)
    flags.add_duration(s)
    s.set_defaults(func=run)


def load(args: argparse.Namespace) -> Config:
    given = {k: getattr(args, k, None) for k in FLAG_KEYS}
    return config_mod.load(args.config, dict(os.environ), given)


def check(cfg: Config) -> SourceDescription:
    """What the start would refuse, short of binding the port itself (a running daemon holds it)
    and reading NVML (a daemon waits for a missing driver): the listening address (that this
    machine has it), the web config with its TLS files, and a replay or drive source."""
    from gpumon.collect.pipeline import open_sources
    from gpumon.config.sources import source_spec
    from gpumon.core.clock import VirtualClock
    from gpumon.core.problems import Problems
    from gpumon.serve.webconfig import load_web_config

    _check_address(cfg)
    load_web_config(cfg.web_config_file)
    spec = source_spec(cfg)
    if spec.real_gpus:
        return SourceDescription.nvml()
    try:
        opened = open_sources(spec, VirtualClock(), Problems(logging.getLogger("gpumon.check")))
        opened.close()
        return opened.description
    except GpumonError as e:
        key = {"replay": "replay", "driven": "drive", "simulated": "simulate"}[spec.kind]
        raise ConfigError(f"{cfg.source_path or 'configuration'}: {key}: {e}") from None


def _check_address(cfg: Config) -> None:
    """The start binds the listening address: an address this machine does not have is refused
    there, so here too (bound on port 0, which any running daemon leaves free)."""
    host, port = cfg.host_port
    if host in ("", "*"):
        return
    where = f"{cfg.source_path}: listen" if cfg.source_path else "listen"
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ConfigError(f"{where} {host}:{port}: cannot resolve {host!r} ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind((*address[:1], 0, *tuple(address[2:])))
        except OSError as e:
            raise ConfigError(
                f"{where} {host}:{port}: {e.strerror}: not an address of this machine"
            ) from None


def run(args: argparse.Namespace) -> int:
    cfg = load(args)
    if args.check_config:
        description = check(cfg)
        host, port = cfg.host_port
        print(
            f"gpumon serve: configuration ok ({cfg.source_path or 'no file, defaults'}): "
            f"listen {host or '*'}:{port}, interval {cfg.interval_s:g} s, {description.phrase()}"
        )
        return EXIT_OK
    logging.getLogger().setLevel(cfg.log_level.upper())
    from gpumon.core import memory

    memory.limit_arenas()  # before the daemon's threads start (gpumon.core.memory)
    from gpumon.config.sources import source_spec
    from gpumon.serve.sampling import daemon_pipeline

    clock = flags.clock_for(args, source_spec(cfg))  # --speed: simulated or replayed GPUs only
    # the driver opens on its own thread while the rest of the daemon is imported
    pipeline = daemon_pipeline(cfg, clock, open_in_background=True)
    from gpumon.serve.daemon import Daemon, run_forever

    try:
        daemon = Daemon(
            cfg, reload=lambda: load(args), clock=clock, duration_s=args.duration, pipeline=pipeline
        )
    except BaseException:
        pipeline.close()  # the driver is shut down before the one-line error
        raise
    return run_forever(daemon)
