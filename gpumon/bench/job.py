"""`gpumon bench`: a small Keras 3 CNN on synthetic CIFAR-shaped data, fed or starved on purpose.

Never imported by the daemon (it imports Keras and a backend; KERAS_BACKEND, default torch).
Input pipelines (--pipeline):
  fed          a PyDataset with process workers and cheap preprocessing
  starved-cpu  heavy per-sample Python augmentation in worker processes (one by default: it pins
               a core)
  starved-io   samples read from files, each worker process a throttled reader waiting on
               "storage" (one by default)
  jpeg         JPEG files read from storage (dropped from the page cache first) and decoded and
               augmented with PIL in worker processes: with more workers than cores, or
               --cpu-hogs beside it, each worker gets part of a core and waits for the rest
Every pipeline runs in --workers processes (default: 2 for fed and jpeg, 1 for the starved ones).
--duration counts from the first step: a start-up slowed by a busy host (the model built, the loader's
  workers started) does not shorten the training.
--cpu-hogs N runs N CPU-bound processes beside the job for its duration (contention, issue 17).
--gpu-step-ms MS makes each step a sleep of MS milliseconds instead of the model's arithmetic: on a
  machine without a GPU, the step then leaves the host's cores to the input pipeline as a real GPU
  does (the model on the CPU takes a core and moves with the host's speed), so that what an input
  fix buys is measured apart from the host's arithmetic (benchmarks/advice.py --gpu-step-ms).
--starve-after S makes the change inside one run: the job trains fed for S seconds (from its first
  step, as --duration), then the same job's loader switches to --pipeline (with the same worker
  processes) and the --cpu-hogs start; the drive file marks the moment ("# switch T"), the truth
  windows break there.
A callback measures, per step, the time waiting for input (from the end of a step to the start
of the next) and the time computing (the step itself), and writes:
  --truth FILE  a labeled timeline: per window, the input-bound share of step time, banded as
                TensorFlow's profiler does (>= 20% highly, >= 5% moderately, else not input-bound),
                and the steps per second the job made in it (what a fix buys is measured on it)
  --drive FILE  each step's busy interval, for a simulated GPU that is busy exactly while the
                step runs (gpumon serve/record/watch --drive FILE), on machines without a GPU.
With more than one GPU visible, it trains data-parallel with every step's batch full: the global
batch is a multiple of the GPU count and the last partial batch is dropped; the model is saved
from the template (single-device) copy.
"""

from __future__ import annotations

import ctypes
import io
import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

from gpumon.bench.exit_guard import leave_even_if_stuck

IMAGE = (32, 32, 3)
FILES = 8
"""Files the starved-io pipeline cycles through."""
CLASSES = 10
TRUTH_WINDOW_S = 5.0
EXIT_GRACE_S = 30.0
"""How long the job's process may take to exit once its results are in (gpumon.bench.exit_guard)."""
DEFAULT_WORKERS = {"fed": 2, "jpeg": 2, "starved-cpu": 1, "starved-io": 1}
"""Loader worker processes per pipeline when --workers is not given: the starved pipelines starve
with one (a pinned core, one reader), as issue 7's figures were measured."""


def workers_for(opts: BenchOptions, pipeline: str) -> int:
    return opts.workers if opts.workers is not None else DEFAULT_WORKERS.get(pipeline, 1)


