"""Ensemble post-processing: a U-Net (or SMoE-U-Net) predicts a Gaussian (μ, σ) per grid point and target,
trained on the closed-form Gaussian CRPS (Ashkboos et al. 2022; SMoE paper §3.3, Table 5)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric

from smoeweather.models.postprocess_network import EnsemblePostprocessor
from smoeweather.nn.crps import gaussian_crps
from smoeweather.training.base import SMoETrainingModule


class PostprocessingModule(SMoETrainingModule):
    """Trains an :class:`EnsemblePostprocessor` on (x, y, ens_mean, ens_std) batches, loss = the Gaussian CRPS
    averaged over grid points and targets in normalised units (``val_loss``, the selection criterion); also
    logs ``val_crps/<target>`` in the target's physical units (``target_std`` per target)."""

    def __init__(self, model: EnsemblePostprocessor, target_names: list[str], target_std: list[float],
                 **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.target_names = list(target_names)
        self.register_buffer("target_std", torch.as_tensor(target_std, dtype=torch.float32), persistent=False)
        self.val_crps = nn.ModuleList(MeanMetric() for _ in target_names)

    def forward(self, x: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(x, ens_mean, ens_std)

    def _crps(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(B, T, H, W) CRPS in normalised units."""
        x, y, ens_mean, ens_std = batch
        mu, sigma = self.model(x, ens_mean, ens_std)
        return gaussian_crps(mu, sigma, y)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        loss = self._crps(batch).mean()
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        return self.with_aux(loss)

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        crps = self._crps(batch)
        n = batch[0].shape[0]
        self.log("val_loss", crps.mean(), prog_bar=True, sync_dist=True, batch_size=n)
        per_target = crps.mean((0, 2, 3)) * self.target_std
        for metric, value in zip(self.val_crps, per_target):
            metric.update(value, weight=n)

    def on_validation_epoch_end(self) -> None:
        for name, metric in zip(self.target_names, self.val_crps):
            self.log(f"val_crps/{name}", metric.compute())
            metric.reset()
