"""Deterministic scores as in WeatherBench 2 (pure xarray): RMSE, bias, anomaly correlation (ACC).

``forecast`` and ``truth`` are aligned DataArrays/Datasets (same dims and coordinates, e.g. ``time`` =
initialisation, ``prediction_timedelta``, ``level``, ``latitude``, ``longitude``; the truth already taken at
the valid time). Every function reduces ``dims`` (those present) and keeps the others. Spatial dims
(``latitude``, ``longitude``) are averaged with WB2's cell-area weights
(:func:`~smoeweather.metrics.weights.cell_area_weights`) unless ``latitude_weighted=False`` or explicit
``weights`` are given. Scores are in the units of the field (ACC is dimensionless).
NaNs (missing truth) are skipped with their weight.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np
import xarray as xr

from smoeweather.metrics.weights import cell_area_weights, weighted_mean

X = TypeVar("X", xr.DataArray, xr.Dataset)
SPATIAL_DIMS: tuple[str, ...] = ("latitude", "longitude")
DEFAULT_DIMS: tuple[str, ...] = ("time", "latitude", "longitude")

__all__ = ["rmse", "rmse_per_time", "mse", "bias", "acc", "default_weights"]


def default_weights(x: xr.DataArray | xr.Dataset, weights: xr.DataArray | None,
                    latitude_weighted: bool) -> xr.DataArray | None:
    """``weights`` if given, else the cell-area weights of ``x`` (when it has a latitude dim and
    ``latitude_weighted``), else None (plain means)."""
    if weights is not None:
        return weights
    if latitude_weighted and "latitude" in x.dims:
        return cell_area_weights(x["latitude"])
    return None


def _space_then_rest(x: X, dims: Sequence[Hashable], weights: xr.DataArray | None) -> X:
    """Weighted mean over the spatial dims in ``dims``, then a plain mean over the other ``dims``.

    WeatherBench 2 order: the area mean per initialisation first, then the mean over time. With no NaNs
    this equals one weighted mean over all dims (the weights do not depend on time).
    """
    space = [d for d in dims if d in SPATIAL_DIMS and d in x.dims]
    rest = [d for d in dims if d not in SPATIAL_DIMS and d in x.dims]
    out = weighted_mean(x, space, weights) if space else x
    # the area mean of a field with no valid point is NaN (zero weight), skipped in the time mean
    return out.mean(rest) if rest else out


def mse(forecast: X, truth: X, weights: xr.DataArray | None = None,
        dims: Sequence[Hashable] = DEFAULT_DIMS, latitude_weighted: bool = True) -> X:
    """Mean squared error, (units)², reduced over ``dims``."""
    err2 = (forecast - truth) ** 2
    return _space_then_rest(err2, dims, default_weights(err2, weights, latitude_weighted))


def rmse(forecast: X, truth: X, weights: xr.DataArray | None = None,
         dims: Sequence[Hashable] = DEFAULT_DIMS, latitude_weighted: bool = True) -> X:
    """Root mean squared error, square root AFTER the mean over time (WeatherBench convention):
    √(mean_t Σ_ij w_i (f − o)² / Σ_ij w_i)."""
    return np.sqrt(mse(forecast, truth, weights, dims, latitude_weighted))


def rmse_per_time(forecast: X, truth: X, weights: xr.DataArray | None = None,
                  dims: Sequence[Hashable] = SPATIAL_DIMS, latitude_weighted: bool = True) -> X:
    """RMSE per initialisation (square root of the area mean only; ``time`` is kept unless in ``dims``)."""
    dims = [d for d in dims if d != "time"]
    return np.sqrt(mse(forecast, truth, weights, dims, latitude_weighted))


def bias(forecast: X, truth: X, weights: xr.DataArray | None = None,
         dims: Sequence[Hashable] = DEFAULT_DIMS, latitude_weighted: bool = True) -> X:
    """Mean error f − o (units), reduced over ``dims``."""
    err = forecast - truth
    return _space_then_rest(err, dims, default_weights(err, weights, latitude_weighted))


def acc(forecast: X, truth: X, climatology: X, weights: xr.DataArray | None = None,
        dims: Sequence[Hashable] = DEFAULT_DIMS, latitude_weighted: bool = True) -> X:
    """Anomaly correlation coefficient (WeatherBench 2): per initialisation the uncentred correlation
    Σ w f′o′ / √(Σ w f′² · Σ w o′²) of the anomalies f′ = f − c, o′ = o − c over the spatial dims, then the
    mean over the other ``dims`` (time). ``climatology`` c is taken at each forecast's VALID time and
    aligned with ``truth`` (see :func:`smoeweather.forecast.climatology.climatology_at`)."""
    fa, oa = forecast - climatology, truth - climatology
    w = default_weights(fa, weights, latitude_weighted)
    space = [d for d in dims if d in SPATIAL_DIMS and d in fa.dims]
    rest = [d for d in dims if d not in SPATIAL_DIMS and d in fa.dims]
    if not space:
        raise ValueError(f"acc needs at least one spatial dim of {SPATIAL_DIMS} in dims={tuple(dims)}")
    valid = fa.notnull() & oa.notnull()
    fa, oa = fa.where(valid), oa.where(valid)
    num = weighted_mean(fa * oa, space, w)
    den = np.sqrt(weighted_mean(fa**2, space, w) * weighted_mean(oa**2, space, w))
    out = num / den.where(den > 0)  # a forecast without anomalies (the climatology itself): NaN, as WB2
    return out.mean(rest) if rest else out
