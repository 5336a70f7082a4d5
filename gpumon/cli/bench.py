"""`gpumon bench`: a Keras training job, fed or starved on purpose (needs the bench extra)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from gpumon.cli import flags
from gpumon.core.errors import EXIT_INTERNAL, EXIT_OK, MissingDependency, UsageError
from gpumon.core.extras import install_hint

T = TypeVar("T")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    s = sub.add_parser(
        "bench",
        parents=[common],
        help="a Keras training job, fed or starved on purpose (needs the bench extra)",
    )
    s.add_argument("--pipeline", choices=["fed", "starved-cpu", "starved-io", "jpeg"], default="fed")
    flags.add_setting(
        s, flags.DURATION, default=60.0, help="how long to train, from the first step (default 60 s)"
    )
    s.add_argument("--batch-size", type=int, default=64, metavar="N")
    s.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="loader worker processes (1 to 64; default: 2 for fed and jpeg, 1 for starved-cpu and "
        "starved-io); with --gpus, each rank's",
    )
    s.add_argument(
        "--cpu-hogs",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes beside the job (a busy host)",
    )
    s.add_argument(
        "--starve-after",
        type=float,
        metavar="SECONDS",
        help="train fed for SECONDS from the first step, then switch this same job to --pipeline (and "
        "start --cpu-hogs then): a change inside one run, as when a neighbour's job takes the CPUs",
    )
    s.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="hold the GPU for SECONDS before the first step, as a job does while it imports, indexes "
        "its data or compiles (its process is on the GPU from the start; gpumon calls it starting)",
    )
    s.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="train data-parallel on N ranks (torch: torchrun + DistributedDataParallel, NCCL on GPUs, "
        "gloo on CPUs; jax: keras.distribution.DataParallel); the global batch is a multiple of N",
    )
    s.add_argument(
        "--straggler",
        metavar="RANK[:PIPELINE]",
        help="starve one rank's input pipeline (default starved-cpu) while the others are fed",
    )
    s.add_argument(
        "--straggler-passes",
        type=int,
        metavar="N",
        help="how long the straggler holds the others: its augmentation passes per sample and rank "
        "(default 6: the others wait ~80%% of each step at 2 ranks on 2 cores; fewer, less)",
    )
    s.add_argument(
        "--gpu-step-ms",
        type=float,
        metavar="MS",
        help="make each step's compute a sleep of MS milliseconds (1 to 10000) instead of the model's "
        "arithmetic: without a GPU, the step then leaves the host's cores to the input pipeline as a "
        "GPU does (nothing is trained; not with --save or KERAS_BACKEND=jax)",
    )
    s.add_argument(
        "--model",
        choices=["auto", "small", "gpu"],
        default="auto",
        help="the model's size: small (for CPUs), gpu (~115 GFLOP a sample: a fed job keeps a data-centre "
        "GPU busy); default auto: gpu where the backend trains on a GPU, else small",
    )
    s.add_argument("--drive", metavar="FILE", help="write each step's busy interval, for a simulated GPU")
    s.add_argument("--truth", metavar="FILE", help="write the labeled input-bound timeline (ground truth)")
    s.add_argument("--save", metavar="FILE.keras", help="save the trained (template) model")
    s.add_argument("--quiet", action="store_true", help="no progress lines (every 5 s: time, steps, loss)")
    s.add_argument(
        "--watch",
        nargs="?",
        const="",
        metavar="URL",
        help="gpumon's verdict in the training log (gpumon.integrations.keras): ask the daemon at URL "
        "(default $GPUMON_URL, else http://127.0.0.1:9877)",
    )
    s.set_defaults(func=run)


MAX_WORKERS = 64


def run(args: argparse.Namespace) -> int:
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers: between 1 and {MAX_WORKERS} loader processes, got {args.workers}")
    if not 0 <= args.start_delay <= 3600:
        raise UsageError(f"--start-delay: between 0 and 3600 seconds, got {args.start_delay:g}")
    if args.start_delay and (args.gpus != 1 or args.straggler is not None):
        raise UsageError("--start-delay: one GPU only (data-parallel ranks start as torchrun starts them)")
    if args.straggler_passes is not None and args.straggler is None:
        raise UsageError("--straggler-passes needs --straggler RANK[:PIPELINE] (and --gpus 2 or more)")
    if args.gpu_step_ms is not None:
        if not 1 <= args.gpu_step_ms <= 10_000:
            raise UsageError(f"--gpu-step-ms: between 1 and 10000 milliseconds, got {args.gpu_step_ms:g}")
        if args.save:
            raise UsageError("--gpu-step-ms trains nothing (each step a sleep): no model to --save")
        if os.environ.get("KERAS_BACKEND", "torch") != "torch":
            raise UsageError("--gpu-step-ms: on the torch backend (KERAS_BACKEND=torch) only")
        if args.model == "gpu":
            raise UsageError("--model gpu: not with --gpu-step-ms (each step a sleep: no model computes)")
    if args.gpus != 1 or args.straggler is not None:
        return _run_ranks(args)
    if args.starve_after is not None and not 0 < args.starve_after < args.duration:
        raise UsageError(
            f"--starve-after must be between 0 and --duration ({args.duration:g} s), "
            f"got {args.starve_after:g}"
        )
    if args.starve_after is not None and args.pipeline == "fed":
        raise UsageError("--starve-after needs a starving --pipeline (starved-cpu, starved-io or jpeg)")
    try:
        from gpumon.bench.job import BenchOptions
        from gpumon.bench.job import run as run_job
    except ImportError as e:
        raise MissingDependency(
            f"gpumon bench needs Keras 3 and a backend ({e.name} is missing): "
            f"{install_hint('bench', 'torch')} (on machines without a GPU, the CPU build is enough)"
        ) from None
    result = run_job(
        _options(
            BenchOptions,
            args,
            pipeline=args.pipeline,
            watch=args.watch,
            starve_after_s=args.starve_after,
            start_delay_s=args.start_delay,
            gpu_step_s=_gpu_step_s(args),
            model=args.model,
        )
    )
    print(
        f"gpumon bench: {args.pipeline}: {result['steps']:.0f} steps in {result['seconds']:.0f} s "
        f"({result['steps'] / max(result['seconds'], 1e-9):.1f} steps/s) on {result['gpus']:.0f} "
        f"device(s), batch {result['batch']:.0f}, {result['workers']:.0f} loader worker(s), "
        f"{result['model']} model",
        file=sys.stderr,
    )
    return EXIT_OK


def _options(options: Callable[..., T], args: argparse.Namespace, **more: Any) -> T:
    """The job's options from the flags every kind of run shares, plus its own."""
    return options(
        duration_s=args.duration,
        batch_size=args.batch_size,
        workers=args.workers,
        drive=args.drive,
        truth=args.truth,
        save=args.save,
        verbose=0 if args.quiet else 1,
        cpu_hogs=args.cpu_hogs,
        **more,
    )


