"""The flight recorder's directory: segment files named after the Unix time of their first tick
(`gpumon-20261130T140000Z.jsonl.gz`), listed oldest first; any other file is not gpumon's."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

SEGMENT_RE = re.compile(r"^gpumon-(\d{8}T\d{6}Z)(?:-(\d+))?\.jsonl\.gz$")


def segment_name(start_unix_s: float, n: int = 0) -> str:
    stamp = datetime.fromtimestamp(start_unix_s, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"gpumon-{stamp}{f'-{n}' if n else ''}.jsonl.gz"


def segment_start(name: str) -> float | None:
    """The Unix time a segment's name says it starts at; None for any other file."""
    m = SEGMENT_RE.match(name)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Segment:
    path: str
    start_unix_s: float
    bytes: int


def list_segments(directory: str) -> list[Segment]:
    """The segments in `directory`, oldest first (files named otherwise are not gpumon's)."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for e in entries:
        start = segment_start(e.name)
        if start is None:
            continue
        try:
            size = e.stat().st_size
        except OSError:
            continue
        out.append(Segment(e.path, start, size))
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
