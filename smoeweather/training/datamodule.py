"""A DataModule over ready-made split datasets with a seeded, rank-aware training order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SPLITS = ("train", "valid", "test")


class SplitDataModule(L.LightningDataModule):
    """Train / valid / test loaders over the datasets returned by ``make_datasets()`` (built lazily in each
    process, so DDP ranks and DataLoader workers open their stores themselves).

    The training order is a :class:`DistributedSampler` with ``seed`` on every run, one process or many
    (num_replicas = world size): epoch e's permutation depends only on (seed, e). Consequences, both
    tested: a run resumed from an epoch-end checkpoint sees the same batches as an uninterrupted one, and
    N ranks with batch b see, step by step, exactly the samples one process with batch N·b sees.
    Lightning calls ``set_epoch`` on the sampler and shards the valid/test loaders itself.
    """

    def __init__(
        self,
        make_datasets: Callable[[], dict[str, Dataset]],
        batch_size: int,
        seed: int = 0,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        self.make_datasets = make_datasets
        self.batch_size, self.seed, self.num_workers = int(batch_size), int(seed), int(num_workers)
        self.collate_fn = collate_fn
        self.datasets: dict[str, Dataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            self.datasets = dict(self.make_datasets())

    def dataset(self, split: str) -> Dataset:
        self.setup()
        if split not in self.datasets:
            raise ValueError(f"no {split!r} split; have {sorted(self.datasets)}")
        return self.datasets[split]

    def _loader(self, split: str, sampler: DistributedSampler | None = None) -> DataLoader:
        return DataLoader(
            self.dataset(split),
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=sampler is not None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=self.collate_fn,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = DistributedSampler(
            self.dataset("train"), num_replicas=world, rank=rank, shuffle=True, seed=self.seed, drop_last=True
        )
        return self._loader("train", sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
