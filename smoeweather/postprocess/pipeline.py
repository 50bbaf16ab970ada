"""``smoe postprocess fit`` / ``apply`` for EMOS end to end, out of core: open the ensemble (a
gridded store or forecast file, a CF site file or a CSV/Parquet site table), fit once or on rolling windows,
globally or per grid point / site, with the mean/spread or the member-weights predictors; apply, with ECC-Q
members and quantiles, streamed to zarr in one pass. Every check runs before anything is computed or written;
a failed run leaves no output behind (atomic writes, the staging folder removed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.readers.forecast_nc import normalise_grid
from smoeweather.data import ensembles
from smoeweather.data.sites import is_site_source, open_sites, station_ids
from smoeweather.io import atomic_path, check_output
from smoeweather.postprocess import chunked, validate
from smoeweather.postprocess.distributions import check_distribution
from smoeweather.postprocess.rolling import check_window_options, rolling_windows


def open_forecast_and_truth(paths: Sequence[Path], truth: Path | None, variables: Sequence[str] | None,
                table: dict[str, Any]) -> tuple[xr.Dataset, xr.Dataset]:
    """(forecast, truth on valid times) of gridded ensemble sources or site files/tables; lazy for stores."""
    if any(is_site_source(p) for p in paths):
        if len(paths) != 1 or truth is not None:
            raise ValueError("site forecasts: pass one site file or table (it holds its observations); "
                             f"got --forecast {[str(p) for p in paths]}{' and --truth' if truth else ''}")
        forecast, obs = open_sites(paths[0], **table)
        if variables:
            lacking = [v for v in variables if v not in forecast.data_vars]
            if lacking:
                raise ValueError(f"{paths[0]}: no variable(s) {lacking}; it has {list(forecast.data_vars)}")
            forecast = forecast[list(variables)]
        return forecast, obs
    return open_gridded(paths, variables), open_gridded_truth(truth, paths)


def open_gridded(paths: Sequence[Path], variables: Sequence[str] | None = None) -> xr.Dataset:
    """:func:`smoeweather.data.ensembles.open_ensemble`, longitudes in [0, 360) and latitudes ascending
    (:func:`pipelines.readers.forecast_nc.normalise_grid`), the convention of every input of a command."""
    return normalise_grid(ensembles.open_ensemble(paths, variables))


def open_gridded_truth(truth: Path | Sequence[Path] | None, paths: Sequence[Path]) -> xr.Dataset:
    """:func:`smoeweather.data.ensembles.open_truth` on the grid convention of :func:`open_gridded`."""
    return normalise_grid(ensembles.open_truth(truth, paths))


def check_non_negative(truth: xr.Dataset, option: str) -> None:
    """ValueError naming ``option`` and the variable when a truth value is negative (a truncated normal at 0 is
    a distribution of non-negative quantities: wind speed, not temperature in °C)."""
    for n in truth.data_vars:
        low = float(truth[n].min(skipna=True))
        if low < 0:
            raise ValueError(f"{option}: {n!r} has negative values (minimum {low:g} "
                             f"{truth[n].attrs.get('units', '')}); the truncated normal is for non-negative targets "
                             "such as wind speed; use --distribution normal for this variable")


def truth_on_valid_times(forecast: xr.Dataset, truth: xr.Dataset) -> xr.Dataset:
    """Truth at init + lead, lazy (dask) when the truth is; sites: NaN where a station has no observation."""
    if "site" in forecast.dims:
        return ensembles.truth_at_valid_times(forecast, truth, gaps="nan")
    return ensembles.truth_at_valid_times(forecast, chunked.as_dask(truth))


def fit(
    forecast_paths: Sequence[Path],
    out: Path,
    *,
    truth_path: Path | None = None,
    variables: Sequence[str] | None = None,
    train_period: Sequence[str] | None = None,
    predictors: str = "mean",
    per_gridpoint: bool = False,
    window: str | None = None,
    lag: str | None = None,
    dates: Sequence[str] | None = None,
    distribution: str = "normal",
    iterations: int | None = None,
    table: dict[str, Any] | None = None,
    scheduler: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> str:
    """Fit EMOS (``smoe postprocess fit --method emos``) and write the model file ``out``; returns a summary line.

    ``forecast_paths``: gridded ensemble stores/files or one site file/table (``table``: its column options,
    :func:`smoeweather.data.sites.open_sites`); ``truth_path``: truth on valid times (default: the forecast's
    own); ``train_period``: inclusive init range; ``predictors``: ``mean`` or ``members``; ``per_gridpoint``:
    one fit per grid point or site; ``window``/``lag``/``dates``: rolling training windows (``25D``, ``2D``);
    ``distribution``: ``normal`` or ``truncnormal``; ``scheduler``: where dask runs
    (:func:`pipelines.compute.dask_client`)."""
    from smoeweather.postprocess.model_file import write_model

    check_output(out, overwrite)  # exists, under a file, read-only folder: before anything is computed
    check_window_options(window, lag, dates)
    distribution = check_distribution(distribution)
    forecast, truth = open_forecast_and_truth(forecast_paths, truth_path, variables, table or {})
    forecast = ensembles.select_period(forecast, train_period)
    truth_at = truth_on_valid_times(forecast, truth)
    if distribution == "truncnormal":
        check_non_negative(truth_at, "--distribution truncnormal")
    rolling = rolling_windows(forecast["time"].values, forecast["prediction_timedelta"].values, window, lag, dates)
    rolling_window, window_attrs = rolling if rolling is not None else (None, {})
    members = [str(m) for m in forecast["member"].values] if predictors == "members" else None
    names = list(forecast.data_vars)
    sources = " ".join(map(str, forecast_paths))
    with chunked.scheduler(scheduler) as client, chunked.staging_dir(out) as tmp:
        fc_dask, truth_dask = chunked.as_dask(forecast), chunked.as_dask(truth_at)
        arrays = chunked.training_arrays(fc_dask, truth_dask, predictors)
        factor = (rolling_window[1].shape[0] * rolling_window[1].shape[1] // max(forecast.sizes["time"], 1)
                  if rolling_window else 1)
        staged, counts = chunked.stage_with(arrays, tmp / "training.zarr", client, progress, max(1, factor),
                                            extra=validate.data_counts(fc_dask, truth_dask, sources))
        report = validate.check_fit_data(counts, forecast, sources)  # refuses before anything is fitted
        params = chunked.fit_staged(staged, names, bool(per_gridpoint), client, progress,
                                    window=rolling_window, members=members, iterations=iterations or 50,
                                    distribution=distribution)
    validate.check_fitted_groups(params.attrs, sources)
    for n in names:
        params[n].attrs["units"] = forecast[n].attrs.get("units", "")
    attrs = {"forecast": sources, "truth": str(truth_path or sources), "predictors": predictors,
             "train_period": " ".join(map(str, train_period)) if train_period else "all",
             "distribution": distribution, **validate.fit_attrs(report)}
    attrs.update(window_attrs)
    written = write_model(params, forecast, out, attrs, overwrite=overwrite)
    kind = "per site" if "site" in forecast.dims and per_gridpoint else (
        "per grid point" if per_gridpoint else "global")
    rolling = f", {len(rolling_window[0])} forecast dates" if rolling_window is not None else ""
    empty = int(params.attrs.get("groups_without_data", 0))
    return (f"{written}: {params.attrs['groups']} EMOS fit(s) ({kind}, {predictors}{rolling}) on "
            f"{attrs['fit_cases']} cases, {params.attrs['groups_not_converged']} not converged"
            + (f", {empty} without enough cases (NaN)" if empty else ""))


def _align_sites(params: xr.Dataset, mattrs: dict[str, Any], forecast: xr.Dataset) -> xr.Dataset:
    """Per-site coefficients in the forecast's site order (matched by station id)."""
    if "site" not in params.dims:
        return params
    pos = {str(s): i for i, s in enumerate(mattrs["station_id"])}
    idx = [pos[str(s)] for s in forecast["station_id"].values]
    return params.isel(site=idx).assign_coords(site=forecast["site"].values)


