"""The forecast-store convention, in one place: open ensemble sources and their truth, static fields, period
and split selection, lead helpers, grid checks, and the one writer of every kind of forecast store.

Convention (WeatherBench 2): dims ``time`` (initialisation), ``prediction_timedelta`` (timedelta64),
[``member`` | ``quantile``], [``level``, hPa], ``latitude`` (ascending), ``longitude`` ([0, 360)); long
variable names with CF ``units``/``long_name``; ``attrs["forecast_kind"]`` is one of :data:`FORECAST_KINDS`:

==============  =========================================================================================
deterministic   ``<name>`` (time, prediction_timedelta, [level], latitude, longitude)
ensemble        ``<name>`` with a ``member`` dim
gaussian        μ as ``<name>``, σ as ``<name>`` + :data:`STD_SUFFIX` (same units)
quantiles       ``<name>`` with a ``quantile`` dim (probability levels in (0, 1))
==============  =========================================================================================

Ensemble sources in other layouts (gcm_ens, SEAS5 ``sdate``/``ftime``, ``smoe data prepare ens10`` stores) are
converted on the fly (:func:`open_ensemble`, with :mod:`pipelines.readers.forecast_nc`). Truth is a Dataset on
``time`` = VALID time (:func:`open_truth`); :func:`truth_at_valid_times` puts it on (init, lead).

Gap policy (:func:`truth_at_valid_times`): by default a valid time the truth lacks is an error naming it
(``gaps="raise"``: fitting and training never see a silent hole); scoring asks for ``gaps="nan"`` and gets
NaN there, so a forecast reaching past the truth is scored on the valid times that exist (``n_time``).
"""

from __future__ import annotations

import datetime as dt
import glob
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.provenance import code_version  # noqa: F401 - re-exported: stores, model files
from pipelines.readers.forecast_nc import LEAD_NAMES, MEMBER_NAMES, TRUTH_SUFFIX, open_forecast_nc, open_forecast_truth
from smoeweather.io import atomic_path, write_netcdf

HOUR = np.timedelta64(1, "h")
"""One hour: leads are whole hours everywhere (``int(td // HOUR)``)."""
STD_SUFFIX = "_std"
"""σ of a ``gaussian`` store's ``<name>`` is the variable ``<name>_std``."""
FORECAST_KINDS = ("deterministic", "ensemble", "gaussian", "quantiles", "probability")
GRID_ATOL = 1e-4
"""Degrees: two grids are the same when every coordinate agrees to this (float32 round-off at 360°)."""

Sources = str | Path | Sequence[str | Path]
X = TypeVar("X", xr.Dataset, xr.DataArray)


# -- leads ---------------------------------------------------------------------------------------------------
def parse_lead(value: str | int, option: str = "--lead") -> int:
    """Lead time in whole hours from ``72``, ``"72h"``, ``"3d"`` or ``"3 days"``; ValueError naming ``option``
    for anything else (``abc``, ``-6h``, ``90min``)."""
    if isinstance(value, int | np.integer):
        hours = float(value)
    else:
        s = str(value).strip()
        try:
            hours = float(s) if s.replace(".", "", 1).isdigit() else pd.Timedelta(s) / pd.Timedelta(hours=1)
        except ValueError:
            hours = float("nan")
    if not hours > 0 or hours != int(hours):
        raise ValueError(f"{option} {value!r}: a lead time must be a positive whole number of hours, e.g. 72h, 3D "
                         "or 72")
    return int(hours)


def lead_timedeltas(hours: Sequence[int]) -> np.ndarray:
    """Leads in hours → ``timedelta64[ns]`` array (the ``prediction_timedelta`` coordinate)."""
    return np.array([np.timedelta64(int(h), "h") for h in hours]).astype("timedelta64[ns]")


