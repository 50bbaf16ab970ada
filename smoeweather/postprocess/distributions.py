"""Predictive distributions of post-processed forecasts: the Gaussian N(μ, σ²) and the normal truncated at
zero N₀(μ, σ²) for non-negative targets (wind speed; as IMPROVER's and ensembleMOS's truncated normal).

Both are parametrised by a location μ and a scale σ > 0. For the truncated normal these are the parameters
of the normal before truncation (not its mean and standard deviation: :func:`moments`).

CRPS in closed form:

- normal (Gneiting et al. 2005): σ [z(2Φ(z) − 1) + 2φ(z) − 1/√π], z = (y − μ)/σ;
- truncated at 0 (Thorarinsdottir & Gneiting 2010, eq. 5), with p = Φ(μ/σ):
  σ p⁻² [z p (2Φ(z) + p − 2) + 2φ(z) p − Φ(√2 μ/σ)/√π], for y ≥ 0; for y < 0 (impossible under N₀)
  the CRPS is the one of y = 0 plus |y| (the predictive CDF is 0 below 0).

Quantiles of N₀: μ + σ Φ⁻¹(Φ(−μ/σ) + q (1 − Φ(−μ/σ))).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from scipy.special import log_ndtr, ndtr, ndtri, ndtri_exp

from smoeweather.metrics.probabilistic import crps_gaussian
from smoeweather.nn.crps import gaussian_crps, normal_cdf
from smoeweather.postprocess.options import DISTRIBUTIONS

LONG_NAMES = {"normal": "N(mu, sigma**2)", "truncnormal": "N(mu, sigma**2) truncated to [0, inf)"}
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
_P_FLOOR = 1e-12  # Φ(μ/σ) floor: a location far below 0 leaves a point mass at 0; keep the CRPS finite


def check_distribution(name: str, option: str = "--distribution") -> str:
    """``name`` if it is one of :data:`DISTRIBUTIONS`; ValueError naming ``option`` otherwise."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"{option} {name!r}: must be one of {list(DISTRIBUTIONS)} (truncnormal: a normal "
                         "truncated at 0, for non-negative targets such as wind speed)")
    return name