def _store(ds: xr.Dataset, kind: str, attrs: dict[str, Any]) -> xr.Dataset:
    """``ds`` ready for a forecast store (:func:`smoeweather.data.ensembles.store_dataset`, the one store format),
    station ids as strings."""
    ds = ensembles.store_dataset(ds, kind, attrs)
    if "station_id" in ds.coords:  # computed, never a lazy cast (dask's astype(str) of objects gives <U1)
        ds = ds.assign_coords(station_id=(ds["station_id"].dims, station_ids(ds["station_id"].values),
                                          ds["station_id"].attrs))
        ds["station_id"].encoding = {}
    return ds


def write_stores(products: Sequence[tuple[xr.Dataset, Path, str, dict[str, Any]]], client: Any, progress: bool,
                 overwrite: bool) -> list[Path]:
    """Write every (Dataset, path, forecast_kind, attrs) as a zarr store in ONE dask computation (each input
    chunk read once), chunk by chunk; atomically: on any error no output is left."""
    with contextlib.ExitStack() as stack:
        jobs = []
        for ds, path, kind, attrs in products:
            tmp = stack.enter_context(atomic_path(path, overwrite=overwrite))
            jobs.append(_store(chunked.zarr_chunks(chunked.as_dask(ds)), kind, attrs).to_zarr(
                tmp, mode="w", compute=False, consolidated=True, zarr_format=2))
        chunked.compute(jobs, client, progress, f"writing {', '.join(p.name for _, p, _, _ in products)}")
    return [p for _, p, _, _ in products]


