"""Area weights and weighted means on the latitude–longitude grid (pure xarray, no torch).

Two weights, each with one home here, and the area mean every per-initialisation score term takes
(:func:`area_mean`):

- :func:`cell_area_weights` (WeatherBench 2's ``get_lat_weights``): the area weight every score uses
  (``smoe evaluate``, the studies, cross-validation, regions). Mean 1 over the latitude rows.
- :func:`latitude_weights` / :func:`latitude_weight_values`: cos φ / mean_φ(cos φ), the WeatherBench (1)
  weighting of the training losses and of the EMOS fits. Equal to the cell areas on grids without pole rows,
  up to rounding.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr


def latitude_weight_values(latitude: np.ndarray | Sequence[float]) -> np.ndarray:
    """cos(latitude) normalised to mean 1 over the given rows: (H,) degrees north → (H,) float64.

    The one implementation of the latitude weights: the EMOS fits (:func:`latitude_weights`) and the training
    losses (:func:`smoeweather.training.losses.latitude_weights`) use it; the scores use
    :func:`cell_area_weights`. Raises ValueError outside [-90, 90].
    """
    lat = np.asarray(latitude, dtype=np.float64)
    if lat.size == 0 or np.any(np.abs(lat) > 90.0) or not np.all(np.isfinite(lat)):
        raise ValueError(f"latitude must be finite degrees north in [-90, 90]; got {lat.min()}..{lat.max()}")
    w = np.cos(np.deg2rad(lat))
    return w / w.mean()


def latitude_weights(latitude: xr.DataArray) -> xr.DataArray:
    """cos(latitude) normalised to mean 1 over the given rows; dims ``(latitude,)``, dimensionless.

    ``latitude`` in degrees north (any order). Raises ValueError outside [-90, 90].
    """
    w = latitude_weight_values(np.asarray(latitude))
    return xr.DataArray(w, dims=latitude.dims, coords=latitude.coords, name="latitude_weight",
                        attrs={"long_name": "latitude weight cos(lat)/mean(cos(lat))", "units": "1"})


def cell_area_weights(latitude: xr.DataArray | np.ndarray | Sequence[float]) -> xr.DataArray:
    """WB2's area weights (latitude,), mean 1: sin φ₊ − sin φ₋ over cells bounded by the mid-latitudes and the
    poles. Equal to cos φ / mean cos φ on grids without pole rows (e.g. 5.625°); on grids with pole rows
    (WB2's 1.5° and 0.25°) the pole cells get their small, non-zero area. ``latitude`` in degrees, ascending
    or descending."""
    if not isinstance(latitude, xr.DataArray):
        values = np.asarray(latitude, np.float64)
        latitude = xr.DataArray(values, dims="latitude", coords={"latitude": values})
    lat = np.asarray(latitude.values, np.float64)
    if lat.size == 0 or not np.all(np.isfinite(lat)) or np.any(np.abs(lat) > 90.0):
        raise ValueError(f"latitude must be finite degrees north in [-90, 90]; got {lat.min()}..{lat.max()}")
    order = np.argsort(lat)
    phi = np.deg2rad(lat[order])
    bounds = np.concatenate([[-np.pi / 2], (phi[:-1] + phi[1:]) / 2, [np.pi / 2]])
    if not np.all(np.diff(bounds) > 0):
        raise ValueError("latitudes must be distinct to give cell areas")
    area = np.empty_like(phi)
    area[order] = np.sin(bounds[1:]) - np.sin(bounds[:-1])
    return xr.DataArray(area / area.mean(), dims=latitude.dims, coords=latitude.coords, name="area_weight",
                        attrs={"long_name": "cell-area weight between mid-latitudes (WeatherBench 2)", "units": "1"})


def weighted_mean(
    x: xr.DataArray | xr.Dataset, dims: Sequence[Hashable], weights: xr.DataArray | None = None
) -> xr.DataArray | xr.Dataset:
    """Mean of ``x`` over ``dims`` (those present), weighted by ``weights`` (e.g. latitude weights) if given.

    Uses ``xarray``'s weighted reductions; NaNs in ``x`` are skipped with their weight.
    """
    present = [d for d in dims if d in x.dims]
    if weights is None:
        return x.mean(present)
    return x.weighted(weights.fillna(0.0)).mean(present)


def area_mean(x: xr.DataArray, weights: xr.DataArray, space: Sequence[Hashable]) -> xr.DataArray:
    """Weighted mean of ``x`` over ``space``, NaNs skipped with their weight; ``weights`` may carry extra dims
    (``region``), kept in the result. NaN where no point with weight > 0 has a value; infinite values propagate.
    The area mean of every per-initialisation term (:func:`smoeweather.metrics.scores.field_terms`), of our
    tables and of WeatherBench 2's files alike."""
    valid = x.notnull().astype(np.float64)
    num = xr.dot(x.fillna(0.0), weights, dim=list(space))
    den = xr.dot(valid, weights, dim=list(space))
    return num / den.where(den > 0)
