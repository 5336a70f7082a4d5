"""Peak memory of a call, for tests that hold memory flat (tracemalloc)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most memory `fn` holds at once. Garbage in reference cycles is collected often while
    it runs (and before), so the peak is what it keeps alive, not when the collector last came:
    that depends on what ran before in the same worker, and made such comparisons flaky."""
    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(200, 2, 2)
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        gc.set_threshold(*threshold)
