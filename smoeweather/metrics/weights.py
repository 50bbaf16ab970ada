"""Area weights and weighted means on the latitude–longitude grid (pure xarray, no torch).

WeatherBench convention: w(φ) = cos φ / mean_φ(cos φ), so the weights have mean 1 over the latitude rows
and a weighted mean over (latitude, longitude) is the area mean of a regular grid.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import xarray as xr


def latitude_weight_values(latitude: np.ndarray | Sequence[float]) -> np.ndarray:
    """cos(latitude) normalised to mean 1 over the given rows: (H,) degrees north → (H,) float64.

    The one implementation of the latitude weights: scores (:func:`latitude_weights`) and training losses
    (:func:`smoeweather.training.losses.latitude_weights`) use it. Raises ValueError outside [-90, 90].
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
