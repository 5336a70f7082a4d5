"""Reading traces, either version, with one set of rules (docs/trace-format.md): line 1 a header,
then one `tick` record per sampler tick, then an `end` record when the recording stopped cleanly.
A partial last line (a killed recorder) is dropped with a warning; anything else malformed is an
error naming the file and where (gpumon.core.errors.TraceError, exit 4).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpumon.core.errors import TraceError
from gpumon.core.files import NotRegularFile, open_regular
from gpumon.core.model import GpuSample, Tick
from gpumon.trace.compact import Decoder, names_from_header
from gpumon.trace.gzipped import GZIP_MAGIC, MAX_RATIO, GzipLines, TooCompressed
from gpumon.trace.records import (
    FORMAT,
    MAX_GAP_S,
    MAX_GPUS_IN_A_TRACE,
    MAX_INTERVAL_S,
    MAX_LINE_BYTES,
    MIN_INTERVAL_S,
    VERSION,
    BadRecord,
    shown,
    tick_from_dict,
)


@dataclass
class Trace:
    path: str
    header: dict[str, Any]
    ticks: list[Tick]
    end: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)

    @property
    def gpu_count(self) -> int:
        return max((len(t.gpus) for t in self.ticks), default=0)

    @property
    def duration_s(self) -> float:
        return self.ticks[-1].t_s - self.ticks[0].t_s if len(self.ticks) > 1 else 0.0


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259); Python's parser takes them unless told."""
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    """A JSON number that does not fit a double (1e999) would become infinity: refused too."""
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def _bounded_int(text: str) -> int:
    """A whole number of more digits than any counter has (Python refuses over 4,300 anyway)."""
    if len(text) > 40:
        raise _NonFinite(f"a number of {len(text)} digits")
    return int(text)


MAX_IGNORED_IN_A_ROW = 10_000
"""Records of unknown types are ignored (a newer gpumon's), but not endlessly: a trace holds a tick
every interval, and a file of nothing else is not one this gpumon can read."""
WARNINGS_PER_KIND = 5
"""Warnings of one kind kept per file (a repeated t_s on every record says the same thing a
million times): the first few, then one line with the count of the rest."""


def iter_trace(
    path: str,
    warnings: list[str] | None = None,
    wanted: Callable[[int], bool] | None = None,
    kinds: list[str] | None = None,
    hidden: dict[str, int] | None = None,
) -> Generator[dict[str, Any] | Tick, None, None]:
    """Yield the header dict, then Ticks, then the end dict if present. Either version.

    Rules (documented in docs/trace-format.md): a partial last line (a killed recorder) is dropped
    with a warning; a tick whose t_s equals the previous one is dropped with a warning; a tick that
    goes back in time, a line that is not JSON elsewhere, or a malformed record is an error naming
    the line (version 2: the record and the compressed byte offset). Unknown record types and
    unknown fields are ignored (forward compatibility).

    `kinds`, when given, gets each warning's kind ("torn", "repeated t_s", ...), one per line
    added to `warnings`: a reader of many files bounds its warnings per kind (gpumon.trace.range).
    `hidden`, when given, gets the count of each kind's warnings past the first WARNINGS_PER_KIND,
    instead of a line saying how many: such a reader counts them with its own.
    """
    reader = _Reader(path, warnings if warnings is not None else [], kinds)
    reader.hidden = hidden
    reader.wanted = wanted
    try:
        f = open_regular(path)  # a FIFO would block, a device never end
    except NotRegularFile as e:
        if e.kind == "directory":
            raise TraceError(
                path, None, "a directory: name a trace file (analyze --from DIR reads a directory)"
            ) from None
        raise TraceError(path, None, f"not a regular file (a {e.kind}): name a trace file") from None
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror}") from None
    with f:
        try:
            if f.read(2) == GZIP_MAGIC:
                f.seek(0)
                yield from _iter_gzip(f, reader)
                return
            f.seek(0)
            lineno = 0
            # a line is read to at most MAX_LINE_BYTES + 1 bytes: a longer one is refused unread
            while raw := f.readline(MAX_LINE_BYTES + 1):
                lineno += 1
                if raw.endswith(b"\n") or len(raw) > MAX_LINE_BYTES:
                    yield from reader.parse(lineno, raw)
                    continue
                # Only the last line can lack its newline: a recorder killed mid-write.
                try:
                    yield from reader.parse(lineno, raw)
                except TraceError:
                    if lineno == 1:
                        raise
                    reader.warn(
                        "partial", f"{path}:{lineno}: partial last line dropped (recorder was killed?)"
                    )
            if lineno == 0:
                raise TraceError(path, None, "empty file: not a gpumon trace")
        except OSError as e:  # a bad sector (EIO), a file gone from NFS: the file's, not a bug (exit 1)
            raise TraceError(path, None, f"cannot read: {e.strerror or e}") from None
        finally:
            reader.finish()


