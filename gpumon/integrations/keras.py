"""`model.fit(..., callbacks=[GpumonCallback()])`: gpumon's verdict in a Keras training log.

Lines found by the background thread are printed between steps (never through the progress bar's
line being drawn); a step costs one check of an empty queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import keras

from gpumon.integrations import Watch


class GpumonCallback(keras.callbacks.Callback):
    def __init__(
        self,
        url: str | None = None,
        *,
        gpus: Iterable[int | str] | str | None = None,
        every_s: float = 5.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.watch = Watch(url, framework="keras", gpus=gpus, every_s=every_s, log=log, defer=True)

    def on_train_begin(self, logs: Any = None) -> None:
        # Keras calls no on_train_end when `fit` raises (Ctrl-C, out of memory): that run's watch
        # ends here, or the next `fit` would go on with it and its thread ask for good
        self.watch.stop(summary=False)
        self.watch.start()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.watch.pending:
            self.watch.drain()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.watch.drain()

    def on_train_end(self, logs: Any = None) -> None:
        self.watch.stop()
