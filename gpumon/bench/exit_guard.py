"""The benchmark job's way out when its exit hangs (gpumon bench): the job is Keras's, and so is
the loader pool that can deadlock the interpreter's exit; this module imports neither."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time


def leave_even_if_stuck(grace_s: float, code: int = 0) -> threading.Thread:
    """Make sure the process ends `grace_s` from now, its loader processes with it.

    Keras's PyDataset loader can leave a multiprocessing pool behind when training stops mid-epoch
    (its enqueuer's thread blocked on a full queue, never stopped): at the interpreter's exit,
    multiprocessing's handler then waits for a lock nobody releases, and the job never ends (seen
    with 6 workers: benchmarks.advice waited 10 minutes on it). The job's results are written by
    then, so a daemon thread waits `grace_s` (it runs while the exit handlers hang), then kills
    the process's children and exits with `code`, saying so on stderr. A process that exits
    sooner never notices it."""

    def force() -> None:
        time.sleep(grace_s)
        for child in multiprocessing.active_children():  # the loader pool's workers
            child.kill()
        sys.stderr.write(
            f"gpumon bench: still running {grace_s:g} s after training (the loader's pool hung at "
            "exit): its loader processes killed, exiting\n"
        )
        sys.stderr.flush()
        os._exit(code)

    t = threading.Thread(target=force, name="gpumon-bench-exit", daemon=True)
    t.start()
    return t
