"""A PyTorch Lightning fit on the CPU for tests/test_integrations.py, starved by a CPU-heavy
Dataset read in the main process (num_workers=0), with gpumon's Lightning callback. A second
callback writes each step's busy interval for the daemon's simulated GPU (--drive FILE).

    python tests/jobs/lightning_loop.py DRIVE_FILE SECONDS
"""

from __future__ import annotations

import os
import sys
import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

from gpumon.integrations.lightning import GpumonCallback

drive_path, seconds = sys.argv[1], float(sys.argv[2])
torch.set_num_threads(1)


class Heavy(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        begin = time.monotonic()
        while time.monotonic() - begin < 0.19:  # decoding in Python, in the main process
            sum(k * k for k in range(2000))
        return torch.randn(256)


class Net(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        begin = time.monotonic()
        loss = self.layer(batch).square().mean()
        while time.monotonic() - begin < 0.06:  # the "GPU" work of a step
            self.layer(batch).square().mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Drive(Callback):
    def __init__(self) -> None:
        self.f = open(drive_path, "a", encoding="utf-8")
        self.f.write(f"# gpumon-drive v1 pid={os.getpid()}\n")
        self.f.flush()
        self.begin = 0.0
        self.stop_at = time.monotonic() + seconds

    def on_train_batch_start(self, trainer: Trainer, *args: object) -> None:
        self.begin = time.monotonic()

    def on_train_batch_end(self, trainer: Trainer, *args: object) -> None:
        self.f.write(f"{self.begin:.6f} {time.monotonic():.6f}\n")
        self.f.flush()
        if time.monotonic() >= self.stop_at:
            trainer.should_stop = True


trainer = Trainer(
    accelerator="cpu",
    max_epochs=1,
    callbacks=[Drive(), GpumonCallback(log=lambda line: print(line, flush=True))],
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
    enable_checkpointing=False,
)
trainer.fit(Net(), DataLoader(Heavy(), batch_size=1, num_workers=0))
print("== done", flush=True)
