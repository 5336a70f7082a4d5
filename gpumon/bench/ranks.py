"""`gpumon bench --gpus N` on the torch backend: N data-parallel ranks, launched by torchrun.

Keras documents multi-device training on its torch backend as a Keras model trained in a torch
DistributedDataParallel loop (keras.io, "Multi-GPU distributed training with PyTorch"); that is
what each rank runs: NCCL on GPUs, gloo on CPUs, one GPU per rank (LOCAL_RANK) when there are
GPUs. Each rank has its own input pipeline (torch DataLoader worker processes over the bench's
datasets); with --straggler RANK[:PIPELINE] one rank's is starved while the others are fed.

A step on each rank:
  input   the next batch from the rank's own loader (the wait is the rank's input wait)
  sync    one small all-reduce that every rank joins once it has its batch: a rank whose batch
          came early waits here for the slowest, exactly as it would wait in DDP's gradient
          all-reduce; putting the wait in one collective measures it apart from the compute.
          It also carries the vote to stop, so all ranks stop after the same step.
  compute forward, backward (DDP's gradient all-reduce, which now finds every rank ready), step

Ground truth per rank (--truth, one JSON record per rank per 5 s window): input and sync shares
of the step time, the rank's batch and whether every batch was full, and the expected state:
`starved` at >= 20% input wait (TensorFlow's "highly input-bound"), else `sync-stall` at >= 50%
of the time blocked in the collective, else `healthy` below 5% input wait and 20% sync, else
`either`.

--drive FILE: every rank appends to the one file, a line at a time (O_APPEND, each line one
write, so lines never interleave):
  # gpumon-drive v2 ranks=N          (written by the launcher first: the GPUs exist, no job yet)
  # gpumon-drive v2 pid=PID rank=R   (the rank's process, whose GPU is simulated GPU R)
  START - R [sync]                   (an interval began: busy until its end is written)
  START END R                        (busy computing)
  START END R sync                   (busy spinning in the collective: busy at idle-level power,
                                      as NCCL's kernels are while they wait)

Never imported by the daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields

os.environ.setdefault("KERAS_BACKEND", "torch")

WINDOW_S = 5.0
STRAGGLER_PASSES_PER_RANK = 6


@dataclass(frozen=True)
class RankPlan:
    """What each rank runs: the bench's options as plain values (passed through the environment)."""

    duration_s: float
    batch_size: int
    """The global batch: each rank trains on batch_size / world_size."""
    workers: int | None
    """Loader worker processes per rank; None: each pipeline's default (the bench's)."""
    straggler: int | None
    straggler_pipeline: str
    drive: str | None
    truth: str | None
    verbose: int
    save: str | None = None
    """Rank 0 saves the trained model: the Keras model itself (the template), not the DDP wrapper."""
    straggler_passes: int = STRAGGLER_PASSES_PER_RANK
    """The straggler's augmentation passes per sample, per rank (bench --straggler-passes): how
    long it holds the others at each step, so how much of it they spend waiting."""
    gpu_step_s: float | None = None
    """Each step's compute a sleep this long instead of forward, backward and step (bench
    --gpu-step-ms: a simulated GPU's compute, off the host's cores); None: the model computes."""
    model: str = "auto"
    """The model's size (gpumon.bench.job.MODELS); "auto": "gpu" on CUDA ranks, else "small"."""


def _line(fd: int | None, text: str) -> None:
    if fd is not None:
        os.write(fd, text.encode())  # one write per line on an O_APPEND file: lines never interleave


def _expected(input_share: float, sync_share: float) -> str:
    if input_share >= 0.20:
        return "starved"
    if sync_share >= 0.50:
        return "sync-stall"
    if input_share < 0.05 and sync_share < 0.20:
        return "healthy"
    return "either"


