"""`Trainer(callbacks=[GpumonCallback()])`: gpumon's verdict in a PyTorch Lightning log.

Only the global-zero process reports (every rank would say the same of the node's GPUs); lines go
to Lightning's logger, between steps."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from lightning.pytorch.callbacks import Callback

from gpumon.integrations import Watch

log = logging.getLogger("lightning.pytorch.gpumon")


class GpumonCallback(Callback):
    def __init__(
        self,
        url: str | None = None,
        *,
        gpus: Iterable[int | str] | str | None = None,
        every_s: float = 5.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self._url, self._gpus, self._every_s, self._log = url, gpus, every_s, log
        self.watch: Watch | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._end(summary=False)  # a run that ended without on_train_end: its thread is not kept
        if not getattr(trainer, "is_global_zero", True):
            return
        self.watch = Watch(
            self._url,
            framework="torch",
            gpus=self._gpus,
            every_s=self._every_s,
            log=self._log or _info,
            defer=True,
        ).start()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.watch is not None and self.watch.pending:
            self.watch.drain()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._end(summary=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """A run that raised (Lightning calls no on_train_end then): stop asking the daemon, or each
        failed `fit` in a notebook would leave a thread asking it for good."""
        self._end(summary=False)

    def _end(self, summary: bool) -> None:
        try:
            if self.watch is not None:
                self.watch.stop(summary=summary)
        except Exception:  # (never raises; nor is this the place to start)
            pass
        self.watch = None


def _info(line: str) -> None:
    log.info(line)
    if not log.hasHandlers() or log.getEffectiveLevel() > logging.INFO:
        print(line, flush=True)  # Lightning's logger quiet or absent: still seen
