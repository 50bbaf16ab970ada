"""Scores of forecasts (pure xarray): ``weights`` (latitude weights), ``deterministic`` (RMSE, bias, ACC),
``probabilistic`` (CRPS, spread–skill, EFI), ``scores`` (the score set of one forecast field per forecast
kind) and ``relative_error`` (the heat benchmark's score). Nothing here opens files or imports the rest of the
package: ``smoe evaluate`` is orchestrated above, in :mod:`smoeweather.evaluate`."""

from smoeweather.metrics.deterministic import acc, bias, rmse, rmse_per_time
from smoeweather.metrics.weights import latitude_weights, weighted_mean

__all__ = ["acc", "bias", "rmse", "rmse_per_time", "latitude_weights", "weighted_mean"]
