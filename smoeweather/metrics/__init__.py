"""Scores of forecasts (pure xarray): ``weights`` (latitude weights), ``deterministic`` (RMSE, bias, ACC),
``probabilistic`` (CRPS, spread–skill, EFI), ``evaluate`` (``smoe evaluate``: scores.{nc,json,md}) and
``relative_error`` (the heat benchmark's score)."""

from smoeweather.metrics.deterministic import acc, bias, rmse, rmse_per_time
from smoeweather.metrics.weights import latitude_weights, weighted_mean

__all__ = ["acc", "bias", "rmse", "rmse_per_time", "latitude_weights", "weighted_mean"]
