"""The one driver of ``smoe postprocess fit`` / ``apply`` for gridded stores and site tables, shared by EMOS and
DRN: open the ensemble (a gridded store or forecast file, a CF site file or a CSV/Parquet site table) and check
it, align the truth on valid times, select periods and rolling windows (:func:`open_training`,
:func:`open_to_apply`), and write every output form atomically (:func:`write_products`).

EMOS (:func:`fit`, :func:`apply`) runs out of core: fit once or on rolling windows, globally or per grid point
/ site, with the mean/spread or the member-weights predictors; apply with ECC-Q members and quantiles, streamed
to zarr in one pass. DRN (:func:`fit_drn_files`, :func:`apply_drn_files`) fits in memory. Every check runs
before anything is computed or written; a failed run leaves no output behind (atomic writes, the staging folder
removed).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.plausibility import check_plausible
from pipelines.readers.forecast_nc import normalise_grid
from smoeweather.data import ensembles
from smoeweather.data.sites import is_site_source, open_sites, station_ids
from smoeweather.io import atomic_path, check_output
from smoeweather.postprocess import chunked, validate
from smoeweather.postprocess.distributions import check_distribution
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


@dataclass
class Training:
    """The training data of a fit: the ensemble (period selected), the truth at init + lead of its ``targets``,
    the rolling windows (``window``: (dates, idx, valid) of :func:`.rolling.window_index`, or None) with their
    model-file attributes, and the sources as one string."""

    forecast: xr.Dataset
    truth_at: xr.Dataset
    targets: list[str]
    window: Any
    window_attrs: dict[str, Any]
    sources: str


def open_training(forecast_paths: Sequence[Path], out: Path, *, truth_path: Path | None = None,
                  variables: Sequence[str] | None = None, extra_variables: Sequence[str] = (),
                  train_period: Sequence[str] | None = None, window: str | None = None, lag: str | None = None,
                  dates: Sequence[str] | None = None, distribution: str = "normal", table: dict[str, Any] | None = None,
                  overwrite: bool = False, static_maps: bool = False, plausibility_check: bool = True) -> Training:
    """Every check of a fit's options and inputs, in order, before anything is computed: the output ``out``,
    the rolling-window options, the distribution; then the ensemble (``variables`` and ``extra_variables``) and
    its truth on valid times, the period, non-negative truth for the truncated normal, the windows.
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
    forecast = ensembles.select_period(forecast, train_period)
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
    return Training(forecast, truth_at, targets, win, dict(attrs), " ".join(map(str, forecast_paths)))


