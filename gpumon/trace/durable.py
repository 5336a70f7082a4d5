"""Durable writing: a file written whole record by whole record, each handed to the OS at once
(a process killed at any moment leaves every earlier record on disk), fsync'd every few seconds and
at close (a power loss costs at most that much). Both trace versions write through it."""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import BinaryIO

from gpumon.core.errors import OutputError
from gpumon.core.files import kind_of

FSYNC_EVERY_S = 5.0


class DurableFile:
    def __init__(self, path: str, *, force: bool = False, fsync_every_s: float = FSYNC_EVERY_S) -> None:
        """Create `path` (refused when it exists, unless `force`)."""
        self.path = path
        self.bytes = 0
        self.failed = False
        """A write failed (disk full): `close` then only releases the file."""
        self._fsync_every_s = fsync_every_s
        self._last_fsync = time.monotonic()
        self._f: BinaryIO = _create(path, force)

    @property
    def closed(self) -> bool:
        return self._f.closed

    def fileno(self) -> int:
        return self._f.fileno()

    def still_at_path(self) -> bool:
        """The open file is still the one its path names: False once it (or its directory) was
        removed, moved or replaced, when writing on would only fill a file nobody can read."""
        try:
            here = os.fstat(self._f.fileno())
            there = os.stat(self.path)
        except OSError:
            return False
        return here.st_nlink > 0 and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def write(self, data: bytes) -> None:
        """Hand `data` to the OS now; fsync when the last one is `fsync_every_s` old."""
        try:
            self._f.write(data)
            self._f.flush()
            self.bytes += len(data)
            now = time.monotonic()
            if now - self._last_fsync >= self._fsync_every_s:
                os.fsync(self._f.fileno())
                self._last_fsync = now
        except OSError as e:
            self.failed = True
            raise OutputError(f"{self.path}: cannot write: {e.strerror}") from None

    def close(self, last: bytes = b"") -> None:
        """Write `last` (unless a write failed), fsync and close. After a failed write, only release
        the file: the error a user sees is that first one, not a second from here."""
        if self._f.closed:
            return
        try:
            if not self.failed:
                if last:
                    self.write(last)
                os.fsync(self._f.fileno())
        except OSError as e:
            self.failed = True
            raise OutputError(f"{self.path}: cannot write: {e.strerror}") from None
        finally:
            try:
                self._f.close()
            except OSError as e:
                if not self.failed:
                    self.failed = True
                    raise OutputError(f"{self.path}: cannot write: {e.strerror}") from None


def _create(path: str, force: bool) -> BinaryIO:
    """`path` created (or, with `force`, truncated) for writing: a regular file (or a character
    device: /dev/full tries a full disk). Opened without waiting, so a FIFO under the name (with
    `force`) is refused at once rather than waited on for a reader forever; so is a socket."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    flags |= os.O_TRUNC if force else os.O_EXCL
    try:
        fd = os.open(path, flags, 0o666)  # (less the umask, as open() makes it)
    except FileExistsError:
        raise OutputError(
            f"{path}: already exists; choose another -o or pass --force to overwrite it"
        ) from None
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO nobody reads, a socket: O_NONBLOCK says so, not a wait
            try:
                kind = kind_of(os.stat(path).st_mode)
            except OSError:
                kind = "FIFO"
            why = f"not a regular file (a {kind}): a trace is written to a file"
            raise OutputError(f"{path}: {why}") from None
        raise OutputError(f"{path}: cannot create: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):  # (/dev/full: how a full disk is tried)
            raise OutputError(f"{path}: not a regular file (a {kind_of(mode)}): a trace is written to a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
