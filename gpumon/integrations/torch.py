"""A plain PyTorch training loop: `with gpumon.integrations.torch.watch(): ...`.

Nothing to call per step: the background thread prints its lines itself (a plain loop draws no
progress bar for them to cut through), and the summary comes when the block ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpumon.integrations import Watch


def watch(
    url: str | None = None,
    *,
    gpus: Iterable[int | str] | str | None = None,
    every_s: float = 5.0,
    log: Callable[[str], None] | None = None,
) -> Watch:
    """A Watch with PyTorch's advice (DataLoader's num_workers); use it as a context manager."""
    return Watch(url, framework="torch", gpus=gpus, every_s=every_s, log=log)