def rank_main(plan: RankPlan) -> dict[str, float]:
    # here, not at the top: the job's backend: loaded in the training job only
    import torch
    import torch.distributed as dist

    # here, not at the top: imports Keras: in the training job only
    from gpumon.bench.job import BenchOptions, CpuHeavyData, build_model, make_data, model_size

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(1)  # CPU ranks share the machine's cores with their loaders
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    pipeline = plan.straggler_pipeline if rank == plan.straggler else "fed"
    per_rank = max(1, plan.batch_size // world)
    opts = BenchOptions(pipeline=pipeline, workers=plan.workers, batch_size=per_rank)
    data, tmp = make_data(opts, pipeline, per_rank, 100_000)
    if isinstance(data, CpuHeavyData):
        # A rank trains on its share of the global batch, so its loader has less to do per step
        # than the one-device bench's. The straggler's augmentation does STRAGGLER_PASSES_PER_RANK
        # passes per sample per rank (12 at 2 ranks; the one-device bench does 3), so its work per
        # step is the same at any rank count and it stays far behind: the others spend most of
        # each step in the all-reduce (~80% at 2 ranks on this 2-core machine)
        data.passes = plan.straggler_passes * world
    # the dataset's own worker count, as processes of this rank (the DataLoader's workers)
    loader: torch.utils.data.DataLoader[tuple[object, object]] = torch.utils.data.DataLoader(
        data, batch_size=None, shuffle=False, num_workers=max(1, data.workers), prefetch_factor=2
    )
    model = build_model(model_size(plan.model, plan.gpu_step_s, cuda))
    model.to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    drive = os.open(plan.drive, flags, 0o644) if plan.drive else None
    truth = os.open(plan.truth, flags, 0o644) if plan.truth else None
    _line(drive, f"# gpumon-drive v2 pid={os.getpid()} rank={rank}\n")
    steps, waited, synced, computed = 0, 0.0, 0.0, 0.0
    full = True
    window_start = time.monotonic()
    start = window_start
    stop_at = start + plan.duration_s
    vote = torch.zeros(1, device=device)
    prev_end = time.monotonic()
    try:
        for x, y in loader:
            got = time.monotonic()
            _line(drive, f"{got:.6f} - {rank} sync\n")
            vote.fill_(1.0 if got >= stop_at else 0.0)
            dist.all_reduce(vote, op=dist.ReduceOp.MAX)  # arrival: waits for the slowest rank
            if cuda:
                torch.cuda.synchronize()
            ready = time.monotonic()
            _line(drive, f"{got:.6f} {ready:.6f} {rank} sync\n")
            if vote.item() > 0:
                break
            _line(drive, f"{ready:.6f} - {rank}\n")
            full = full and len(x) == per_rank  # the origin's rule: every batch full
            if plan.gpu_step_s is not None:
                time.sleep(plan.gpu_step_s)  # the collective above still holds the ranks together
            else:
                inputs = torch.as_tensor(x, device=device)
                labels = torch.as_tensor(y, device=device, dtype=torch.long)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(inputs), labels)
                loss.backward()
                optimizer.step()
                if cuda:
                    torch.cuda.synchronize()
            end = time.monotonic()
            _line(drive, f"{ready:.6f} {end:.6f} {rank}\n")
            steps += 1
            waited += got - prev_end
            synced += ready - got
            computed += end - ready
            prev_end = end
            if end - window_start >= WINDOW_S:
                shares = (waited, synced, computed)
                _close(truth, rank, pipeline, window_start, end, shares, steps, per_rank, full)
                window_start, waited, synced, computed, steps, full = end, 0.0, 0.0, 0.0, 0, True
            if plan.verbose and rank == 0 and steps % 20 == 0 and plan.gpu_step_s is None:
                print(f"rank 0: step loss {loss.detach().item():.3f}", file=sys.stderr)  # no autograd warning
        if plan.save and rank == 0:
            model.save(plan.save)
    finally:
        for fd in (drive, truth):
            if fd is not None:
                os.close(fd)
        if tmp is not None:
            tmp.cleanup()
        dist.destroy_process_group()
    return {"seconds": time.monotonic() - start}


def _close(
    fd: int | None,
    rank: int,
    pipeline: str,
    start: float,
    end: float,
    shares: tuple[float, float, float],
    steps: int,
    batch: int,
    full: bool,
) -> None:
    """One truth record: the window's input wait, time in the collective and compute."""
    waited, synced, computed = shares
    total = waited + synced + computed
    if fd is None or total <= 0:
        return
    unix_end = time.time() - (time.monotonic() - end)
    record = {
        "start_unix_s": round(unix_end - (end - start), 3),
        "end_unix_s": round(unix_end, 3),
        "gpu": rank,
        "input_share": round(waited / total, 4),
        "sync_share": round(synced / total, 4),
        "steps": steps,
        "steps_per_s": round(steps / (end - start), 3) if end > start else None,
        "batch": batch,
        "full_batches": full,
        "pipeline": pipeline,
        "expected": _expected(waited / total, synced / total),
    }
    _line(fd, json.dumps(record) + "\n")


PLAN_ENV = "GPUMON_BENCH_PLAN"


def cuda_devices() -> int:
    """GPUs torch sees here (0 without CUDA): one rank per GPU on a GPU machine."""
    # here, not at the top: the job's backend: loaded in the training job only
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def launch(plan: RankPlan, ranks: int) -> int:
    """Run `ranks` ranks on this machine with torchrun (its standalone rendezvous: a free port on
    localhost), each given the plan; the exit status of the slowest to fail, 0 when all succeed."""

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        # one machine: ranks meet on loopback, never by looking up the host's name (a container
        # or chroot whose /etc/hosts lacks it would hang there)
        "--local-addr=127.0.0.1",
        f"--nproc-per-node={ranks}",
        "--module",
        "gpumon.bench.ranks",
    ]
    env = dict(os.environ, **{PLAN_ENV: json.dumps(asdict(plan))})
    env.setdefault("OMP_NUM_THREADS", "1")
    # CUDA numbers GPUs fastest first unless told otherwise; NVML (and so gpumon) in PCI bus order:
    # the same order makes rank R's GPU gpumon's GPU R, as the truth records say
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the CPU ranks' backend, on loopback too
    return subprocess.run(cmd, env=env, check=False).returncode


def main() -> int:
    raw = json.loads(os.environ[PLAN_ENV])
    plan = RankPlan(**{f.name: raw[f.name] for f in fields(RankPlan)})
    rank_main(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
