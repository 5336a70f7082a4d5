"""`gpumon bench`: a small Keras 3 CNN on synthetic CIFAR-shaped data, fed or starved on purpose.

Never imported by the daemon (it imports Keras and a backend; KERAS_BACKEND, default torch).
Input pipelines (--pipeline):
  fed          a PyDataset with process workers and cheap preprocessing
  starved-cpu  heavy per-sample Python augmentation in one worker process (it pins one core)
  starved-io   samples read from files through a throttled reader (a thread waiting on "storage")
A callback measures, per step, the time waiting for input (from the end of a step to the start
of the next) and the time computing (the step itself), and writes:
  --truth FILE  a labeled timeline: per window, the input-bound share of step time, banded as
                TensorFlow's profiler does (>= 20% highly, >= 5% moderately, else not input-bound)
  --drive FILE  each step's busy interval, for a simulated GPU that is busy exactly while the
                step runs (gpumon serve/record/watch --drive FILE), on machines without a GPU.
With more than one GPU visible, it trains data-parallel with every step's batch full: the global
batch is a multiple of the GPU count and the last partial batch is dropped; the model is saved
from the template (single-device) copy.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

IMAGE = (32, 32, 3)
FILES = 8
"""Files the starved-io pipeline cycles through."""
CLASSES = 10
TRUTH_WINDOW_S = 5.0


@dataclass(frozen=True)
class BenchOptions:
    pipeline: str = "fed"
    duration_s: float = 60.0
    batch_size: int = 64
    workers: int = 2
    steps_per_epoch: int = 100_000
    """One long epoch that --duration cuts short: Keras restarts PyDataset workers every epoch, and a
    real job's epochs last minutes, not the seconds a short synthetic epoch would."""
    drive: str | None = None
    truth: str | None = None
    save: str | None = None
    verbose: int = 1
    io_mb_per_s: float = 60.0
    file_mb: float = 16.0
    watch: str | None = None
    """Report gpumon's verdict in the log (gpumon.integrations.keras): the daemon's URL ("": default)."""


