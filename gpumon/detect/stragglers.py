"""Data-parallel jobs: the rank the others wait for, and whether it stays the same one. Pure.

A straggler is a GPU of the job that is starved while most of the job's other GPUs spin in a
collective (`sync-stall`), waiting for it: its fix is the job's fix. SPDL's rule (Meta, 2025):
when the slowest rank changes from episode to episode, data loading is the cause (every rank's
loader stalls now and then, and the job waits for whichever does); a slow rank that stays the
same points at that rank's hardware or its share of the data.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpumon.detect.vocabulary import State

K = TypeVar("K", bound=Hashable)

MIN_STRAGGLING_S = 10.0
"""A GPU counts as the job's straggler over a range once it has straggled this long in all (a
change of episodes leaves a second or two where the labels do not line up)."""


def stragglers(labels: Mapping[K, str]) -> list[K]:
    """The GPUs starved while more than half of the job's other GPUs wait in sync-stall. All of
    them starved (a slow shared filesystem) is no straggler: nobody waits."""
    starved = [k for k, v in labels.items() if v.startswith(State.STARVED)]
    others = [v for v in labels.values() if not v.startswith(State.STARVED)]
    if not starved or not others:
        return []
    return starved if sum(v == State.SYNC_STALL for v in others) * 2 > len(others) else []


@dataclass(eq=False)  # state, not a value: equal only to itself
class StragglerHistory(Generic[K]):
    """Which GPU straggled, and for how long, over a range."""

    seconds: dict[K, float] = field(default_factory=dict)
    order: list[K] = field(default_factory=list)
    """The stragglers in the order they took over (a GPU again after another counts again)."""

    @property
    def ranks(self) -> list[K]:
        """The GPUs that straggled MIN_STRAGGLING_S or longer, longest first."""
        found = [k for k, s in self.seconds.items() if s >= MIN_STRAGGLING_S]
        return sorted(found, key=lambda k: -self.seconds[k])

    @property
    def moving(self) -> bool:
        """The straggler changed from one GPU to another (SPDL's rule: data loading)."""
        kept = set(self.ranks)
        seq = [k for k in self.order if k in kept]
        return len(kept) > 1 and any(a != b for a, b in itertools.pairwise(seq))

    def diagnosis(self, name: str = "GPU") -> str | None:
        """One line: the moving straggler is a data-loading problem; a fixed one is its rank's."""
        ranks = self.ranks
        if not ranks:
            return None
        listed = ", ".join(f"{name} {k}" if name else str(k) for k in ranks)
        if self.moving:
            return (
                f"the straggler moves between ranks ({listed}): data loading, not a slow GPU (SPDL's "
                "rule): feed every rank's input pipeline"
            )
        return f"the straggler stays {listed}: its input pipeline (or its node's hardware) holds the job back"


def history(timelines: Mapping[K, Sequence[tuple[float, float, str]]]) -> StragglerHistory[K]:
    """From each GPU's labelled intervals (start, end, label), e.g. its episodes: who straggled
    when, at each stretch where every GPU's label is constant."""
    cuts = sorted({t for spans in timelines.values() for s, e, _ in spans for t in (s, e)})
    out: StragglerHistory[K] = StragglerHistory()
    last: frozenset[K] = frozenset()
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        labels = {
            k: next((lb for s, e, lb in spans if s <= mid < e), "unknown") for k, spans in timelines.items()
        }
        found = frozenset(stragglers(labels))
        for k in found:
            out.seconds[k] = out.seconds.get(k, 0.0) + (b - a)
            if k not in last:
                out.order.append(k)
        if found:
            last = found
    return out
