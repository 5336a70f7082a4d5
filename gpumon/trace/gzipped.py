"""Version 2's container: JSON records in one gzip stream (zlib level 9), made decodable on disk by a
sync flush (after every record, or every few seconds: the writer's caller decides), and read back
line by line with bounded memory."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from gpumon.trace.durable import FSYNC_EVERY_S, DurableFile

LEVEL = 9
"""9, not zlib's default 6: 7-8% smaller for a few microseconds more CPU per tick and file, a
thousandth of a percent of a core at 1 s ticks (benchmarks/trace_size.py --gpu-day, issue 29)."""
GZIP_MAGIC = b"\x1f\x8b"


class GzipRecordWriter:
    """Writes JSON records into one gzip stream; `sync` makes what was written so far decodable on
    disk (a sync flush, then a durable write); the stream's end (CRC and length) at `finish`.

    Each sync flush ends a deflate block: a block per record costs a third of the file (an empty
    stored block and a Huffman table per record), a block per 5 s of records little."""

    def __init__(self, path: str, *, force: bool = False, fsync_every_s: float = FSYNC_EVERY_S) -> None:
        self._file = DurableFile(path, force=force, fsync_every_s=fsync_every_s)
        self.path = path
        self._z = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)
        self._pending: list[bytes] = []
        """Compressed output not yet handed to the OS (records written with sync=False)."""
        self._unsynced = False

    @property
    def failed(self) -> bool:
        return self._file.failed

    def write(self, line: bytes, *, sync: bool = True) -> None:
        """Compress `line` into the stream; unless `sync` is False, `sync()` too."""
        self._pending.append(self._z.compress(line))
        self._unsynced = True
        if sync:
            self.sync()

    def sync(self) -> None:
        """Hand every record written so far to the OS, decodable (a no-op when there is none)."""
        if self._unsynced and not self._file.failed:
            self._pending.append(self._z.flush(zlib.Z_SYNC_FLUSH))
            data = b"".join(self._pending)
            self._pending.clear()
            self._unsynced = False
            self._file.write(data)

    def still_at_path(self) -> bool:
        return self._file.still_at_path()

    def finish(self) -> None:
        """Close the gzip stream and the file."""
        if self._file.closed:
            return
        if self._file.failed:
            self._file.close(b"")
            return
        self._pending.append(self._z.flush(zlib.Z_FINISH))
        data = b"".join(self._pending)
        self._pending.clear()
        self._file.close(data)

    @property
    def bytes(self) -> int:  # after the methods: it shadows the type's name in the class body
        return self._file.bytes


CHUNK = 4096
MAX_PENDING = 16 * 1024 * 1024 + 1
MAX_RATIO = 200
"""A trace inflates to at most this many times its compressed size: gpumon's own segments, flushed
after every record, inflate about 10 times; the same records gzipped again in one go (`zcat | gzip
-9`) of an idle GPU sampled 20 times a second, 64 times. Deflate reaches about 1,000: a file beyond
this bound is a decompression bomb, refused before it costs time or memory."""
RATIO_FREE_BYTES = 1024 * 1024
"""The first MiB inflated is not held to MAX_RATIO (a short trace of a quiet GPU may exceed it)."""


class TooCompressed(Exception):
    """The stream inflates to more than MAX_RATIO times its compressed size."""

    def __init__(self, offset: int, inflated: int) -> None:
        super().__init__(f"inflates to {inflated} bytes from {offset}")
        self.offset = offset
        self.inflated = inflated


SALVAGE_PIECE = 16
"""A damaged chunk is inflated again this many compressed bytes at a time, to find the piece in which
zlib fails (one 4 KiB call raises with none of its output: a segment of ~5 KB, the whole of a
minute's recording, lost every record to 8 bad bytes two thirds in)."""
FLUSH_MARK = b"\x00\x00\xff\xff"
"""What a sync flush leaves in a deflate stream (an empty stored block): gpumon's writers flush at
whole records (the recorder every few seconds, `record -o` more often), so the bytes up to one
inflate to whole records."""
SALVAGE_DROP = 1
"""Of a damaged chunk, what inflates up to the last flush but one ahead of the failing piece is
kept, less this many records more: the block before the failure, and a record more, may hold
what the bad bytes made before zlib saw them. A 1,160-byte stream flushed at every record, each of
its 9,056 single-bit flips (a reviewer's pass, 2026-12-04): an altered record that parses as JSON
in 4 flips, as in 3 when nothing of a damaged chunk was kept (54 and 7 keeping all up to the last
flush). This bounds what the damaged chunk adds; records of the chunks before it were given before
any error could show (a CRC error comes only at the stream's end): a longer stream read to its
damage can give altered records, as it did before."""
TRAILER_ERRORS = ("incorrect data check", "incorrect length check")
"""zlib's errors at the stream's end (its CRC or length): the damage is somewhere before, unknown
where, and what inflated may hold altered records: nothing of the chunk is kept."""


def _before_damage(z: Any, data: bytes, error: zlib.error, most: int) -> bytes:
    """The whole records of `data` that inflate before its damage, from `z` (a copy of the
    decompressor before it), at most `most` bytes: up to the flush before the last flush ahead of
    the piece in which zlib fails, less SALVAGE_DROP records more (bad bytes may inflate into
    something for a while before zlib sees them). Nothing where zlib failed on the trailer's check."""
    if any(e in str(error) for e in TRAILER_ERRORS):
        return b""
    probe = z.copy()
    failed = len(data)
    for i in range(0, len(data), SALVAGE_PIECE):
        try:
            probe.decompress(data[i : i + SALVAGE_PIECE], most + 1)
        except zlib.error:
            failed = i
            break
        if probe.unconsumed_tail or probe.eof:
            return b""  # more than `most`, or a stream that ends: not the damage this is about
    # the block that ends at the last flush before the failure may hold what the bad bytes made:
    # kept up to the flush before it
    cut = data.rfind(FLUSH_MARK, 0, max(0, data.rfind(FLUSH_MARK, 0, failed)))
    if cut < 0:
        return b""
    try:
        out: bytes = z.decompress(data[: cut + len(FLUSH_MARK)], most + 1)
    except zlib.error:
        return b""
    if len(out) > most:
        return b""
    for _ in range(SALVAGE_DROP):
        end = out.rfind(b"\n", 0, len(out) - 1)
        out = out[: end + 1] if end >= 0 else b""
    return out


def _whole_lines(pending: bytearray, out: bytes, offset: int) -> Iterator[tuple[bytes, int]]:
    """`out` appended to `pending` (which holds no newline), its whole lines given and cut from it
    at once, never sliced per line (a chunk inflating to half a million short lines cost a copy of
    the rest per line, 14 s for a 1 MB file: found by a hostile-input pass)."""
    scan = len(pending)
    pending += out
    start = 0
    while (nl := pending.find(b"\n", scan)) >= 0:
        yield bytes(pending[start : nl + 1]), offset
        start = scan = nl + 1
    del pending[:start]


class GzipLines:
    """The lines of a gzip stream as (raw_line, offset), offset being the compressed byte the
    stream had reached; memory stays bounded (a line is cut at MAX_PENDING bytes). A torn stream (a
    killed writer) gives its whole lines, then its partial last one without a newline; afterwards
    `trailer_seen` says whether the stream ended properly. Corrupt data raises zlib.error with
    `.offset` set; a stream that inflates beyond MAX_RATIO raises TooCompressed."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.trailer_seen = False
        self.offset = 0
        self.inflated = 0
        self.after_end = 0
        """Bytes after the stream's end that are not another gzip member, as far as they were read
        (ignored; 0: none)."""

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        z = zlib.decompressobj(31)
        pending = bytearray()  # inflated bytes not yet given (no newline in them): _whole_lines
        while chunk := self._f.read(CHUNK):
            data = chunk
            bound = RATIO_FREE_BYTES + MAX_RATIO * (self.offset + len(chunk))  # inflated, at most
            while data:
                before = z.copy()  # (~1 us): what a damaged chunk inflates before the damage
                try:
                    out = z.decompress(data, MAX_PENDING)
                except zlib.error as e:
                    e.offset = self.offset  # type: ignore[attr-defined]
                    # the whole lines before the damage are records like any other: the chunk
                    # again up to the damage (its partial line dropped), then the error
                    most = min(MAX_PENDING - len(pending), bound - self.inflated)
                    out = _before_damage(before, data, e, most)
                    self.inflated += len(out)
                    yield from _whole_lines(pending, out, self.offset)
                    raise
                self.inflated += len(out)
                if self.inflated > bound:
                    raise TooCompressed(self.offset + len(chunk), self.inflated)
                yield from _whole_lines(pending, out, self.offset)
                data = z.unconsumed_tail
                if len(pending) >= MAX_PENDING:
                    yield bytes(pending), self.offset
                    return
                if z.eof and (rest := z.unused_data + data).strip(b"\0"):
                    if not rest.startswith(GZIP_MAGIC[: len(rest)]):
                        # not another gzip member: bytes appended after the stream's end (by
                        # hand, a tool): the records before them stand; how many is said
                        self.trailer_seen = True
                        self.after_end = len(rest)  # (at least: what follows is not read)
                        if pending:
                            yield bytes(pending), self.offset
                        return
                    # another gzip member follows (files joined): read on; the reader refuses
                    # the second header it holds
                    z = zlib.decompressobj(31)
                    data = rest
            self.offset += len(chunk)
        self.trailer_seen = z.eof
        if pending:
            yield bytes(pending), self.offset
