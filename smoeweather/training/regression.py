"""Lightning module for field-to-field regression (heat diffusion): MSE + routing losses."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.metrics.relative_error import within_tolerance
from smoeweather.nn.smoe import rc_loss_value, set_loss_scale


def auxiliary_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum of the ``aux_loss`` tensors left by the last forward (SMoE App. C.1 losses, V-MoE losses)."""
    terms = [m.aux_loss for m in model.modules() if isinstance(getattr(m, "aux_loss", None), torch.Tensor)]
    return torch.stack([t.reshape(()) for t in terms]).sum() if terms else None


class FieldRegressionModule(L.LightningModule):
    """Trains ``model`` (B, C, H, W) → (B, C', H, W) with MSE; logs the "% within 1 %" score.

    The SMoE routing-classification loss and expert damping act inside backward; this module only adds
    the auxiliary routing losses (× ``aux_weight``) and keeps the SMoE layers' loss scale in sync with
    the fp16 GradScaler.
    """

    def __init__(self, model: nn.Module, lr: float = 1e-3, plateau_factor: float = 0.1,
                 plateau_patience: int = 15, aux_weight: float = 0.01) -> None:
        super().__init__()
        self.model = model
        self.lr, self.plateau_factor, self.plateau_patience = lr, plateau_factor, plateau_patience
        self.aux_weight = aux_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.model(x), y)
        aux = auxiliary_loss(self.model)
        self.log("train_mse", loss, prog_bar=True, on_step=False, on_epoch=True)
        if aux is not None:
            loss = loss + self.aux_weight * aux
            self.log("train_aux", aux, on_step=False, on_epoch=True)
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        set_loss_scale(self.model, scaler.get_scale() if scaler is not None else 1.0)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        rc = rc_loss_value(self.model)
        if rc is not None:
            self.log("train_rc", rc, on_step=False, on_epoch=True)

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], prefix: str) -> None:
        x, y = batch
        pred = self.model(x)
        self.log(f"{prefix}_loss", F.mse_loss(pred, y), prog_bar=True)
        self.log(f"{prefix}_pct_within_1pct", 100.0 * within_tolerance(pred, y).float().mean(), prog_bar=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=self.plateau_factor, patience=self.plateau_patience)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}
