"""WeatherBench-style forecasting: latitude-weighted MSE on normalised fields, RMSE in physical units.

The trained network sits inside a :class:`~smoeweather.models.resnet.NormalizedModel`, whose buffers hold
the normalisation statistics of every input and target channel: the saved model maps physical units to
physical units. Batches from :class:`~smoeweather.data.weather.WeatherBenchDataset` are already
normalised with the same statistics, so training runs ``model.net`` on them directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchmetrics import MeanMetric

from smoeweather.models.resnet import NormalizedModel
from smoeweather.training.base import SMoETrainingModule
from smoeweather.training.losses import lat_weighted_mse, latitude_weights


def input_statistics(dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-input-channel (mean, std), each (C_in,), of a :class:`WeatherBenchDataset` in physical units.

    Channel order as ``dataset.channel_names``: the fields at every input offset, the constants (the
    latitude channel in degrees), and the lead-time channel τ/100 h (mean 0, std 1: passed through).
    """
    means = list(dataset.input_mean) * len(dataset.input_offsets_h)
    stds = list(dataset.input_std) * len(dataset.input_offsets_h)
    for c in dataset.constants:
        if c == "latitude":
            means.append(float(dataset.latitude.mean()))
            stds.append(float(dataset.latitude.std()))
        else:
            mean, std = dataset._const_stats[c]
            means.append(mean)
            stds.append(std)
    if dataset.continuous:
        means.append(0.0)
        stds.append(1.0)
    return np.asarray(means, np.float32), np.asarray(stds, np.float32)


def normalized_model(net: torch.nn.Module, dataset: Any) -> NormalizedModel:
    """Wrap ``net`` with the statistics of ``dataset`` (physical units in and out)."""
    mean, std = input_statistics(dataset)
    return NormalizedModel(net, mean, std, dataset.target_mean, dataset.target_std)


class ForecastingModule(SMoETrainingModule):
    """Trains a :class:`NormalizedModel` on normalised (x, y) batches, (B, C_in, H, W) → (B, C_out, H, W).

    Loss: latitude-weighted MSE in normalised units (mean over channels), ``val_loss`` likewise. Also logs
    ``val_rmse_<target>``: latitude-weighted RMSE in physical units over the whole validation set (square
    root after the mean over time, as WeatherBench), synchronised across DDP ranks.

    Args:
        model: the NormalizedModel (its ``net`` is trained).
        latitude: (H,) latitudes in degrees north of the grid.
        target_names: names of the C_out targets (for the logged metrics).
        lr, plateau_factor, plateau_patience, aux_weight, freeze_batchnorm, metadata: see
            :class:`SMoETrainingModule`.
    """

    def __init__(
        self,
        model: NormalizedModel,
        latitude: np.ndarray | list[float],
        target_names: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.register_buffer("lat_weights", latitude_weights(latitude), persistent=False)
        self.target_names = list(target_names)
        self.val_mse = torch.nn.ModuleList(MeanMetric() for _ in self.target_names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Physical units in and out: (B, C_in, H, W) → (B, C_out, H, W)."""
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = lat_weighted_mse(self.model.net(x), y, self.lat_weights)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        return self.with_aux(loss)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        pred = self.model.net(x)
        self.log(
            "val_loss",
            lat_weighted_mse(pred, y, self.lat_weights),
            prog_bar=True,
            sync_dist=True,
            batch_size=x.shape[0],
        )
        std = self.model.target_std.view(1, -1, 1, 1)
        per_channel = lat_weighted_mse(pred * std, y * std, self.lat_weights, per_channel=True)
        for metric, value in zip(self.val_mse, per_channel):
            metric.update(value, weight=x.shape[0])

    def on_validation_epoch_end(self) -> None:
        for name, metric in zip(self.target_names, self.val_mse):
            self.log(f"val_rmse_{name}", metric.compute().sqrt())
            metric.reset()
