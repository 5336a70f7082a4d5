"""Points in time as people write them on a command line or in a query: ISO 8601
(`2026-11-30T02:00`, with a zone or in local time) or how long ago (`90s`, `30m`, `2h`, `1d`)."""

from __future__ import annotations

import datetime
import time

AGO_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_AGO_S = 3650 * 86400.0


def time_point(text: str, now: float | None = None) -> float:
    """Unix seconds; ValueError with a message that names the text and the forms taken."""
    t = text.strip()
    if t and t[-1] in AGO_UNITS and t[:-1].replace(".", "", 1).isdigit():
        ago = float(t[:-1]) * AGO_UNITS[t[-1]]
        if ago > MAX_AGO_S:
            raise ValueError(f"more than ten years ago: {text!r}")
        return (time.time() if now is None else now) - ago
    try:
        when = datetime.datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (ISO 8601 such as 2026-11-30T02:00, or ago such as 30m, 2h, 1d)"
        ) from None
    return when.timestamp()


def iso_utc(unix_s: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the microsecond (what `time_point` reads back)."""
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="microseconds")
