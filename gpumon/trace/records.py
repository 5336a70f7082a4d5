"""The codec between samples (gpumon.core.model) and trace records (docs/trace-format.md), in both
directions, with the one set of rules every reader applies: version 1's tick dictionaries are the
common form (version 2's compact records decode into them: gpumon.trace.compact). The format's
constants and its one error type live here too.
"""

from __future__ import annotations

import math
import reprlib
import socket
import time
from collections.abc import Callable
from typing import Any

from gpumon import __version__
from gpumon.core.model import (
    MAX_GPU_PROCESSES,
    MAX_HOST_PROCESSES,
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
VERSION = 3
"""The newest version read and, by default, written (version 1: plain JSON Lines; 2: compact,
gzipped; 3: version 2 with short field names, their table in the header)."""
MAX_GAP_S = 7 * 86400.0
"""The largest step between two ticks a reader accepts: a recorder suspended for a week is still
read; a `t_s` of 1e12 (an edited or corrupt line, two recordings joined) is refused, naming the
line. Gaps up to this are skipped in time proportional to the data, not to the gap."""
MAX_GPUS_IN_A_TRACE = 4096
"""GPUs (index and UUID) one trace may name, over its whole length: a node's GPUs, their MIG
instances, boards replaced. Each is followed through the analysis, so more are refused."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""No tick of a real fleet comes near this (~0.7 KB per GPU): a longer line is refused."""
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.05, 3600.0
"""The header's interval_s must lie here, as `record --interval` must (gpumon.config.settings)."""

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


class BadRecord(Exception):
    """A record (or one of its fields) that breaks the format's rules; the reader adds the file and
    where in it."""


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 60
_SHOWN.maxlist = _SHOWN.maxdict = 4
_SHOWN.maxlevel = 2


def shown(value: Any) -> str:
    """A value read from a trace, as an error message quotes it: escaped like repr (no terminal
    controls) and cut short (a 16 MiB list once made a 15 MB error line: found by a hostile-input
    pass)."""
    return _SHOWN.repr(value)


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


def host_to_dict(h: HostSample) -> dict[str, Any]:
    return {
        "cpu_count": h.cpu_count,
        "cpu_ratio": h.cpu_ratio,
        "busiest_core_ratio": h.busiest_core_ratio,
        "iowait_ratio": h.iowait_ratio,
        "load1": h.load1,
        "disk_read_bytes_per_s": h.disk_read_bytes_per_s,
        **({"disk_busy_ratio": h.disk_busy_ratio} if h.disk_busy_ratio is not None else {}),
        **({"runnable": h.runnable} if h.runnable is not None else {}),
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
    for key in ("busiest_demand_ratio", "runq_wait_ratio", "blkio_wait_ratio", "age_s"):
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


def make_header(source: dict[str, Any], interval_s: float, version: int = VERSION) -> dict[str, Any]:

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


# -- decoding -----------------------------------------------------------------------------------


def _num(d: dict[str, Any], key: str, *, optional: bool = True, integer: bool = False) -> Any:
    value = d.get(key)
    if value is None:
        if optional:
            return None
        raise BadRecord(f"missing field {key!r}")
    kind = type(value)  # exact types: bool is not a number here; this runs millions of times
    if kind is float and not integer:
        if -1e18 <= value <= 1e18:  # also false for NaN and infinities
            return value
    elif kind is int and -(10**18) <= value <= 10**18:
        return value if integer else float(value)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (isinstance(value, float) and not math.isfinite(value)):
        what = "whole number" if integer else "number"
        raise BadRecord(f"field {shown(key)} must be a {what}, got {shown(value)}")
    # beyond any counter, byte count or time a GPU produces
    raise BadRecord(f"field {shown(key)} is out of range: {shown(value)}")


def _str(d: dict[str, Any], key: str, default: str = "") -> str:
    value = d.get(key, default)
    if not isinstance(value, str):
        raise BadRecord(f"field {key!r} must be a string, got {shown(value)}")
    return value


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key) or []
    if not isinstance(value, list):
        raise BadRecord(f"field {key!r} must be a list")
    return value


MAX_PROCESSES = MAX_GPU_PROCESSES
"""Processes one GPU may list in a tick: as many as gpumon's NVML source reads."""
# MAX_HOST_PROCESSES: a version 2 file's host inherits its list on every tick that does not change
# it: a record of 200,000 made each tick after it cost 0.6 s to read (a reviewer's finding).


def _processes(d: dict[str, Any], most: int = MAX_PROCESSES) -> list[Any]:
    procs = _list(d, "processes")
    if len(procs) > most:
        raise BadRecord(f"{len(procs)} processes in one list, more than {most}: not a trace to read")
    return procs


_NUMBER = (int, float)
"""Exact types (type(x) in _NUMBER): bool, a subclass of int, is not a number in a trace."""


def _job(d: Any) -> JobRef:
    if not isinstance(d, dict):
        raise BadRecord("each entry of 'jobs' must be an object")
    for key in ("scheduler", "job_id"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise BadRecord(f"a job's {key!r} must be a string")
    kwargs: dict[str, Any] = {k: d.get(k) for k in JobRef._fields if k in d}
    started = kwargs.pop("started_unix_s", None)
    if any(v is not None and not isinstance(v, str) for v in kwargs.values()):
        raise BadRecord("a job's fields must be strings")
    if started is not None:
        kwargs["started_unix_s"] = _num({"started_unix_s": started}, "started_unix_s")
    kwargs.setdefault("via", "")
    return JobRef(**kwargs)


def _gpu(d: Any, t_s: float) -> GpuSample:
    if not isinstance(d, dict):
        raise BadRecord("each entry of 'gpus' must be an object")
    history = []
    for p in _list(d, "util_history"):
        if type(p) is not list or len(p) != 2:
            raise BadRecord(f"util_history entries must be [t_s, util_ratio], got {shown(p)}")
        t, u = p
        if type(t) not in _NUMBER or type(u) not in _NUMBER:
            raise BadRecord(f"util_history entries must be [t_s, util_ratio], got {shown(p)}")
        if not -1e18 <= t <= 1e18:  # false for NaN and infinities too
            raise BadRecord(f"util_history entry out of range: {shown(p)}")
        if not -1e-9 <= u <= 1 + 1e-9:
            raise BadRecord(
                f"util_history entries must be finite, with util_ratio between 0 and 1; got {shown(p)}"
            )
        history.append(UtilPoint(float(t), float(u)))
    procs = []
    for p in _processes(d):
        if not isinstance(p, dict):
            raise BadRecord("each process must be an object")
        procs.append(
            GpuProcess(_num(p, "pid", optional=False, integer=True), _num(p, "gpu_mem_bytes", integer=True))
        )
    available = d.get("available", True)
    if not isinstance(available, bool):
        raise BadRecord(f"field 'available' must be true or false, got {shown(available)}")
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
            raise BadRecord("field 'gpm' must be an object")
        unknown = set(gpm) - set(GpmActivity._fields)
        if unknown:
            raise BadRecord(f"field 'gpm' has unknown keys: {', '.join(map(shown, sorted(unknown)[:4]))}")
        out["gpm"] = GpmActivity(**{k: _num(gpm, k) for k in gpm})
    out["clock_events"] = _num(d, "clock_events", integer=True)
    seconds = d.get("clock_event_s")
    if seconds is not None:
        if not isinstance(seconds, dict):
            raise BadRecord("field 'clock_event_s' must be an object of reason: seconds")
        out["clock_event_s"] = tuple((str(k), float(_num(seconds, k, optional=False))) for k in seconds)
    xids = d.get("xids")
    if xids is not None:
        # a code's digits are ASCII, and few: int() takes '٣' and refuses '²' or 5,000 digits
        if not isinstance(xids, dict) or not all(k.isascii() and k.isdigit() and len(k) <= 10 for k in xids):
            raise BadRecord("field 'xids' must be an object of XID code: count")
        out["xids"] = tuple(XidCount(int(k), _num(xids, k, optional=False, integer=True)) for k in xids)
    last = d.get("last_xid")
    if last is not None:
        shape_ok = type(last) is list and len(last) == 2
        if not shape_ok or type(last[0]) is not int or type(last[1]) not in _NUMBER:
            raise BadRecord(f"field 'last_xid' must be [code, unix_s], got {shown(last)}")
        out["last_xid"] = (last[0], float(last[1]))
    return out


def _host(d: Any, t_s: float) -> HostSample | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise BadRecord("'host' must be an object or null")
    procs = []
    for p in _processes(d, MAX_HOST_PROCESSES):
        if not isinstance(p, dict):
            raise BadRecord("each host process must be an object")
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
                age_s=_num(p, "age_s"),
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
        disk_busy_ratio=_num(d, "disk_busy_ratio"),  # added within version 1: absent in older traces
        runnable=_num(d, "runnable", integer=True),  # added 2026-12-03: absent in older traces
    )


def tick_from_dict(d: dict[str, Any], wanted: Callable[[int], bool] | None = None) -> Tick:
    """`wanted(index)`: read only these GPUs (the others are passed over unread)."""
    t_s = _num(d, "t_s", optional=False)
    gpus = d.get("gpus")
    if not isinstance(gpus, list):
        raise BadRecord("missing or invalid field 'gpus' (a list)")
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
