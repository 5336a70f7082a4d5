"""One small file of /proc read in as few system calls as it takes: `os.open`, `os.read` until the
end, `os.close`. Python's `open` adds an fstat twice, an ioctl and two lseeks to each, and the host
source reads such files for the machine and for every job process on every tick."""

from __future__ import annotations

import os

CHUNK = 65536


def read_proc(path: str, max_bytes: int = CHUNK, *, one_record: bool = False) -> bytes:
    """At most `max_bytes` of `path`; OSError as os.open and os.read raise it. Read until the end:
    a /proc file made of records (diskstats) may come a page at a time. `one_record`: a file the
    kernel writes whole at its first read (a process's stat, io, schedstat; loadavg), so one read
    of `max_bytes` is all of it, without a second to find the end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if one_record:
            return os.read(fd, max_bytes)
        parts, size = [], 0
        while size < max_bytes:
            part = os.read(fd, min(CHUNK, max_bytes - size))
            if not part:
                break
            parts.append(part)
            size += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)
