"""`gpumon dstat-plugin install|uninstall`: the `dstat --gpu` / `dool --gpu` plugin."""

from __future__ import annotations

import argparse

from gpumon.errors import EXIT_OK


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
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
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon import dstat_install

    if args.action == "install":
        for path in dstat_install.install(args.system):
            print(f"installed {path}")
        print("try: dstat -c --gpu 5    (or: dool -c --gpu 5); GPUMON_URL points it at another daemon")
    else:
        removed = dstat_install.uninstall(args.system)
        print("\n".join(f"removed {p}" for p in removed) or "nothing to remove")
    return EXIT_OK