def lead_hours(leads: xr.Dataset | xr.DataArray | np.ndarray | Sequence[Any]) -> list[int]:
    """Leads in whole hours of a forecast (its ``prediction_timedelta``) or of timedelta64 values."""
    if isinstance(leads, xr.Dataset | xr.DataArray) and "prediction_timedelta" in leads.coords:
        leads = leads["prediction_timedelta"].values
    return [int(v // HOUR) for v in np.asarray(leads).astype("timedelta64[ns]")]


def lead_label(td: np.timedelta64) -> str:
    """A lead as whole hours, e.g. ``72h`` (the key used in every scores file)."""
    return f"{int(np.timedelta64(td, 'ns') // HOUR)}h"


# -- grids ---------------------------------------------------------------------------------------------------
def check_grid(ds: xr.Dataset | xr.DataArray, latitude: Any, longitude: Any, where: str,
               reference: str = "the reference grid") -> None:
    """ValueError naming ``where`` unless ``ds`` is on the (latitude, longitude) grid to :data:`GRID_ATOL`."""
    for name, want in (("latitude", np.asarray(latitude)), ("longitude", np.asarray(longitude))):
        have = np.asarray(ds[name].values)
        if have.shape != want.shape or not np.allclose(have, want, atol=GRID_ATOL):
            raise ValueError(f"{where}: {name} grid ({have.size} points, {have[:1]}..{have[-1:]}) differs from "
                             f"{reference} ({want.size} points, {want[:1]}..{want[-1:]}); regrid first")


# -- opening -------------------------------------------------------------------------------------------------
def _paths(source: Sources) -> list[Path]:
    paths = [Path(source)] if isinstance(source, str | Path) else [Path(p) for p in source]
    if not paths:
        raise ValueError("no ensemble source given (a path or a list of paths was expected)")
    return paths


def is_url(source: str | Path) -> bool:
    """Whether ``source`` is an fsspec URL (``gs://``, ``s3://``, ``https://``, ``file://``, ``memory://``)."""
    return "://" in str(source)


def open_url(url: str, storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """A zarr store (a folder at the URL) or one netCDF file at an fsspec URL, lazily; ``storage_options`` go
    to fsspec (e.g. ``{"token": "anon"}`` for WB2's public bucket). Needs the protocol's package
    (``pip install "smoeweather[cloud]"`` for gcsfs and s3fs)."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as err:
        raise ValueError(f"{url}: cannot open this URL ({err}); install the protocol's package, e.g. "
                         'pip install "smoeweather[cloud]" for gs:// and s3://') from None
    if not fs.exists(path):
        raise FileNotFoundError(f"{url} does not exist")
    if fs.isdir(path):
        return xr.open_zarr(fs.get_mapper(path), consolidated=None)
    return xr.open_dataset(fs.open(path, "rb"), engine="h5netcdf", chunks={})


def _open_any(path: Path | str, storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    if is_url(path):
        return open_url(str(path), storage_options)
    from pipelines.readers._files import open_data

    return open_data(path)


def describe(source: Sources) -> str:
    """A source as one provenance string (absolute paths)."""
    if isinstance(source, str | Path):
        s = str(source)
        return s if "://" in s else str(Path(s).resolve())
    return ", ".join(describe(s) for s in source)


def _files(source: Sources) -> list[str]:
    if not isinstance(source, str | Path):
        return [f for s in source for f in _files(s)]
    s = str(source)
    if any(c in s for c in "*?["):
        found = sorted(glob.glob(s))
        if not found:
            raise FileNotFoundError(f"no files match {s}")
        return found
    return [s]


def open_canonical(source: Sources, storage_options: dict[str, Any] | None = None, *, where: str | None = None,
                   role: str = "this input", fix: str = "give a prepared store or an analysis") -> xr.Dataset:
    """Lazy canonical Dataset (fields on valid times) of a prepared store (zarr directory) or canonical
    netCDF file(s) / a glob, local or at an fsspec URL (``storage_options`` for fsspec): long names,
    ``latitude`` ascending, ``longitude`` in [0, 360) and ascending. A forecast (time = init) is refused by
    :func:`refuse_forecast`, naming ``where`` (default: the source), the ``role`` of the input and the ``fix``."""
    from pipelines.readers._files import open_data

    files = _files(source)
    for f in files:
        if not is_url(f) and not Path(f).exists():
            raise FileNotFoundError(f"data source {f} does not exist")
    if len(files) == 1 and is_url(files[0]):
        from pipelines.canonical import canonicalize

        ds = open_url(files[0], storage_options)
        ds = ds if "latitude" in ds.dims and "longitude" in ds.dims else canonicalize(ds)
    elif len(files) == 1 and (Path(files[0]).is_dir() or files[0].endswith(".zarr")):
        ds = open_data(files[0])
    else:
        from pipelines.canonical import canonicalize

        if len(files) == 1:
            ds = open_data(files[0], chunks={})
        else:
            try:
                ds = xr.open_mfdataset(files, combine="nested", concat_dim="time", data_vars="minimal",
                                       coords="minimal", compat="override", chunks={})
            except (OSError, ValueError, RuntimeError):
                for f in files:  # name the file that cannot be read (xarray's error names none)
                    open_data(f, chunks={}).close()
                raise
        ds = canonicalize(ds)
    refuse_forecast(ds, where or describe(source), role, fix)
    if "latitude" not in ds.dims or "longitude" not in ds.dims:
        raise ValueError(f"{describe(source)}: expected dims latitude and longitude, got {dict(ds.sizes)}")
    ds = ds.assign_coords(longitude=np.mod(ds["longitude"], 360.0))
    return ds.sortby(["latitude", "longitude"])


def _is_wb2_forecast(ds: xr.Dataset) -> bool:
    return ("time" in ds.dims and "prediction_timedelta" in ds.dims
            and np.issubdtype(ds["prediction_timedelta"].dtype, np.timedelta64))


def refuse_forecast(ds: xr.Dataset, where: str, wanted: str, fix: str) -> None:
    """ValueError naming ``where`` and saying ``fix`` when ``ds`` is a forecast (a ``prediction_timedelta`` dim:
    time = init) where ``wanted`` (data on valid times: the truth, a training store) is expected."""
    if "prediction_timedelta" in ds.dims:
        raise ValueError(f"{where}: has a prediction_timedelta dim, so it is a forecast (time = init), but {wanted} "
                         f"must be data on valid times; {fix}")


def _is_ens10_store(ds: xr.Dataset) -> bool:
    """A ``smoe data prepare ens10`` store: ``time`` = init, ``member``, one lead (no lead dim), truth as
    ``<name>_truth`` on the init time."""
    return ("member" in ds.dims and "time" in ds.dims and "prediction_timedelta" not in ds.dims
            and "time" in ds.indexes and not any(d in ds.dims for d in LEAD_NAMES))


def is_forecast_file(path: str | Path) -> bool:
    """True for one (netCDF) file holding an ensemble forecast (any member-dim name) rather than fields on
    valid times: its truth, if any, is the truth held inside it."""
    p = Path(path)
    if not p.is_file():
        return False
    ds = _open_any(p)
    try:
        return any(m in ds.dims for m in MEMBER_NAMES)
    finally:
        ds.close()


def _ens10_lead(ds: xr.Dataset, where: str) -> np.timedelta64:
    """The one lead of an ENS-10 store: its scalar ``prediction_timedelta``, ``valid_time − time`` or the
    ``lead_time`` attribute ("48 h") that ``smoe data prepare ens10`` writes."""
    if "prediction_timedelta" in ds.coords:
        return ds["prediction_timedelta"].values.astype("timedelta64[ns]")
    if "valid_time" in ds.coords and ds["valid_time"].dims == ("time",):
        leads = np.unique(ds["valid_time"].values - ds["time"].values)
        if len(leads) == 1:
            return leads[0].astype("timedelta64[ns]")
    text = str(ds.attrs.get("lead_time", "")).replace(" ", "")
    if text:
        return pd.Timedelta(text).to_timedelta64().astype("timedelta64[ns]")
    raise ValueError(f"{where}: an ensemble store without a lead time (no prediction_timedelta dim or coord, "
                     "no valid_time, no lead_time attribute); expected a `smoe data prepare ens10` store")


def check_unique_times(ds: xr.Dataset, where: str, dim: str = "time") -> None:
    """ValueError naming the file ``where`` and the repeated initialisation times when ``ds[dim]`` holds one
    twice (a case counted twice in a fit; an index error in a score), as times repeated across files are."""
    if dim not in ds.dims:
        return
    t = pd.Index(ds[dim].values)
    if t.has_duplicates:
        twice = [str(pd.Timestamp(v)) if isinstance(v, np.datetime64) else str(v) for v in t[t.duplicated()].unique()]
        raise ValueError(f"{where}: initialisation time(s) {twice[:5]}{' ...' if len(twice) > 5 else ''} appear "
                         f"more than once in this file ({len(twice)} repeated); remove the repeats (e.g. "
                         "xarray's ds.drop_duplicates('time')) and write it again")


def _open_one_ensemble(path: Path) -> xr.Dataset:
    ds = _open_one_ensemble_layout(path)
    check_unique_times(ds, str(path))
    return ds


def _open_one_ensemble_layout(path: Path) -> xr.Dataset:
    ds = _open_any(path)
    if _is_ens10_store(ds):
        names = [n for n in ds.data_vars if "member" in ds[n].dims and not str(n).endswith(TRUTH_SUFFIX)]
        lead = _ens10_lead(ds, str(path))
        out = ds[names].drop_vars([c for c in ds[names].coords if c not in ds[names].dims])
        out = out.expand_dims(prediction_timedelta=[lead], axis=1)
        order = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
        for n in names:
            out[n] = out[n].transpose(*[d for d in order if d in out[n].dims])
        out.attrs = dict(ds.attrs, source_format="ens10 store")
        return out.sortby("latitude")
    if not (_is_wb2_forecast(ds) and "member" in ds.dims):
        ds = open_forecast_nc(path)
    return ds.sortby("latitude") if "latitude" in ds.dims else ds


def _concat_times(parts: list[xr.Dataset], paths: list[Path]) -> xr.Dataset:
    """Concatenate per-file Datasets along ``time`` after checking that every other axis agrees."""
    first = parts[0]
    for p, ds in zip(paths[1:], parts[1:]):
        for dim in ("prediction_timedelta", "member", "level", "latitude", "longitude"):
            a = first[dim].values if dim in first.dims else None
            b = ds[dim].values if dim in ds.dims else None
            if (a is None) != (b is None) or (a is not None and (a.shape != b.shape or not np.array_equal(a, b))):
                raise ValueError(f"{p}: {dim} differs from {paths[0]}'s; ensemble files must share every axis "
                                 "except time")
    out = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override",
                    join="override", combine_attrs="drop_conflicts")
    t = pd.DatetimeIndex(out["time"].values)
    if t.has_duplicates:
        raise ValueError(f"initialisation times repeat across {[str(p) for p in paths]} "
                         f"(first {t[t.duplicated()][0]})")
    return out.sortby("time")


def open_ensemble(source: Sources, variables: Sequence[str] | None = None) -> xr.Dataset:
    """Ensemble forecast Dataset (lazy) in the convention of this module, from any supported layout.

    ``source``: one path or several (concatenated along ``time``, duplicates refused). Layouts: a
    WeatherBench 2 ensemble zarr/netCDF (``time`` = init, ``prediction_timedelta``, ``member``, [``level``],
    ``latitude``, ``longitude``), a forecast file with other axis names (gcm_ens, SEAS5 ``sdate``/``ftime``;
    :mod:`pipelines.readers.forecast_nc`) or a ``smoe data prepare ens10`` store (one lead). Only the
    variables with a ``member`` dim are kept; latitude ascending.
    """
    paths = _paths(source)
    parts = [_open_one_ensemble(p) for p in paths]
    ds = parts[0] if len(parts) == 1 else _concat_times(parts, paths)
    where = ", ".join(map(str, paths))
    names = [n for n in ds.data_vars if "member" in ds[n].dims]
    if variables:
        missing = [v for v in variables if v not in names]
        if missing:
            raise ValueError(f"{where}: no ensemble variable(s) {missing}; it has {names}")
        names = list(variables)
    if not names:
        raise ValueError(f"{where}: no variable with a 'member' dimension (an ensemble forecast was expected)")
    if ds.sizes["member"] < 2:
        raise ValueError(f"{where}: {ds.sizes['member']} member(s); post-processing needs at least 2")
    out = ds[names]
    out.attrs = dict(ds.attrs, forecast_kind="ensemble", source_files=where)
    return out


# -- IMPROVER's CF names -------------------------------------------------------------------------------------
FIELD_ATTR = "smoe__variable"
"""Attribute of a probability variable named in IMPROVER's way: the field's name in a store (``temperature``),
which :func:`store_names` gives it back."""
PROBABILITY_NAME = re.compile(r"probability_of_(?P<field>.+?)_(?P<sense>above|below)_threshold")
"""IMPROVER's name of a probability variable: ``probability_of_<X>_above_threshold`` (``_below_``), X the
field's standard name (or its name where it has none)."""
IMPROVER_TIMES = {"forecast_reference_time": "time", "forecast_period": "prediction_timedelta"}
"""The init and lead dims of IMPROVER's layout (a netCDF of ``smoe postprocess apply``) → this module's names;
IMPROVER's ``time`` is the validity time, init + lead."""


def probability_name(name: str, standard_name: str | None, below: bool) -> str:
    """IMPROVER's name of the probability of exceeding (``below``: of not exceeding) thresholds of the field
    ``name``: ``probability_of_<standard_name or name>_above_threshold`` (``_below_threshold``)."""
    return f"probability_of_{standard_name or name}_{'below' if below else 'above'}_threshold"


def store_names(ds: xr.Dataset, ensemble_dim: str | None = None, where: str = "forecast") -> xr.Dataset:
    """A forecast in IMPROVER's CF names (the files of ``smoe postprocess apply``) in this module's: the dims
    ``forecast_reference_time`` → ``time`` and ``forecast_period`` → ``prediction_timedelta`` (the validity
    ``time`` dropped; :data:`IMPROVER_TIMES`), ``realization`` → ``member`` (unless ``ensemble_dim`` names the
    ensemble dim), ``percentile`` (0–100) → ``quantile`` (0–1) and ``probability_of_<X>_above_threshold`` →
    the field's name (its :data:`FIELD_ATTR`, else X). A store in this module's names is returned unchanged;
    ValueError naming ``where`` (the file) when a renamed probability meets a variable of that name."""
    if "forecast_reference_time" in ds.dims and "time" not in ds.dims:
        ds = ds.drop_vars([v for v in ("time",) if v in ds.variables])
        ds = ds.rename({k: v for k, v in IMPROVER_TIMES.items() if k in ds.variables or k in ds.dims})
    if ensemble_dim is None and "realization" in ds.dims and "member" not in ds.dims:
        ds = ds.rename(realization="member")
    if "percentile" in ds.dims and "quantile" not in ds.dims:
        ds = ds.assign_coords(percentile=ds["percentile"].values / 100.0).rename(percentile="quantile")
    renames = {}
    for n in ds.data_vars:
        m = PROBABILITY_NAME.fullmatch(str(n))
        if m is not None and "threshold" in ds[n].dims:
            renames[n] = str(ds[n].attrs.get(FIELD_ATTR) or m["field"])
    taken = [v for v in renames.values() if v in ds.data_vars or list(renames.values()).count(v) > 1]
    if taken:
        raise ValueError(f"{where}: the probabilities {list(renames)} are of {taken[0]!r}, which it holds twice "
                         "(a variable of that name, or two probabilities of it); expected one per field: keep one "
                         "of them in this file")
    return ds.rename(renames) if renames else ds


ENSEMBLE_DIMS = ("member", "realization", "number", "ensemble")
"""Names of an ensemble dimension found in forecast stores (WB2 writes ``realization``, ECMWF ``number``);
:func:`open_forecast` renames the one it finds to ``member``."""


def _ensemble_dim(ds: xr.Dataset, where: str, ensemble_dim: str | None) -> str | None:
    """The ensemble dim of ``ds``: ``ensemble_dim`` if given (ValueError when absent), else the one of
    :data:`ENSEMBLE_DIMS` it has (ValueError naming them when several), else None."""
    if ensemble_dim is not None:
        if ensemble_dim not in ds.dims:
            raise ValueError(f"forecast {where}: --ensemble-dim {ensemble_dim!r} is not one of its dims "
                             f"{list(ds.dims)}")
        if ensemble_dim in ("time", "prediction_timedelta", "latitude", "longitude", "level") or (
                ensemble_dim != "member" and "member" in ds.dims):
            why = "the forecast has a member dim" if "member" in ds.dims else "that is a coordinate axis"
            raise ValueError(f"forecast {where}: --ensemble-dim {ensemble_dim!r} cannot be its ensemble dim ({why}); "
                             "name the dim of its members, or leave --ensemble-dim out")
        return ensemble_dim
    found = [d for d in ENSEMBLE_DIMS if d in ds.dims]
    if len(found) > 1:
        raise ValueError(f"forecast {where}: several dims could be its ensemble ({found}); name it with "
                         "--ensemble-dim")
    return found[0] if found else None


def open_forecast(path: str | Path, storage_options: dict[str, Any] | None = None,
                  ensemble_dim: str | None = None) -> xr.Dataset:
    """Any forecast store of :data:`FORECAST_KINDS` (zarr directory or netCDF, local or an fsspec URL),
    latitude ascending, longitude in [0, 360), its ensemble dim (any of :data:`ENSEMBLE_DIMS`, or
    ``ensemble_dim``, in any position) named ``member``, IMPROVER's names read as this module's
    (:func:`store_names`); a forecast file in another layout (SEAS5-like) opens as its ensemble. ValueError
    naming the file if not a forecast; FileNotFoundError if missing."""
    where = str(path)
    if not is_url(path) and not Path(path).exists():
        raise FileNotFoundError(f"forecast {path} does not exist")
    ds = store_names(_open_any(path, storage_options), ensemble_dim, f"forecast {where}")  # IMPROVER's names
    if (not is_url(path) and "prediction_timedelta" not in ds.dims
            and any(m in ds.dims for m in MEMBER_NAMES)):
        ds = open_ensemble(Path(path))
    dim = _ensemble_dim(ds, where, ensemble_dim)
    if dim is not None and dim != "member":
        ds = ds.rename({dim: "member"})
    for d in ("time", "prediction_timedelta", "latitude", "longitude"):
        if d not in ds.dims:
            raise ValueError(f"forecast {where}: missing dim {d!r} (WeatherBench 2 layout: time = init, "
                             f"prediction_timedelta, latitude, longitude); got {dict(ds.sizes)}")
    check_unique_times(ds, f"forecast {where}")
    ds = ds.assign_coords(longitude=np.mod(ds["longitude"], 360.0))
    ds = ds.sortby(["latitude", "longitude"])
    forecast_kind(ds, where)  # refuses an attribute the data contradicts, before anything is computed
    return ds


def _kind_from_data(ds: xr.Dataset) -> str:
    if "threshold" in ds.dims:
        return "probability"
    if "member" in ds.dims:
        return "ensemble"
    if "quantile" in ds.dims:
        return "quantiles"
    names = [str(n) for n in ds.data_vars if not str(n).endswith(STD_SUFFIX)]
    if any(f"{n}{STD_SUFFIX}" in ds.data_vars for n in names):
        return "gaussian"
    return "deterministic"


def forecast_kind(ds: xr.Dataset, where: str = "forecast") -> str:
    """The kind the data holds (a ``threshold`` dim: probability of exceeding (or, with the attribute
    ``spp__relative_to_threshold``, falling below) each threshold; a ``member`` dim: ensemble; ``quantile``:
    quantiles; a ``<name>`` with a ``<name>_std``: gaussian; else deterministic). An ``attrs["forecast_kind"]``
    that contradicts it is refused
    by name: the data is never overridden silently."""
    kind = _kind_from_data(ds)
    declared = ds.attrs.get("forecast_kind")
    if declared is not None and declared not in FORECAST_KINDS:
        raise ValueError(f"{where}: attribute forecast_kind={declared!r} is not one of {FORECAST_KINDS}")
    if declared is not None and declared != kind:
        raise ValueError(f"{where}: attribute forecast_kind={declared!r} contradicts the data, which holds a(n) "
                         f"{kind} forecast (dims {list(ds.dims)}); remove or correct the attribute")
    return kind


def _ens10_truth(ds: xr.Dataset, where: str) -> xr.Dataset:
    """``<name>_truth`` on init times of an ENS-10 store → truth on valid times (``time`` = init + lead)."""
    names = [n for n in ds.data_vars if str(n).endswith(TRUTH_SUFFIX)]
    if not names:
        raise ValueError(f"{where}: no <name>{TRUTH_SUFFIX} variable (prepare ens10 with --truth, or pass a truth)")
    lead = _ens10_lead(ds, where)
    out = ds[names].rename({n: str(n)[: -len(TRUTH_SUFFIX)] for n in names})
    out = out.drop_vars([c for c in out.coords if c not in out.dims])
    return out.assign_coords(time=ds["time"].values.astype("datetime64[ns]") + lead).sortby("latitude")


def _open_one_truth(path: Path | None, forecast_path: Path) -> xr.Dataset:
    src = path if path is not None else forecast_path
    ds = _open_any(src)
    if _is_ens10_store(ds):
        return _ens10_truth(ds, str(src))
    if any(m in ds.dims for m in MEMBER_NAMES) or path is None:
        try:
            return open_forecast_truth(src)
        except ValueError as err:
            if path is None:
                raise ValueError(f"{err}; pass --truth STORE (a store with the fields at the valid times)") from err
            raise
    if "time" not in ds.dims:
        raise ValueError(f"truth {src}: no 'time' dimension (valid times expected)")
    return ds.sortby("latitude") if "latitude" in ds.dims else ds


def open_truth(path: Sources | None, forecast_path: Sources | None = None) -> xr.Dataset:
    """Truth on ``time`` = valid time: from ``path`` (a canonical store, or a forecast file holding its truth),
    or, when ``path`` is None, from the forecast file(s) ``forecast_path`` themselves (gcm_ens
    ``truth_<name>``, SEAS5 ``<name>_era5``, ENS-10 store ``<name>_truth``). Several files: their truths are
    merged; a valid time held by two files must hold the same values."""
    if path is not None:
        parts = [_open_one_truth(p, p) for p in _paths(path)]
    elif forecast_path is not None:
        parts = [_open_one_truth(None, p) for p in _paths(forecast_path)]
    else:
        raise ValueError("no truth given: pass a truth store or the forecast file that holds its truth")
    if len(parts) == 1:
        return parts[0]
    out = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override",
                    join="override", combine_attrs="drop_conflicts")
    t = pd.Index(out["time"].values)
    if t.has_duplicates:
        out = out.isel(time=~t.duplicated())
    return out.sortby("time")


STATIC_FIELDS = {"land_sea_mask": ("land_sea_mask", "lsm", "land_sea"),
                 "orography": ("geopotential_at_surface", "orography", "z_surface", "surface_geopotential")}
"""Static inputs read from a file, each with the variable names it may have there."""


def open_static(source: Sources, names: Sequence[str]) -> xr.Dataset:
    """Static (latitude, longitude) fields ``names`` (keys of :data:`STATIC_FIELDS`) from the first file of
    ``source`` that holds them (latitude ascending). ValueError naming the files when one is missing."""
    out = {}
    opened = [_open_any(p) for p in _paths(source)]  # each file once, whatever the number of fields
    for name in names:
        if name not in STATIC_FIELDS:
            raise ValueError(f"unknown static field {name!r}; expected one of {sorted(STATIC_FIELDS)} or 'latitude'")
        found = next(((ds, v) for ds in opened for v in STATIC_FIELDS[name]
                      if v in ds.variables and set(ds[v].dims) >= {"latitude", "longitude"}), None)
        if found is None:
            raise ValueError(f"no static field {name!r} (any of {STATIC_FIELDS[name]}) on latitude/longitude in "
                             f"{[str(p) for p in _paths(source)]}; set data.constants to a file that has it")
        da = found[0][found[1]].sortby("latitude")
        extra = [d for d in da.dims if d not in ("latitude", "longitude")]
        out[name] = da.isel({d: 0 for d in extra}, drop=True).astype(np.float64)
    return xr.Dataset(out)


# -- truth at valid times ------------------------------------------------------------------------------------
def truth_at_valid_times(forecast: xr.Dataset | xr.DataArray, truth: X,
                         gaps: Literal["raise", "nan"] = "raise") -> X:
    """``truth`` (on valid ``time``) at init + lead for every (time, prediction_timedelta) of ``forecast``.

    ``forecast``: anything with ``time`` (init) and ``prediction_timedelta`` coordinates; when it is a Dataset
    with variables, the truth's variables of those names are taken, and on the dims it has (``level``,
    ``latitude``, ``longitude``) the truth is cut to its values. Gap policy (module doc): ``gaps="raise"``
    ValueError naming the valid times the truth lacks; ``gaps="nan"`` NaN there.
    """
    if isinstance(truth, xr.Dataset) and isinstance(forecast, xr.Dataset) and forecast.data_vars:
        missing = [n for n in forecast.data_vars if n not in truth.data_vars]
        if missing:
            raise ValueError(f"truth has no variable(s) {missing} (it has {list(truth.data_vars)})")
        truth = truth[list(forecast.data_vars)]
    valid = forecast["time"] + forecast["prediction_timedelta"]  # (time, prediction_timedelta)
    needed = np.unique(valid.values)
    t = truth.rename(time="valid_time")
    if gaps == "raise":
        lacking = pd.DatetimeIndex(needed).difference(pd.DatetimeIndex(truth["time"].values))
        if len(lacking):
            raise ValueError(f"truth lacks {len(lacking)} valid time(s), first {[str(x) for x in lacking[:3]]}; "
                             "expected truth at every init + lead of the forecast")
    elif gaps == "nan":
        t = t.reindex(valid_time=needed)
    else:
        raise ValueError(f"gaps must be 'raise' or 'nan', got {gaps!r}")
    out = t.sel(valid_time=valid).drop_vars("valid_time")
    for dim in ("latitude", "longitude", "level"):
        if dim in forecast.dims:
            if dim not in out.dims:
                raise ValueError(f"truth has no {dim!r} dimension that the forecast has")
            try:
                out = out.sel({dim: forecast[dim].values})
            except KeyError as err:
                raise ValueError(f"truth {dim} does not contain the forecast's {dim} values ({err})") from err
    return out.assign_coords({d: forecast[d] for d in ("latitude", "longitude") if d in forecast.dims})


# -- periods and splits --------------------------------------------------------------------------------------
def select_period(ds: X, period: Sequence[Any] | None, invert: bool = False) -> X:
    """Init times in [start, end] (inclusive; years like 2003 mean the whole year); ``invert``: outside."""
    if period is None:
        return ds
    start, end = (str(p) for p in period)
    t = pd.DatetimeIndex(ds["time"].values)
    lo = pd.Timestamp(start)
    hi = pd.Timestamp(f"{end}-12-31T23:59:59") if end.isdigit() and len(end) == 4 else pd.Timestamp(end)
    inside = (t >= lo) & (t <= hi)
    keep = ~inside if invert else inside
    if not keep.any():
        what = "outside" if invert else "inside"
        raise ValueError(f"no initialisation time {what} the period {start}..{end} "
                         f"(forecast inits {t.min()}..{t.max()})")
    return ds.isel(time=np.flatnonzero(keep))


def split_times(times: np.ndarray, max_lead_h: int, years: Sequence[Any] | None = None,
                period: Sequence[Any] | None = None) -> np.ndarray:
    """Indices of the initialisation ``times`` in a split: init year within ``years`` (inclusive) and, with
    ``period`` [start, end], init ≥ start and valid time init + ``max_lead_h`` ≤ end (so the truths of
    adjacent splits never overlap)."""
    t = np.asarray(times).astype("datetime64[ns]")
    keep = np.ones(len(t), bool)
    if years is not None:
        y = t.astype("datetime64[Y]").astype(int) + 1970
        keep &= (y >= int(years[0])) & (y <= int(years[-1]))
    if period is not None:
        start, end = (np.datetime64(str(p)).astype("datetime64[ns]") for p in period)
        keep &= (t >= start) & (t + np.timedelta64(int(max_lead_h), "h") <= end)
    return np.flatnonzero(keep)


def select_split(forecast: xr.Dataset, truth: xr.Dataset, leads_h: Sequence[int], targets: Sequence[str],
                 split: str, years: Sequence[Any] | None = None, period: Sequence[Any] | None = None,
                 where: str = "") -> tuple[xr.Dataset, xr.Dataset]:
    """(forecast cut to the ``split``'s inits (:func:`split_times` with the longest of ``leads_h``), the truth
    of the ``targets`` variables at its valid times). ``truth`` is on valid times (:func:`open_truth`)."""
    keep = split_times(forecast["time"].values, max(leads_h), years, period)
    if len(keep) == 0:
        raise ValueError(f"{where}: no initialisation time in the {split} split (years {years}, period {period})")
    fc = forecast.isel(time=keep)
    return fc, truth_at_valid_times(fc[list(dict.fromkeys(targets))], truth)


# -- writing -------------------------------------------------------------------------------------------------
COORD_ATTRS = {
    "time": {"long_name": "initialisation time", "standard_name": "forecast_reference_time"},
    "prediction_timedelta": {"long_name": "lead time", "standard_name": "forecast_period"},
    "latitude": {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude"},
    "longitude": {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude"},
    "level": {"units": "hPa", "long_name": "pressure level", "standard_name": "air_pressure"},
    "member": {"long_name": "ensemble member"},
    "quantile": {"long_name": "probability level of the predictive quantile", "units": "1"},
}
"""CF attributes every forecast store's coordinates get (where they do not have their own)."""


def gaussian_dataset(mu: xr.Dataset, sigma: xr.Dataset) -> xr.Dataset:
    """μ (``<name>``) and σ (``<name>_std``) of every variable of ``mu`` in one Dataset (float32)."""
    ds = xr.Dataset()
    for n in mu.data_vars:
        ds[n] = mu[n].astype(np.float32).assign_attrs(mu[n].attrs)
        ds[n + STD_SUFFIX] = sigma[n].astype(np.float32).assign_attrs(
            {**mu[n].attrs, "long_name": f"{mu[n].attrs.get('long_name', n)} (predictive standard deviation)"})
    return ds


def split_gaussian(ds: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """(μ, σ) Datasets of a ``gaussian`` store (``<name>`` and ``<name>_std``)."""
    names = [n for n in ds.data_vars if not str(n).endswith(STD_SUFFIX) and f"{n}{STD_SUFFIX}" in ds.data_vars]
    if not names:
        raise ValueError("not a gaussian forecast store: no <name> / <name>_std variable pair")
    return ds[names], ds[[f"{n}{STD_SUFFIX}" for n in names]].rename({f"{n}{STD_SUFFIX}": n for n in names})


def store_dataset(ds: xr.Dataset, kind: str, attrs: dict[str, Any] | None = None) -> xr.Dataset:
    """``ds`` as a forecast store of ``forecast_kind`` = ``kind`` (:data:`FORECAST_KINDS`) holds it, lazily.

    Floating variables as float32, CF attributes on the coordinates (:data:`COORD_ATTRS`), ``Conventions``,
    ``code_version`` and ``created_utc`` unless given; attrs that are None are dropped, non-scalars written as
    strings; the source's codecs (CF packing) are not carried over. ValueError for another kind or a Dataset
    without the forecast dims.
    """
    if kind not in FORECAST_KINDS:
        raise ValueError(f"forecast_kind must be one of {FORECAST_KINDS}, got {kind!r}")
    missing = [d for d in ("time", "prediction_timedelta") if d not in ds.dims]
    if missing or not ({"latitude", "longitude"} <= set(ds.dims) or "site" in ds.dims):
        raise ValueError(f"a {kind} forecast store needs dims time, prediction_timedelta and latitude/longitude "
                         f"(or site); got {dict(ds.sizes)}")
    ds = ds.copy()
    for n in ds.data_vars:
        if np.issubdtype(ds[n].dtype, np.floating):
            ds[n] = ds[n].astype(np.float32)
    for c, cf in COORD_ATTRS.items():
        if c in ds.coords:
            ds[c].attrs = {**cf, **ds[c].attrs}
    given = {k: (v if isinstance(v, str | int | float) else str(v)) for k, v in {**ds.attrs, **(attrs or {})}.items()
             if v is not None}
    ds.attrs = {"Conventions": "CF-1.8", "code_version": code_version(),
                "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                **given, "forecast_kind": kind}
    for v in ds.variables.values():
        v.encoding = {}
    return ds


def write_store(ds: xr.Dataset, out: str | Path, kind: str, attrs: dict[str, Any] | None = None,
                overwrite: bool = False, time_chunk: int | None = 1) -> Path:
    """Write :func:`store_dataset` of ``ds`` atomically: ``*.nc``/``*.nc4`` as netCDF, anything else as zarr
    (format 2, consolidated, ``time_chunk`` inits per chunk, None = one chunk)."""
    ds = store_dataset(ds, kind, attrs)
    out = Path(out)
    if out.suffix in (".nc", ".nc4"):
        return write_netcdf(ds, out, overwrite=overwrite)
    with atomic_path(out, overwrite=overwrite) as tmp:
        if time_chunk is not None:
            ds = ds.chunk({"time": time_chunk})
        ds.to_zarr(tmp, mode="w", consolidated=True, zarr_format=2)  # format 2, as the prepared stores
    return out