def _fit_attrs(data: Training, truth_path: Path | None, train_period: Sequence[str] | None,
               report: dict[str, Any]) -> dict[str, Any]:
    """The model-file attributes every fit records: sources, period, the data report, the windows."""
    return {**data.window_attrs, "forecast": data.sources, "truth": str(truth_path or data.sources),
            "train_period": " ".join(map(str, train_period)) if train_period else "all",
            **validate.fit_attrs(report)}


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
    plausibility_check: bool = True,
) -> str:
    """Fit EMOS (``smoe postprocess fit --method emos``) and write the model file ``out``; returns a summary line.

    ``forecast_paths``: gridded ensemble stores/files or one site file/table (``table``: its column options,
    :func:`smoeweather.data.sites.open_sites`); ``truth_path``: truth on valid times (default: the forecast's
    own); ``train_period``: inclusive init range; ``predictors``: ``mean`` or ``members``; ``per_gridpoint``:
    one fit per grid point or site; ``window``/``lag``/``dates``: rolling training windows (``25D``, ``2D``);
    ``distribution``: ``normal`` or ``truncnormal``; ``scheduler``: where dask runs
    (:func:`pipelines.compute.dask_client`); ``plausibility_check``: see :func:`open_training`."""
    from smoeweather.postprocess.model_file import write_model

    data = open_training(forecast_paths, out, truth_path=truth_path, variables=variables, train_period=train_period,
                         window=window, lag=lag, dates=dates, distribution=distribution, table=table,
                         overwrite=overwrite, plausibility_check=plausibility_check)
    distribution = check_distribution(distribution)  # checked in open_training: the canonical name
    forecast, rolling_window = data.forecast, data.window
    members = [str(m) for m in forecast["member"].values] if predictors == "members" else None
    names = list(forecast.data_vars)
    with chunked.scheduler(scheduler) as client, chunked.staging_dir(out) as tmp:
        fc_dask, truth_dask = chunked.as_dask(forecast), chunked.as_dask(data.truth_at)
        arrays = chunked.training_arrays(fc_dask, truth_dask, predictors)
        factor = (rolling_window[1].shape[0] * rolling_window[1].shape[1] // max(forecast.sizes["time"], 1)
                  if rolling_window else 1)
        staged, counts = chunked.stage_with(arrays, tmp / "training.zarr", client, progress, max(1, factor),
                                            extra=validate.data_counts(fc_dask, truth_dask, data.sources))
        report = validate.check_fit_data(counts, forecast, data.sources)  # refuses before anything is fitted
        params = chunked.fit_staged(staged, names, bool(per_gridpoint), client, progress,
                                    window=rolling_window, members=members, iterations=iterations or 50,
                                    distribution=distribution)
    validate.check_fitted_groups(params.attrs, data.sources)
    for n in names:
        params[n].attrs["units"] = units_of(forecast[n])  # the units it is fitted in (the model file records them)
    attrs = {**_fit_attrs(data, truth_path, train_period, report), "predictors": predictors,
             "distribution": distribution}
    written = write_model(params, forecast, out, attrs, overwrite=overwrite)
    kind = "per site" if "site" in forecast.dims and per_gridpoint else (
        "per grid point" if per_gridpoint else "global")
    rolling = f", {len(rolling_window[0])} forecast dates" if rolling_window is not None else ""
    empty = int(params.attrs.get("groups_without_data", 0))
    return (f"{written}: {params.attrs['groups']} EMOS fit(s) ({kind}, {predictors}{rolling}) on "
            f"{attrs['fit_cases']} cases, {params.attrs['groups_not_converged']} not converged"
            + (f", {empty} without enough cases (NaN)" if empty else ""))


def fit_drn_files(forecast_paths: Sequence[Path], out: Path, settings: Any, *, truth: Path | None = None,
                  variables: Sequence[str] | None = None, train_period: Sequence[str] | None = None,
                  window: str | None = None, lag: str | None = None, dates: Sequence[str] | None = None,
                  table: dict[str, Any] | None = None, overwrite: bool = False, progress: bool = True,
                  plausibility_check: bool = True) -> str:
    """``smoe postprocess fit --method drn``: fit the DRN of ``settings`` (:class:`.drn.DRNSettings`) on the
    ensemble files (a gridded store/file, a CF site file or a site table), in memory, and write the model file
    ``out``; returns a one-line summary. ``window``/``lag``/``dates`` as for rolling EMOS (:mod:`.rolling`)."""
    from smoeweather.postprocess.drn import fit_drn
    from smoeweather.postprocess.model_file import write_drn_model

    settings.check()
    data = open_training([Path(p) for p in forecast_paths], Path(out), truth_path=Path(truth) if truth else None,
                         variables=variables, extra_variables=settings.extra_variables, train_period=train_period,
                         window=window, lag=lag, dates=dates, distribution=settings.distribution, table=table,
                         overwrite=overwrite, static_maps=True, plausibility_check=plausibility_check)
    targets, win = data.targets, data.window
    fc, truth_at = data.forecast.load(), data.truth_at.load()
    report = validate.check_fit_data(validate.data_counts(fc[targets], truth_at, data.sources), fc[targets],
                                     data.sources)
    t0 = time.perf_counter()
    model = fit_drn(fc, truth_at, settings, window=win, progress=progress, targets=targets)
    attrs = {**_fit_attrs(data, truth, train_period, report), "fit_seconds": round(time.perf_counter() - t0, 1)}
    path = write_drn_model(model, fc[targets], out, attrs, overwrite=overwrite)
    kind = "sites" if "site" in fc.dims else "grid points"
    rolling = f", {len(win[0])} forecast dates" if win is not None else ""
    return (f"{path}: DRN ({settings.hidden} hidden, embedding {settings.embedding}, {settings.seeds} seed(s), "
            f"{settings.epochs} epochs, {fc.sizes.get('site', 0) or fc.sizes['latitude'] * fc.sizes['longitude']} "
            f"{kind}{rolling}) on {attrs['fit_cases']} cases in {attrs['fit_seconds']} s")


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


