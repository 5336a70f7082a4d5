"""Trace files: what `gpumon record` and the daemon's recorder write and `analyze` / `--replay` read.

Format (docs/trace-format.md): JSON Lines, UTF-8. Line 1 is a header, then one `tick` record per
sampler tick, then an `end` record when the recording stopped cleanly. Each line is written and
flushed as a whole, so a process killed with SIGKILL leaves every earlier line intact and at most a
partial last line, which readers drop with a warning. fsync runs every few seconds and at close,
so even a power loss costs at most that much. Version 2 (gpumon.tracev2) is the same records made
compact inside one gzip stream; the reader here takes both, with one set of rules.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpumon.errors import OutputError, TraceError
from gpumon.model import (
    GpmActivity,
    GpuProcess,
    GpuSample,
    HostSample,
    JobRef,
    ProcessCpu,
    Tick,
    UtilPoint,
    XidCount,
)

FORMAT = "gpumon-trace"
VERSION = 2
"""The newest version read and, by default, written (version 1: plain JSON Lines)."""
FSYNC_EVERY_S = 5.0
MAX_GAP_S = 7 * 86400.0
"""The largest step between two ticks a reader accepts: a recorder suspended for a week is still
read; a `t_s` of 1e12 (an edited or corrupt line, two recordings joined) is refused, naming the
line. Gaps up to this are skipped in time proportional to the data, not to the gap."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""No tick of a real fleet comes near this (~0.7 KB per GPU): a longer line is refused."""
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.05, 3600.0
"""The header's interval_s must lie here, as `record --interval` must (gpumon.config)."""

_GPU_FLOATS = (
    "util_ratio",
    "mem_util_ratio",
    "power_w",
    "power_limit_w",
    "temp_c",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
)
_GPU_INTS = ("mem_used_bytes", "mem_total_bytes")


# -- encoding -----------------------------------------------------------------------------------


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def gpu_to_dict(g: GpuSample) -> dict[str, Any]:
    d: dict[str, Any] = {"index": g.index, "uuid": g.uuid, "name": g.name, "available": g.available}
    for f in _GPU_FLOATS:
        d[f] = _r(getattr(g, f))
    for f in _GPU_INTS:
        d[f] = getattr(g, f)
    d["processes"] = [{"pid": p.pid, "gpu_mem_bytes": p.gpu_mem_bytes} for p in g.processes]
    d["util_history"] = [[round(p.t_s, 6), round(p.util_ratio, 4)] for p in g.util_history]
    if g.error is not None:
        d["error"] = g.error
    if g.jobs:
        d["jobs"] = [job_to_dict(j) for j in g.jobs]
    # Hopper/MIG fields: written only where the GPU has them, so older traces read the same.
    if g.mig is not None:
        d["mig"] = g.mig
    if g.gpm is not None:
        d["gpm"] = {k: _r(v) for k, v in g.gpm._asdict().items() if v is not None}
    if g.clock_events is not None:
        d["clock_events"] = g.clock_events
    if g.clock_event_s:
        d["clock_event_s"] = {k: round(v, 3) for k, v in g.clock_event_s}
    if g.xids:
        d["xids"] = {str(x.xid): x.seen for x in g.xids}
    if g.last_xid is not None:
        d["last_xid"] = [g.last_xid[0], round(g.last_xid[1], 3)]
    return d


def job_to_dict(j: JobRef) -> dict[str, Any]:
    """A job as traces and the state API write it (absent fields left out)."""
    return {k: v for k, v in j._asdict().items() if v not in (None, "")}