def crps_truncnormal(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Closed-form CRPS of N(μ, σ²) truncated to [0, ∞) at y (numpy, broadcast; module doc)."""
    mu, sigma, y = np.broadcast_arrays(np.asarray(mu, np.float64), np.asarray(sigma, np.float64),
                                       np.asarray(y, np.float64))
    below = np.minimum(y, 0.0)
    y0 = np.maximum(y, 0.0)
    z = (y0 - mu) / sigma
    p = np.maximum(ndtr(mu / sigma), _P_FLOOR)
    crps = sigma / p**2 * (z * p * (2.0 * ndtr(z) + p - 2.0) + 2.0 * np.exp(-0.5 * z * z) / _SQRT_2PI * p
                           - ndtr(math.sqrt(2.0) * mu / sigma) * _INV_SQRT_PI)
    return crps - below


def crps(distribution: str, mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Closed-form CRPS of ``distribution`` (:data:`DISTRIBUTIONS`) at y."""
    return crps_truncnormal(mu, sigma, y) if distribution == "truncnormal" else crps_gaussian(mu, sigma, y)


def crps_torch(distribution: str, mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS (element-wise, differentiable) of ``distribution`` at y (torch)."""
    if distribution == "truncnormal":
        below = torch.clamp(y, max=0.0)
        z = (torch.clamp(y, min=0.0) - mu) / sigma
        p = normal_cdf(mu / sigma).clamp_min(_P_FLOOR)
        pdf = torch.exp(-0.5 * z * z) / _SQRT_2PI
        out = sigma / p**2 * (z * p * (2.0 * normal_cdf(z) + p - 2.0) + 2.0 * pdf * p
                              - normal_cdf(math.sqrt(2.0) * mu / sigma) * _INV_SQRT_PI)
        return out - below
    return gaussian_crps(mu, sigma, y)


def quantile_levels_z(distribution: str, mu: np.ndarray, sigma: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Standard-normal quantiles z such that μ + σ z is the q-quantile of ``distribution`` (broadcast; for the
    normal z = Φ⁻¹(q), for the truncated normal z = Φ⁻¹(Φ(−μ/σ) + q (1 − Φ(−μ/σ))))."""
    if distribution != "truncnormal":
        return np.broadcast_to(ndtri(q), np.broadcast_shapes(np.shape(mu), np.shape(q)))
    lo = ndtr(-np.asarray(mu, np.float64) / np.asarray(sigma, np.float64))
    return ndtri(lo + np.asarray(q) * (1.0 - lo))


def quantiles(distribution: str, mu: np.ndarray, sigma: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q-quantiles of ``distribution`` (broadcast); never below 0 for the truncated normal."""
    x = np.asarray(mu, np.float64) + np.asarray(sigma, np.float64) * quantile_levels_z(distribution, mu, sigma, q)
    return np.maximum(x, 0.0) if distribution == "truncnormal" else x


def moments(distribution: str, mu: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) of ``distribution`` with location μ and scale σ."""
    mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
    if distribution != "truncnormal":
        return mu, sigma
    a = -mu / sigma
    z = np.maximum(1.0 - ndtr(a), _P_FLOOR)
    lam = np.exp(-0.5 * a * a) / _SQRT_2PI / z
    mean = mu + sigma * lam
    var = sigma**2 * (1.0 + a * lam - lam**2)
    return mean, np.sqrt(np.maximum(var, 0.0))


class Distribution(Protocol):
    """A predictive distribution family evaluated element-wise (numpy, broadcast): what every output form
    (probabilities, percentiles, members) is computed from. A new family plugs in by implementing these."""

    name: str

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """P(Y ≤ x)."""
        ...

    def ppf(self, q: np.ndarray) -> np.ndarray:
        """q-quantile, q in (0, 1)."""
        ...

    def mean(self) -> np.ndarray:
        """Mean of the distribution."""
        ...

    def std(self) -> np.ndarray:
        """Standard deviation of the distribution."""
        ...


@dataclass(frozen=True)
class Normal:
    """N(μ, σ²); ``mu``, ``sigma`` arrays of one shape (or broadcastable)."""

    mu: np.ndarray
    sigma: np.ndarray
    name: str = "normal"

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return ndtr((np.asarray(x, np.float64) - self.mu) / self.sigma)

    def ppf(self, q: np.ndarray) -> np.ndarray:
        return quantiles("normal", self.mu, self.sigma, q)

    def mean(self) -> np.ndarray:
        return moments("normal", self.mu, self.sigma)[0]

    def std(self) -> np.ndarray:
        return moments("normal", self.mu, self.sigma)[1]


@dataclass(frozen=True)
class TruncatedNormal:
    """N(μ, σ²) truncated to [0, ∞); μ, σ the location and scale before truncation. With the survival
    functions S(x) = Φ((μ − x)/σ), CDF for x ≥ 0: 1 − S(x)/S(0) (0 below 0), quantile μ − σ Φ⁻¹((1 − q) S(0)),
    both through log Φ so they keep their precision when μ lies far below 0."""

    mu: np.ndarray
    sigma: np.ndarray
    name: str = "truncnormal"

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        p = -np.expm1(log_ndtr((self.mu - x) / self.sigma) - log_ndtr(self.mu / self.sigma))
        return np.where(x < 0.0, 0.0, np.clip(p, 0.0, 1.0))

    def ppf(self, q: np.ndarray) -> np.ndarray:
        log_s = np.log1p(-np.asarray(q, np.float64)) + log_ndtr(self.mu / self.sigma)
        return np.maximum(self.mu - self.sigma * ndtri_exp(log_s), 0.0)

    def mean(self) -> np.ndarray:
        return self._scipy().mean()

    def std(self) -> np.ndarray:
        return self._scipy().std()

    def _scipy(self) -> Any:
        from scipy.stats import truncnorm  # its moments keep their precision far in the tail

        return truncnorm(-self.mu / self.sigma, np.inf, loc=self.mu, scale=self.sigma)


FAMILIES: dict[str, type] = {"normal": Normal, "truncnormal": TruncatedNormal}
"""Distribution family of each name of :data:`DISTRIBUTIONS`."""


def family(name: str, mu: np.ndarray, sigma: np.ndarray) -> Distribution:
    """The :class:`Distribution` ``name`` with location ``mu`` and scale ``sigma`` (float64 arrays)."""
    return FAMILIES[check_distribution(name)](np.asarray(mu, np.float64), np.asarray(sigma, np.float64))


__all__ = ["DISTRIBUTIONS", "FAMILIES", "Distribution", "Normal", "TruncatedNormal", "check_distribution", "crps",
           "crps_torch", "crps_truncnormal", "family", "moments", "quantile_levels_z", "quantiles"]
