"""Lightning module for field-to-field regression (heat diffusion): MSE + routing losses."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.metrics.relative_error import within_tolerance
from smoeweather.training.base import SMoETrainingModule
from smoeweather.training.blocks import TrainingSettings

_DEFAULTS = TrainingSettings()

SELECTION_METRICS = {"val_loss": "min", "val_pct_within_1pct": "max"}


class FieldRegressionModule(SMoETrainingModule):
    """Trains ``model`` (B, C, H, W) → (B, C', H, W) with MSE; logs the "% within 1 %" score.

    The SMoE routing-classification loss and expert damping act inside backward; the base class adds the
    auxiliary routing losses, keeps the loss scale in sync and sets up Adam. ``monitor`` is the validation
    metric the ReduceLROnPlateau schedule watches: ``val_loss`` (MSE, minimised; the project's default)
    or ``val_pct_within_1pct`` (maximised; the reference code's ``--opt-metric prcntclose1.0
    --opt-metric-max``). The same metric should drive early stopping and the best checkpoint.
    """

    def __init__(self, model: nn.Module, lr: float = _DEFAULTS.lr, plateau_factor: float = 0.1,
                 plateau_patience: int = 15, aux_weight: float = 0.01, monitor: str = "val_loss",
                 **kwargs: Any) -> None:
        if monitor not in SELECTION_METRICS:
            raise ValueError(f"monitor must be one of {', '.join(SELECTION_METRICS)}, got {monitor!r}")
        super().__init__(model, lr=lr, plateau_factor=plateau_factor, plateau_patience=plateau_patience,
                         aux_weight=aux_weight, **kwargs)
        self.monitor = monitor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.model(x), y)
        self.log("train_mse", loss, prog_bar=True, on_step=False, on_epoch=True)
        return self.with_aux(loss)

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], prefix: str) -> None:
        x, y = batch
        pred = self.model(x)
        # batch_size: the epoch value is the mean over samples (every sample has the same number of points)
        self.log(f"{prefix}_loss", F.mse_loss(pred, y), prog_bar=True, sync_dist=True, batch_size=x.shape[0])
        # raw (unstandardised) frames: |ŷ − y| ≤ 1e-8 + 0.01·|y| per point, averaged over the batch's points
        pct = 100.0 * within_tolerance(pred, y).float().mean()
        self.log(f"{prefix}_pct_within_1pct", pct, prog_bar=True, sync_dist=True, batch_size=x.shape[0])

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        config = super().configure_optimizers()
        mode = SELECTION_METRICS[self.monitor]
        if mode != "min" and self.lr_schedule == "plateau":  # rebuild the plateau schedule on the chosen metric
            config["lr_scheduler"] = {
                "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
                    config["optimizer"], mode=mode, factor=self.plateau_factor, patience=self.plateau_patience
                ),
                "monitor": self.monitor,
            }
        return config
