"""Writing traces: version 1 (JSON Lines) and version 2 (compact records in one gzip stream), one
record per line, each handed to the OS whole (gpumon.trace.durable), so a recorder killed at any
moment leaves every earlier record readable."""

from __future__ import annotations

import json
import threading
from typing import Any

from gpumon.core.errors import OutputError
from gpumon.core.model import Tick
from gpumon.trace.compact import NAMES, Encoder
from gpumon.trace.durable import FSYNC_EVERY_S, DurableFile
from gpumon.trace.gzipped import GzipRecordWriter
from gpumon.trace.records import VERSION, tick_to_dict


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class _Gated:
    """A tick's write and the file's close exclude each other (`_gate`): a tick from a sampling
    thread still running as the file closes is dropped, never written after the end record. The
    versions write a tick (`_write_tick`) and end the file (`_end`) each their own way."""

    ticks: int
    last_t_s: float | None
    """The last tick written's time, as the end record gives it."""

    def _start_gate(self) -> None:
        self._gate = threading.Lock()
        self._closed = False

    def write_tick(self, tick: Tick) -> None:
        with self._gate:
            if not self._closed:
                self._write_tick(tick)

    def close(self, t_s: float | None, reason: str | None) -> None:
        """Write the end record (none when `reason` is None) and close. After a failed write, only
        release the file: the error the user sees is that first one (exit 5), not a second from here."""
        with self._gate:
            self._close(t_s, reason)

    def finish(self, reason: str) -> None:
        """Close with the end record at the last tick written (a tick still being taken is not)."""
        with self._gate:
            self._close(self.last_t_s, reason)

    def _close(self, t_s: float | None, reason: str | None) -> None:
        if not self._closed:
            self._closed = True
            self._end(t_s, reason)

    def _write_tick(self, tick: Tick) -> None:
        raise NotImplementedError

    def _end(self, t_s: float | None, reason: str | None) -> None:
        raise NotImplementedError


class TraceWriter(_Gated):
    """Version 1: a JSON line per record."""

    def __init__(
        self, path: str, header: dict[str, Any], *, force: bool = False, fsync_every_s: float = FSYNC_EVERY_S
    ) -> None:
        self.path = path
        self.ticks = 0
        self.last_t_s = None  # (version 1 writes the caller's clock)
        self._start_gate()
        self._out = DurableFile(path, force=force, fsync_every_s=fsync_every_s)
        self._write({**header, "version": 1})

    @property
    def failed(self) -> bool:
        """A write failed (disk full): close() then only releases the file."""
        return self._out.failed

    def _write(self, record: dict[str, Any]) -> None:
        try:
            self._out.write(_line(record))
        except OutputError as e:
            raise OutputError(f"{e}; the {self.ticks} ticks before are kept") from None

    def _write_tick(self, tick: Tick) -> None:
        self._write(tick_to_dict(tick))
        self.ticks += 1
        self.last_t_s = tick.t_s

    def _end(self, t_s: float | None, reason: str | None) -> None:
        end = b""
        if reason is not None and not self._out.failed:
            end = _line({"type": "end", "t_s": t_s, "ticks": self.ticks, "reason": reason})
        self._out.close(end)


class TraceWriterV2(_Gated):
    """Version 2: the same records, compact, in one gzip stream, made decodable on disk after every
    record, or (`sync_every_s`) once the ticks not yet on disk span that many seconds."""

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        *,
        force: bool = False,
        fsync_every_s: float = FSYNC_EVERY_S,
        origin_s: float = 0.0,
        sync_every_s: float = 0.0,
        version: int = VERSION,
    ) -> None:
        """`version`: 2, or 3 (version 2 with short field names, their table in the header).
        `origin_s`: the caller's clock at the file's t_s 0 (the daemon's recorder starts each
        segment's times afresh). `sync_every_s`: a tick is handed to the OS (decodable) by the first
        tick at least this much later by the ticks' own clock, by `sync()`, or at `close`; 0: each
        at once. The header always goes at once, so the file is a trace from its start."""
        self.path = path
        self.ticks = 0
        self.last_t_s = None  # (the file's own time)
        self._origin = origin_s
        self._sync_every_s = sync_every_s
        self._synced_t_s: float | None = None
        """The file's time of the last tick handed to the OS (None: none written yet)."""
        self._start_gate()
        self._out = GzipRecordWriter(path, force=force, fsync_every_s=fsync_every_s)
        if version not in (2, 3):
            raise ValueError(f"TraceWriterV2 writes versions 2 and 3, not {version}")
        self._enc = Encoder(origin_s, short_names=version == 3)
        self._write({**header, "version": version, **({"names": NAMES} if version == 3 else {})})

    @property
    def failed(self) -> bool:
        return self._out.failed

    @property
    def bytes(self) -> int:
        return self._out.bytes

    def _write(self, record: dict[str, Any], *, sync: bool = True) -> None:
        try:
            self._out.write(_line(record), sync=sync)
        except OutputError as e:
            raise self._kept(e) from None

    def _kept(self, e: OutputError) -> OutputError:
        if self._sync_every_s:
            return OutputError(f"{e}; the ticks before the last {self._sync_every_s:g} s are kept")
        return OutputError(f"{e}; the {self.ticks} ticks before are kept")

    def _write_tick(self, tick: Tick) -> None:
        if self._enc.behind(tick):  # a version 1 file may start at a negative t_s: it converted unreadable
            raise OutputError(
                f"{self.path}: a tick at t_s {tick.t_s:g} comes before the trace's start or the tick before "
                "it: this format holds times from its start on; write version 1 (an output name ending in "
                ".jsonl) to keep them"
            )
        t_s = round(tick.t_s - self._origin, 6)
        if self._synced_t_s is None:
            self._synced_t_s = t_s - self._sync_every_s  # the first tick goes at once
        sync = t_s - self._synced_t_s >= self._sync_every_s
        self._write(self._enc.encode(tick), sync=sync)
        self.ticks += 1
        self.last_t_s = t_s
        if sync:
            self._synced_t_s = t_s

    def sync(self) -> None:
        """Hand every tick written so far to the OS, decodable."""
        try:
            self._out.sync()
        except OutputError as e:
            raise self._kept(e) from None
        self._synced_t_s = self.last_t_s

    def still_at_path(self) -> bool:
        """False once the file was removed or replaced behind the writer's back."""
        return self._out.still_at_path()

    def _end(self, t_s: float | None, reason: str | None) -> None:
        """`t_s` on the file's own clock (`last_t_s`); no end record when `reason` is None."""
        try:
            if not self._out.failed and reason is not None:
                self._write({"type": "end", "t_s": t_s, "ticks": self.ticks, "reason": reason})
        finally:
            self._out.finish()


def open_writer(
    path: str, header: dict[str, Any], version: int, *, force: bool = False
) -> TraceWriter | TraceWriterV2:
    if version == 1:
        return TraceWriter(path, {**header, "version": 1}, force=force)
    return TraceWriterV2(path, header, force=force, version=version)


def version_for(path: str, asked: int | None) -> int:
    """The version `record -o PATH` writes: as asked, else 1 for a `.jsonl` name, else the newest."""
    if asked is not None:
        return asked
    return 1 if path.endswith(".jsonl") else VERSION