def _job(d: Any) -> JobRef:
    if not isinstance(d, dict):
        raise _Bad("each entry of 'jobs' must be an object")
    for key in ("scheduler", "job_id"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise _Bad(f"a job's {key!r} must be a string")
    kwargs: dict[str, Any] = {k: d.get(k) for k in JobRef._fields if k in d}
    started = kwargs.pop("started_unix_s", None)
    if any(v is not None and not isinstance(v, str) for v in kwargs.values()):
        raise _Bad("a job's fields must be strings")
    if started is not None:
        kwargs["started_unix_s"] = _num({"started_unix_s": started}, "started_unix_s")
    kwargs.setdefault("via", "")
    return JobRef(**kwargs)


def host_to_dict(h: HostSample) -> dict[str, Any]:
    return {
        "cpu_count": h.cpu_count,
        "cpu_ratio": h.cpu_ratio,
        "busiest_core_ratio": h.busiest_core_ratio,
        "iowait_ratio": h.iowait_ratio,
        "load1": h.load1,
        "disk_read_bytes_per_s": h.disk_read_bytes_per_s,
        "processes": [
            {
                "pid": p.pid,
                "name": p.name,
                "cpu_ratio": p.cpu_ratio,
                "children_cpu_ratio": p.children_cpu_ratio,
                "busiest_child_cpu_ratio": p.busiest_child_cpu_ratio,
                "children": p.children,
                "read_bytes_per_s": p.read_bytes_per_s,
                **_sched_fields(p),
            }
            for p in h.processes
        ],
    }


def _sched_fields(p: ProcessCpu) -> dict[str, float]:
    """Written only where the kernel gave them (added within version 1: older readers ignore them)."""
    out = {}
    for key in ("busiest_demand_ratio", "runq_wait_ratio", "blkio_wait_ratio"):
        value = getattr(p, key)
        if value is not None:
            out[key] = value
    return out


def tick_to_dict(t: Tick) -> dict[str, Any]:
    d: dict[str, Any] = {
        "type": "tick",
        "t_s": round(t.t_s, 6),
        "gpus": [gpu_to_dict(g) for g in t.gpus],
        "host": host_to_dict(t.host) if t.host is not None else None,
    }
    if t.source_errors:
        d["source_errors"] = list(t.source_errors)
    return d


# -- writing ------------------------------------------------------------------------------------


def make_header(source: dict[str, Any], interval_s: float, version: int = VERSION) -> dict[str, Any]:
    from gpumon import __version__

    return {
        "type": "header",
        "format": FORMAT,
        "version": version,
        "gpumon_version": __version__,
        "started_unix_s": round(time.time(), 3),
        "hostname": socket.gethostname(),
        "interval_s": interval_s,
        "source": source,
    }


class TraceWriter:
    """Appends whole lines; never leaves a half-written line except when killed mid-write."""

    def __init__(
        self, path: str, header: dict[str, Any], *, force: bool = False, fsync_every_s: float = FSYNC_EVERY_S
    ) -> None:
        self.path = path
        self.ticks = 0
        self.failed = False
        """A write failed (disk full): close() then only releases the file."""
        self._fsync_every_s = fsync_every_s
        self._last_fsync = time.monotonic()
        try:
            self._f: TextIO = open(path, "w" if force else "x", encoding="utf-8")
        except FileExistsError:
            raise OutputError(
                f"{path}: already exists; choose another -o or pass --force to overwrite it"
            ) from None
        except OSError as e:
            raise OutputError(f"{path}: cannot create: {e.strerror}") from None
        self._write({**header, "version": 1})

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        try:
            self._f.write(line)
            self._f.flush()
            now = time.monotonic()
            if now - self._last_fsync >= self._fsync_every_s:
                os.fsync(self._f.fileno())
                self._last_fsync = now
        except OSError as e:
            self.failed = True
            raise OutputError(
                f"{self.path}: cannot write: {e.strerror}; the {self.ticks} ticks before are kept"
            ) from None

    def write_tick(self, tick: Tick) -> None:
        self._write(tick_to_dict(tick))
        self.ticks += 1

    def close(self, t_s: float | None, reason: str | None) -> None:
        """Write the end record (none when `reason` is None) and close. After a failed write, only
        release the file: the error the user sees is that first one (exit 5), not a second from here."""
        if self._f.closed:
            return
        try:
            if not self.failed and reason is not None:
                self._write({"type": "end", "t_s": t_s, "ticks": self.ticks, "reason": reason})
                try:
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


class TraceWriterV2:
    """Version 2: the same records, compact, in one gzip stream flushed after every record."""

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        *,
        force: bool = False,
        fsync_every_s: float = FSYNC_EVERY_S,
        origin_s: float = 0.0,
    ) -> None:
        """`origin_s`: the caller's clock at the file's t_s 0 (the daemon's recorder starts each
        segment's times afresh)."""
        from gpumon.tracev2 import Encoder, GzipRecordWriter

        self.path = path
        self.ticks = 0
        self.last_t_s: float | None = None
        """The file's own time of the last tick written."""
        self._origin = origin_s
        self._out = GzipRecordWriter(path, force=force, fsync_every_s=fsync_every_s)
        self._enc = Encoder(origin_s)
        self._write({**header, "version": 2})

    @property
    def failed(self) -> bool:
        return self._out.failed

    @property
    def bytes(self) -> int:
        return self._out.bytes

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        try:
            self._out.write(line)
        except OutputError as e:
            raise OutputError(f"{e}; the {self.ticks} ticks before are kept") from None

    def write_tick(self, tick: Tick) -> None:
        self._write(self._enc.encode(tick))
        self.ticks += 1
        self.last_t_s = round(tick.t_s - self._origin, 6)

    def close(self, t_s: float | None, reason: str | None) -> None:
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
    return TraceWriterV2(path, header, force=force)


