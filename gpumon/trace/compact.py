"""Trace format version 2 (docs/trace-format.md): version 1's records, made compact, gzipped.

What changes from version 1, and why (measured on a simulated starved-cpu + healthy hour, 1 s
ticks, driver samples at 1/6 s: benchmarks/trace_size.py):
- The file is one gzip stream (zlib level 9), flushed (Z_SYNC_FLUSH) after every record by
  `gpumon record`, every 5 s by the daemon's recorder (gpumon.trace.recorder.SYNC_EVERY_S), so a
  process killed at any moment leaves every record older than that decodable. `zcat FILE`
  shows the JSON Lines inside.
- A tick says only what changed: a GPU's field equal to its value in the previous tick of the same
  GPU (by index) in this file is left out; the host object likewise. Absent means "as before";
  `null` means null (a field that went away).
- Times are whole microseconds, as deltas: the tick's `dt_us` from the previous tick (the first from
  the start), and `util_history` as a flat list `[dt_us, util_ratio, dt_us, util_ratio, ...]` where
  the first dt is from the tick's own time and each next one from the sample before.
- A host process's age, which grows every tick, is written as its birth (`born_us`, on the file's
  clock), the same number tick after tick, wherever that gives the very age back (Encoder._births).
Together: 66 MB per GPU per day in version 1 becomes about 4.6; zstandard at comparable CPU cost
did no better (flushing every second leaves it little to work with), so no dependency is added.

Encoder and Decoder hold the "previous tick" state; the Decoder turns a record back into the
version 1 dictionary that gpumon.trace.reader validates, so both versions share one set of rules.
"""

from __future__ import annotations

import math
from typing import Any

from gpumon.core.model import Tick
from gpumon.trace.records import MAX_GPUS_IN_A_TRACE, BadRecord, gpu_to_dict, host_to_dict, shown

_MISSING = object()


NAMES: dict[str, str] = {
    # a tick
    "t": "dt_us",
    "g": "gpus",
    "h": "host",
    "E": "source_errors",
    # a GPU (and a MIG instance)
    "i": "index",
    "m": "mig",
    "u": "uuid",
    "n": "name",
    "a": "available",
    "U": "util_ratio",
    "M": "mem_util_ratio",
    "P": "power_w",
    "L": "power_limit_w",
    "T": "temp_c",
    "R": "pcie_rx_bytes_per_s",
    "X": "pcie_tx_bytes_per_s",
    "mu": "mem_used_bytes",
    "mt": "mem_total_bytes",
    "p": "processes",
    "s": "util_history",
    "e": "error",
    "j": "jobs",
    "G": "gpm",
    "ce": "clock_events",
    "cs": "clock_event_s",
    "x": "xids",
    "lx": "last_xid",
    # a process on a GPU
    "k": "pid",
    "gm": "gpu_mem_bytes",
    # GPM's activities
    "ga": "graphics_ratio",
    "sa": "sm_active_ratio",
    "so": "sm_occupancy_ratio",
    "tn": "tensor_ratio",
    "dw": "dram_bw_ratio",
    "f16": "fp16_ratio",
    "f32": "fp32_ratio",
    "f64": "fp64_ratio",
    # the host, and its processes
    "cn": "cpu_count",
    "c": "cpu_ratio",
    "bc": "busiest_core_ratio",
    "w": "iowait_ratio",
    "l": "load1",
    "dr": "disk_read_bytes_per_s",
    "db": "disk_busy_ratio",
    "rn": "runnable",
    "cc": "children_cpu_ratio",
    "bcc": "busiest_child_cpu_ratio",
    "ch": "children",
    "rb": "read_bytes_per_s",
    "bd": "busiest_demand_ratio",
    "rq": "runq_wait_ratio",
    "bw": "blkio_wait_ratio",
    "age": "age_s",
    "bn": "born_us",
}
"""Version 3's field names, short -> long, written in each file's header (`names`): a tick's field
names, written in full on every tick, were a sixth of a GPU-day once gzipped. The reader takes the
table from the header, so a file says how to read itself; a name not in it is read as it is
(a field added later). Jobs, errors, and the keys of `clock_event_s` and `xids` (which are data,
not field names) are never renamed."""

_SHORT = {long: short for short, long in NAMES.items()}
MAX_NAMES = 256
"""A header's `names` table is refused beyond this many entries (or names beyond 64 characters)."""