@dataclass(frozen=True)
class BenchOptions:
    pipeline: str = "fed"
    duration_s: float = 60.0
    batch_size: int = 64
    workers: int | None = None
    """Loader worker processes; None: the pipeline's default (DEFAULT_WORKERS)."""
    steps_per_epoch: int = 100_000
    """One long epoch that --duration cuts short: Keras restarts PyDataset workers every epoch, and a
    real job's epochs last minutes, not the seconds a short synthetic epoch would."""
    drive: str | None = None
    truth: str | None = None
    save: str | None = None
    verbose: int = 1
    io_mb_per_s: float = 60.0
    file_mb: float = 16.0
    cpu_hogs: int = 0
    """CPU-bound processes run beside the job (a busy host)."""
    jpeg_files: int = 256
    watch: str | None = None
    """Report gpumon's verdict in the log (gpumon.integrations.keras): the daemon's URL ("": default)."""
    devices: int | None = None
    """JAX only: train data-parallel over this many devices (keras.distribution.DataParallel); on
    a machine without GPUs, as many CPU devices (XLA_FLAGS must ask for them before JAX starts)."""
    starve_after_s: float | None = None
    """Train fed this long, then switch the same job to `pipeline` (and start the CPU hogs then)."""
    start_delay_s: float = 0.0
    """Hold the GPU this long before the first step (a job's start-up: imports, data, compiling)."""
    gpu_step_s: float | None = None
    """Each step a sleep this long instead of the model's arithmetic (a simulated GPU's compute,
    off the host's cores); None: the model computes on the backend's device."""
    model: str = "auto"
    """The model's size (MODELS); "auto": "gpu" where the backend trains on a GPU, else "small"."""


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

    passes = 3
    """Python passes over every pixel of every sample: the loader's cost per sample."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = _batch(i, self.batch_size)
        out = np.empty(x.shape, dtype="float32")
        for n in range(x.shape[0]):  # deliberately slow: Python loops over every pixel
            img = x[n].tolist()
            for k in range(self.passes):
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


def _write_jpegs(folder: str, count: int) -> None:
    """Photo-like 640x480 JPEGs (smooth gradients and noise, ~170 KB each), a little larger than
    ImageNet's average (~400x350, ~110 KB)."""
    # here, not at the top: extra bench: the jpeg pipeline only
    from PIL import Image

    rng = np.random.default_rng(0)
    h, w = 480, 640
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(count):
        base = (np.sin(xx / (20 + i % 17)) + np.cos(yy / (15 + i % 11))) * 60 + 128
        img = np.stack([base + rng.normal(0, 25, (h, w)) for _ in range(3)], axis=-1)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            os.path.join(folder, f"img-{i:05d}.jpg"), quality=90
        )


class JpegData(FedData):
    """An ImageNet-style loader: each sample a JPEG read from storage (dropped from the page cache
    first, so the reads are real) and decoded, cropped, resized and flipped with PIL."""

    def __init__(self, batch_size: int, batches: int, folder: str, files: int, **kw: object) -> None:
        super().__init__(batch_size, batches, **kw)
        self.folder, self.files = folder, files

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        # here, not at the top: extra bench: the jpeg pipeline only
        from PIL import Image, ImageEnhance, ImageOps

        out = np.empty((self.batch_size, *IMAGE), dtype="float32")
        for n in range(self.batch_size):
            path = os.path.join(self.folder, f"img-{(i * self.batch_size + n) % self.files:05d}.jpg")
            fd = os.open(path, os.O_RDONLY)
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                with os.fdopen(os.dup(fd), "rb") as f:
                    img = Image.open(io.BytesIO(f.read())).convert("RGB")
            finally:
                os.close(fd)
            # torchvision's usual training transforms: a crop resized to 224, a flip, colour jitter
            img = ImageOps.fit(img, (224, 224)).rotate((i + n) % 15)
            if (i + n) % 2:
                img = ImageOps.mirror(img)
            jitter = 0.8 + 0.05 * ((i + n) % 9)
            img = ImageEnhance.Contrast(ImageEnhance.Brightness(img).enhance(jitter)).enhance(2 - jitter)
            img = ImageEnhance.Color(img).enhance(jitter)
            out[n] = np.asarray(img.resize(IMAGE[:2]), dtype="float32") / 255.0
        return out, np.arange(self.batch_size) % CLASSES


class SwitchingData(FedData):
    """Fed until a moment (CLOCK_MONOTONIC, the same in the loader's worker processes), then the
    starved pipeline's batches: one job whose input changes under it. The moment is set at the
    first step (StepTimer), after Keras has forked the workers: it lives in shared memory."""

    def __init__(self, fed: FedData, starved: FedData, **kw: object) -> None:
        super().__init__(fed.batch_size, fed.batches, **kw)
        self.fed, self.starved = fed, starved
        self.switch_at = multiprocessing.RawValue("d", math.inf)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.starved if time.monotonic() >= self.switch_at.value else self.fed)[i]


