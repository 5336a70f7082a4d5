"""The daemon's signals, taken with sigwait by its main thread (gpumon.serve.daemon.run_forever):
SIGTERM and SIGINT stop it, SIGHUP reloads, SIGUSR1 wakes it when the sampling loop ends.

`gpumon.cli` blocks them before anything else is imported, so a SIGHUP during start-up is a reload,
not a death; every thread started afterwards inherits the mask."""

from __future__ import annotations

import os
import signal
import threading

DAEMON_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1})
MAIN_THREAD = threading.main_thread().ident


def block_signals() -> None:
    """Hold the daemon's signals for sigwait, in this thread and every thread started after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, DAEMON_SIGNALS)


def wake_main_thread() -> None:
    """SIGUSR1 to ourselves: the main thread, in sigwait, notices that the daemon stopped."""
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    except OSError:
        pass
