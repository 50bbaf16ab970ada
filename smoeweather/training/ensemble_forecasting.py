"""Training of ensemble forecast networks (``model.name`` ∈ ``e3``, ``deep_ensemble``, ``gaussian``, ``mc_dropout``).

The network (inside a :class:`~smoeweather.models.resnet.NormalizedModel`) maps normalised inputs
(B, C_in, H, W) to (B, M, C_out, H, W) members, or (B, 2, C_out, H, W) = (μ, σ) for ``gaussian``. The loss is
``training.loss`` (:mod:`smoeweather.training.ensemble_losses`): ``mse`` (per member, E³ and deep ensembles),
``crps`` (almost-fair CRPS across members with ``training.crps_alpha``, default 0: the standard CRPS, see
docs/guide/ensembles.md "Which CRPS") or ``gaussian_crps``
(the only loss of ``gaussian``). ``val_loss`` is the same loss on the validation split (checkpoint selection);
also logged: ``val_crps`` (fair CRPS, or the Gaussian CRPS) and ``val_rmse_<target>`` of the ensemble mean
(or μ) in physical units.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from smoeweather.models.ensemble import model_kind
from smoeweather.models.resnet import NormalizedModel
from smoeweather.training.blocks import TrainingSettings
from smoeweather.training.ensemble_losses import ENSEMBLE_LOSSES, ensemble_crps, ensemble_loss, gaussian_crps_loss
from smoeweather.training.forecasting import ForecastingModule
from smoeweather.training.losses import lat_weighted_mse

DEFAULT_LOSS = {"e3": "mse", "deep_ensemble": "mse", "gaussian": "gaussian_crps", "mc_dropout": "mse"}


def loss_settings(model: Mapping[str, Any], t: TrainingSettings) -> tuple[str, float]:
    """(``training.loss``, ``training.crps_alpha``) of a ``model`` block and its ``training`` block, defaults per
    model, checked against the model."""
    name = str(model.get("name"))
    loss = str(t.loss or DEFAULT_LOSS.get(name, "mse"))
    # default α 0 (standard CRPS, TrainingSettings): the members of e3/deep_ensemble are distinct networks, not
    # exchangeable draws, and a fair share lets them spread out (gcm_ensembles_cpu_600: α 0.95 spread/skill 2.4,
    # α 0 1.1)
    alpha = float(t.crps_alpha)
    if loss not in ENSEMBLE_LOSSES:
        raise ValueError(f"training.loss must be one of {', '.join(ENSEMBLE_LOSSES)}, got {loss!r}")
    if (loss == "gaussian_crps") != (name == "gaussian"):
        raise ValueError(f"training.loss {loss!r} does not fit model {name!r}: gaussian_crps is the loss of "
                         "model gaussian (and its only one); e3/deep_ensemble take mse or crps")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"training.crps_alpha must be in [0, 1], got {alpha}")
    if name == "mc_dropout" and loss != "mse":
        raise ValueError(f"model mc_dropout trains one stochastic pass per sample: training.loss must be mse, "
                         f"got {loss!r}")
    return loss, alpha


def check_loss(model: Mapping[str, Any], t: TrainingSettings) -> None:
    """ValueError unless ``training.loss`` fits ``model.name`` (a deterministic model trains on mse; an ensemble
    model as :func:`loss_settings` says): a pure config check, run before anything is built."""
    if model_kind(model) == "deterministic":
        if t.loss not in (None, "mse"):
            raise ValueError(f"training.loss {t.loss!r} needs an ensemble model (model.name e3, deep_ensemble or "
                             "gaussian); a deterministic model trains on mse")
    else:
        loss_settings(model, t)


class EnsembleForecastingModule(ForecastingModule):
    """Trains an ensemble network (see the module docstring); ``forward`` gives physical units.

    Args:
        model: NormalizedModel around an ensemble network.
        latitude, target_names: as :class:`ForecastingModule`.
        kind: ``ensemble`` or ``gaussian``.
        loss, crps_alpha: the training loss and the almost-fair CRPS weight.
        **kwargs: :class:`SMoETrainingModule` arguments (lr, metadata, …).
    """

    def __init__(self, model: NormalizedModel, latitude: np.ndarray | list[float], target_names: list[str],
                 kind: str = "ensemble", loss: str = "mse", crps_alpha: float = 0.0, **kwargs: Any) -> None:
        super().__init__(model, latitude, target_names, **kwargs)
        self.kind, self.loss_name, self.crps_alpha = kind, loss, float(crps_alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Physical units: (B, C_in, H, W) → (B, M, C_out, H, W) members or (B, 2, C_out, H, W) = (μ, σ)."""
        from smoeweather.models.ensemble import physical_members

        return physical_members(self.model, x, self.kind)

    def _point(self, out: torch.Tensor) -> torch.Tensor:
        return out[:, 0] if self.kind == "gaussian" else out.mean(dim=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = ensemble_loss(self.loss_name, self.model.net(x), y, self.lat_weights, self.crps_alpha)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        return self.with_aux(loss)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        out = self.model.net(x)
        n = x.shape[0]
        self.log("val_loss", ensemble_loss(self.loss_name, out, y, self.lat_weights, self.crps_alpha),
                 prog_bar=True, sync_dist=True, batch_size=n)
        crps = (gaussian_crps_loss(out, y, self.lat_weights) if self.kind == "gaussian"
                else ensemble_crps(out, y, self.lat_weights, alpha=1.0) if out.shape[1] > 1
                else (out[:, 0] - y).abs().mul(self.lat_weights.view(1, 1, -1, 1)).mean())
        self.log("val_crps", crps, sync_dist=True, batch_size=n)
        std = self.model.target_std.view(1, -1, 1, 1)
        per_channel = lat_weighted_mse(self._point(out) * std, y * std, self.lat_weights, per_channel=True)
        for metric, value in zip(self.val_mse, per_channel):
            metric.update(value, weight=n)


def build_forecasting_module(block: Mapping[str, Any], training: TrainingSettings, model: NormalizedModel,
                             latitude: np.ndarray | list[float], target_names: list[str],
                             metadata: dict[str, Any]) -> ForecastingModule:
    """The Lightning module of a weatherbench config's ``model`` block (``block``) and ``training`` block:
    :class:`EnsembleForecastingModule` for an ensemble ``model.name``, else the deterministic
    :class:`ForecastingModule`; the module's keywords are ``training``'s (:meth:`TrainingSettings.module_kwargs`)."""
    kind = model_kind(block)
    check_loss(block, training)
    kwargs = {"metadata": metadata, **training.module_kwargs()}
    if kind == "deterministic":
        return ForecastingModule(model, latitude, target_names, **kwargs)
    loss, alpha = loss_settings(block, training)
    return EnsembleForecastingModule(model, latitude, target_names, kind=kind, loss=loss, crps_alpha=alpha,
                                     **kwargs)