OUTPUT_SUFFIXES = (".nc", ".zarr")
"""What an output of ``smoe postprocess apply`` is: a CF netCDF file (``.nc``, IMPROVER's layout,
:func:`.forms.cf_netcdf_dataset`) or a zarr store (``.zarr``)."""


def write_stores(products: Sequence[tuple[xr.Dataset, Path, str, dict[str, Any]]], client: Any, progress: bool,
                 overwrite: bool) -> list[Path]:
    """Write every (Dataset, path, forecast_kind, attrs) in ONE dask computation (each input chunk read once),
    chunk by chunk: a ``.zarr`` path as a zarr store, a ``.nc`` path as CF netCDF (staged as zarr beside it,
    then streamed into the file, :func:`.forms.to_cf_netcdf`); atomically: on any error no output is left."""
    from smoeweather.postprocess.forms import to_cf_netcdf

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


@dataclass(frozen=True)
class Outputs:
    """The stores an apply writes: the (μ, σ) store ``out``; ``members`` ECC-Q members to ``members_out``, the
    quantiles ``levels`` to ``quantiles_out``, the probabilities and percentiles of ``forms``
    (:class:`.forms.OutputForms`), where given."""

    out: Path
    members_out: Path | None = None
    members: int | None = None
    quantiles_out: Path | None = None
    levels: np.ndarray | None = None
    forms: Any = None

    def check(self, overwrite: bool, inputs: Sequence[Any] = ()) -> Outputs:
        """``self``; ValueError naming the option when an output ends in neither ``.nc`` nor ``.zarr``
        (:data:`OUTPUT_SUFFIXES`) or two outputs are one path, and :func:`smoeweather.io.check_output` of each
        (exists without ``overwrite``, under a file, read-only folder, is/contains/lies inside one of ``inputs``),
        before anything is computed."""
        forms = self.forms
        named = {"--out": self.out, "--members-out": self.members_out, "--quantiles-out": self.quantiles_out,
                 "--thresholds-out": getattr(forms, "thresholds_out", None),
                 "--percentiles-out": getattr(forms, "percentiles_out", None)}
        for option, p in named.items():
            if p is not None and Path(p).suffix not in OUTPUT_SUFFIXES:
                raise ValueError(f"{option} {p}: expected a path ending in .nc (a CF netCDF file) or .zarr (a zarr "
                                 f"store), e.g. {option} {Path(p).with_suffix('.zarr')}")
        outs = [p for p in named.values() if p is not None]
        if len({Path(p).resolve() for p in outs}) < len(outs):
            raise ValueError(f"outputs must be distinct paths, got {[str(p) for p in outs]}")
        for p in outs:  # checked again when each is written
            check_output(Path(p), overwrite, inputs=inputs)
        return self


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
    forecast = ensembles.select_period(open_forecast(forecast_paths, table), apply_period)
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


def write_products(mu: xr.Dataset, sigma: xr.Dataset, raw: xr.Dataset, attrs: dict[str, Any], distribution: str,
                   outputs: Outputs, *, scheduler: str | None = None, progress: bool = True,
                   overwrite: bool = False) -> list[Path]:
    """Every store of ``outputs`` from the predictive (μ, σ) of ``distribution`` (:func:`distribution_products`)
    and the raw ensemble ``raw``, written in one dask computation, atomically (:func:`write_stores`)."""
    products = distribution_products(mu, sigma, raw, attrs, distribution, outputs)
    with chunked.scheduler(scheduler) as client:
        return write_stores(products, client, progress, overwrite)


