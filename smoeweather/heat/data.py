"""Heat-diffusion samples for training: frame t → frame t + 1 of every run of one split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

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


def batched_pairs(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate function of :class:`HeatDiffusionDataset` batches, which ``__getitems__`` already stacks."""
    return batch


def heat_splits(store: str | Path, max_runs: dict[str, int | None] | None = None) -> dict[str, HeatDiffusionDataset]:
    """The ``train`` / ``valid`` / ``test`` datasets of a heat store (the store's ``val`` split is ``valid``),
    each limited to ``max_runs[split]`` runs; for :class:`smoeweather.training.datamodule.SplitDataModule`."""
    limits = dict(max_runs or {})
    if "val" in limits:  # the store's own name for the split
        limits.setdefault("valid", limits.pop("val"))
    return {split: HeatDiffusionDataset(store, name, limits.get(split))
            for split, name in (("train", "train"), ("valid", "val"), ("test", "test"))}
