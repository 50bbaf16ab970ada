"""Small Lightning callbacks: per-batch reseeding (exact resume), throughput, the resolved config file."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml

from smoeweather.io import write_text


class BatchSeed(L.Callback):
    """Reseed torch / numpy / random before every training batch from (seed, epoch, batch, global rank).

    Dropout masks and gate noise then depend only on these numbers, not on what ran before (validation,
    checkpointing, DataLoader iterators all draw from the global generators at moments that differ
    between an uninterrupted and a resumed run), so a run resumed from a checkpoint continues bit for bit.
    The data order comes from the seeded sampler of :class:`~smoeweather.training.datamodule.SplitDataModule`;
    DataLoader worker seeds are not covered (the datasets here draw no random numbers).
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        key = (
            (self.seed * 1_000_003 + trainer.current_epoch) * 100_003 + batch_idx
        ) * 101 + trainer.global_rank
        s = key % 2**31
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


class SamplesPerSecond(L.Callback):
    """Logs training throughput ``samples_per_s`` (all ranks together, since the epoch start) to the
    logger and the progress bar; ``batch_size_fn(batch)`` gives the samples of one rank's batch."""

    def __init__(self, batch_size_fn: Any = None) -> None:
        self.batch_size_fn = batch_size_fn or (lambda batch: int(batch[0].shape[0]))
        self._start, self._samples = 0.0, 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._samples = time.perf_counter(), 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples += self.batch_size_fn(batch) * trainer.world_size
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        pl_module.log(
            "samples_per_s",
            self._samples / elapsed,
            prog_bar=True,
            on_step=True,
            on_epoch=False,
            rank_zero_only=True,
        )


class SaveResolvedConfig(L.Callback):
    """Writes the resolved config to ``<output_dir>/config.yaml`` (rank 0 only, atomically)."""

    def __init__(self, config: dict[str, Any], output_dir: str | Path) -> None:
        self.config, self.output_dir = config, Path(output_dir)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            write_text(self.output_dir / "config.yaml", yaml.safe_dump(self.config, sort_keys=False))
