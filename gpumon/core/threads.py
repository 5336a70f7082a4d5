"""Threads the kernel can name: `top -H`, `ps -L` and /proc/PID/task/*/comm show which of the
daemon's threads spends what, instead of eight threads all called `python`."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15
"""prctl(2): the calling thread's name, at most 15 bytes."""


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux, or a libc without prctl
        return None


_PRCTL = _prctl()


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel too (first 15 bytes); never fails."""
    if _PRCTL is None:
        return
    try:
        _PRCTL(PR_SET_NAME, ctypes.c_char_p(name.encode("ascii", "replace")[:15]), 0, 0, 0)
    except Exception:  # a name is a convenience, never a reason to stop a thread
        pass


def named_thread(target: Callable[..., Any], name: str, *, daemon: bool = True) -> threading.Thread:
    """A threading.Thread whose kernel name is `name` while it runs `target`."""

    def run() -> None:
        name_this_thread(name)
        target()

    return threading.Thread(target=run, name=name, daemon=daemon)