def apply(
    model: Path,
    forecast_paths: Sequence[Path],
    out: Path,
    *,
    apply_period: Sequence[str] | None = None,
    members_out: Path | None = None,
    members: int | None = None,
    quantiles_out: Path | None = None,
    levels: np.ndarray | None = None,
    table: dict[str, Any] | None = None,
    scheduler: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    forms: Any = None,
) -> list[Path]:
    """Calibrate a forecast with an EMOS model file (``smoe postprocess apply --emos``): the (μ, σ) store ``out``,
    with ``members`` ECC-Q members to ``members_out`` and the quantiles ``levels`` to ``quantiles_out``; streamed
    out of core; ``forms`` (:class:`.forms.OutputForms`): probabilities and percentiles too. The caller has
    checked the output paths."""
    from smoeweather.postprocess.emos import apply_emos
    from smoeweather.postprocess.model_file import check_forecast, read_model

    params, mattrs = read_model(model)
    sources = " ".join(map(str, forecast_paths))
    forecast, _ = open_forecast_and_truth(forecast_paths, None, None, table or {}) if any(
        is_site_source(p) for p in forecast_paths) else (open_gridded(forecast_paths), None)
    forecast = ensembles.select_period(forecast, apply_period)
    check_member_count(members, forecast, sources)
    forecast = check_forecast(mattrs, forecast, str(model), sources)
    forecast = chunked.as_dask(forecast)
    params = _align_sites(params, mattrs, forecast)
    mu, sigma = apply_emos(params, forecast)  # lazy; refuses dates without coefficients, mismatched members
    local = int(mattrs["per_gridpoint"])
    where = "site" if "site" in forecast.dims else "gridpoint"
    attrs = {"method": "emos" + (f"_{where}" if local else "_global"), "model": str(model),
             "model_train_period": mattrs.get("train_period"), "members": int(forecast.sizes["member"]),
             "predictors": mattrs.get("predictors", "mean"), "window": mattrs.get("window"),
             "forecast": sources}
    products = distribution_products(mu, sigma, forecast, attrs, str(mattrs.get("distribution", "normal")),
                                     out, members_out, members, quantiles_out, levels, forms)
    with chunked.scheduler(scheduler) as client:
        return write_stores(products, client, progress, overwrite)


