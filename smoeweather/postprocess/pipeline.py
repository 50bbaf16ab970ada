"""What every calibrator (:mod:`.calibrator`) shares on files, for ``smoe postprocess fit`` / ``apply`` on
gridded stores and site tables: open the ensemble (a gridded store or forecast file, a CF site file or a
CSV/Parquet site table) and check it, align the truth on valid times, select periods and rolling windows
(:func:`open_training`, :func:`open_to_apply`), convert to and from the units a model was fitted in, and write
every output form of a predictive distribution atomically, in one dask computation (:func:`write_products`).

Every check runs before anything is computed or written; a failed run leaves no output behind (atomic writes,
the staging folder removed).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from pipelines.plausibility import check_plausible
from pipelines.readers.forecast_nc import normalise_grid
from smoeweather.data import forecast_stores
from smoeweather.data.sites import is_site_source, open_sites, station_ids
from smoeweather.io import atomic_path, check_output
from smoeweather.postprocess import chunked, validate
from smoeweather.postprocess.distributions import check_distribution
from smoeweather.postprocess.forms import Outputs, Predictive, to_cf_netcdf
from smoeweather.postprocess.rolling import check_window_options, rolling_windows
from smoeweather.units import align_truth, conversion, convert, units_of


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
    """:func:`smoeweather.data.forecast_stores.open_ensemble`, longitudes in [0, 360) and latitudes ascending
    (:func:`pipelines.readers.forecast_nc.normalise_grid`), the convention of every input of a command."""
    return normalise_grid(forecast_stores.open_ensemble(paths, variables))


def open_gridded_truth(truth: Path | Sequence[Path] | None, paths: Sequence[Path]) -> xr.Dataset:
    """:func:`smoeweather.data.forecast_stores.open_truth` on the grid convention of :func:`open_gridded`."""
    return normalise_grid(forecast_stores.open_truth(truth, paths))


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
        return forecast_stores.truth_at_valid_times(forecast, truth, gaps="nan")
    return forecast_stores.truth_at_valid_times(forecast, chunked.as_dask(truth))


@dataclass
class Training:
    """The training data of a fit: the ensemble (period selected), the truth at init + lead of its ``targets``,
    the rolling windows (``window``: (dates, idx, valid) of :func:`.rolling.window_index`, or None) with their
    model-file attributes, the sources as one string, and where the truth and which period (as a model file
    records them)."""

    forecast: xr.Dataset
    truth_at: xr.Dataset
    targets: list[str]
    window: Any
    window_attrs: dict[str, Any]
    sources: str
    truth: str = ""
    train_period: str = "all"

    @classmethod
    def of(cls, forecast: xr.Dataset, truth_at: xr.Dataset, *, window: str | None = None, lag: str | None = None,
           dates: Sequence[str] | None = None) -> Training:
        """Training data in memory: the ensemble ``forecast`` and its truth at the valid times (same dims without
        ``member``); the targets are the forecast variables the truth has (the others are predictors only).
        ``window``/``lag``/``dates``: rolling windows as ``smoe postprocess fit`` takes them (:mod:`.rolling`)."""
        targets = [str(n) for n in forecast.data_vars if n in truth_at.data_vars]
        rolling = rolling_windows(forecast["time"].values, forecast["prediction_timedelta"].values, window, lag, dates)
        win, attrs = rolling if rolling is not None else (None, {})
        sources = str(forecast.attrs.get("source_files", "the forecast"))
        return cls(forecast, truth_at[targets], targets, win, dict(attrs), sources, "the truth")

    def fit_attrs(self, report: dict[str, Any]) -> dict[str, Any]:
        """The model-file attributes every fit records: sources, period, the data report
        (:func:`.validate.check_fit_data`), the windows."""
        return {**self.window_attrs, "forecast": self.sources, "truth": self.truth, "train_period": self.train_period,
                **validate.fit_attrs(report)}


@dataclass(frozen=True)
class Run:
    """How a fit or an apply runs: where dask runs (``scheduler``, :func:`.chunked.scheduler`; ``threads``: no
    cluster), progress on the terminal, and ``staging``: the output beside which the out-of-core staging
    folder is made (None: a temporary folder)."""

    scheduler: str | None = "threads"
    progress: bool = False
    staging: Path | None = None


LOCAL = Run()
"""In memory: dask's threads (no cluster), no progress, a temporary staging folder (the Python API's default)."""


def open_training(forecast_paths: Sequence[Path], out: Path, *, truth_path: Path | None = None,
                  variables: Sequence[str] | None = None, extra_variables: Sequence[str] = (),
                  train_period: Sequence[str] | None = None, window: str | None = None, lag: str | None = None,
                  dates: Sequence[str] | None = None, distribution: str, table: dict[str, Any] | None = None,
                  overwrite: bool = False, static_maps: bool = False, plausibility_check: bool = True) -> Training:
    """Every check of a fit's options and inputs, in order, before anything is computed: the output ``out``,
    the rolling-window options, the ``distribution`` (the calibrator's ``training_options``); then the ensemble
    (``variables`` and ``extra_variables``) and its truth on valid times, the period, non-negative truth for the
    truncated normal, the windows.
    ``static_maps``: gridded sources' land-sea mask and orography as coordinates (:func:`.drn.with_static`);
    ``plausibility_check``: refuse implausible ensemble or truth values
    (:func:`pipelines.plausibility.check_plausible`)."""
    # exists, under a file, read-only folder, is/contains/lies inside an input: before anything is computed
    check_output(out, overwrite, inputs=[forecast_paths, truth_path])
    check_window_options(window, lag, dates)
    distribution = check_distribution(distribution)
    wanted = list(dict.fromkeys([*variables, *extra_variables])) if variables else None
    forecast, truth = open_forecast_and_truth(forecast_paths, truth_path, wanted, table or {})
    check_plausible({f"--forecast {' '.join(map(str, forecast_paths))}": forecast, f"truth {truth_path or ''}": truth},
                    plausibility_check)
    targets = list(variables) if variables else list(forecast.data_vars)
    forecast = forecast_stores.select_period(forecast, train_period)
    if static_maps:
        from smoeweather.postprocess.drn import with_static

        forecast = with_static(forecast, list(forecast_paths))
    truth_at = truth_on_valid_times(forecast if targets == list(forecast.data_vars) else forecast[targets], truth)
    where_truth = f"--truth {truth_path}" if truth_path else f"the truth in {' '.join(map(str, forecast_paths))}"
    # the model is fitted in the forecast's units: the truth converted to them (noted), a mismatch refused
    truth_at = align_truth(truth_at, forecast, where_truth, f"--forecast {' '.join(map(str, forecast_paths))}")
    if distribution == "truncnormal":
        check_non_negative(truth_at, "--distribution truncnormal")
    rolling = rolling_windows(forecast["time"].values, forecast["prediction_timedelta"].values, window, lag, dates)
    win, attrs = rolling if rolling is not None else (None, {})
    sources = " ".join(map(str, forecast_paths))
    return Training(forecast, truth_at, targets, win, dict(attrs), sources, str(truth_path or sources),
                    " ".join(map(str, train_period)) if train_period else "all")


def _store(ds: xr.Dataset, kind: str, attrs: dict[str, Any]) -> xr.Dataset:
    """``ds`` ready for a forecast store (:func:`smoeweather.data.forecast_stores.store_dataset`, the one store format),
    station ids as strings."""
    ds = forecast_stores.store_dataset(ds, kind, attrs)
    if "station_id" in ds.coords:  # computed, never a lazy cast (dask's astype(str) of objects gives <U1)
        ds = ds.assign_coords(station_id=(ds["station_id"].dims, station_ids(ds["station_id"].values),
                                          ds["station_id"].attrs))
        ds["station_id"].encoding = {}
    return ds


def write_stores(products: Sequence[tuple[xr.Dataset, Path, str, dict[str, Any]]], client: Any, progress: bool,
                 overwrite: bool) -> list[Path]:
    """Write every (Dataset, path, forecast_kind, attrs) in ONE dask computation (each input chunk read once),
    chunk by chunk: a ``.zarr`` path as a zarr store, a ``.nc`` path as CF netCDF (staged as zarr beside it,
    then streamed into the file, :func:`.forms.to_cf_netcdf`); atomically: on any error no output is left."""
    with contextlib.ExitStack() as stack:
        jobs, netcdf = [], []
        for ds, path, kind, attrs in products:
            tmp = stack.enter_context(atomic_path(path, overwrite=overwrite))
            target = tmp
            if Path(path).suffix == ".nc":
                target = stack.enter_context(chunked.staging_dir(Path(path))) / "store.zarr"
                netcdf.append((target, tmp))
            jobs.append(_store(chunked.zarr_chunks(chunked.as_dask(ds)), kind, attrs).to_zarr(
                target, mode="w", compute=False, consolidated=True, zarr_format=2))
        chunked.compute(jobs, client, progress, f"writing {', '.join(p.name for _, p, _, _ in products)}")
        for staged, tmp in netcdf:
            to_cf_netcdf(staged, tmp)
    return [p for _, p, _, _ in products]


def open_forecast(forecast_paths: Sequence[Path], table: dict[str, Any] | None = None) -> xr.Dataset:
    """The ensemble to calibrate: one site file or table (``table``: its column options), or gridded sources."""
    paths = [Path(p) for p in forecast_paths]
    if any(is_site_source(p) for p in paths):
        return open_forecast_and_truth(paths, None, None, table or {})[0]
    return open_gridded(paths)


def open_to_apply(mattrs: dict[str, Any], model: Path, forecast_paths: Sequence[Path], *,
                  apply_period: Sequence[str] | None = None, members: int | None = None,
                  table: dict[str, Any] | None = None, static_maps: bool = False,
                  extra_variables: Sequence[str] = ()) -> tuple[xr.Dataset, str]:
    """(the forecast reduced to the model's fields and levels, the sources as one string), after every check:
    the period, the ECC member count, the model against the forecast (:func:`.model_file.check_forecast`: field,
    level, lead, members, grid or sites). ``extra_variables`` the model reads besides its fields are kept;
    ``static_maps`` as :func:`open_training`."""
    from smoeweather.postprocess.model_file import check_forecast

    sources = " ".join(map(str, forecast_paths))
    forecast = forecast_stores.select_period(open_forecast(forecast_paths, table), apply_period)
    if static_maps:
        from smoeweather.postprocess.drn import with_static

        forecast = with_static(forecast, list(forecast_paths))
    check_member_count(members, forecast, sources)
    full = forecast
    forecast = to_model_units(mattrs, check_forecast(mattrs, forecast, str(model), sources), str(model), sources)
    for v in extra_variables:
        if v in full.data_vars and v not in forecast.data_vars:
            forecast[v] = full[v].sel(level=forecast["level"]) if "level" in full[v].dims else full[v]
    return forecast, sources


def to_model_units(mattrs: dict[str, Any], forecast: xr.Dataset, model: str, sources: str) -> xr.Dataset:
    """``forecast`` (the model's fields) in the units the model was fitted in (``mattrs["field_units"]``), each
    conversion noted (:mod:`smoeweather.units`); attribute ``forecast_units`` {field: its own units}, the units
    :func:`from_model_units` gives the calibrated forecast back in. A mismatch is refused naming both; so is an
    offset conversion (°C ↔ K) of a model truncated at 0 (zero is another value in the other unit)."""
    fitted = mattrs.get("field_units", {})
    own = {str(n): units_of(forecast[n]) for n in forecast.data_vars}
    out = forecast.copy()
    for n, have in own.items():
        conv = conversion(n, have, f"--forecast {sources}", fitted.get(n, ""), f"the model {model}")
        if conv is None:
            continue
        if conv.offset != 0.0 and str(mattrs.get("distribution", "normal")) == "truncnormal":
            raise ValueError(f"{n!r}: the model {model} is truncated at 0 {conv.target} and --forecast {sources} "
                             f"is in {conv.source}; give the forecast in {conv.target}")
        out[n] = convert(chunked.as_dask(forecast[[n]])[n], conv.target, n, f"--forecast {sources}",
                         f"the model {model}")
    out.attrs["forecast_units"] = json.dumps(own)
    return out


def from_model_units(mu: xr.Dataset, sigma: xr.Dataset, forecast: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """(μ, σ) of a model applied in its own units (:func:`to_model_units`) in the forecast's own units again:
    μ converted as a value, σ as a spread, exactly; the ``units`` attribute of both set."""
    own = json.loads(forecast.attrs.get("forecast_units", "{}"))
    mu, sigma = mu.copy(), sigma.copy()
    for n in mu.data_vars:
        fitted = units_of(forecast[n]) if n in forecast.data_vars else ""
        conv = conversion(str(n), fitted, "the model", own.get(str(n), fitted), "the forecast")
        if conv is not None:
            mu[n] = conv.value(mu[n]).assign_attrs({**mu[n].attrs, "units": conv.target})
            sigma[n] = conv.spread(sigma[n]).assign_attrs({**sigma[n].attrs, "units": conv.target})
    return mu, sigma


def write_products(pred: Predictive, raw: xr.Dataset, outputs: Outputs, run: Run = LOCAL,
                   overwrite: bool = False) -> list[Path]:
    """Every store of ``outputs`` from the predictive distribution ``pred`` and the raw ensemble ``raw``
    (:meth:`.forms.Predictive.stores`), written in one dask computation, atomically (:func:`write_stores`)."""
    products = pred.stores(raw, outputs)
    with chunked.scheduler(run.scheduler) as client:
        return write_stores(products, client, run.progress, overwrite)


def check_member_count(members: int | None, forecast: xr.Dataset, sources: str) -> None:
    """ValueError unless ``members`` (ECC-Q members asked for) is None or the raw ensemble's member count."""
    if members is not None and members != forecast.sizes["member"]:
        raise ValueError(f"--members {members}: ECC-Q reorders the raw members, so N must equal the raw "
                         f"ensemble's member count ({forecast.sizes['member']} in {sources})")
