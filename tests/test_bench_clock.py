"""`gpumon bench`'s own clock: --duration counts from the first step, and the truth's windows start
there. In a module of its own, not test_real_jobs.py: importing the bench imports Keras (~10 s), and
that module, on one worker, is the suite's longest path."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from .realjobs import require_bench, truth_windows


@pytest.fixture(autouse=True)
def bench_installed() -> None:
    require_bench()


def test_the_bench_trains_for_its_duration_from_its_first_step(tmp_path: Path) -> None:
    """A start-up slowed by a loaded host (the first step builds the model, the loader's workers
    start: 24 s in one fresh-machine run) must not eat the training that --duration asks for, and
    the truth's first window starts at the first step, from which the tests judge the detector."""
    from gpumon.bench.job import BenchOptions, StepTimer  # here: it imports Keras, once the extra is known

    now = [1000.0]
    truth = tmp_path / "truth.jsonl"
    timer = StepTimer(BenchOptions(duration_s=10.0, truth=str(truth)), clock=lambda: now[0])
    model = SimpleNamespace(stop_training=False)
    timer.set_model(model)
    now[0] += 30.0  # the start-up: longer than the whole duration
    steps = 0
    while not model.stop_training:
        timer.on_train_batch_begin(steps)
        now[0] += 0.25
        timer.on_train_batch_end(steps)
        steps += 1
    timer.close()
    assert steps == 40  # 10 s of 0.25 s steps, from the first
    (first, second) = truth_windows(truth)
    assert first["steps"] == 20 and second["steps"] == 20, (first, second)
    length = float(first["end_unix_s"]) - float(first["start_unix_s"])  # type: ignore[arg-type]
    assert abs(length - 5.0) < 0.01, first  # not 35 s: the start-up is in no window
    assert first["steps_per_s"] == 4.0


def test_the_bench_switches_to_starved_after_its_fed_part_from_its_first_step(tmp_path: Path) -> None:
    """--starve-after counts from the first step too (a slow start-up ate the fed part, and the tests
    that judge it found none), and the moment reaches the loader's workers through shared memory
    (they were forked before the first step)."""
    import multiprocessing

    from gpumon.bench.job import BenchOptions, StepTimer  # here: it imports Keras

    now = [1000.0]
    shared = multiprocessing.RawValue("d", float("inf"))
    drive, truth = tmp_path / "drive", tmp_path / "truth.jsonl"
    opts = BenchOptions(
        pipeline="starved-cpu", duration_s=12.0, starve_after_s=6.0, drive=str(drive), truth=str(truth)
    )
    timer = StepTimer(opts, shared, clock=lambda: now[0])
    model = SimpleNamespace(stop_training=False)
    timer.set_model(model)
    now[0] += 20.0  # a start-up longer than the fed part
    steps = 0
    while not model.stop_training:
        timer.on_train_batch_begin(steps)
        if steps == 0:
            assert shared.value == now[0] + 6.0  # the workers switch 6 s after the first step
        now[0] += 0.5
        timer.on_train_batch_end(steps)
        steps += 1
    timer.close()
    switch = [ln for ln in drive.read_text().splitlines() if ln.startswith("# switch")]
    assert switch == ["# switch 1026.000000"], switch
    windows = truth_windows(truth)
    # fed 5 s, fed up to the switch (1 s), starved 5 s; the last second's window is not closed
    assert [w["pipeline"] for w in windows] == ["fed", "fed", "starved-cpu"], windows
    assert windows[1]["steps"] == 2 and windows[2]["steps"] == 10, windows


def test_a_simulated_gpu_step_sleeps_its_time_and_computes_nothing(tmp_path: Path) -> None:
    """`bench --gpu-step-ms`: each batch the loader hands over is a step of the given time, slept
    (off the host's cores, as a GPU's compute), and the model's arithmetic is not run at all: its
    weights stay as they were built. The steps and the truth are timed as any other step."""
    import numpy as np  # here: with the bench's modules, once the extra is known

    from gpumon.bench.job import BenchOptions, FedData, StepTimer, build_model, simulate_gpu_steps

    now = [50.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    model = build_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    before = [w.copy() for w in model.get_weights()]
    simulate_gpu_steps(model, 0.125, sleep=sleep)
    truth = tmp_path / "truth.jsonl"
    timer = StepTimer(BenchOptions(duration_s=1e6, truth=str(truth)), clock=lambda: now[0])
    model.fit(FedData(8, 48), epochs=1, verbose=0, callbacks=[timer])
    timer.close()
    assert slept == [0.125] * 48  # one step a batch, each the given time
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    first = truth_windows(truth)[0]
    assert first["steps"] == 40 and first["steps_per_s"] == pytest.approx(8.0)  # 5 s of 0.125 s steps
    assert first["input_share"] == pytest.approx(0.0)


def test_the_model_fits_the_device_its_steps_run_on() -> None:
    """`bench --model auto`: on a GPU the gpu model, whose step is GPU work a fed loader keeps up
    with (the small one left an H200 95% idle while fed: docs/gpu-check.md); on CPUs, and for a
    simulated GPU's sleeps, the small one. What is asked is what trains."""
    import torch

    from gpumon.bench.job import build_model, model_size

    assert model_size("auto", None) == "small"  # this machine has no GPU
    cuda = torch.cuda.is_available
    try:  # as on a GPU machine: Keras's torch backend lists no devices; torch is asked
        torch.cuda.is_available = lambda: True
        assert model_size("auto", None) == "gpu"
        assert model_size("auto", 0.1) == "small"  # a simulated GPU's sleeps compute nothing
    finally:
        torch.cuda.is_available = cuda
    assert model_size("auto", 0.1) == "small"
    assert model_size("gpu", None) == "gpu" and model_size("small", None) == "small"
    # a rank knows its device (CUDA or gloo on CPUs)
    assert model_size("auto", None, on_gpu=True) == "gpu"
    assert model_size("auto", None, on_gpu=False) == "small"
    assert model_size("auto", 0.1, on_gpu=True) == "small"
    small, gpu = build_model("small"), build_model("gpu")
    assert gpu.count_params() > 100 * small.count_params()
    assert gpu.output_shape == small.output_shape
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        build_model("huge")
