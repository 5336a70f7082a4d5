"""The flight recorder's directory: segment files named after the Unix time of their first tick
(`gpumon-20261130T140000Z.jsonl.gz`), listed oldest first; any other file is not gpumon's.

Only regular files count as segments: a FIFO, a device, a directory or a symlink named like one
is passed over (a FIFO would block the reader, a symlink may point at any file), as is a name
whose time is not a real one (`gpumon-20261399T999999Z.jsonl.gz`); each is named in the warnings
of whoever lists the directory, and never deleted.
"""

from __future__ import annotations

import os
import re
import stat
from datetime import UTC, datetime
from typing import NamedTuple

from gpumon.core.files import kind_of

SEGMENT_RE = re.compile(r"^gpumon-(\d{8}T\d{6}Z)(?:-(\d+))?\.jsonl\.gz$")


def segment_name(start_unix_s: float, n: int = 0) -> str:
    stamp = datetime.fromtimestamp(start_unix_s, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"gpumon-{stamp}{f'-{n}' if n else ''}.jsonl.gz"


def segment_start(name: str) -> float | None:
    """The Unix time a segment's name says it starts at; None for any other file."""
    m = SEGMENT_RE.match(name)
    if m is None:
        return None
    try:
        s = m.group(1)  # YYYYmmddTHHMMSS: read by hand, as strptime's import and regexes cost 3 ms
        return datetime(
            int(s[0:4]), int(s[4:6]), int(s[6:8]), int(s[9:11]), int(s[11:13]), int(s[13:15]), tzinfo=UTC
        ).timestamp()
    except ValueError:  # month 13, second 99: named like a segment, but not one of gpumon's
        return None


def shown_path(path: str) -> str:
    """A path found in a directory, as a message names it: quoted and escaped when it holds a
    newline or a terminal control (a file named so could forge a line, or retitle a terminal)."""
    return path if path.isprintable() else repr(path)


def looks_like_segment(name: str) -> bool:
    """Named like a segment (a file gpumon may have written, or a stray copy of one)."""
    return name.startswith("gpumon-") and name.endswith(".jsonl.gz")


class Segment(NamedTuple):
    path: str
    start_unix_s: float
    bytes: int


def list_segments(directory: str, skipped: list[str] | None = None) -> list[Segment]:
    """The segments in `directory`, oldest first (files named otherwise are not gpumon's). What is
    named like a segment but is not one (a bad time in its name, not a regular file) is passed
    over and, when `skipped` is given, named there."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for e in entries:
        start = segment_start(e.name)
        if start is None:
            if skipped is not None and looks_like_segment(e.name):
                skipped.append(
                    f"{shown_path(e.path)}: skipped: named like a segment, but its name is not a time"
                )
            continue
        try:
            st = e.stat(follow_symlinks=False)  # from the directory listing: nothing is opened
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            if skipped is not None:
                skipped.append(f"{e.path}: skipped: not a regular file (a {kind_of(st.st_mode)})")
            continue
        out.append(Segment(e.path, start, st.st_size))
    out.sort(key=lambda s: (s.start_unix_s, s.path))
    return out


def default_directory(env: dict[str, str] | None = None) -> str:
    """systemd's StateDirectory=, else /var/lib/gpumon as root, else the user's state directory."""
    env = dict(os.environ) if env is None else env
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return os.path.join(state, "recordings")
    if os.geteuid() == 0:
        return "/var/lib/gpumon/recordings"
    base = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local/state"
    )
    return os.path.join(base, "gpumon", "recordings")
