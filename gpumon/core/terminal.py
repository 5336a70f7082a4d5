"""Text from outside gpumon (a trace, a job file, a driver, a server) as it may reach a terminal:
its control characters shown as '?', so that a GPU name or a job's user cannot move the cursor,
clear the screen or retitle the window of whoever reads the report."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 controls and DEL; not the newline, which only the caller's own text holds."""


def printable(text: str) -> str:
    return _CONTROL.sub("?", text)