def version_for(path: str, asked: int | None) -> int:
    """The version `record -o PATH` writes: as asked, else 1 for a `.jsonl` name, else 2."""
    if asked is not None:
        return asked
    return 1 if path.endswith(".jsonl") else VERSION


# -- reading ------------------------------------------------------------------------------------


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


class _Bad(Exception):
    """A field-level problem; the reader adds the file and line."""


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


def _num(d: dict[str, Any], key: str, *, optional: bool = True, integer: bool = False) -> Any:
    value = d.get(key)
    if value is None:
        if optional:
            return None
        raise _Bad(f"missing field {key!r}")
    kind = type(value)  # exact types: bool is not a number here; this runs millions of times
    if kind is float and not integer:
        if -1e18 <= value <= 1e18:  # also false for NaN and infinities
            return value
    elif kind is int and -(10**18) <= value <= 10**18:
        return value if integer else float(value)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise _Bad(f"field {key!r} must be a {'whole number' if integer else 'number'}, got {value!r}")
    # beyond any counter, byte count or time a GPU produces
    raise _Bad(f"field {key!r} is out of range: {value!r}")


def _str(d: dict[str, Any], key: str, default: str = "") -> str:
    value = d.get(key, default)
    if not isinstance(value, str):
        raise _Bad(f"field {key!r} must be a string, got {value!r}")
    return value


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key) or []
    if not isinstance(value, list):
        raise _Bad(f"field {key!r} must be a list")
    return value


_NUMBER = (int, float)
"""Exact types (type(x) in _NUMBER): bool, a subclass of int, is not a number in a trace."""


def _gpu(d: Any, t_s: float) -> GpuSample:
    if not isinstance(d, dict):
        raise _Bad("each entry of 'gpus' must be an object")
    history = []
    for p in _list(d, "util_history"):
        if type(p) is not list or len(p) != 2:
            raise _Bad(f"util_history entries must be [t_s, util_ratio], got {p!r}")
        t, u = p
        if type(t) not in _NUMBER or type(u) not in _NUMBER:
            raise _Bad(f"util_history entries must be [t_s, util_ratio], got {p!r}")
        if not -1e18 <= t <= 1e18:  # false for NaN and infinities too
            raise _Bad(f"util_history entry out of range: {p!r}")
        if not -1e-9 <= u <= 1 + 1e-9:
            raise _Bad(f"util_history entries must be finite, with util_ratio between 0 and 1; got {p!r}")
        history.append(UtilPoint(float(t), float(u)))
    procs = []
    for p in _list(d, "processes"):
        if not isinstance(p, dict):
            raise _Bad("each process must be an object")
        procs.append(
            GpuProcess(_num(p, "pid", optional=False, integer=True), _num(p, "gpu_mem_bytes", integer=True))
        )
    available = d.get("available", True)
    if not isinstance(available, bool):
        raise _Bad(f"field 'available' must be true or false, got {available!r}")
    kwargs: dict[str, Any] = {f: _num(d, f) for f in _GPU_FLOATS}
    kwargs.update({f: _num(d, f, integer=True) for f in _GPU_INTS})
    kwargs.update(_hopper_fields(d))
    error = d.get("error")
    return GpuSample(
        t_s=t_s,
        index=_num(d, "index", optional=False, integer=True),
        uuid=_str(d, "uuid"),
        name=_str(d, "name"),
        available=available,
        processes=tuple(procs),
        util_history=tuple(history),
        error=error if isinstance(error, str) else None,
        jobs=tuple(_job(j) for j in _list(d, "jobs")),
        **kwargs,
    )


