"""Points in time as people write them on a command line or in a query: ISO 8601
(`2026-11-30T02:00`, with a zone or in local time) or how long ago (`90s`, `30m`, `2h`, `1d`)."""

from __future__ import annotations

import datetime
import time

AGO_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_AGO_S = 3650 * 86400.0


EARLIEST_S = 0.0
"""1970-01-01 UTC: nothing was recorded before (and Unix time is counted from it)."""
LATEST_S = 253_402_128_000.0
"""9999-12-30 UTC: a day short of what Python's dates can hold, so that a point in range can be
moved by a range's length (a replay's start a window earlier) and still be written as a date."""


def time_point(text: str, now: float | None = None) -> float:
    """Unix seconds, from 1970 to 9999-12-30; ValueError with a message that names the text and
    the forms taken."""
    t = text.strip()
    if t and t[-1] in AGO_UNITS and t[:-1].isascii() and t[:-1].replace(".", "", 1).isdigit():
        ago = float(t[:-1]) * AGO_UNITS[t[-1]]
        if ago > MAX_AGO_S:
            raise ValueError(f"more than ten years ago: {text!r}")
        return (time.time() if now is None else now) - ago
    try:
        if not t.isascii():  # (fromisoformat takes other scripts' digits)
            raise ValueError
        unix_s = datetime.datetime.fromisoformat(t).timestamp()
    except (ValueError, OverflowError, OSError):  # not a time, or one no date can be made of in UTC
        raise ValueError(
            f"not a time: {text!r} (ISO 8601 such as 2026-11-30T02:00, or ago such as 30m, 2h, 1d)"
        ) from None
    if not EARLIEST_S <= unix_s <= LATEST_S:
        raise ValueError(f"{text!r} is before 1970 or after 9999: no recording holds it")
    return unix_s


def iso_utc(unix_s: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the microsecond (what `time_point` reads back)."""
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="microseconds")
