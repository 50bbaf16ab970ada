"""Model files of ``smoe postprocess fit`` (EMOS and DRN), one format: a CF netCDF of float arrays and plain
attributes, written atomically and opened with xarray (data only, never unpickled); and the checks that a new
forecast matches a model.

EMOS layout: one variable per field and coefficient, ``<name>_a``, ``<name>_b``, ``<name>_c``, ``<name>_d``, on
(``prediction_timedelta``, [``level``], [``latitude``, ``longitude``]) — the grid dims only for a per-grid-point
fit; ``latitude``/``longitude`` coordinates are written either way (the grid the model was fitted on).
Units: a in the field's units, b and d ``1``, c in the field's units squared; the global attribute
``field_units`` (JSON {field: units}) records the units every field was fitted in, and an apply converts a
forecast in other units to them (:mod:`smoeweather.units`). The predictive distribution is
N(a + b·mean, c + d·var), mean and var (ddof = 1) over the ensemble members. Global attributes record the
method, the fit (global / per grid point), fields, levels, leads (hours), member count, training period and
inits, source files, solver and the software version. DRN: the network weights (:mod:`.drn`) as float32
arrays, with the same attributes of the training ensemble.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.errors import DataError
from smoeweather.data.forecast_stores import check_grid
from smoeweather.data.sites import site_coord_names, station_ids, unicode_strings
from smoeweather.io import write_netcdf
from smoeweather.models.checkpoint_io import file_head
from smoeweather.postprocess.emos import COEFFICIENTS
from smoeweather.units import units_of

KIND = "smoeweather_emos_model"
DRN_KIND = "smoeweather_drn_model"
_LONG = {"a": "EMOS intercept of the predictive mean", "b": "EMOS slope on the ensemble mean",
         "c": "EMOS constant term of the predictive variance", "d": "EMOS slope on the ensemble variance"}


def _units(units: str, coef: str) -> str:
    if coef in ("b", "d"):
        return "1"
    if coef == "c":
        return f"({units})**2" if units else ""
    return units


def write_model(params: xr.Dataset, forecast: xr.Dataset, out: str | Path, attrs: dict[str, Any],
                overwrite: bool = False) -> Path:
    """Write ``params`` (of :func:`~.emos.fit_emos`) fitted on ``forecast`` (the training ensemble) to ``out``."""
    ds = _with_locations(xr.Dataset(), forecast)
    for name in params.data_vars:
        units = str(params[name].attrs.get("units", ""))
        labels = [str(c) for c in params[name]["coefficient"].values]
        for c in COEFFICIENTS:
            if c == "b" and "b" not in labels:  # members form: one b per (non-exchangeable) member
                bs = [x for x in labels if x.startswith("b_")]
                da = params[name].sel(coefficient=bs).rename(coefficient="member").assign_coords(
                    member=[x[2:] for x in bs]).astype(np.float64)
            else:
                da = params[name].sel(coefficient=c, drop=True).astype(np.float64)
            ds[f"{name}_{c}"] = da.assign_attrs(units=_units(units, c), long_name=f"{_LONG[c]} ({name})")
    ds["prediction_timedelta"].attrs.update(standard_name="forecast_period", long_name="lead time")
    ds.attrs = {
        "Conventions": "CF-1.8", "title": "EMOS coefficients (smoe postprocess fit)", "kind": KIND,
        "method": "emos", "per_gridpoint": int(params.attrs.get("per_gridpoint", 0)),
        **_training_attrs(forecast, [str(n) for n in params.data_vars]),
        "solver": str(params.attrs.get("solver", "")), "iterations": int(params.attrs.get("iterations", 0)),
        "groups_not_converged": int(params.attrs.get("groups_not_converged", 0)),
        "groups_without_data": int(params.attrs.get("groups_without_data", 0)),
        "predictive_distribution": "N(a + b*mean, c + d*var)" + (
            " truncated to [0, inf)" if attrs.get("distribution") == "truncnormal" else "")
        + ", ensemble mean and variance (ddof=1) over members",
        **{k: (v if isinstance(v, str | int | float) else str(v)) for k, v in attrs.items() if v is not None},
    }
    return write_model_dataset(ds, out, overwrite)


def _with_locations(ds: xr.Dataset, forecast: xr.Dataset) -> xr.Dataset:
    """``ds`` with the training locations of ``forecast``: its sites with their CF coordinates and station ids
    as strings, or its grid's latitude/longitude."""
    if "site" in forecast.dims:
        ds = ds.assign_coords({c: forecast[c] for c in ("site", *site_coord_names(forecast))})
        return ds.assign_coords(station_id=("site", station_ids(ds["station_id"].values), ds["station_id"].attrs))
    ds = ds.assign_coords(latitude=forecast["latitude"].values, longitude=forecast["longitude"].values)
    ds["latitude"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
    ds["longitude"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
    return ds


def _training_attrs(forecast: xr.Dataset, fields: list[str]) -> dict[str, Any]:
    """The attributes of every model file that describe its training ensemble (what an apply checks)."""
    from smoeweather.data.forecast_stores import code_version

    levels = [int(v) for v in forecast["level"].values] if "level" in forecast.dims else []
    leads = pd.to_timedelta(forecast["prediction_timedelta"].values) // pd.Timedelta("1h")
    times = pd.DatetimeIndex(forecast["time"].values)
    return {"fields": " ".join(fields), "field_units": json.dumps({f: units_of(forecast[f]) for f in fields}),
            "levels": " ".join(map(str, levels)),
            "leads_hours": " ".join(str(int(h)) for h in leads), "members": int(forecast.sizes["member"]),
            "grid": (f"{forecast.sizes['site']} sites" if "site" in forecast.dims
                     else f"{forecast.sizes['latitude']}x{forecast.sizes['longitude']}"),
            "n_train_inits": len(times), "train_first_init": str(times.min()), "train_last_init": str(times.max()),
            "software": f"smoeweather {code_version()}"}


NETCDF_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")


def open_model_file(path: str | Path, option: str, what: str) -> xr.Dataset:
    """The loaded Dataset of the model file ``path`` given as ``option`` (``--emos``, ``--drn``); a one-line
    error naming the option and the file when it does not exist, is a folder (a zarr store), is not netCDF (a
    text or YAML file) or cannot be read (truncated or corrupt)."""
    path = Path(path)
    hint = f"expected the netCDF {what} file of `smoe postprocess fit`"
    head = file_head(path, DataError(f"{option} {path}: a folder (a zarr store?), not a model file; {hint}"),
                     f"{option} {path}: {what} file does not exist")
    if not any(head.startswith(m) for m in NETCDF_MAGIC):
        raise DataError(f"{option} {path}: not a netCDF file (it starts with {head!r}; a text file?); {hint}")
    try:
        with xr.open_dataset(path) as raw:
            return unicode_strings(raw.load())
    except (OSError, ValueError, RuntimeError, IndexError) as err:
        reason = " ".join(str(err).split())[:200]
        raise DataError(f"{option} {path}: cannot read this netCDF file (truncated or corrupt? {reason}); fit the "
                        "model again") from None


def read_model(path: str | Path) -> tuple[xr.Dataset, dict[str, Any]]:
    """(coefficients in :func:`~.emos.fit_emos` form, attrs, with ``latitude``/``longitude`` arrays) of a file."""
    path = Path(path)
    ds = open_model_file(path, "--emos", "EMOS model")
    if ds.attrs.get("kind") != KIND:
        raise ValueError(f"{path} is not an EMOS model file of `smoe postprocess fit` (attribute kind={KIND!r})")
    params = {}
    for name in str(ds.attrs["fields"]).split():
        parts, labels = [], []
        for c in COEFFICIENTS:
            da = ds[f"{name}_{c}"]
            if "member" in da.dims:  # members form: b per member → coefficients b_<member>
                names = [f"b_{m}" for m in da["member"].values]
                parts += [da.isel(member=i, drop=True) for i in range(da.sizes["member"])]
                labels += names
            else:
                parts.append(da)
                labels.append(c)
        da = xr.concat(parts, "coefficient").assign_coords(coefficient=labels)
        params[name] = da.transpose(..., "coefficient").drop_vars(
            [c for c in ("latitude", "longitude", "altitude") if c in da.coords and c not in da.dims]
        ).assign_attrs(units=parts[0].attrs.get("units", ""))
    attrs = dict(ds.attrs, latitude=ds["latitude"].values, longitude=ds["longitude"].values,
                 field_units=fitted_units(ds, "_a"))
    if "site" in ds.dims:
        attrs["station_id"] = station_ids(ds["station_id"].values)
    return xr.Dataset(params, attrs={k: v for k, v in ds.attrs.items()}), attrs


def fitted_units(ds: xr.Dataset, variable_suffix: str) -> dict[str, str]:
    """{field: the units the model file ``ds`` was fitted in} ("" for none): its ``field_units`` attribute, or
    (files written before it) the ``units`` of each field's ``<field><variable_suffix>`` variable."""
    if "field_units" in ds.attrs:
        return {str(k): str(v) for k, v in json.loads(str(ds.attrs["field_units"])).items()}
    return {f: units_of(ds[f"{f}{variable_suffix}"]) if f"{f}{variable_suffix}" in ds else ""
            for f in str(ds.attrs.get("fields", "")).split()}


def check_forecast(attrs: dict[str, Any], forecast: xr.Dataset, model: str, where: str) -> xr.Dataset:
    """``forecast`` reduced to the model's fields and levels; ValueError naming the first mismatch (field,
    level, lead, member count or grid) between the model file ``model`` and the forecast ``where``."""
    fields = str(attrs["fields"]).split()
    missing = [f for f in fields if f not in forecast.data_vars]
    if missing:
        raise ValueError(f"{where} lacks field(s) {missing} that the model {model} was fitted for "
                         f"(forecast fields: {list(forecast.data_vars)})")
    forecast = forecast[fields]
    levels = [int(v) for v in str(attrs.get("levels", "")).split()]
    if levels:
        have = [int(v) for v in forecast["level"].values] if "level" in forecast.dims else []
        lacking = [lv for lv in levels if lv not in have]
        if lacking:
            raise ValueError(f"{where} lacks level(s) {lacking} hPa of the model {model} (forecast levels: {have})")
        forecast = forecast.sel(level=levels)
    elif "level" in forecast.dims:
        raise ValueError(f"{where} has a level dim; the model {model} was fitted on single-level fields")
    leads = [int(h) for h in str(attrs["leads_hours"]).split()]
    have_leads = [int(h) for h in pd.to_timedelta(forecast["prediction_timedelta"].values) // pd.Timedelta("1h")]
    extra = [h for h in have_leads if h not in leads]
    if extra:
        raise ValueError(f"{where} has lead(s) {extra} h that the model {model} has no coefficients for "
                         f"(model leads: {leads} h)")
    members = int(attrs["members"])
    if forecast.sizes["member"] != members:
        raise ValueError(f"{where} has {forecast.sizes['member']} members; the model {model} was fitted on "
                         f"{members} (the ensemble variance of another member count is another predictor)")
    if "site" in forecast.dims or "station_id" in attrs:
        return _check_sites(attrs, forecast, model, where)
    check_grid(forecast, np.asarray(attrs["latitude"], np.float64), np.asarray(attrs["longitude"], np.float64),
               where, f"the grid of the model {model}")
    return forecast


def _check_sites(attrs: dict[str, Any], forecast: xr.Dataset, model: str, where: str) -> xr.Dataset:
    """Site forecasts: a per-site model must hold every forecast site (ValueError naming the first missing
    station ids); a global model applies at any site."""
    if "site" not in forecast.dims or "station_id" not in attrs:
        raise ValueError(f"{where} and the model {model} differ in kind: one is on sites, the other on a grid")
    if int(attrs.get("per_gridpoint", 0)):
        have = set(str(s) for s in attrs["station_id"])
        lacking = [str(s) for s in forecast["station_id"].values if str(s) not in have]
        if lacking:
            raise ValueError(f"{where} has {len(lacking)} site(s) the per-site model {model} has no coefficients "
                             f"for, first {lacking[:5]}; fit on those sites or use a global fit")
    return forecast


def write_model_dataset(ds: xr.Dataset, out: str | Path, overwrite: bool = False) -> Path:
    """Write a model file's Dataset as netCDF atomically (encodings dropped: plain CF values); EMOS and DRN."""
    for v in ds.variables.values():
        v.encoding = {}
    return write_netcdf(ds, out, overwrite=overwrite)


# --- DRN model files: the same format (data only, netCDF, plain attributes) -------------------------------------


def write_drn_model(model: xr.Dataset, forecast: xr.Dataset, out: Any, attrs: dict[str, Any],
                    overwrite: bool = False) -> Any:
    """Write ``model`` (of :func:`.drn.fit_drn`, fitted on ``forecast``) as a netCDF: weights as float32 variables,
    plain attributes (no pickled objects; :func:`read_drn_model` opens it with xarray). Atomic."""
    ds = model.copy()
    for v in ds.data_vars:
        ds[v] = ds[v].astype(np.float32)
    ds = _with_locations(ds, forecast)
    ds.attrs = {
        "Conventions": "CF-1.8", "title": "DRN weights (smoe postprocess fit --method drn)", "kind": DRN_KIND,
        **model.attrs, "per_gridpoint": 0, **_training_attrs(forecast, _drn_fields(model)),
        "predictive_distribution": ("mu = ensemble mean + net_1, sigma = softplus(net_2) + 1e-3 (standardised "
                                    "units), averaged over seeds; "
                                    + ("normal truncated to [0, inf)" if model.attrs.get("distribution")
                                       == "truncnormal" else "normal")),
        "new_locations": "a site the model never saw, or with fewer than min_location_cases training cases, "
                         "gets the mean of the trained embeddings",
        **{k: (v if isinstance(v, str | int | float) else str(v)) for k, v in attrs.items() if v is not None},
    }
    return write_model_dataset(ds, out, overwrite)


def _drn_fields(model: xr.Dataset) -> list[str]:
    return [str(v)[: -len("_w1")] for v in model.data_vars if str(v).endswith("_w1")]


def read_drn_model(path: Any) -> tuple[xr.Dataset, dict[str, Any]]:
    """(model Dataset, attrs with ``latitude``/``longitude`` [and ``station_id``] arrays) of a DRN model file;
    ValueError for a file of another kind."""
    path = Path(path)
    ds = open_model_file(path, "--drn", "DRN model")
    if ds.attrs.get("kind") != DRN_KIND:
        raise ValueError(f"{path} is not a DRN model file of `smoe postprocess fit --method drn` (attribute "
                         f"kind={DRN_KIND!r}; an EMOS model file is applied with --emos)")
    attrs = dict(ds.attrs, latitude=ds["latitude"].values, longitude=ds["longitude"].values,
                 field_units=fitted_units(ds, "_w1"))
    if "site" in ds.dims:
        attrs["station_id"] = station_ids(ds["station_id"].values)
    return ds, attrs
