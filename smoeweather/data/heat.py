"""Heat-diffusion samples for training: frame t → frame t + 1 of every run of one split."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipelines.heat_diffusion import open_heat, split_runs


class HeatDiffusionDataset(Dataset):
    """Pairs (x = frame t, y = frame t + 1), each (1, S, S) float32, of the runs of ``split``.

    The split is small enough to hold in memory (1,000 runs × 101 × 64² floats = 1.6 GB for the full
    train split). ``__getitems__`` returns whole batches, so the DataLoader skips per-sample collation.
    """

    def __init__(self, store: str | Path, split: str, max_runs: int | None = None) -> None:
        ds = open_heat(store)
        runs = split_runs(ds, split)[:max_runs]
        if runs.size == 0:
            raise ValueError(f"heat store {store} has no runs in split {split!r}")
        self.frames = torch.from_numpy(np.ascontiguousarray(ds["heat"].isel(run=runs).values))
        self.runs, self.steps = self.frames.shape[0], self.frames.shape[1] - 1

    def __len__(self) -> int:
        return self.runs * self.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        run, t = divmod(i, self.steps)
        return self.frames[run, t].unsqueeze(0), self.frames[run, t + 1].unsqueeze(0)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        run, t = idx // self.steps, idx % self.steps
        return self.frames[run, t].unsqueeze(1), self.frames[run, t + 1].unsqueeze(1)


def _batched(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


class HeatDataModule(L.LightningDataModule):
    """Train / val / test loaders over a heat store (shuffled train order, seeded by Lightning)."""

    def __init__(self, store: str | Path, batch_size: int = 32, max_runs: dict[str, int] | None = None) -> None:
        super().__init__()
        self.store, self.batch_size, self.max_runs = Path(store), batch_size, max_runs or {}
        self.splits: dict[str, HeatDiffusionDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        for split in ("train", "val", "test"):
            if split not in self.splits:
                self.splits[split] = HeatDiffusionDataset(self.store, split, self.max_runs.get(split))

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.batch_size, shuffle=shuffle, collate_fn=_batched)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)
