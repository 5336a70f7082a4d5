"""Trace format version 2 (docs/trace-format.md): version 1's records, made compact, gzipped.

What changes from version 1, and why (measured on a simulated starved-cpu + healthy hour, 1 s
ticks, driver samples at 1/6 s: benchmarks/trace_size.py):
- The file is one gzip stream (zlib level 6), flushed (Z_SYNC_FLUSH) after every record by
  `gpumon record`, every 5 s by the daemon's recorder (gpumon.trace.recorder.SYNC_EVERY_S), so a
  process killed at any moment leaves every record older than that decodable. `zcat FILE`
  shows the JSON Lines inside.
- A tick says only what changed: a GPU's field equal to its value in the previous tick of the same
  GPU (by index) in this file is left out; the host object likewise. Absent means "as before";
  `null` means null (a field that went away).
- Times are whole microseconds, as deltas: the tick's `dt_us` from the previous tick (the first from
  the start), and `util_history` as a flat list `[dt_us, util_ratio, dt_us, util_ratio, ...]` where
  the first dt is from the tick's own time and each next one from the sample before.
Together: 66 MB per GPU per day in version 1 becomes about 4.6; zstandard at comparable CPU cost
did no better (flushing every second leaves it little to work with), so no dependency is added.

Encoder and Decoder hold the "previous tick" state; the Decoder turns a record back into the
version 1 dictionary that gpumon.trace.reader validates, so both versions share one set of rules.
"""

from __future__ import annotations

import math
from typing import Any

from gpumon.core.model import Tick
from gpumon.trace.records import BadRecord, gpu_to_dict, host_to_dict

_MISSING = object()


class Encoder:
    def __init__(self, origin_s: float = 0.0) -> None:
        """`origin_s`: the writer's clock at the file's start (its t_s 0)."""
        self._origin = origin_s
        self._t_us = 0
        self._gpus: dict[tuple[int, int | None], dict[str, Any]] = {}
        self._host: dict[str, Any] | None = None

    def encode(self, tick: Tick) -> dict[str, Any]:
        origin = self._origin
        t_us = round((tick.t_s - origin) * 1e6)
        rec: dict[str, Any] = {"dt_us": t_us - self._t_us}
        self._t_us = t_us
        gpus = []
        for g in tick.gpus:
            full = _recording_precision(gpu_to_dict(g))
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
            full_host = _recording_precision(host_to_dict(tick.host))
            rec["host"] = _changes(self._host, full_host)
            self._host = full_host
        if tick.source_errors:
            rec["source_errors"] = list(tick.source_errors)
        return rec


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


def _recording_precision(d: dict[str, Any]) -> dict[str, Any]:
    """A GPU's or the host's fields (and the host's processes') at the precision version 2
    records (docs/trace-format.md "Precision"): rounding noise away is most of what a GPU-day
    costs on disk (benchmarks.trace_size --gpu-day)."""
    for k, v in d.items():
        if type(v) is not float:
            if k == "processes" and v and isinstance(v[0], dict) and "cpu_ratio" in v[0]:
                d[k] = [_recording_precision(dict(p)) for p in v]
        elif k.endswith("_ratio") and k not in ("util_ratio", "mem_util_ratio"):
            d[k] = round(v, RATIO_DIGITS)
        elif k.endswith("bytes_per_s"):
            d[k] = _significant(v, RATE_DIGITS)
        elif k in ("power_w", "power_limit_w"):
            d[k] = round(v, POWER_DIGITS)
    return d


def _changes(prev: dict[str, Any] | None, full: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    if prev is None:
        return {k: v for k, v in full.items() if k not in skip}
    out = {k: v for k, v in full.items() if k not in skip and prev.get(k, _MISSING) != v}
    out.update({k: None for k in prev if k not in full})
    return out


class Decoder:
    def __init__(self) -> None:
        self._t_us = 0
        self._gpus: dict[tuple[int, Any], dict[str, Any]] = {}
        self._host: dict[str, Any] | None = None

    def decode(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A version 2 tick record -> the version 1 tick dictionary it stands for."""
        dt = rec.get("dt_us")
        if not isinstance(dt, int) or isinstance(dt, bool) or dt < 0 or dt > 1e17:
            raise BadRecord(f"field 'dt_us' must be a whole number of microseconds >= 0, got {dt!r}")
        t_us = self._t_us + dt
        self._t_us = t_us
        gpus_in = rec.get("gpus")
        if not isinstance(gpus_in, list):
            raise BadRecord("missing or invalid field 'gpus' (a list)")
        gpus = []
        for d in gpus_in:
            if not isinstance(d, dict):
                raise BadRecord("each entry of 'gpus' must be an object")
            index = d.get("index")
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 1 << 31:
                raise BadRecord(f"field 'index' must be a whole number, got {index!r}")
            mig = d.get("mig")
            if mig is not None and (type(mig) is not int or not 0 <= mig < 1 << 31):
                raise BadRecord(f"field 'mig' must be a whole number (a GPU instance id), got {mig!r}")
            full = dict(self._gpus.get((index, mig)) or {})
            full.update((k, v) for k, v in d.items() if k != "util_history")
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
            self._host = merged
            out["host"] = merged
        else:
            raise BadRecord("'host' must be an object or null")
        if "source_errors" in rec:
            out["source_errors"] = rec["source_errors"]
        return out


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
            raise BadRecord(f"util_history times must be whole microseconds, got {dt!r}")
        last += dt
        pairs.append([last / 1e6, util])
    return pairs
