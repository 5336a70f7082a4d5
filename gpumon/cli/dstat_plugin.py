"""`gpumon dstat-plugin install|uninstall`: `dstat --gpu` for whichever dstat this machine has.

The original dstat 0.7.4 (Debian 12, Ubuntu 22.04) and dool load a Python plugin file; pcp-dstat
(Ubuntu 24.04, Fedora, RHEL, and any host with PCP) reads an INI plugin over PCP metrics, fed from
gpumon serve by PCP's openmetrics PMDA (gpumon.dstat.pcp)."""

from __future__ import annotations

import argparse
import os
import shutil
import urllib.parse

from gpumon.core.errors import EXIT_OK, UsageError
from gpumon.core.fetch import redacted
from gpumon.core.terminal import printable


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "dstat-plugin",
        parents=[common],
        help="install or remove `dstat --gpu` (the original dstat, dool, or PCP's pcp-dstat)",
    )
    s.add_argument("action", choices=["install", "uninstall"])
    where = s.add_mutually_exclusive_group()
    where.add_argument(
        "--user",
        dest="system",
        action="store_false",
        default=False,
        help="for this user: ~/.dstat/, ~/.local/share/dool/plugins/, ~/.pcp/dstat/ (default)",
    )
    where.add_argument(
        "--system",
        dest="system",
        action="store_true",
        help="for everyone: /usr/local/share/dstat/, /usr/local/share/dool/; for pcp-dstat "
        "/etc/pcp/dstat/ and PCP's openmetrics PMDA (root)",
    )
    s.add_argument(
        "--for",
        dest="flavour",
        choices=["auto", "dstat", "pcp"],
        default="auto",
        help="which dstat: auto (the one `dstat` runs), dstat (0.7.4 and dool), pcp (pcp-dstat)",
    )
    s.add_argument(
        "--url",
        metavar="URL",
        help="for pcp-dstat: the gpumon daemon PCP reads (default $GPUMON_URL, else http://127.0.0.1:9877)",
    )
    s.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        help="for pcp-dstat: credentials when the daemon asks for basic auth (default $GPUMON_BASIC_AUTH)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpumon.dstat import install as dstat_install
    from gpumon.dstat import pcp as dstat_pcp

    flavour = args.flavour
    if flavour == "auto":
        flavour = dstat_pcp.which_dstat() or "dstat"
    if flavour == "pcp":
        return _pcp(args)
    if args.action == "install":
        for path in dstat_install.install(args.system):
            print(f"installed {path}")
        print("try: dstat -c --gpu 5    (or: dool -c --gpu 5); GPUMON_URL points it at another daemon")
    else:
        removed = dstat_install.uninstall(args.system)
        print("\n".join(f"removed {p}" for p in removed) or "nothing to remove")
    return EXIT_OK


def _pcp(args: argparse.Namespace) -> int:
    from gpumon.dstat import install as dstat_install
    from gpumon.dstat import pcp as dstat_pcp

    if args.action == "install":
        url, auth = _daemon(args)
        written, notes = dstat_pcp.install(args.system, url, auth)
        for path in written:
            print(f"installed {path}")
        if shutil.which("dool"):  # dool, beside pcp-dstat, still takes the Python plugin
            for path in dstat_install.install(args.system)[1:]:
                print(f"installed {path}")
        for note in notes:
            print(f"note: {note}")
        if args.system:
            print(printable(dstat_pcp.probe(url)))
        print("try: dstat -c --gpu 5")
    else:
        removed, notes = dstat_pcp.uninstall(args.system)
        removed += dstat_install.uninstall(args.system)[1:] if shutil.which("dool") else []
        print("\n".join(f"removed {p}" for p in removed) or "nothing to remove")
        for note in notes:
            print(f"note: {note}")
    return EXIT_OK


def _daemon(args: argparse.Namespace) -> tuple[str, str | None]:
    """The URL PCP is to read and the credentials for it, checked: PCP's .url file takes the URL
    as a line (a newline in it wrote a line of its own), and a password in the URL is moved to the
    Authorization header (the .url file is then root's alone; the URL is printed)."""
    where = "--url" if args.url else "GPUMON_URL"
    url = args.url or os.environ.get("GPUMON_URL") or "http://127.0.0.1:9877"
    auth = args.basic_auth or os.environ.get("GPUMON_BASIC_AUTH")
    said = "--basic-auth" if args.basic_auth else "GPUMON_BASIC_AUTH"
    if auth is not None and ":" not in auth:
        raise UsageError(f"{said}: expected USER:PASSWORD")
    if not args.system and not args.url:
        return url, auth  # (a user install writes no .url file: $GPUMON_URL is not used)
    shown = printable(redacted(url)).replace("\n", "?")[:200].encode("utf-8", "backslashreplace").decode()
    if any(c.isspace() or not c.isprintable() for c in url):
        raise UsageError(f"{where}: {shown}: a URL holds no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a port out of range or not a number: ValueError
    except ValueError as e:
        raise UsageError(f"{where}: {shown}: not a URL ({printable(str(e))[:200]})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or "?" in url or "#" in url:
        # (PCP reads URL/metrics/pcp: after a query or a fragment, that path is no path)
        raise UsageError(f"{where}: {shown}: expected http://HOST:PORT or https://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        if auth is None:
            user = urllib.parse.unquote(parts.username or "", errors="surrogateescape")
            auth = f"{user}:{urllib.parse.unquote(parts.password or '', errors='surrogateescape')}"
        host = parts.netloc.rpartition("@")[2]
        url = urllib.parse.urlunsplit(parts._replace(netloc=host))
    return url, auth
