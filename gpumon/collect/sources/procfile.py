"""One small file of /proc read in as few system calls as it takes: `os.open`, `os.read` until the
end, `os.close`. Python's `open` adds an fstat twice, an ioctl and two lseeks to each, and the host
source reads such files for the machine and for every job process on every tick."""

from __future__ import annotations

import os
from collections.abc import Callable

CHUNK = 65536


def read_proc(path: str, max_bytes: int = CHUNK, *, one_record: bool = False) -> bytes:
    """At most `max_bytes` of `path`; OSError as os.open and os.read raise it. Read until the end:
    a /proc file made of records (diskstats) may come a page at a time. `one_record`: a file the
    kernel writes whole at its first read (a process's stat, io, schedstat; loadavg), so one read
    of `max_bytes` is all of it, without a second to find the end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_all(lambda n, _at: os.read(fd, n), max_bytes, one_record)
    finally:
        os.close(fd)


def _read_all(read: Callable[[int, int], bytes], max_bytes: int, one_record: bool) -> bytes:
    """At most `max_bytes` by `read(n, offset)`, until the end (or one read of a `one_record` file)."""
    if one_record:
        return read(max_bytes, 0)
    parts, size = [], 0
    while size < max_bytes:
        part = read(min(CHUNK, max_bytes - size), size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class ProcFile:
    """One file of /proc read on every tick (/proc/stat, /proc/loadavg, /proc/diskstats): opened
    once and read from its start each time with pread, which the kernel answers with the file made
    afresh, as it does a new open's first read. The open and close that `read_proc` pays cost ~15 µs
    a file on a tick after a second asleep here (the three files 156 -> 111 µs, medians of 20 cold
    reads alternated: a few thousandths of a percent of a core). A read that fails closes the
    file: the next one opens it again."""

    def __init__(self, path: str, max_bytes: int = CHUNK, *, one_record: bool = False) -> None:
        self.path = path
        self._max = max_bytes
        self._one_record = one_record
        self._fd: int | None = None

    def read(self) -> bytes:
        """As `read_proc(path, max_bytes, one_record=...)` would; OSError as os.open and os.pread."""
        fd = self._fd
        if fd is None:
            fd = self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _read_all(lambda n, at: os.pread(fd, n, at), self._max, self._one_record)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()
