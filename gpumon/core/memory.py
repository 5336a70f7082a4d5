"""Freed heap given back to the system, so a daemon's RSS stays flat over days (issue 29).

CPython frees its objects into glibc's malloc, which keeps freed pages in its arenas: one per
thread that allocates, up to eight per core. A daemon whose threads (sampler, recorder, HTTP loop,
its executor) each allocate a little in turn ends up holding pages no object uses, and its RSS
creeps up although its live objects do not (benchmarks.soak: none per tick, scrape or
connection). Two glibc calls through ctypes, for the daemon's process only, never inside a user's
training job: at start, at most two arenas (mallopt M_ARENA_MAX); now and then malloc_trim(0),
which hands the free pages of every arena back. Where the C library is not glibc, both do nothing.

Also the cyclic garbage collector, for the daemon's start: importing it makes some 30,000 objects
that live as long as the process (modules, classes, functions), and the collector scanned them
again and again as they came (about 50 young and 5 middle collections, some 6 ms of a 110 ms start,
benchmarks.serve_idle). `hold_collector` stops it before the imports; `settle`, once the first
sample is out, freezes what the start made (gc.freeze: never scanned again, which the later full
collections also save) and starts it again, after one full collection of what the start left as
garbage: at the first sample, or HOLD_COLLECTOR_MAX_S after the start if none has come by then.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from typing import Any

HOLD_COLLECTOR_MAX_S = 10.0
"""The collector is back this long after the start at the latest, sample or not (a driver that
takes a minute to open: the HTTP server answers meanwhile, and its requests' cycles must go)."""
_HELD: list[bool] = []
"""Whether hold_collector stopped the collector (and settle has not started it again)."""

M_ARENA_MAX = -8
"""mallopt(3)'s parameter for the most arenas malloc may create."""


@functools.cache
def _libc() -> Any:
    """The process's C library, opened once: a CDLL made for each call (once a minute, by `trim`)
    made a class and a function pointer each time, left in a cycle for the collector."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_arenas(arenas: int = 2) -> bool:
    """At most `arenas` malloc arenas in this process; call before its threads start. True when
    the C library took it."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    try:
        return bool(mallopt(M_ARENA_MAX, arenas))
    except Exception:  # a C library that exports the name with another meaning: leave it be
        return False


def trim() -> bool:
    """Hand malloc's free pages back to the system (malloc_trim(0)); True when some were."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    try:
        return bool(malloc_trim(0))
    except Exception:
        return False


def hold_collector() -> None:
    """Stop the cyclic garbage collector while a daemon starts (only where it was running)."""
    if gc.isenabled() and not _HELD:
        gc.disable()
        _HELD.append(True)


def settle() -> bool:
    """After the start: what it made is frozen (kept out of every later collection) and the
    collector runs again. True when hold_collector had stopped it; otherwise nothing is done."""
    if not _HELD:
        return False
    _HELD.clear()
    gc.collect()  # the start's own garbage (and any requests' before the first sample) goes first
    gc.freeze()
    gc.enable()
    return True
