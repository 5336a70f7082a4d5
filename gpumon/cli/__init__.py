"""The `gpumon` command line: one module per command (gpumon/cli/*.py), beside the flags they
share (flags.py); app.py parses and maps errors to exit codes.

This file stays small on purpose: `gpumon serve` must hold its signals (so that a SIGHUP during
start-up is a reload, not a death) before the rest of gpumon is even imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def command_of(argv: Sequence[str]) -> str | None:
    """The command named by these arguments (the first one that is not an option)."""
    takes_value = {"--log-level"}
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None and command_of(args) == "serve":
        # The daemon takes these with sigwait (gpumon.serve.daemon.run_forever); threads inherit it.
        from gpumon.serve.signals import block_signals

        block_signals()
    from gpumon.cli.app import main as run

    return run(args)