def apply_network(checkpoint: Path, forecast_paths: Sequence[Path], out: Path, *,
                  apply_period: Sequence[str] | None = None, members_out: Path | None = None,
                  members: int | None = None, quantiles_out: Path | None = None, levels: np.ndarray | None = None,
                  batch_size: int = 8, overwrite: bool = False, forms: Any = None) -> list[Path]:
    """Calibrate a gridded forecast with a post-processing network checkpoint (``smoe postprocess apply
    --network``): the same stores as :func:`apply`, in memory. The caller has checked the output paths."""
    from smoeweather.postprocess.neural import apply_checkpoint

    forecast = ensembles.select_period(open_gridded(forecast_paths), apply_period)
    sources = " ".join(map(str, forecast_paths))
    check_member_count(members, forecast, sources)
    mu, sigma, attrs = apply_checkpoint(checkpoint, forecast, batch_size=batch_size)
    mu, sigma = mu.load(), sigma.load()
    products = distribution_products(mu, sigma, forecast.load(), {**attrs, "forecast": sources}, "normal",
                                     out, members_out, members, quantiles_out, levels, forms)
    return [ensembles.write_store(ds, path, kind, a, overwrite=overwrite) for ds, path, kind, a in products]


def check_member_count(members: int | None, forecast: xr.Dataset, sources: str) -> None:
    """ValueError unless ``members`` (ECC-Q members asked for) is None or the raw ensemble's member count."""
    if members is not None and members != forecast.sizes["member"]:
        raise ValueError(f"--members {members}: ECC-Q reorders the raw members, so N must equal the raw "
                         f"ensemble's member count ({forecast.sizes['member']} in {sources})")


def distribution_products(mu: xr.Dataset, sigma: xr.Dataset, forecast: xr.Dataset, attrs: dict[str, Any],
                          distribution: str, out: Path, members_out: Path | None, members: int | None,
                          quantiles_out: Path | None, levels: np.ndarray | None, forms: Any = None
                          ) -> list[tuple[xr.Dataset, Path, str, dict[str, Any]]]:
    """The stores of a (μ, σ) forecast of ``distribution``: the (μ, σ) store, ECC-Q members and quantiles, and
    the probabilities and percentiles of ``forms`` (:class:`.forms.OutputForms`), each with CF metadata
    (:func:`.forms.cf_decorate`).

    For the truncated normal the (μ, σ) store holds the location and scale of the normal before truncation
    (attribute ``predictive_distribution`` says so; a Gaussian scorer would misread it); its members and
    quantiles are the truncated distribution's, and ``smoe evaluate`` scores those correctly."""
    from smoeweather.postprocess.distributions import LONG_NAMES
    from smoeweather.postprocess.ecc import ecc_members, gaussian_quantiles
    from smoeweather.postprocess.forms import cf_decorate, form_products

    attrs = {**attrs, "distribution": distribution, "predictive_distribution": LONG_NAMES[distribution]}
    products = [(ensembles.gaussian_dataset(mu, sigma), out, "gaussian", attrs)]
    if members_out is not None:
        raw = forecast[list(mu.data_vars)]
        if "level" in mu.dims:  # a network may calibrate fewer levels than the raw ensemble holds
            raw = raw.sel(level=mu["level"].values)
        ens = ecc_members(mu, sigma, raw, members, distribution=distribution)
        products.append((ens, members_out, "ensemble", {**attrs, "method": f"{attrs['method']}_ecc",
                                                        "ecc": "ECC-Q, levels (i-0.5)/N, stable ranks"}))
    if quantiles_out is not None:
        products.append((gaussian_quantiles(mu, sigma, levels, distribution=distribution), quantiles_out,
                         "quantiles", {**attrs, "method": f"{attrs['method']}_quantiles"}))
    if forms is not None:
        products.extend(form_products(mu, sigma, distribution, attrs, forms))
    return [(cf_decorate(ds, distribution), path, kind, a) for ds, path, kind, a in products]