def _iter_gzip(f: Any, reader: _Reader) -> Iterator[dict[str, Any] | Tick]:
    path = reader.path
    lines = GzipLines(f)
    lineno = 0
    try:
        for raw, offset in lines:
            lineno += 1
            reader.offset = offset
            if raw.endswith(b"\n"):
                yield from reader.parse(lineno, raw)
                continue
            try:
                yield from reader.parse(lineno, raw)
            except TraceError:
                if lineno == 1:
                    raise
                reader.warn(
                    "partial",
                    f"{path}: record {lineno} (byte {offset}): partial last record dropped "
                    "(recorder was killed?)",
                )
    except TooCompressed as e:
        raise TraceError(
            path,
            None,
            f"byte {e.offset}: inflates to more than {MAX_RATIO} times its compressed size, which no "
            "gpumon trace does (a decompression bomb?): refused",
        ) from None
    except zlib.error as e:
        where = getattr(e, "offset", lines.offset)
        if lineno == 0:
            raise TraceError(
                path, None, f"byte {where}: not a gpumon trace (corrupt gzip data: {e})"
            ) from None
        raise TraceError(
            path, None, f"byte {where}: corrupt compressed data after record {lineno} ({e})"
        ) from None
    except EOFError:
        pass
    if lineno == 0:
        raise TraceError(path, None, "empty compressed stream: not a gpumon trace")
    if lines.after_end:
        reader.warn(
            "after-end",
            f"{path}: what follows the end of the compressed stream is not a trace's: ignored, "
            "the records before it read",
        )
    if not lines.trailer_seen:
        reader.warn(
            "torn",
            f"{path}: the compressed stream stops at byte {lines.offset} without its end "
            "(the recorder was killed?): read to its last whole record",
        )