def _gpu_step_s(args: argparse.Namespace) -> float | None:
    return None if args.gpu_step_ms is None else args.gpu_step_ms / 1000.0


STRAGGLER_PIPELINES = ("starved-cpu", "starved-io", "jpeg")


def parse_straggler(text: str, ranks: int) -> tuple[int, str]:
    """`RANK[:PIPELINE]` -> (rank, pipeline), checked against the rank count."""
    rank_text, _, pipeline = text.partition(":")
    pipeline = pipeline or "starved-cpu"
    try:
        rank = int(rank_text)
    except ValueError:
        raise UsageError(f"--straggler: {rank_text!r} is not a rank number (RANK[:PIPELINE])") from None
    if not 0 <= rank < ranks:
        raise UsageError(f"--straggler: rank {rank} is not one of the {ranks} ranks (0-{ranks - 1})")
    if pipeline not in STRAGGLER_PIPELINES:
        raise UsageError(
            f"--straggler: pipeline must be one of {', '.join(STRAGGLER_PIPELINES)}, got {pipeline!r}"
        )
    return rank, pipeline


def _run_ranks(args: argparse.Namespace) -> int:
    if not 1 <= args.gpus <= 64:
        raise UsageError(f"--gpus must be between 1 and 64, got {args.gpus}")
    if args.straggler is not None and args.gpus < 2:
        raise UsageError("--straggler needs --gpus 2 or more: one rank to starve, others to wait for it")
    for flag, value in (("--starve-after", args.starve_after), ("--watch", args.watch)):
        if value is not None:
            raise UsageError(f"{flag} is not supported with --gpus (one job per rank)")
    if args.pipeline != "fed":
        raise UsageError("with --gpus, every rank is fed: starve one with --straggler RANK[:PIPELINE]")
    straggler, pipeline = parse_straggler(args.straggler, args.gpus) if args.straggler else (None, "")
    passes = args.straggler_passes
    if passes is not None and not 1 <= passes <= 100:
        raise UsageError(f"--straggler-passes: between 1 and 100, got {passes}")
    backend = os.environ.get("KERAS_BACKEND", "torch")
    if backend == "jax":
        if straggler is not None:
            raise UsageError(
                "--straggler needs one input pipeline per rank: the torch backend's ranks; with "
                "KERAS_BACKEND=jax, DataParallel trains every device from one pipeline"
            )
        return _run_jax(args)
    if backend != "torch":
        raise UsageError(f"--gpus runs on the torch or jax backend, not KERAS_BACKEND={backend}")
    try:
        from gpumon.bench.job import _start_hogs, _stop_hogs
        from gpumon.bench.ranks import RankPlan, cuda_devices, launch
    except ImportError as e:
        raise MissingDependency(
            f"gpumon bench --gpus needs Keras 3 and torch ({e.name} is missing): "
            f"{install_hint('bench', 'torch')}"
        ) from None
    gpus = cuda_devices()
    if gpus and args.gpus > gpus:
        raise UsageError(f"--gpus {args.gpus}: this machine has {gpus} GPU(s)")
    plan = RankPlan(
        duration_s=args.duration,
        batch_size=args.batch_size,
        workers=args.workers,
        straggler=straggler,
        straggler_pipeline=pipeline,
        drive=args.drive,
        truth=args.truth,
        verbose=0 if args.quiet else 1,
        save=args.save,
        gpu_step_s=_gpu_step_s(args),
        model=args.model,
        **({"straggler_passes": passes} if passes is not None else {}),
    )
    if args.drive:  # the GPUs exist before the ranks start on them (their start-up is not work)
        with open(args.drive, "a", encoding="utf-8") as f:
            f.write(f"# gpumon-drive v2 ranks={args.gpus}\n")
    hogs = _start_hogs(args.cpu_hogs)
    try:
        code = launch(plan, args.gpus)
    finally:
        _stop_hogs(hogs)
    per_rank = max(1, args.batch_size // args.gpus)
    where = "GPUs" if gpus else "CPU ranks (gloo)"
    print(
        f"gpumon bench: {args.gpus} {where}, global batch {per_rank * args.gpus} ({per_rank} per rank)"
        + (f", rank {straggler} starved ({pipeline})" if straggler is not None else "")
        + ("" if code == 0 else f": a rank failed (exit {code})"),
        file=sys.stderr,
    )
    return EXIT_OK if code == 0 else EXIT_INTERNAL


def _run_jax(args: argparse.Namespace) -> int:
    """Keras's own data parallelism in one process, over the first N devices; without GPUs, N
    CPU devices that XLA is asked for before JAX starts."""
    flag = f"--xla_force_host_platform_device_count={args.gpus}"
    if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    try:
        from gpumon.bench.job import BenchOptions, TooFewDevices
        from gpumon.bench.job import run as run_job
    except ImportError as e:
        raise MissingDependency(
            f"gpumon bench needs Keras 3 and jax ({e.name} is missing): {install_hint('bench', 'jax')}"
        ) from None
    try:
        result = run_job(_options(BenchOptions, args, devices=args.gpus))
    except TooFewDevices as e:
        raise UsageError(f"--gpus {args.gpus}: {e}") from None
    print(
        f"gpumon bench: fed: {result['steps']:.0f} steps in {result['seconds']:.0f} s on "
        f"{result['gpus']:.0f} device(s) (jax DataParallel), global batch {result['batch']:.0f}",
        file=sys.stderr,
    )
    return EXIT_OK
