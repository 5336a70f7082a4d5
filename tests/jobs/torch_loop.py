"""A plain PyTorch training loop (CPU) for tests/test_integrations.py: fed, then starved by CPU-heavy
input preparation in the main process, with `gpumon.integrations.torch.watch()` around it. Its
steps drive the daemon's simulated GPU (--drive FILE), as `gpumon bench --drive` does.

    python tests/jobs/torch_loop.py DRIVE_FILE FED_SECONDS STARVED_SECONDS
"""

from __future__ import annotations

import os
import sys
import time

import torch

from gpumon.integrations.torch import watch

drive_path, fed_s, starved_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
drive = open(drive_path, "a", encoding="utf-8")
drive.write(f"# gpumon-drive v1 pid={os.getpid()}\n")
drive.flush()
torch.set_num_threads(1)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def step(x: torch.Tensor) -> None:
    begin = time.monotonic()
    while time.monotonic() - begin < 0.06:  # the "GPU" work of a step
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    drive.write(f"{begin:.6f} {time.monotonic():.6f}\n")
    drive.flush()


def heavy_batch() -> torch.Tensor:
    """Decoding and augmenting in Python, in the main process: a core pinned, the GPU waiting."""
    begin = time.monotonic()
    while time.monotonic() - begin < 0.19:
        sum(i * i for i in range(2000))
    return torch.randn(64, 256)


with watch(log=lambda line: print(line, flush=True)):
    print("== phase fed", flush=True)
    end = time.monotonic() + fed_s
    while time.monotonic() < end:
        step(torch.randn(64, 256))
    print("== phase starved", flush=True)
    end = time.monotonic() + starved_s
    while time.monotonic() < end:
        step(heavy_batch())
    print("== done", flush=True)