class _Reader:
    def __init__(self, path: str, warnings: list[str], kinds: list[str] | None = None) -> None:
        self.path = path
        self.warnings = warnings
        self.warning_kinds = kinds
        """The kind of each line added to `warnings`, when the caller asked."""
        self.last_t: float | None = None
        self.decoder: Any = None
        """Set by a version 2 header: turns its compact tick records back into version 1's."""
        self.offset: int | None = None
        """Version 2: the compressed byte reached, named in errors."""
        self.wanted: Callable[[int], bool] | None = None
        """Only these GPU indices are read (analyze --gpu, and a worker's share)."""
        self._kinds: dict[str, int] = {}
        self.hidden: dict[str, int] | None = None
        """Where the counts of warnings not kept go, instead of a line (iter_trace's `hidden`)."""
        self.ignored = 0
        """Records of unknown types since the last known one."""
        self._gpus_seen: set[tuple[int, int | None, str | None]] = set()

    def warn(self, kind: str, text: str) -> None:
        """A warning, kept when it is among the first WARNINGS_PER_KIND of its kind."""
        n = self._kinds[kind] = self._kinds.get(kind, 0) + 1
        if n <= WARNINGS_PER_KIND:
            self._add(kind, text)

    def _add(self, kind: str, text: str) -> None:
        self.warnings.append(text)
        if self.warning_kinds is not None:
            self.warning_kinds.append(kind)

    def finish(self) -> None:
        """One line for each kind of warning that had more than were kept."""
        for kind, n in self._kinds.items():
            if n <= WARNINGS_PER_KIND:
                continue
            if self.hidden is not None:
                self.hidden[kind] = self.hidden.get(kind, 0) + n - WARNINGS_PER_KIND
            else:
                self._add(kind, f"{self.path}: {n - WARNINGS_PER_KIND} more warning(s) like these ({kind})")
        self._kinds.clear()

    def _error(self, lineno: int, reason: str) -> TraceError:
        if self.offset is None:
            return TraceError(self.path, lineno, reason)
        return TraceError(self.path, None, f"record {lineno} (byte {self.offset}): {reason}")

    def parse(self, lineno: int, raw: bytes) -> Iterator[dict[str, Any] | Tick]:
        path = self.path
        if len(raw) > MAX_LINE_BYTES:
            raise self._error(
                lineno,
                f"a line of more than {MAX_LINE_BYTES} bytes (no gpumon record comes near): refused unread",
            )
        try:
            record = json.loads(
                raw, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int
            )
        except UnicodeDecodeError:
            raise self._error(lineno, "not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise self._error(lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except _NonFinite as e:
            raise self._error(lineno, f"not valid JSON: {e} is not a number JSON allows") from None
        except RecursionError:
            raise self._error(lineno, "JSON nested too deeply to be a gpumon record") from None
        if not isinstance(record, dict):
            raise self._error(lineno, "each line must be a JSON object")
        kind = record.get("type")
        if lineno > 1 and kind is None and self.decoder is not None:
            try:
                record = self.decoder.decode(record)
            except BadRecord as e:
                raise self._error(lineno, str(e)) from None
            kind = "tick"
        elif kind == "tick" and self.decoder is not None:
            kind = "tick (in a version 2 trace)"  # version 2 ticks carry no type: some other record
        if lineno == 1:
            yield self._header(lineno, record)
        elif kind == "tick":
            try:
                tick = tick_from_dict(record, self.wanted)
            except BadRecord as e:
                raise self._error(lineno, str(e)) from None
            if self.last_t is not None and tick.t_s < self.last_t:
                raise self._error(
                    lineno, f"t_s {tick.t_s:g} goes back in time (previous tick was at {self.last_t:g})"
                )
            if self.last_t is not None and tick.t_s - self.last_t > MAX_GAP_S:
                raise self._error(
                    lineno,
                    f"t_s {tick.t_s:g} is {tick.t_s - self.last_t:g} s after the previous tick, more "
                    f"than the largest gap read ({MAX_GAP_S / 86400:g} days): a corrupt t_s, or two "
                    "recordings joined",
                )
            if self.last_t is not None and tick.t_s == self.last_t:
                self.warn("repeated t_s", f"{path}:{lineno}: repeated t_s {tick.t_s:g}: tick dropped")
                return
            self.last_t = tick.t_s
            yield self._count_gpus(lineno, tick)
        elif kind == "end":
            yield record
        elif kind == "header":
            raise self._error(lineno, "a second header: two traces concatenated?")
        else:  # unknown record types: ignored, for forward compatibility, a bounded number at a time
            self.ignored += 1
            if self.ignored > MAX_IGNORED_IN_A_ROW:
                raise self._error(
                    lineno,
                    f"{MAX_IGNORED_IN_A_ROW} records in a row of a type this gpumon does not know "
                    f"({str(kind)[:40]!r}), and no tick: not a trace it can read (a newer gpumon's?)",
                )
            return
        self.ignored = 0

    def _count_gpus(self, lineno: int, tick: Tick) -> Tick:
        """Each GPU a trace names is followed through its whole analysis: a trace naming more than
        MAX_GPUS_IN_A_TRACE is refused (20 ticks of 10,000 GPUs each took 1.6 GB and printed a
        million lines: found by a hostile-input pass). A GPU listed twice in one tick is read
        once, with a warning (fed twice, two GPUs' samples made one bursty GPU of them)."""
        units = {(g.index, g.mig, g.uuid) for g in tick.gpus}
        if len(units) < len(tick.gpus):
            kept: list[GpuSample] = []
            twice: list[GpuSample] = []
            for g in tick.gpus:
                key = (g.index, g.mig, g.uuid)
                (kept if key in units else twice).append(g)
                units.discard(key)
            self.warn(
                "duplicate GPU",
                f"{self.path}:{lineno}: GPU {twice[0].index} listed twice in one tick: the second dropped",
            )
            tick = tick._replace(gpus=tuple(kept))
        seen = self._gpus_seen
        for g in tick.gpus:  # (with `mig`: 50,000 MIG instances of one index and UUID ran 3 minutes)
            seen.add((g.index, g.mig, g.uuid))
        if len(seen) > MAX_GPUS_IN_A_TRACE:
            raise self._error(
                lineno,
                f"more than {MAX_GPUS_IN_A_TRACE} GPUs in one trace (no node has that many, MIG "
                "instances and replaced boards included): refused",
            )
        return tick

    def _header(self, lineno: int, record: dict[str, Any]) -> dict[str, Any]:
        if record.get("type") != "header" or record.get("format") != FORMAT:
            raise self._error(lineno, f"not a gpumon trace (line 1 must be a {FORMAT} header)")
        version = record.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self._error(lineno, f"invalid trace version {shown(version)}")
        if version > VERSION:
            raise self._error(
                lineno, f"trace version {version} is newer than this gpumon reads ({VERSION}); upgrade gpumon"
            )
        if version == 2:  # compact ticks (also read from a zcat'd copy, and v1 from a gzipped one)
            self.decoder = Decoder()
        elif version == 3:  # version 2 with short field names, their table in the header
            try:
                self.decoder = Decoder(names_from_header(record.get("names")))
            except ValueError as e:
                raise self._error(lineno, str(e)) from None
        source = record.get("source", {})
        if not isinstance(source, dict):
            raise self._error(lineno, f"header field 'source' must be an object, got {type(source).__name__}")
        interval = record.get("interval_s")
        if interval is not None and (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S
        ):
            raise self._error(
                lineno,
                f"header field 'interval_s' must be a number from {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}, "
                f"got {shown(interval)}",
            )
        for key in ("started_unix_s",):
            value = record.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise self._error(lineno, f"header field {key!r} must be a number, got {shown(value)}")
        return record


def read_trace(path: str) -> Trace:
    warnings: list[str] = []
    header: dict[str, Any] | None = None
    ticks: list[Tick] = []
    end = None
    for item in iter_trace(path, warnings):
        if isinstance(item, Tick):
            ticks.append(item)
        elif item.get("type") == "header":
            header = item
        else:
            end = item
    assert header is not None
    if end is None:
        warnings.append(
            f"{path}: no end record: the recording did not stop cleanly ({len(ticks)} ticks kept)"
        )
    return Trace(path=path, header=header, ticks=ticks, end=end, warnings=warnings)