def _batch(index: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(index)
    x = rng.integers(0, 256, size=(batch_size, *IMAGE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, size=(batch_size,))
    return x, y


class FedData(keras.utils.PyDataset):
    """Cheap preprocessing in worker processes: the GPU never waits for long."""

    def __init__(self, batch_size: int, batches: int, **kw: object) -> None:
        super().__init__(**kw)
        self.batch_size, self.batches = batch_size, batches

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = _batch(i, self.batch_size)
        return x.astype("float32") / 255.0, y


class CpuHeavyData(FedData):
    """Per-sample augmentation in pure Python, in a single worker: the loader pins a core."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = _batch(i, self.batch_size)
        out = np.empty(x.shape, dtype="float32")
        for n in range(x.shape[0]):  # deliberately slow: Python loops over every pixel, three passes
            img = x[n].tolist()
            for k in range(3):
                jitter = (i * 7 + n + k) % 5
                img = [[[min(255, v + jitter) for v in px] for px in row] for row in img]
            out[n] = np.asarray(img, dtype="float32") / 255.0
        return out, y


class ThrottledFileData(FedData):
    """Samples stored as files (padded to `file_mb`, as raw images would be), read from storage:
    each file is dropped from the page cache first (posix_fadvise DONTNEED), then read at no more
    than `mb_per_s`. The reads are real storage reads, the kind the host counters see."""

    def __init__(self, batch_size: int, batches: int, folder: str, mb_per_s: float, **kw: object) -> None:
        super().__init__(batch_size, batches, **kw)
        self.folder, self.mb_per_s = folder, mb_per_s

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        path = os.path.join(self.folder, f"batch-{i % FILES}.npz")
        start = time.monotonic()
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # from storage, not page cache
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                # the throttle: storage that delivers mb_per_s
                time.sleep(
                    max(0.0, sum(map(len, chunks)) / (self.mb_per_s * 1e6) - (time.monotonic() - start))
                )
        finally:
            os.close(fd)
        data = np.load(io.BytesIO(b"".join(chunks)))
        return data["x"].astype("float32") / 255.0, data["y"]


class StepTimer(keras.callbacks.Callback):
    """Per step: input wait (end of the previous step to the start of this one) and compute."""

    def __init__(self, opts: BenchOptions, stop_at: float) -> None:
        super().__init__()
        self.opts, self.stop_at = opts, stop_at
        self.prev_end: float | None = None
        self.begin = 0.0
        self.window: list[tuple[float, float]] = []  # (wait, busy)
        self.window_start = time.monotonic()
        self.steps = 0
        self._drive = open(opts.drive, "a", encoding="utf-8") if opts.drive else None
        self._truth = open(opts.truth, "a", encoding="utf-8") if opts.truth else None
        if self._drive:
            self._drive.write(f"# gpumon-drive v1 pid={os.getpid()}\n")
            self._drive.flush()

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        self.begin = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        end = time.monotonic()
        wait = self.begin - self.prev_end if self.prev_end is not None else 0.0
        self.prev_end = end
        self.steps += 1
        self.window.append((wait, end - self.begin))
        if self._drive:
            self._drive.write(f"{self.begin:.6f} {end:.6f}\n")
            self._drive.flush()
        if end - self.window_start >= TRUTH_WINDOW_S:
            self._close_window(end)
        if end >= self.stop_at:
            self.model.stop_training = True

    def _close_window(self, now: float) -> None:
        waited = sum(w for w, _ in self.window)
        busy = sum(b for _, b in self.window)
        share = waited / (waited + busy) if waited + busy > 0 else 0.0
        band = "highly" if share >= 0.20 else "moderately" if share >= 0.05 else "not"
        if self._truth:
            unix_end = time.time() - (time.monotonic() - now)
            record = {
                "start_unix_s": round(unix_end - (now - self.window_start), 3),
                "end_unix_s": round(unix_end, 3),
                "input_share": round(share, 4),
                "band": band,
                "steps": len(self.window),
                "pipeline": self.opts.pipeline,
                "expected": "starved" if band == "highly" else ("healthy" if band == "not" else "either"),
            }
            self._truth.write(json.dumps(record) + "\n")
            self._truth.flush()
        self.window, self.window_start = [], now

    def close(self) -> None:
        for f in (self._drive, self._truth):
            if f:
                f.close()


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(IMAGE),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES),
        ]
    )


def _devices() -> int:
    try:
        return max(1, len([d for d in keras.distribution.list_devices("gpu")]))
    except Exception:
        return 1


def _leave_cores_for_the_input_pipeline() -> None:
    """On the CPU, torch's compute would take every core and no loader could ever saturate one:
    keep half the cores for the input pipeline, as a GPU job's host would have them."""
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


def run(opts: BenchOptions) -> dict[str, float]:
    gpus = _devices()
    if gpus == 1:
        _leave_cores_for_the_input_pipeline()
    # The seed's rules: the global batch a multiple of the GPU count, every batch full.
    batch = max(gpus, opts.batch_size // gpus * gpus)
    batches = opts.steps_per_epoch
    tmp = None
    if opts.pipeline == "fed":
        data: FedData = FedData(
            batch, batches, workers=opts.workers, use_multiprocessing=True, max_queue_size=8
        )
    elif opts.pipeline == "starved-cpu":
        data = CpuHeavyData(batch, batches, workers=1, use_multiprocessing=True, max_queue_size=2)
    elif opts.pipeline == "starved-io":
        tmp = tempfile.TemporaryDirectory(prefix="gpumon-bench-")
        for i in range(FILES):
            x, y = _batch(i, batch)
            pad = np.zeros(int(opts.file_mb * 1e6), dtype=np.uint8)  # the rest of a raw sample's bytes
            np.savez(os.path.join(tmp.name, f"batch-{i}.npz"), x=x, y=y, pad=pad)
        data = ThrottledFileData(
            batch, batches, tmp.name, opts.io_mb_per_s, workers=1, use_multiprocessing=False, max_queue_size=2
        )
    else:
        raise ValueError(f"unknown pipeline {opts.pipeline!r}")
    template = build_model()
    model = template
    if gpus > 1 and keras.backend.backend() == "jax":  # Keras 3's own data parallelism
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.monotonic()
    timer = StepTimer(opts, start + opts.duration_s)
    epochs = 1 if batches >= 10_000 else max(1, math.ceil(opts.duration_s * 100 / batches))
    callbacks: list[keras.callbacks.Callback] = [timer]
    if opts.watch is not None:
        from gpumon.integrations.keras import GpumonCallback

        callbacks.append(GpumonCallback(opts.watch or None))
    try:
        model.fit(data, epochs=epochs, verbose=opts.verbose, callbacks=callbacks)
    finally:
        timer.close()
        if tmp is not None:
            tmp.cleanup()
    if opts.save:
        template.save(opts.save)
    return {"steps": timer.steps, "seconds": time.monotonic() - start, "gpus": gpus, "batch": batch}