def _hopper_fields(d: dict[str, Any]) -> dict[str, Any]:
    """mig, gpm, clock events and XIDs (docs/trace-format.md), each optional."""
    out: dict[str, Any] = {}
    out["mig"] = _num(d, "mig", integer=True)
    gpm = d.get("gpm")
    if gpm is not None:
        if not isinstance(gpm, dict):
            raise _Bad("field 'gpm' must be an object")
        unknown = set(gpm) - set(GpmActivity._fields)
        if unknown:
            raise _Bad(f"field 'gpm' has unknown keys: {', '.join(sorted(unknown))}")
        out["gpm"] = GpmActivity(**{k: _num(gpm, k) for k in gpm})
    out["clock_events"] = _num(d, "clock_events", integer=True)
    seconds = d.get("clock_event_s")
    if seconds is not None:
        if not isinstance(seconds, dict):
            raise _Bad("field 'clock_event_s' must be an object of reason: seconds")
        out["clock_event_s"] = tuple((str(k), float(_num(seconds, k, optional=False))) for k in seconds)
    xids = d.get("xids")
    if xids is not None:
        if not isinstance(xids, dict) or not all(k.isdigit() for k in xids):
            raise _Bad("field 'xids' must be an object of XID code: count")
        out["xids"] = tuple(XidCount(int(k), _num(xids, k, optional=False, integer=True)) for k in xids)
    last = d.get("last_xid")
    if last is not None:
        shape_ok = type(last) is list and len(last) == 2
        if not shape_ok or type(last[0]) is not int or type(last[1]) not in _NUMBER:
            raise _Bad(f"field 'last_xid' must be [code, unix_s], got {last!r}")
        out["last_xid"] = (last[0], float(last[1]))
    return out


def _host(d: Any, t_s: float) -> HostSample | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise _Bad("'host' must be an object or null")
    procs = []
    for p in _list(d, "processes"):
        if not isinstance(p, dict):
            raise _Bad("each host process must be an object")
        procs.append(
            ProcessCpu(
                pid=_num(p, "pid", optional=False, integer=True),
                name=_str(p, "name"),
                cpu_ratio=_num(p, "cpu_ratio") or 0.0,
                children_cpu_ratio=_num(p, "children_cpu_ratio") or 0.0,
                busiest_child_cpu_ratio=_num(p, "busiest_child_cpu_ratio") or 0.0,
                children=_num(p, "children", integer=True) or 0,
                read_bytes_per_s=_num(p, "read_bytes_per_s"),
                busiest_demand_ratio=_num(p, "busiest_demand_ratio"),
                runq_wait_ratio=_num(p, "runq_wait_ratio"),
                blkio_wait_ratio=_num(p, "blkio_wait_ratio"),
            )
        )
    return HostSample(
        t_s=t_s,
        cpu_count=_num(d, "cpu_count", integer=True) or 1,
        cpu_ratio=_num(d, "cpu_ratio", optional=False),
        busiest_core_ratio=_num(d, "busiest_core_ratio") or 0.0,
        iowait_ratio=_num(d, "iowait_ratio"),
        load1=_num(d, "load1") or 0.0,
        disk_read_bytes_per_s=_num(d, "disk_read_bytes_per_s"),
        processes=tuple(procs),
    )


def tick_from_dict(d: dict[str, Any], wanted: Callable[[int], bool] | None = None) -> Tick:
    """`wanted(index)`: read only these GPUs (the others are passed over unread)."""
    t_s = _num(d, "t_s", optional=False)
    gpus = d.get("gpus")
    if not isinstance(gpus, list):
        raise _Bad("missing or invalid field 'gpus' (a list)")
    if wanted is not None:
        gpus = [
            g
            for g in gpus
            if not isinstance(g, dict) or not isinstance(g.get("index"), int) or wanted(g["index"])
        ]
    errors = d.get("source_errors") or []
    return Tick(
        t_s=t_s,
        gpus=tuple(_gpu(g, t_s) for g in gpus),
        host=_host(d.get("host"), t_s),
        source_errors=tuple(str(e) for e in errors) if isinstance(errors, list) else (),
    )


