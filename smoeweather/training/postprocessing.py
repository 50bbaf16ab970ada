"""ENS-10 post-processing: a U-Net predicts a Gaussian (μ, σ) per grid point, trained on Gaussian CRPS."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torchmetrics import MeanMetric

from smoeweather.models.resnet import _channel_stats
from smoeweather.models.unet import gaussian_head
from smoeweather.training.base import SMoETrainingModule
from smoeweather.training.losses import gaussian_crps


class Ens10Postprocessor(nn.Module):
    """Physical units in and out: ensemble statistics → Gaussian forecast of one target field.

    ``forward(x, ens_mean, ens_std)``: ``x`` (B, 2·V, H, W) = [ensemble mean, ensemble std] of V predictor
    fields (physical units); ``ens_mean``, ``ens_std`` (B, H, W) of the target field. Returns (μ, σ), each
    (B, H, W) in the target's units: μ = o₀·s + m, σ = softplus(o₁)·s (:func:`gaussian_head`).
    The predictor/target statistics are buffers (they travel in the checkpoint); ``input_mean`` is 0 for
    the std channels, which are only scaled.
    """

    def __init__(
        self, net: nn.Module, input_mean: Any, input_std: Any, target_mean: float, target_std: float
    ) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("input_mean", _channel_stats(input_mean, "input_mean"))
        self.register_buffer("input_std", _channel_stats(input_std, "input_std"))
        self.register_buffer("target_mean", torch.tensor(float(target_mean)))
        self.register_buffer("target_std", torch.tensor(float(target_std)))

    def normalized(
        self, x: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Same as ``forward`` with every input and output in normalised units (training)."""
        return gaussian_head(self.net(x), ens_mean, ens_std)

    def forward(
        self, x: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xn = (x - self.input_mean) / self.input_std
        mu, sigma = self.normalized(
            xn, (ens_mean - self.target_mean) / self.target_std, ens_std / self.target_std
        )
        return mu * self.target_std + self.target_mean, sigma * self.target_std


def postprocessor_for(net: nn.Module, dataset: Any) -> Ens10Postprocessor:
    """Wrap ``net`` with the statistics of an :class:`~smoeweather.data.ens10.Ens10Dataset` (one target)."""
    if len(dataset.target_variables) != 1:
        raise ValueError(f"ENS-10 post-processing predicts one target field, got {dataset.target_names}")
    mean = np.stack([dataset.input_mean, np.zeros_like(dataset.input_mean)], 1).reshape(-1)
    std = np.repeat(dataset.input_std, 2)
    return Ens10Postprocessor(net, mean, std, dataset.target_mean[0], dataset.target_std[0])


class PostprocessingModule(SMoETrainingModule):
    """Trains an :class:`Ens10Postprocessor` on (x, y, ens_mean, ens_std) batches (all (B, C, H, W),
    normalised, one target channel) with the mean Gaussian CRPS in normalised units (``val_loss``);
    also logs ``val_crps`` in the target's physical units."""

    def __init__(self, model: Ens10Postprocessor, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.val_crps = MeanMetric()

    def forward(
        self, x: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical units: see :meth:`Ens10Postprocessor.forward`."""
        return self.model(x, ens_mean, ens_std)

    def _crps(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y, ens_mean, ens_std = batch
        mu, sigma = self.model.normalized(x, ens_mean, ens_std)
        return gaussian_crps(mu, sigma, y[:, 0]).mean()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        loss = self._crps(batch)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        return self.with_aux(loss)

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        loss = self._crps(batch)
        n = batch[0].shape[0]
        self.log("val_loss", loss, prog_bar=True, sync_dist=True, batch_size=n)
        self.val_crps.update(loss * self.model.target_std, weight=n)

    def on_validation_epoch_end(self) -> None:
        self.log("val_crps", self.val_crps.compute())
        self.val_crps.reset()
