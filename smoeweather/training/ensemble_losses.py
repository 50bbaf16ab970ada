"""Differentiable losses of ensemble forecast networks (torch), latitude-weighted as :func:`lat_weighted_mse`.

Shapes: members ``x`` (B, M, C, H, W), truth ``y`` (B, C, H, W), latitude weights ``w`` (H,) with mean 1
(:func:`smoeweather.training.losses.latitude_weights`). Every loss is the mean over B, C, H, W of a
per-point score times w(φ), in the units of the inputs (normalised units in training).

* :func:`member_mse`: mean over members of each member's MSE (E³ trains every member on its own error).
* :func:`ensemble_crps`: the ensemble CRPS per point,
  (1/M) Σⱼ|xⱼ − y| − c · Σⱼₖ|xⱼ − xₖ| with c = 1/(2M²) (``standard``), 1/(2M(M − 1)) (``fair``), or their
  blend α·fair + (1 − α)·standard, the "almost fair" CRPS of AIFS-CRPS (Lang et al. 2024) that keeps the
  fair CRPS's unbiasedness up to (1 − α) while penalising the degenerate solutions the fair score allows
  (a member may sit anywhere when the others bracket the truth).
* :func:`gaussian_crps_loss`: closed-form CRPS of N(μ, σ²).
"""

from __future__ import annotations

from typing import Literal

import torch

from smoeweather.nn.crps import gaussian_crps

EnsembleLoss = Literal["mse", "crps", "gaussian_crps"]
ENSEMBLE_LOSSES: tuple[str, ...] = ("mse", "crps", "gaussian_crps")


def _check(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> None:
    if x.dim() != 5 or y.dim() != 4 or x.shape[:1] + x.shape[2:] != y.shape:
        raise ValueError(f"members must be (B, M, C, H, W) and truth (B, C, H, W); got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")
    if w.shape != (x.shape[-2],):
        raise ValueError(f"weights must be (H,) = ({x.shape[-2]},), got {tuple(w.shape)}")


def _weighted_mean(score: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean of a (B, C, H, W) score weighted by w (H,)."""
    return (score * w.to(score.dtype).view(1, 1, -1, 1)).mean()


def member_mse(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean over members of the latitude-weighted MSE of each member: scalar, squared units."""
    _check(x, y, w)
    return _weighted_mean((x - y.unsqueeze(1)).square().mean(dim=1), w)


def crps_coefficient(members: int, alpha: float) -> float:
    """c of the spread term Σⱼₖ|xⱼ − xₖ| for the almost-fair CRPS with weight ``alpha`` on the fair score:
    α/(2M(M − 1)) + (1 − α)/(2M²); α = 1 fair, α = 0 standard (needs M ≥ 2 when α > 0)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"crps alpha must be in [0, 1], got {alpha}")
    if members < 2 and alpha > 0:
        raise ValueError(f"the fair CRPS needs at least 2 members, got {members}")
    fair = alpha / (2.0 * members * (members - 1)) if alpha > 0 else 0.0
    return fair + (1.0 - alpha) / (2.0 * members * members)


def ensemble_crps_pointwise(x: torch.Tensor, y: torch.Tensor, alpha: float = 0.95) -> torch.Tensor:
    """Almost-fair ensemble CRPS per point: ``x`` (B, M, C, H, W), ``y`` (B, C, H, W) → (B, C, H, W), units of
    the inputs. ``alpha`` = 1 fair, 0 standard."""
    m = x.shape[1]
    c = crps_coefficient(m, alpha)
    skill = (x - y.unsqueeze(1)).abs().mean(dim=1)
    spread = (x.unsqueeze(1) - x.unsqueeze(2)).abs().sum(dim=(1, 2))  # Σⱼₖ|xⱼ − xₖ|, O(M²) for small M
    return skill - c * spread


def ensemble_crps(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, alpha: float = 0.95) -> torch.Tensor:
    """Latitude-weighted mean of :func:`ensemble_crps_pointwise`: scalar, units of the inputs."""
    _check(x, y, w)
    return _weighted_mean(ensemble_crps_pointwise(x, y, alpha), w)


def gaussian_crps_loss(params: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Latitude-weighted mean CRPS of N(μ, σ²): ``params`` (B, 2, C, H, W) = (μ, σ > 0), ``y`` (B, C, H, W)."""
    _check(params, y, w)
    if params.shape[1] != 2:
        raise ValueError(f"Gaussian parameters must be (B, 2, C, H, W) = (μ, σ), got {tuple(params.shape)}")
    return _weighted_mean(gaussian_crps(params[:, 0], params[:, 1], y), w)


def ensemble_loss(kind: str, out: torch.Tensor, y: torch.Tensor, w: torch.Tensor, alpha: float = 0.95) -> torch.Tensor:
    """Dispatch on ``kind`` ∈ :data:`ENSEMBLE_LOSSES` (``training.loss``)."""
    if kind == "mse":
        return member_mse(out, y, w)
    if kind == "crps":
        return ensemble_crps(out, y, w, alpha)
    if kind == "gaussian_crps":
        return gaussian_crps_loss(out, y, w)
    raise ValueError(f"training.loss must be one of {', '.join(ENSEMBLE_LOSSES)}, got {kind!r}")
