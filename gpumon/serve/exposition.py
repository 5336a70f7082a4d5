"""The Prometheus exposition of each snapshot, rendered once and served to every scraper.

Only the sample age changes between two scrapes of one snapshot, so the text is rendered with a
sentinel in the age's place and split around it: a scrape joins the two halves around the age
(and, gzipped, finishes a copy of the compressor that already holds the first half).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from gpumon.serve.metrics import families
from gpumon.serve.snapshot import Snapshot
from gpumon.serve.textformat import Format, float_text, negotiate

AGE_SENTINEL = 123456789.125
"""Rendered in place of the sample age, which is filled in when a scraper asks."""


class _Rendered(NamedTuple):
    """One snapshot's exposition in one format, split around the age (filled in per scrape)."""

    snap: Snapshot | None
    """The snapshot rendered, held (not its `id`, which a later snapshot may reuse once this
    one is freed: the cache would then serve the old text as the new snapshot's)."""
    head: bytes
    tail: bytes
    gz_head: bytes
    gz_state: Any
    """zlib compressor after `head`: a copy finishes the gzip stream with the age and tail."""
    t_s: float


class Exposition:
    def __init__(self, snapshot: Callable[[], Snapshot | None], now: Callable[[], float]) -> None:
        self._snapshot = snapshot
        self._now = now
        self._lock = threading.Lock()
        self._rendered: dict[Format, _Rendered] = {}
        """One rendering per format (at most eight), of the snapshot scraped last in it."""

    def render(self, accept: str, gzip_ok: bool = False) -> tuple[bytes, str, str | None]:
        """(body, content type, content encoding) for this scrape: the snapshot's exposition,
        rendered on the first scrape that asks for it; the sample age filled in now (so it stays
        true when the sampler stops)."""
        fmt, content_type = negotiate(accept)
        snap = self._snapshot()
        with self._lock:
            r = self._rendered.get(fmt)
            if r is None or r.snap is not snap:
                # the snapshot taken above, even if a newer one is published meanwhile
                r = _split(fmt.render(families(snap, AGE_SENTINEL)), snap)
                self._rendered[fmt] = r
        age = b"" if snap is None else float_text(round(max(0.0, self._now() - r.t_s), 3)).encode()
        if not gzip_ok:
            return r.head + age + r.tail, content_type, None
        c = r.gz_state.copy()
        return r.gz_head + c.compress(age + r.tail) + c.flush(), content_type, "gzip"


def _split(body: bytes, snap: Snapshot | None) -> _Rendered:
    marker = float_text(AGE_SENTINEL).encode()
    head, found, tail = body.partition(marker)
    if not found or marker in tail:
        head, tail = body, b""
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    gz_head = comp.compress(head)
    return _Rendered(snap, head, tail, gz_head, comp, snap.t_s if snap else 0.0)
