"""The `gpumon` command line: one module per command (gpumon/cli/*.py), beside the flags they
share (flags.py); app.py parses and maps errors to exit codes.

This file stays small on purpose: `gpumon serve` must hold its signals (so that a SIGHUP during
start-up is a reload, not a death) before the rest of gpumon is even imported; every other command
takes SIGTERM as Ctrl-C from its first moment (exit 130, README "Exit codes"), not only once its
loop runs: a SIGTERM during the imports used to end `gpumon record` with 143.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

EXIT_INTERRUPTED = 130
"""gpumon.core.errors.EXIT_INTERRUPTED, not imported here: nothing heavy before the handler."""


class Terminated(BaseException):
    """SIGTERM before (or after) a command handles signals itself. Not a KeyboardInterrupt:
    CPython marks one raised inside exec() (dataclasses build methods so, at import) as unhandled
    and ends the process by SIGINT, whatever main() returns."""


_TERMINATED: list[str] = []


def terminated_early() -> bool:
    """Whether SIGTERM came before the command's loop took signals over: raising Terminated may
    not be enough, as a library being imported may swallow any exception (one did, in the tests:
    `gpumon record` then ran on forever), so the loop asks before it starts."""
    return bool(_TERMINATED)


def _term_as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _TERMINATED.append(signal.Signals(signum).name)
    raise Terminated(signal.Signals(signum).name)


def _default_sigterm_in_child() -> None:
    """A child forked by a gpumon command (a Keras PyDataset's or a torch DataLoader's loader
    worker, forked by `gpumon bench`) is not the command: SIGTERM ends it at once, as its pool
    expects. With the command's handler it ran Python on SIGTERM instead: every pool's terminate()
    printed a traceback per worker, and a worker that took the signal in its exit path, with
    a lock copied from another thread at fork, waited on that lock forever and its parent with it
    (the bench hung at its end). Forks that exec (subprocess) reset handlers anyway."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def caused_by_terminated(e: BaseException | None) -> bool:
    """Whether a SIGTERM at start-up is behind this exception: raised inside code that wraps what
    it raises (Python 3.11 turns an exception in a descriptor's __set_name__, while a dataclass is
    being built at import, into "RuntimeError: Error calling __set_name__"), so it arrives as
    another exception with Terminated as its cause."""
    seen = 0
    while e is not None and seen < 32:
        if isinstance(e, Terminated):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _quiet_when_swallowed() -> None:
    """A signal whose handler ran inside a finalizer (a __del__, a weakref or gc callback during
    an import) raises there, and CPython prints the exception it cannot raise further as
    "Exception ignored in: ... Traceback": a traceback for an ordinary SIGTERM. The signal is
    already noted (terminated_early) or is noted here (flags.note_swallowed, which also stops a
    running loop), so that report is dropped; every other one is printed as before. Likewise a
    thread that fails because of it (an import the main thread left half done): once SIGTERM came
    at start-up, the process is ending, and its threads' failures are not the user's news."""
    default = sys.unraisablehook

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if caused_by_terminated(info.exc_value):
            return
        if info.exc_type is not None and info.exc_type.__name__ == "Interrupted":
            from gpumon.cli.flags import Interrupted, note_swallowed

            if issubclass(info.exc_type, Interrupted):
                note_swallowed(str(info.exc_value))
                return
        default(info)

    sys.unraisablehook = unraisable
    default_thread_hook = threading.excepthook

    def thread_failed(args: threading.ExceptHookArgs) -> None:
        if _TERMINATED or caused_by_terminated(args.exc_value):
            return
        default_thread_hook(args)

    threading.excepthook = thread_failed


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
        from gpumon.core import memory

        memory.hold_collector()  # until the first sample is out (gpumon.core.memory)
        from gpumon.cli.app import main as run

        return run(args)
    try:
        if argv is None:  # the command line's process (not a caller's, e.g. a test's)
            signal.signal(signal.SIGTERM, _term_as_ctrl_c)
            os.register_at_fork(after_in_child=_default_sigterm_in_child)
            _quiet_when_swallowed()
        from gpumon.cli.app import main as run

        return run(args)
    except (KeyboardInterrupt, Terminated):  # before (or after) the command's own handling of it
        print("gpumon: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as e:
        if not caused_by_terminated(e):
            raise
        print("gpumon: interrupted", file=sys.stderr)  # a SIGTERM, wrapped by the code it interrupted
        return EXIT_INTERRUPTED