def apply_files(method: str, model: Path, forecast_paths: Sequence[Path], outputs: Outputs, *,
                apply_period: Sequence[str] | None = None, table: dict[str, Any] | None = None,
                scheduler: str | None = None, progress: bool = True, overwrite: bool = False, batch_size: int = 8
                ) -> list[Path]:
    """``smoe postprocess apply``: calibrate the forecast with the model file or checkpoint ``model`` of
    ``method`` (``emos``, ``drn``, ``network``) and write ``outputs``; the paths written."""
    if not Path(model).exists():
        raise FileNotFoundError(f"model {model} does not exist")
    if method == "network":
        return apply_network(model, forecast_paths, outputs, apply_period=apply_period, batch_size=batch_size,
                             overwrite=overwrite)
    run = {"emos": apply, "drn": apply_drn_files}[method]
    return run(model, forecast_paths, outputs, apply_period=apply_period, table=table, scheduler=scheduler,
               progress=progress, overwrite=overwrite)


def apply(model: Path, forecast_paths: Sequence[Path], outputs: Outputs, *,
          apply_period: Sequence[str] | None = None, table: dict[str, Any] | None = None,
          scheduler: str | None = None, progress: bool = True, overwrite: bool = False) -> list[Path]:
    """Calibrate a forecast with an EMOS model file (``smoe postprocess apply --emos``) and write ``outputs``,
    streamed out of core. The caller has checked the output paths (:meth:`Outputs.check`)."""
    from smoeweather.postprocess.emos import apply_emos
    from smoeweather.postprocess.model_file import read_model

    params, mattrs = read_model(model)
    forecast, sources = open_to_apply(mattrs, model, forecast_paths, apply_period=apply_period,
                                      members=outputs.members, table=table)
    forecast = chunked.as_dask(forecast)
    params = _align_sites(params, mattrs, forecast)
    mu, sigma = from_model_units(*apply_emos(params, forecast), forecast)  # lazy; the forecast's own units
    local = int(mattrs["per_gridpoint"])
    where = "site" if "site" in forecast.dims else "gridpoint"
    attrs = {"method": "emos" + (f"_{where}" if local else "_global"), "model": str(model),
             "model_train_period": mattrs.get("train_period"), "members": int(forecast.sizes["member"]),
             "predictors": mattrs.get("predictors", "mean"), "window": mattrs.get("window"),
             "forecast": sources}
    return write_products(mu, sigma, forecast, attrs, str(mattrs.get("distribution", "normal")), outputs,
                          scheduler=scheduler, progress=progress, overwrite=overwrite)


def apply_drn_files(model_path: Path, forecast_paths: Sequence[Path], outputs: Outputs, *,
                    apply_period: Sequence[str] | None = None, table: dict[str, Any] | None = None,
                    scheduler: str | None = None, progress: bool = True, overwrite: bool = False) -> list[Path]:
    """``smoe postprocess apply --drn MODEL.nc``: the same stores as :func:`apply`, the DRN applied in memory.
    Sites the model never saw get the mean embedding (one line says how many)."""
    from smoeweather.postprocess.drn import apply_drn, site_positions
    from smoeweather.postprocess.model_file import read_drn_model

    model, mattrs = read_drn_model(model_path)
    forecast, sources = open_to_apply(mattrs, Path(model_path), [Path(p) for p in forecast_paths],
                                      apply_period=apply_period, members=outputs.members, table=table, static_maps=True,
                                      extra_variables=str(mattrs.get("extra_variables", "")).split())
    forecast = forecast.load()
    idx, new = site_positions(mattrs, forecast)
    if new and progress:
        print(f"DRN: {len(new)} site(s) the model never saw get the mean station embedding, first {new[:5]}",
              file=sys.stderr, flush=True)
    mu, sigma = from_model_units(*apply_drn(model, forecast, idx), forecast)  # the forecast's own units
    attrs = {"method": "drn", "model": str(model_path), "model_train_period": mattrs.get("train_period"),
             "members": int(forecast.sizes["member"]), "window": mattrs.get("window"), "forecast": sources,
             "new_sites_mean_embedding": len(new)}
    return write_products(mu, sigma, forecast[str(mattrs["fields"]).split()], attrs,
                          str(mattrs.get("distribution", "normal")), outputs, scheduler=scheduler,
                          progress=progress, overwrite=overwrite)