def iter_trace(
    path: str, warnings: list[str] | None = None, wanted: Callable[[int], bool] | None = None
) -> Iterator[dict[str, Any] | Tick]:
    """Yield the header dict, then Ticks, then the end dict if present. Either version.

    Rules (documented in docs/trace-format.md): a partial last line (a killed recorder) is dropped
    with a warning; a tick whose t_s equals the previous one is dropped with a warning; a tick that
    goes back in time, a line that is not JSON elsewhere, or a malformed record is an error naming
    the line (version 2: the record and the compressed byte offset). Unknown record types and
    unknown fields are ignored (forward compatibility).
    """
    reader = _Reader(path, warnings if warnings is not None else [])
    reader.wanted = wanted
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise TraceError(
            path, None, "a directory: name a trace file (analyze --from DIR reads a directory)"
        ) from None
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror}") from None
    with f:
        from gpumon.tracev2 import GZIP_MAGIC

        if f.read(2) == GZIP_MAGIC:
            f.seek(0)
            yield from _iter_gzip(f, reader)
            return
        f.seek(0)
        lineno = 0
        for raw in f:
            lineno += 1
            if raw.endswith(b"\n"):
                yield from reader.parse(lineno, raw)
                continue
            # Only the last line can lack its newline: a recorder killed mid-write.
            try:
                yield from reader.parse(lineno, raw)
            except TraceError:
                if lineno == 1:
                    raise
                reader.warnings.append(f"{path}:{lineno}: partial last line dropped (recorder was killed?)")
        if lineno == 0:
            raise TraceError(path, None, "empty file: not a gpumon trace")


def _iter_gzip(f: Any, reader: _Reader) -> Iterator[dict[str, Any] | Tick]:
    import zlib

    from gpumon.tracev2 import GzipLines

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
                reader.warnings.append(
                    f"{path}: record {lineno} (byte {offset}): partial last record dropped "
                    "(recorder was killed?)"
                )
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
    if not lines.trailer_seen:
        reader.warnings.append(
            f"{path}: the compressed stream stops at byte {lines.offset} without its end "
            "(the recorder was killed?): read to its last whole record"
        )


class _Reader:
    def __init__(self, path: str, warnings: list[str]) -> None:
        self.path = path
        self.warnings = warnings
        self.last_t: float | None = None
        self.decoder: Any = None
        """Set by a version 2 header: turns its compact tick records back into version 1's."""
        self.offset: int | None = None
        """Version 2: the compressed byte reached, named in errors."""
        self.wanted: Callable[[int], bool] | None = None
        """Only these GPU indices are read (analyze --gpu, and a worker's share)."""

    def _error(self, lineno: int, reason: str) -> TraceError:
        if self.offset is None:
            return TraceError(self.path, lineno, reason)
        return TraceError(self.path, None, f"record {lineno} (byte {self.offset}): {reason}")

    def parse(self, lineno: int, raw: bytes) -> Iterator[dict[str, Any] | Tick]:
        path = self.path
        if len(raw) > MAX_LINE_BYTES:
            raise self._error(lineno, f"a line of {len(raw)} bytes (at most {MAX_LINE_BYTES} are read)")
        try:
            record = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
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
            from gpumon.tracev2 import Bad

            try:
                record = self.decoder.decode(record)
            except Bad as e:
                raise self._error(lineno, str(e)) from None
            kind = "tick"
        elif kind == "tick" and self.decoder is not None:
            return  # version 2 ticks carry no type: this is some other record, ignored
        if lineno == 1:
            yield self._header(lineno, record)
        elif kind == "tick":
            try:
                tick = tick_from_dict(record, self.wanted)
            except _Bad as e:
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
                self.warnings.append(f"{path}:{lineno}: repeated t_s {tick.t_s:g}: tick dropped")
                return
            self.last_t = tick.t_s
            yield tick
        elif kind == "end":
            yield record
        elif kind == "header":
            raise self._error(lineno, "a second header: two traces concatenated?")
        # unknown record types: ignored, for forward compatibility

    def _header(self, lineno: int, record: dict[str, Any]) -> dict[str, Any]:
        if record.get("type") != "header" or record.get("format") != FORMAT:
            raise self._error(lineno, f"not a gpumon trace (line 1 must be a {FORMAT} header)")
        version = record.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self._error(lineno, f"invalid trace version {version!r}")
        if version > VERSION:
            raise self._error(
                lineno, f"trace version {version} is newer than this gpumon reads ({VERSION}); upgrade gpumon"
            )
        if version == 2:  # compact ticks (also read from a zcat'd copy, and v1 from a gzipped one)
            from gpumon.tracev2 import Decoder

            self.decoder = Decoder()
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
                f"got {interval!r}",
            )
        for key in ("started_unix_s",):
            value = record.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise self._error(lineno, f"header field {key!r} must be a number, got {value!r}")
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