def _keys(d: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    return {table.get(k, k): v for k, v in d.items()}


def _inner(d: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    """A GPU or the host, in long names: its processes' and GPM's names mapped by `table`."""
    procs = d.get("processes")
    if type(procs) is list:
        d["processes"] = [_keys(p, table) if type(p) is dict else p for p in procs]
    gpm = d.get("gpm")
    if type(gpm) is dict:
        d["gpm"] = _keys(gpm, table)
    return d


def _renamed(rec: dict[str, Any], table: dict[str, str], expanding: bool) -> dict[str, Any]:
    """A tick record's field names mapped by `table`: its own, its GPUs' and the host's (and theirs:
    processes, GPM). The structure is walked in long names: after the mapping when expanding,
    before it when shortening."""
    out = _keys(rec, table) if expanding else dict(rec)
    gpus = out.get("gpus")
    if type(gpus) is list:
        units = [
            _inner(_keys(g, table) if expanding else dict(g), table) if type(g) is dict else g for g in gpus
        ]
        out["gpus"] = units if expanding else [_keys(g, table) if type(g) is dict else g for g in units]
    host = out.get("host")
    if type(host) is dict:
        host = _inner(_keys(host, table) if expanding else dict(host), table)
        out["host"] = host if expanding else _keys(host, table)
    return out if expanding else _keys(out, table)


def shorten(rec: dict[str, Any], short: dict[str, str] = _SHORT) -> dict[str, Any]:
    """A version 2 tick record -> version 3's (field names by `short`: long -> short)."""
    return _renamed(rec, short, expanding=False)


def expand(rec: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A version 3 tick record -> version 2's (field names by the header's `names`: short -> long);
    a name not in the table is kept as it is."""
    return _renamed(rec, names, expanding=True)


def names_from_header(value: Any) -> dict[str, str]:
    """A version 3 header's `names` -> the table to read its ticks by; ValueError(why) if it is
    not one (not an object, too large, a name not a short string, two short names for one field)."""
    if type(value) is not dict:
        kind = type(value).__name__
        raise ValueError(f"header field 'names' must be an object (short name -> field), got {kind}")
    if len(value) > MAX_NAMES:
        raise ValueError(f"header field 'names' has {len(value)} entries, more than {MAX_NAMES}")
    for short, long in value.items():
        if type(long) is not str or not 0 < len(short) <= 64 or not 0 < len(long) <= 64:
            name = str(short)[:40]
            raise ValueError(f"header field 'names': {name!r} must name a field in at most 64 characters")
    if len(set(value.values())) != len(value):
        raise ValueError("header field 'names' gives two short names to one field")
    return dict(value)


class Encoder:
    def __init__(self, origin_s: float = 0.0, short_names: bool = False) -> None:
        """`origin_s`: the writer's clock at the file's start (its t_s 0). `short_names`: version
        3's records (NAMES), else version 2's."""
        self._origin = origin_s
        self._short = short_names
        self._t_us = 0
        self._gpus: dict[tuple[int, int | None], dict[str, Any]] = {}
        self._host: dict[str, Any] | None = None
        self._born: dict[Any, tuple[int, int, int]] = {}
        """The last tick's host processes, by pid: the birth written (born_us), and the earliest
        and latest births their ages allowed so far."""

    def behind(self, tick: Tick) -> bool:
        """Whether `tick` comes before the file's start or the tick before it: a record's `dt_us`
        cannot be negative."""
        return round((tick.t_s - self._origin) * 1e6) < self._t_us

    def encode(self, tick: Tick) -> dict[str, Any]:
        origin = self._origin
        t_us = round((tick.t_s - origin) * 1e6)
        rec: dict[str, Any] = {"dt_us": t_us - self._t_us}
        self._t_us = t_us
        gpus = []
        for g in tick.gpus:
            full = _gpu_precision(gpu_to_dict(g))
            history = full.pop("util_history")
            key = (g.index, g.mig)  # a MIG instance shares its parent's index
            d: dict[str, Any] = {"index": g.index}
            if g.mig is not None:
                d["mig"] = g.mig
            d.update(_changes(self._gpus.get(key), full, skip=("index", "mig")))
            flat: list[float] = []
            last = t_us
            for ts, util in history:
                us = round((ts - origin) * 1e6)
                flat += [us - last, util]
                last = us
            if flat:
                d["util_history"] = flat
            self._gpus[key] = full
            gpus.append(d)
        rec["gpus"] = gpus
        if tick.host is None:
            rec["host"] = None
            self._host = None
        else:
            full_host = _host_precision(host_to_dict(tick.host))
            self._births(full_host, t_us)
            rec["host"] = _changes(self._host, full_host)
            self._host = full_host
        if tick.source_errors:
            rec["source_errors"] = list(tick.source_errors)
        return shorten(rec) if self._short else rec

    def _births(self, host: dict[str, Any], t_us: int) -> None:
        """Each host process's `age_s` written as its birth, `born_us` (the file's microseconds),
        wherever the reader's `age_at(t_us, born_us)` gives the very same age back; else as it is.
        An age grows with every tick (5% of a starved GPU-day, once gzipped); a birth stays the same number
        while it gives each tick's age. Ages come to 0.1 s, so each one says the birth lies within
        50 ms of the tick's time less the age: the births a process's ages allowed so far narrow
        to its true one, and a birth taken from their middle keeps giving the ages the ticks' jitter
        moves across a tenth (one taken from a single age would miss some)."""
        born_was = self._born
        born_now: dict[Any, tuple[int, int, int]] = {}
        procs = host.get("processes") or []
        for i, p in enumerate(procs):
            age = p.get("age_s")
            if type(age) is not float or not math.isfinite(age) or abs(age) > 1e9:
                continue
            pid = p.get("pid")
            centre = t_us - round(age * 1e6)
            lo, hi = centre - _TENTH_US // 2, centre + _TENTH_US // 2
            was = born_was.get(pid)
            if was is not None and max(lo, was[1]) <= min(hi, was[2]):
                lo, hi = max(lo, was[1]), min(hi, was[2])  # else a new process under an old pid
            if was is not None and _gives(t_us, was[0], age):
                born: int | None = was[0]
            else:
                born = next((b for b in ((lo + hi) // 2, centre) if _gives(t_us, b, age)), None)
            if born is None:
                continue
            born_now[pid] = (born, lo, hi)
            procs[i] = {**{k: v for k, v in p.items() if k != "age_s"}, "born_us": born}
        self._born = born_now


_TENTH_US = 100_000
"""The step of the ages the host source gives (0.1 s), in microseconds."""
MAX_BORN_US = 10**17
"""The largest `born_us` (either sign) a reader takes, as for `dt_us`: the writer gives the age as
it is beyond it."""


def _gives(t_us: int, born_us: int, age: float) -> bool:
    """Whether a reader gets `age` back from `born_us` at `t_us`, to its sign (0.0 is not -0.0 in
    JSON), with a birth it does not refuse."""
    back = age_at(t_us, born_us)
    return back == age and math.copysign(1.0, back) == math.copysign(1.0, age) and abs(born_us) <= MAX_BORN_US


def age_at(t_us: int, born_us: int) -> float:
    """A host process's age (`age_s`, to 0.1 s as the host source gives it) at `t_us` from its
    birth `born_us`, both the file's whole microseconds: the writer and the reader compute it alike."""
    return round((t_us - born_us) / 1e6, 1)


RATIO_DIGITS = 3
"""The host's shares (CPU, I/O wait, run-queue wait) to 0.1%: their 4th digit is noise that costs
~0.5 MB a GPU-day once gzipped, and no rule reads it (thresholds are whole percents). GPM's
activities keep their 4 digits: the waste of `small-kernels` is computed from them, and a replay
must count the same GPU-seconds as the daemon did live."""
POWER_DIGITS = 1
"""Watts to 0.1 W: NVML's milliwatts are below any sensor's accuracy."""
RATE_DIGITS = 3
"""Bytes per second to 3 significant digits (0.5% at worst)."""


def _significant(value: float, digits: int) -> float:
    if not value or not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


_HOST_RATIOS = ("cpu_ratio", "busiest_core_ratio", "iowait_ratio", "disk_busy_ratio")
_PROCESS_RATIOS = (
    "cpu_ratio",
    "children_cpu_ratio",
    "busiest_child_cpu_ratio",
    "busiest_demand_ratio",
    "runq_wait_ratio",
    "blkio_wait_ratio",
)


def _gpu_precision(d: dict[str, Any]) -> dict[str, Any]:
    """A GPU's fields at the precision version 2 records (docs/trace-format.md "Precision"):
    rounding noise away is most of what a GPU-day costs on disk (benchmarks.trace_size --gpu-day)."""
    for k in ("power_w", "power_limit_w"):
        v = d.get(k)
        if type(v) is float:
            d[k] = round(v, POWER_DIGITS)
    for k in ("pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s"):
        v = d.get(k)
        if type(v) is float:
            d[k] = _significant(v, RATE_DIGITS)
    return d


def _rounded(d: dict[str, Any], ratios: tuple[str, ...], rate: str) -> None:
    for k in ratios:
        v = d.get(k)
        if type(v) is float:
            d[k] = round(v, RATIO_DIGITS)
    v = d.get(rate)
    if type(v) is float:
        d[rate] = _significant(v, RATE_DIGITS)


def _host_precision(d: dict[str, Any]) -> dict[str, Any]:
    """The host's fields and its processes', at the precision version 2 records."""
    _rounded(d, _HOST_RATIOS, "disk_read_bytes_per_s")
    for p in d.get("processes") or ():
        _rounded(p, _PROCESS_RATIOS, "read_bytes_per_s")
    return d


def _changes(prev: dict[str, Any] | None, full: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    if prev is None:
        return {k: v for k, v in full.items() if k not in skip}
    out = {k: v for k, v in full.items() if k not in skip and prev.get(k, _MISSING) != v}
    out.update({k: None for k in prev if k not in full})
    return out


MAX_FIELDS = 256
"""Fields a GPU or the host may hold in a version 2 trace (gpumon writes about 30): each tick
inherits every field before it, so a trace adding a new one per tick cost time growing with the
square of its ticks (20,000 ticks: 5 s; found by a hostile-input pass)."""


class Decoder:
    def __init__(self, names: dict[str, str] | None = None) -> None:
        """`names`: a version 3 header's table (its records' short names), None for version 2."""
        self._names = names
        self._t_us = 0
        self._gpus: dict[tuple[int, Any], dict[str, Any]] = {}
        self._host: dict[str, Any] | None = None

    def decode(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A version 2 (or 3) tick record -> the version 1 tick dictionary it stands for."""
        if self._names is not None:
            rec = expand(rec, self._names)
        dt = rec.get("dt_us")
        if not isinstance(dt, int) or isinstance(dt, bool) or dt < 0 or dt > 1e17:
            raise BadRecord(f"field 'dt_us' must be a whole number of microseconds >= 0, got {shown(dt)}")
        t_us = self._t_us + dt
        self._t_us = t_us
        gpus_in = rec.get("gpus")
        if not isinstance(gpus_in, list):
            raise BadRecord("missing or invalid field 'gpus' (a list)")
        gpus = []
        here: set[tuple[int, int | None]] = set()
        for d in gpus_in:
            if not isinstance(d, dict):
                raise BadRecord("each entry of 'gpus' must be an object")
            index = d.get("index")
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 1 << 31:
                raise BadRecord(f"field 'index' must be a whole number, got {shown(index)}")
            mig = d.get("mig")
            if mig is not None and (type(mig) is not int or not 0 <= mig < 1 << 31):
                raise BadRecord(f"field 'mig' must be a whole number (a GPU instance id), got {shown(mig)}")
            full = dict(self._gpus.get((index, mig)) or {})
            full.update((k, v) for k, v in d.items() if k != "util_history")
            if len(full) > MAX_FIELDS:
                raise BadRecord(
                    f"GPU {index} has more than {MAX_FIELDS} fields: not a trace this gpumon reads"
                )
            if (index, mig) not in self._gpus and len(self._gpus) >= MAX_GPUS_IN_A_TRACE:
                raise BadRecord(f"more than {MAX_GPUS_IN_A_TRACE} GPUs in one trace: refused")
            if (index, mig) not in here:  # a GPU listed twice: the reader drops the second (and
                here.add((index, mig))  # so does the next tick's base, which the first stays)
                self._gpus[(index, mig)] = full
            gpus.append({**full, "util_history": _history(d.get("util_history"), t_us)})
        out: dict[str, Any] = {"type": "tick", "t_s": t_us / 1e6, "gpus": gpus}
        host = rec.get("host", _MISSING)
        if host is _MISSING:
            raise BadRecord("missing field 'host' (an object, or null)")
        if host is None:
            self._host = None
            out["host"] = None
        elif isinstance(host, dict):
            merged = {**(self._host or {}), **host}
            if len(merged) > MAX_FIELDS:
                raise BadRecord(f"the host has more than {MAX_FIELDS} fields: not a trace this gpumon reads")
            self._host = merged
            out["host"] = _aged(merged, t_us)
        else:
            raise BadRecord("'host' must be an object or null")
        if "source_errors" in rec:
            out["source_errors"] = rec["source_errors"]
        return out


def _aged(host: dict[str, Any], t_us: int) -> dict[str, Any]:
    """The host with each process's `born_us` read back as its `age_s` at `t_us` (a birth carries
    over from tick to tick, the age it gives grows)."""
    procs = host.get("processes")
    if type(procs) is not list or not any(type(p) is dict and "born_us" in p for p in procs):
        return host
    out = []
    for p in procs:
        if type(p) is dict and "born_us" in p:
            born = p["born_us"]
            if type(born) is not int or abs(born) > MAX_BORN_US:
                raise BadRecord(f"a host process's 'born_us' must be whole microseconds, got {shown(born)}")
            p = {k: v for k, v in p.items() if k != "born_us"}
            p["age_s"] = age_at(t_us, born)
        out.append(p)
    return {**host, "processes": out}


def _history(flat: Any, t_us: int) -> list[list[float]]:
    if flat is None:
        return []
    if not isinstance(flat, list) or len(flat) % 2:
        raise BadRecord("util_history must be a flat list [dt_us, util_ratio, ...] of even length")
    pairs = []
    last = t_us
    for i in range(0, len(flat), 2):
        dt, util = flat[i], flat[i + 1]
        if not isinstance(dt, int) or isinstance(dt, bool) or abs(dt) > 1e17:
            raise BadRecord(f"util_history times must be whole microseconds, got {shown(dt)}")
        last += dt
        pairs.append([last / 1e6, util])
    return pairs
