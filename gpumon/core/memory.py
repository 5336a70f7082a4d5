"""Freed heap given back to the system, so a daemon's RSS stays flat over days (issue 29).

CPython frees its objects into glibc's malloc, which keeps freed pages in its arenas: one per
thread that allocates, up to eight per core. A daemon whose threads (sampler, recorder, HTTP loop,
its executor) each allocate a little in turn ends up holding pages no object uses, and its RSS
creeps up although its live objects do not (benchmarks.soak: none per tick, scrape or
connection). Two glibc calls through ctypes, for the daemon's process only, never inside a user's
training job: at start, at most two arenas (mallopt M_ARENA_MAX); now and then malloc_trim(0),
which hands the free pages of every arena back. Where the C library is not glibc, both do nothing.
"""

from __future__ import annotations

import ctypes
from typing import Any

M_ARENA_MAX = -8
"""mallopt(3)'s parameter for the most arenas malloc may create."""


def _libc() -> Any:
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