class Progress(keras.callbacks.Callback):
    """A line every few seconds: steps, time against --duration, the loss. Keras's own bar counts
    against steps_per_epoch (100,000: the job stops by time long before) and shows hours of ETA."""

    def __init__(self, duration_s: float, every_s: float = 5.0) -> None:
        super().__init__()
        self.duration_s, self.every_s = duration_s, every_s
        self.start = self.last = time.monotonic()
        self.steps = 0

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self.steps == 0:  # --duration counts from the first step (StepTimer)
            self.start = self.last = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self.steps += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            loss = (logs or {}).get("loss")
            said = f", loss {loss:.3f}" if loss is not None else ""
            print(
                f"gpumon bench: {now - self.start:4.0f} s of {self.duration_s:g} s, {self.steps} steps "
                f"({self.steps / (now - self.start):.1f}/s){said}",
                file=sys.stderr,
                flush=True,
            )


class StepTimer(keras.callbacks.Callback):
    """Per step: input wait (end of the previous step to the start of this one) and compute."""

    def __init__(
        self,
        opts: BenchOptions,
        shared_switch: ctypes.c_double | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.opts, self.shared_switch, self.clock = opts, shared_switch, clock
        self.stop_at = math.inf
        """--duration from the first step's start (set then): a start-up slowed by a loaded host
        (the first step builds the model, the loader's workers start) does not eat the training."""
        self.switch_at: float | None = None
        """--starve-after from the first step's start too (set then, and in `shared_switch`, the
        loader workers' SwitchingData.switch_at): the fed part is not eaten either."""
        self.hogs: list[int] = []
        self.pipeline = "fed" if opts.starve_after_s is not None else opts.pipeline
        """The pipeline feeding the job now (truth windows name it)."""
        self.prev_end: float | None = None
        self.begin = 0.0
        self.window: list[tuple[float, float]] = []  # (wait, busy)
        self.window_start = self.clock()
        self.steps = 0
        self._drive = open(opts.drive, "a", encoding="utf-8") if opts.drive else None
        self._truth = open(opts.truth, "a", encoding="utf-8") if opts.truth else None
        if self._drive:
            self._drive.write(f"# gpumon-drive v1 pid={os.getpid()}\n")
            self._drive.flush()

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        self.begin = self.clock()
        if self.stop_at == math.inf:  # the first step: training (and the first truth window) starts
            self.stop_at = self.begin + self.opts.duration_s
            self.window_start = self.begin
            if self.opts.starve_after_s is not None:
                self.switch_at = self.begin + self.opts.starve_after_s
                if self.shared_switch is not None:
                    self.shared_switch.value = self.switch_at
        if self._drive:  # busy from now: a driver sample read before the step ends counts it
            self._drive.write(f"{self.begin:.6f} -\n")
            self._drive.flush()
        if self.switch_at is not None and self.begin >= self.switch_at:
            self._switch(self.switch_at)

    def _switch(self, at: float) -> None:
        """The input pipeline has changed: the truth window breaks here, the drive file says when,
        and the neighbours' CPU-bound processes start."""
        self.switch_at = None
        if self.window:
            self._close_window(at)
        self.window_start, self.pipeline = at, self.opts.pipeline
        if self._drive:
            self._drive.write(f"# switch {at:.6f}\n")
            self._drive.flush()
        self.hogs = _start_hogs(self.opts.cpu_hogs)

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        end = self.clock()
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
            unix_end = time.time() - (self.clock() - now)
            record = {
                "start_unix_s": round(unix_end - (now - self.window_start), 3),
                "end_unix_s": round(unix_end, 3),
                "input_share": round(share, 4),
                "band": band,
                "steps": len(self.window),
                "steps_per_s": round(len(self.window) / (now - self.window_start), 3)
                if now > self.window_start
                else None,
                "pipeline": self.pipeline,
                "expected": "starved" if band == "highly" else ("healthy" if band == "not" else "either"),
            }
            self._truth.write(json.dumps(record) + "\n")
            self._truth.flush()
        self.window, self.window_start = [], now

    def close(self) -> None:
        _stop_hogs(self.hogs)
        for f in (self._drive, self._truth):
            if f:
                f.close()


def _start_hogs(n: int) -> list[int]:
    """Other work on the host: N processes that each keep a core busy. Started through a shell that
    exits at once, so they are not the job's descendants (gpumon would count those as its loader
    workers), each in a session of its own (setsid: its own scheduling group, as another user's
    job has under Slurm, Kubernetes or systemd): neighbours, as other users' jobs are. Their PIDs,
    for _stop_hogs."""

    # setsid execs in place (a background job of a shell without job control leads no process
    # group), so $! is the neighbour's own PID
    setsid = "setsid " if shutil.which("setsid") else ""
    pids = []
    for _ in range(n):
        out = subprocess.run(
            ["sh", "-c", f"{setsid}'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        pids.append(int(out.strip()))
    return pids


def _stop_hogs(pids: list[int]) -> None:

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


MODELS = ("small", "gpu")
"""small: a few MFLOP a sample, for CPUs (and simulated GPUs, whose steps are sleeps); gpu: three
1024-channel convolutions at full resolution (~115 GFLOP a sample, forward and backward: ~7 TFLOP a
step at batch 64), so that a fed job keeps a data-centre GPU busy beyond Keras's host work a step.
On an H200 the small model's step was ~0.5 ms of GPU work: fed at batch 64, the GPU idled 95% of
the time, and starved, NVML's utilization read 0%. The gpu model there: fed 23 steps/s with the
GPU 63-79% busy, starved by one loader worker ~4 steps/s at ~12% (docs/gpu-check.md, runs 3-4)."""


def build_model(size: str = "small") -> keras.Model:
    if size == "gpu":
        return keras.Sequential(
            [
                keras.Input(IMAGE),
                keras.layers.Conv2D(1024, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(1024, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(1024, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(CLASSES),
            ]
        )
    if size != "small":
        raise ValueError(f"unknown model {size!r}: one of {', '.join(MODELS)}")
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


def model_size(asked: str, gpu_step_s: float | None, on_gpu: bool | None = None) -> str:
    """The model to train: as asked, or for "auto" the one that fits the device the steps run on
    (`on_gpu`: known to the caller, as a rank knows its device; else asked of the backend)."""
    if asked != "auto":
        return asked
    if gpu_step_s is not None:
        return "small"
    return "gpu" if (_on_gpu() if on_gpu is None else on_gpu) else "small"


def _on_gpu() -> bool:
    if keras.backend.backend() == "torch":
        # Keras's torch backend has no device listing (keras.distribution raises there): torch's own
        import torch

        return bool(torch.cuda.is_available())
    try:
        return bool(keras.distribution.list_devices("gpu"))
    except Exception:  # JAX without a GPU platform says so by raising
        return False


def _devices() -> int:
    try:
        return max(1, len([d for d in keras.distribution.list_devices("gpu")]))
    except Exception:
        return 1


def _leave_cores_for_the_input_pipeline() -> None:
    """On the CPU, torch's compute would take every core and no loader could ever saturate one:
    keep half the cores for the input pipeline, as a GPU job's host would have them."""
    if keras.backend.backend() == "torch":
        # here, not at the top: the job's backend: loaded in the training job only
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))


def simulate_gpu_steps(
    model: keras.Model, step_s: float, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Make each of the model's training steps a sleep of `step_s`: the batch is taken from the
    loader as before (the input side unchanged), the compute is off the host's CPUs, as a GPU's."""

    def train_step(data: object) -> dict[str, float]:
        sleep(step_s)
        return {}

    model.train_step = train_step  # the trainer calls the instance's train_step for each batch


class TooFewDevices(ValueError):
    """--gpus asks for more devices than the backend sees."""


def make_data(
    opts: BenchOptions, pipeline: str, batch: int, batches: int
) -> tuple[FedData, tempfile.TemporaryDirectory[str] | None]:
    """The input pipeline, and the folder holding its files (the caller cleans it up)."""
    tmp = None
    workers = workers_for(opts, pipeline)
    # Keras keeps at most max_queue_size batches asked for: fewer than workers + 1 would leave a
    # worker idle, and a loader of N workers would do the work of fewer
    queue = max(2, workers + 1)
    if pipeline == "fed":
        data: FedData = FedData(batch, batches, workers=workers, use_multiprocessing=True, max_queue_size=8)
    elif pipeline == "starved-cpu":
        data = CpuHeavyData(batch, batches, workers=workers, use_multiprocessing=True, max_queue_size=queue)
    elif pipeline == "jpeg":
        tmp = tempfile.TemporaryDirectory(prefix="gpumon-bench-jpeg-")
        _write_jpegs(tmp.name, opts.jpeg_files)
        data = JpegData(
            batch,
            batches,
            tmp.name,
            opts.jpeg_files,
            workers=workers,
            use_multiprocessing=True,
            max_queue_size=max(4, queue),
        )
    elif pipeline == "starved-io":
        tmp = tempfile.TemporaryDirectory(prefix="gpumon-bench-")
        for i in range(FILES):
            x, y = _batch(i, batch)
            pad = np.zeros(int(opts.file_mb * 1e6), dtype=np.uint8)  # the rest of a raw sample's bytes
            np.savez(os.path.join(tmp.name, f"batch-{i}.npz"), x=x, y=y, pad=pad)
        data = ThrottledFileData(
            batch,
            batches,
            tmp.name,
            opts.io_mb_per_s,
            workers=workers,
            use_multiprocessing=True,
            max_queue_size=queue,
        )
    else:
        raise ValueError(f"unknown pipeline {pipeline!r}")
    return data, tmp


def run(opts: BenchOptions) -> dict[str, Any]:
    jax_devices = None
    if opts.devices is not None and keras.backend.backend() == "jax":
        try:
            found = keras.distribution.list_devices("gpu")
        except RuntimeError:  # JAX without a GPU platform says so by raising
            found = []
        found = found or keras.distribution.list_devices("cpu")
        if len(found) < opts.devices:
            raise TooFewDevices(f"{opts.devices} devices asked for, {len(found)} visible to JAX")
        jax_devices = found[: opts.devices]
    gpus = len(jax_devices) if jax_devices else _devices()
    if gpus == 1:
        _leave_cores_for_the_input_pipeline()
    # The seed's rules: the global batch a multiple of the GPU count, every batch full.
    batch = max(gpus, opts.batch_size // gpus * gpus)
    batches = opts.steps_per_epoch
    data, tmp = make_data(opts, opts.pipeline, batch, batches)
    switching = None
    if opts.starve_after_s is not None:
        data = switching = SwitchingData(
            FedData(batch, batches),
            data,
            workers=data.workers,
            use_multiprocessing=data.use_multiprocessing,
            max_queue_size=data.max_queue_size,
        )
    if gpus > 1 and keras.backend.backend() == "jax":  # Keras 3's own data parallelism, set
        # before the model exists so that its variables are laid out over the devices
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax_devices))
    size = model_size(opts.model, opts.gpu_step_s)
    template = build_model(size)
    model = template
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if opts.gpu_step_s is not None:
        simulate_gpu_steps(model, opts.gpu_step_s)
    if opts.drive and opts.start_delay_s:
        # the job's process is on the GPU from now (the drive file says so), before any kernel
        with open(opts.drive, "a", encoding="utf-8") as f:
            f.write(f"# gpumon-drive v1 pid={os.getpid()}\n")
        time.sleep(opts.start_delay_s)
    hogs = _start_hogs(opts.cpu_hogs) if switching is None else []  # else at the switch
    start = time.monotonic()
    timer = StepTimer(opts, switching.switch_at if switching is not None else None)
    epochs = 1 if batches >= 10_000 else max(1, math.ceil(opts.duration_s * 100 / batches))
    callbacks: list[keras.callbacks.Callback] = [timer]
    if opts.verbose:
        callbacks.append(Progress(opts.duration_s))
    if opts.watch is not None:
        # here, not at the top: imports Keras: only inside a Keras job
        from gpumon.integrations.keras import GpumonCallback

        callbacks.append(GpumonCallback(opts.watch or None))
    try:
        model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
    finally:
        timer.close()
        _stop_hogs(hogs)
        if tmp is not None:
            tmp.cleanup()
    if opts.save:
        template.save(opts.save)
    leave_even_if_stuck(EXIT_GRACE_S)
    return {
        "steps": timer.steps,
        "seconds": time.monotonic() - start,
        "gpus": gpus,
        "batch": batch,
        "workers": workers_for(opts, opts.pipeline),
        "model": size,
    }