def apply_network(checkpoint: Path, forecast_paths: Sequence[Path], outputs: Outputs, *,
                  apply_period: Sequence[str] | None = None, batch_size: int = 8, overwrite: bool = False
                  ) -> list[Path]:
    """Calibrate a gridded forecast with a post-processing network checkpoint (``smoe postprocess apply
    --network``): the same stores as :func:`apply`, in memory. The caller has checked the output paths."""
    from smoeweather.postprocess.neural import apply_checkpoint

    forecast = ensembles.select_period(open_gridded(forecast_paths), apply_period)
    sources = " ".join(map(str, forecast_paths))
    check_member_count(outputs.members, forecast, sources)
    mu, sigma, attrs = apply_checkpoint(checkpoint, forecast, batch_size=batch_size)
    mu, sigma = mu.load(), sigma.load()
    products = distribution_products(mu, sigma, forecast.load(), {**attrs, "forecast": sources}, "normal", outputs)
    return write_stores(products, None, False, overwrite)


def check_member_count(members: int | None, forecast: xr.Dataset, sources: str) -> None:
    """ValueError unless ``members`` (ECC-Q members asked for) is None or the raw ensemble's member count."""
    if members is not None and members != forecast.sizes["member"]:
        raise ValueError(f"--members {members}: ECC-Q reorders the raw members, so N must equal the raw "
                         f"ensemble's member count ({forecast.sizes['member']} in {sources})")


def distribution_products(mu: xr.Dataset, sigma: xr.Dataset, forecast: xr.Dataset, attrs: dict[str, Any],
                          distribution: str, outputs: Outputs) -> list[tuple[xr.Dataset, Path, str, dict[str, Any]]]:
    """The stores of ``outputs`` of a (μ, σ) forecast of ``distribution`` (``forecast``: the raw ensemble),
    each with CF metadata in IMPROVER's names (:func:`.forms.cf_decorate`, the raw fields' standard names).

    For the truncated normal the (μ, σ) store holds the location and scale of the normal before truncation
    (attribute ``predictive_distribution`` says so; a Gaussian scorer would misread it); its members and
    quantiles are the truncated distribution's, and ``smoe evaluate`` scores those correctly."""
    from smoeweather.postprocess.distributions import LONG_NAMES
    from smoeweather.postprocess.ecc import ecc_members, gaussian_quantiles
    from smoeweather.postprocess.forms import cf_decorate, field_metadata, form_products

    o = outputs
    attrs = {**attrs, "distribution": distribution, "predictive_distribution": LONG_NAMES[distribution]}
    products = [(ensembles.gaussian_dataset(mu, sigma), Path(o.out), "gaussian", attrs)]
    if o.members_out is not None:
        raw = forecast[list(mu.data_vars)]
        # a network may calibrate fewer levels or leads (or inits) than the raw ensemble holds: ECC-Q reorders
        # the raw members at exactly the forecast's points
        fewer = {d: mu[d].values for d in mu.dims if d in raw.dims and d in mu.coords and raw.sizes[d] != mu.sizes[d]}
        raw = raw.sel(fewer) if fewer else raw
        ens = ecc_members(mu, sigma, raw, o.members, distribution=distribution)
        products.append((ens, Path(o.members_out), "ensemble", {**attrs, "method": f"{attrs['method']}_ecc",
                                                        "ecc": "ECC-Q, levels (i-0.5)/N, stable ranks"}))
    if o.quantiles_out is not None:
        products.append((gaussian_quantiles(mu, sigma, o.levels, distribution=distribution), Path(o.quantiles_out),
                         "quantiles", {**attrs, "method": f"{attrs['method']}_quantiles"}))
    if o.forms is not None:
        products.extend(form_products(mu, sigma, distribution, attrs, o.forms))
    fields = field_metadata(forecast, [str(n) for n in mu.data_vars])
    return [(cf_decorate(ds, distribution, fields), path, kind, a) for ds, path, kind, a in products]
