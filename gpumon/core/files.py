"""Opening files that a user, a script or an attacker may have put anywhere gpumon expects one.

A FIFO blocks `open()` until someone writes to it (a sampler that opens one stops ticking), a
device such as /dev/zero never ends, and a symlink in a directory another user owns points where
it likes. So where gpumon expects a regular file, it opens only a regular file: with O_NONBLOCK (a
FIFO's open returns at once instead of waiting for a writer), then fstat on what it opened (not on
the name, which may change in between), and every read is bounded in bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO


class NotRegularFile(OSError):
    """Something other than a regular file where one was expected; `str()` says what it is."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file (a {kind})", path)
        self.kind = kind


def kind_of(mode: int) -> str:
    """What an st_mode is, in words a user knows."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    return "special file"


def open_regular(path: str, *, follow_symlinks: bool = True) -> BinaryIO:
    """`path` opened for reading in binary, only when it is a regular file; NotRegularFile (an
    OSError) otherwise, and OSError as `open` raises it. Never blocks on a FIFO. With
    `follow_symlinks=False`, a symlink is refused too (ELOOP, reported as a symbolic link)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFile(path, "symbolic link") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, kind_of(mode))
        os.set_blocking(fd, True)  # a regular file: reads never wait on a writer
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """At most `max_bytes + 1` bytes of a regular file (one more than allowed, so that a caller
    can tell a file that is too large); NotRegularFile or OSError otherwise."""
    with open_regular(path, follow_symlinks=follow_symlinks) as f:
        return f.read(max_bytes + 1)


def is_regular(path: str, *, follow_symlinks: bool = True) -> bool:
    """A regular file is there now (stat only: nothing is opened)."""
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=follow_symlinks).st_mode)
    except OSError:
        return False
