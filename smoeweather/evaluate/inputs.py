"""The inputs of ``smoe evaluate``, opened and aligned: forecasts (local or fsspec URLs, the ensemble dim found by
name) and truth on one grid, the fields, initialisations and leads they share, the reference forecasts
(persistence, climatology), the climatology at the valid times (mean, quantile thresholds, event probabilities),
regions and the event thresholds of the Brier scores. :mod:`smoeweather.evaluate` scores what this module opens."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.plausibility import check_plausible
from smoeweather.data.forecast_stores import (
    STD_SUFFIX,
    check_grid,
    describe,
    forecast_kind,
    is_forecast_file,
    is_url,
    lead_hours,
    open_canonical,
    open_forecast,
    open_truth,
)
from smoeweather.data.weather import Field, field_name
from smoeweather.metrics.regions import Region, parse_regions, region_weights
from smoeweather.units import Quantity, convert, convert_threshold_coord, units_of, values_in

Source = str | Path
SAME_THRESHOLD = float(np.finfo(np.float32).eps)  # thresholds closer (relative) than float32 rounding: one event


def relative_to_threshold(ds: xr.Dataset, name: str) -> str:
    """How the probabilities of ``ds[name]`` are meant: its ``spp__relative_to_threshold``, else its threshold
    coordinate's (IMPROVER's place for it), else exceedance (``greater_than``)."""
    coord = ds["threshold"].attrs if "threshold" in ds.coords else {}
    return str(ds[name].attrs.get("spp__relative_to_threshold", coord.get("spp__relative_to_threshold"))
               or "greater_than")


def add_thresholds(have: set[float], values: np.ndarray) -> None:
    """Add ``values`` to the event thresholds ``have``, but not one within float32 rounding of one there (a
    store's float32 270.3, 270.29998779..., is the event 270.3 given)."""
    have.update(t for t in map(float, values) if not any(abs(t - u) <= SAME_THRESHOLD * abs(u) for u in have))


def at_thresholds(p: xr.DataArray, thresholds: xr.DataArray) -> xr.DataArray:
    """A probability forecast ``p`` at the event ``thresholds`` (its own float32 thresholds matched within
    rounding; NaN at a threshold it lacks)."""
    return p.sortby("threshold").reindex(threshold=thresholds.values, method="nearest",
                                         tolerance=SAME_THRESHOLD * float(np.abs(thresholds).max()))


@dataclass
class Inputs:
    """The aligned inputs of one evaluation: forecasts by method name, their kinds, the truth and the axes."""

    paths: dict[str, str]
    forecasts: dict[str, xr.Dataset]
    kinds: dict[str, str]
    truth: xr.Dataset
    truth_in_file: bool
    where_truth: str
    fields: list[Field]
    inits: np.ndarray
    leads: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)


def open_truth_source(truth: Source | Sequence[Source], storage_options: dict[str, Any] | None = None
                      ) -> tuple[xr.Dataset, bool]:
    """(truth Dataset on valid times, whether it came from inside a forecast file).

    A single local forecast file with an ensemble dim (gcm_ens, SEAS5) gives the truth it holds; anything
    else opens as a prepared store or canonical file(s), local or at an fsspec URL."""
    if isinstance(truth, str | Path) and not is_url(truth) and is_forecast_file(truth):
        ds = open_truth(truth)
        ds = ds.assign_coords(longitude=np.mod(ds["longitude"], 360.0))
        return ds.sortby(["latitude", "longitude"]), True
    return open_canonical(truth, storage_options, where=f"truth {describe(truth)}", role="the truth",
                          fix="give --truth the analysis or prepared store the forecasts are scored against (e.g. "
                              "the --data store of `smoe forecast`)"), False


def method_name(ds: xr.Dataset, path: str) -> str:
    """The method name of the forecast ``ds`` read from ``path``: its ``method`` attribute without control
    characters (:func:`smoeweather.io.printable`), else the file name's stem. ValueError naming the file for an
    attribute that is empty, ``.`` or ``..`` once printable (it names the output folder wb2/METHOD)."""
    from smoeweather.io import printable

    given = ds.attrs.get("method")
    if given is None or given == "":
        return Path(str(path).rstrip("/")).stem
    name = printable(str(given)).strip()
    if name.strip(".") == "":
        raise ValueError(f"{path}: its method attribute {name!r} cannot name a method (empty, '.' or '..'); "
                         f"name it on the command line instead: NAME={path}")
    return name


def _named(forecasts: Mapping[str, Source] | Source | Sequence[Source], storage_options: dict[str, Any] | None,
           ensemble_dim: str | None) -> dict[str, tuple[str, xr.Dataset]]:
    """{method name: (path, opened forecast)}; names from the mapping, ``attrs["method"]`` or the file name."""
    if isinstance(forecasts, Mapping):
        items = [(str(k), str(v)) for k, v in forecasts.items()]
    else:
        paths = [forecasts] if isinstance(forecasts, str | Path) else list(forecasts)
        items = [(None, str(p)) for p in paths]
    out: dict[str, tuple[str, xr.Dataset]] = {}
    for name, p in items:
        ds = open_forecast(p, storage_options, ensemble_dim)
        stem = Path(p.rstrip("/")).stem
        name = name or method_name(ds, p)
        if name in out:
            name = f"{name} ({stem})" if f"{name} ({stem})" not in out else p
        out[name] = (p, ds)
    return out


def land_sea_mask_of(source: Source | Sequence[Source] | None, truth_ds: xr.Dataset | None = None
                     ) -> xr.DataArray | None:
    """Land fraction (latitude, longitude) from a store or netCDF (``land_sea_mask`` or ``lsm``), else from the
    truth Dataset; None when neither has one. Only this 2-D constant is loaded."""
    try:
        ds = open_canonical(source) if source is not None else truth_ds
    except (OSError, ValueError) as err:
        raise ValueError(f"--land-sea-mask {source}: not a readable store or netCDF ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:120]})") from None
    if ds is None:
        return None
    name = next((v for v in ("land_sea_mask", "lsm") if v in ds.variables), None)
    if name is None:
        if source is not None:
            raise ValueError(f"--land-sea-mask {describe(source)} has no land_sea_mask or lsm variable")
        return None
    da = ds[name]
    extra = [d for d in da.dims if d not in ("latitude", "longitude")]
    da = da.isel({d: 0 for d in extra}, drop=True)
    return da.astype(np.float64).load()


def _regions_for(regions: Sequence[str | Region] | str, truth_ds: xr.Dataset,
                 land_sea_mask: Source | None, land_threshold: float | None, where: str
                 ) -> tuple[list[Region], xr.DataArray, str | None]:
    """(regions, their area weights, where the land-sea mask came from). The default set falls back to the
    global region alone, with a warning, when no land-sea mask is found; named land/sea regions refuse."""
    specs = [regions] if isinstance(regions, str | Region) else list(regions)
    is_default = [str(s) for s in specs] == ["default"]
    parsed: list[Region] = []
    for s in specs:
        parsed += [s] if isinstance(s, Region) else parse_regions([s])
    lsm, lsm_from = None, None
    if any(r.surface != "all" for r in parsed):
        lsm = land_sea_mask_of(land_sea_mask, truth_ds)
        lsm_from = describe(land_sea_mask) if land_sea_mask is not None else where
        if lsm is None and is_default:
            warnings.warn(f"{where} has no land_sea_mask (give one with --land-sea-mask): scoring the global "
                          "region only", stacklevel=3)
            parsed = [r for r in parsed if r.surface == "all"]
            lsm_from = None
        elif lsm is None:
            raise ValueError(f"--regions {[r.name for r in parsed if r.surface != 'all']} need a land-sea mask: "
                             f"{where} has no land_sea_mask; give one with --land-sea-mask STORE_OR_NC")
        else:
            lsm = lsm.assign_coords(longitude=np.mod(lsm["longitude"], 360.0)).sortby(["latitude", "longitude"])
            check_grid(lsm.to_dataset(name="land_sea_mask"), truth_ds["latitude"].values,
                       truth_ds["longitude"].values, f"land-sea mask {lsm_from}", "the truth's")
    rw = region_weights(parsed, truth_ds["latitude"], truth_ds["longitude"], lsm, land_threshold)
    return parsed, rw, lsm_from


def _select(ds: xr.Dataset, f: Field, var: str | None = None) -> xr.DataArray:
    da = ds[var or f[0]]
    return da.sel(level=f[1], drop=True) if f[1] is not None else da


def _check_extra_dims(ds: xr.Dataset, name: str, where: str) -> None:
    """Refuse a forecast variable with a dim the scores do not know (one-line error naming it)."""
    known = {"time", "prediction_timedelta", "member", "quantile", "threshold", "level", "latitude", "longitude"}
    for v in ds.data_vars:
        if "prediction_timedelta" not in ds[v].dims:  # not a forecast variable (the truth a file holds, ...)
            continue
        extra = [d for d in ds[v].dims if d not in known]
        if extra:
            raise ValueError(f"forecast {where} ({name}): variable {v!r} has dims {extra} that a forecast store "
                             f"does not have (expected {sorted(known)}); select or rename them first")


def _common_fields(fcs: dict[str, xr.Dataset], truth_ds: xr.Dataset, where_truth: str) -> list[Field]:
    """The forecast fields that the truth holds (warning for the others; ValueError if none)."""
    from smoeweather.forecast.output import forecast_fields

    fields: list[Field] = list(dict.fromkeys(f for ds in fcs.values() for f in forecast_fields(ds)))
    levels = [int(v) for v in truth_ds["level"].values] if "level" in truth_ds.dims else []
    in_truth = [f for f in fields if f[0] in truth_ds.data_vars and (f[1] is None or f[1] in levels)]
    if len(in_truth) < len(fields):
        warnings.warn(f"{where_truth} lacks {[field_name(f) for f in fields if f not in in_truth]}: not scored",
                      stacklevel=3)
    if not in_truth:
        raise ValueError(f"{where_truth} holds none of the forecast fields {[field_name(f) for f in fields]}")
    for f in in_truth:
        if "member" in truth_ds[f[0]].dims:
            raise ValueError(f"{where_truth}: {f[0]!r} has a member dim; the truth must be deterministic")
    return in_truth


def _common_times(fcs: dict[str, xr.Dataset], truth_ds: xr.Dataset, where_truth: str, names: list[str]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(initialisations every forecast has, the union of their leads); ValueError when they share none or no
    valid time lies in the truth."""
    inits = np.array(sorted(set.intersection(*(set(ds["time"].values.astype("datetime64[ns]").tolist())
                                               for ds in fcs.values()))), dtype="datetime64[ns]")
    if len(inits) == 0:
        raise ValueError(f"the forecasts {names} share no initialisation time (coordinate 'time')")
    leads = np.unique(np.concatenate([ds["prediction_timedelta"].values.astype("timedelta64[ns]")
                                      for ds in fcs.values()]))
    tt = truth_ds["time"].values
    valid = inits[:, None] + leads[None, :]
    if not np.isin(valid, tt).any():
        raise ValueError(
            f"no valid time (time + prediction_timedelta) of the forecasts ({str(valid.min())[:16]} .. "
            f"{str(valid.max())[:16]}) lies in the time coordinate of {where_truth} "
            f"({str(tt.min())[:16]} .. {str(tt.max())[:16]})")
    return inits, leads


def open_inputs(forecasts: Mapping[str, Source] | Source | Sequence[Source], truth: Source | Sequence[Source],
                storage_options: dict[str, Any] | None = None, ensemble_dim: str | None = None,
                plausibility_check: bool = True) -> Inputs:
    """Open forecasts and truth (local or fsspec URLs), check grids and dims (and, with ``plausibility_check``,
    the values: :func:`pipelines.plausibility.check_plausible`), and find the common fields, initialisations
    and leads."""
    named = _named(forecasts, storage_options, ensemble_dim)
    if not named:
        raise ValueError("evaluate needs at least one forecast")
    truth_ds, in_file = open_truth_source(truth, storage_options)
    where_truth = f"truth {describe(truth)}"
    check_plausible({where_truth: truth_ds, **{f"forecast {p}": ds for p, ds in named.values()}}, plausibility_check)
    fcs = {n: ds for n, (_, ds) in named.items()}
    for n, (p, ds) in named.items():
        _check_extra_dims(ds, n, p)
        check_grid(ds, truth_ds["latitude"].values, truth_ds["longitude"].values, f"forecast {p}", "the truth's")
    fields = _common_fields(fcs, truth_ds, where_truth)
    inits, leads = _common_times(fcs, truth_ds, where_truth, list(named))
    kinds = {n: forecast_kind(ds, named[n][0]) for n, ds in fcs.items()}
    # every forecast in the truth's units (the units of the scores): converted with a note, a mismatch refused
    fcs = {n: align_forecast(ds, kinds[n], truth_ds, [f[0] for f in fields], f"forecast {named[n][0]}",
                             where_truth) for n, ds in fcs.items()}
    return Inputs(paths={n: p for n, (p, _) in named.items()}, forecasts=fcs, kinds=kinds, truth=truth_ds,
                  truth_in_file=in_file, where_truth=where_truth, fields=fields, inits=inits, leads=leads)


def add_persistence(inp: Inputs, truth: Source | Sequence[Source]) -> None:
    """Add persistence (from the truth) as a method for the same leads, in place; it limits the
    initialisations to those the truth holds."""
    from smoeweather.forecast import make_forecast

    if "persistence" in inp.forecasts:
        return
    ref_inits = inp.inits[np.isin(inp.inits, inp.truth["time"].values)]
    if not len(ref_inits):
        warnings.warn(f"{inp.where_truth} holds none of the initialisation times: no persistence", stacklevel=3)
        return
    inp.forecasts["persistence"] = make_forecast(truth, ref_inits, method="persistence", leads_h=lead_hours(inp.leads),
                                                 fields=[field_name(f) for f in inp.fields], beyond_data=True,
                                                 progress=False, plausibility_check=False)  # open_inputs checked
    inp.kinds["persistence"] = "deterministic"
    inp.inits = ref_inits


def add_climatology_reference(inp: Inputs, truth: Source | Sequence[Source], climatology: Source,
                              climatology_years: tuple[int, int] | None, clim_means: dict[Field, xr.DataArray],
                              clim_kind: str | None) -> None:
    """Add the climatology forecast (the climatological mean at every valid time) as a method, in place."""
    from smoeweather.forecast import make_forecast

    if "climatology" in inp.forecasts:
        return
    if clim_kind == "wb2":
        inp.forecasts["climatology"] = _fields_dataset(clim_means)
    else:
        ref = make_forecast(truth, inp.inits, method="climatology", leads_h=lead_hours(inp.leads),
                            fields=[field_name(f) for f in inp.fields], climatology_from=str(climatology),
                            climatology_years=climatology_years, beyond_data=True, progress=False,
                            plausibility_check=False)  # the truth: checked by open_inputs
        store = open_canonical(climatology)
        for f in dict.fromkeys(f[0] for f in inp.fields):  # values of the store, in the truth's units
            ref[f] = convert(ref[f], units_of(inp.truth[f]), f, f"--climatology {climatology}", inp.where_truth,
                             have=climatology_units(store, f), quiet=True)
        inp.forecasts["climatology"] = ref
    inp.kinds["climatology"] = "deterministic"


def _fields_dataset(per_field: dict[Field, xr.DataArray]) -> xr.Dataset:
    """{(name, level): (time, lead, lat, lon)} → a deterministic forecast Dataset (``level`` dim where needed)."""
    by_name: dict[str, list[xr.DataArray]] = {}
    for (name, level), da in per_field.items():
        by_name.setdefault(name, []).append(da if level is None else da.expand_dims(level=[level], axis=2))
    data = {n: (xr.concat(das, "level") if "level" in das[0].dims else das[0]) for n, das in by_name.items()}
    return xr.Dataset(data, attrs={"forecast_kind": "deterministic", "method": "climatology"})


def climatology_inputs(climatology: Source | None, fields: Sequence[Field], years: tuple[int, int] | None,
                       inits: np.ndarray, leads: np.ndarray, quantiles: Sequence[float],
                       storage_options: dict[str, Any] | None = None, truth: Inputs | None = None
                       ) -> tuple[dict[Field, xr.DataArray], dict[Field, xr.DataArray], str | None]:
    """({field: climatological mean at the valid times (time, lead, lat, lon)}, {field: climatological quantile
    thresholds (quantile, time, lead, lat, lon)}, kind: ``"wb2"`` for a WB2 climatology zarr (dims
    ``dayofyear``, ``hour``), ``"store"`` for a training store (31-day day-of-year window), None without).
    ``truth``: the inputs whose truth's units the means and thresholds are converted to (noted; a mismatch
    refused, :mod:`smoeweather.units`)."""
    from smoeweather.forecast.climatology import (
        climatology_at,
        doy_climatology,
        doy_quantiles,
        is_wb2_climatology,
        wb2_climatology_at,
    )
    from smoeweather.forecast.reference import training_fields

    if climatology is None:
        return {}, {}, None
    vt = xr.DataArray(inits[:, None] + leads[None, :], dims=("time", "prediction_timedelta"),
                      coords={"time": inits, "prediction_timedelta": leads})
    q = np.asarray(quantiles, np.float64)
    ds = open_canonical(climatology, storage_options) if is_url(climatology) or Path(climatology).is_dir() else None
    if ds is not None and is_wb2_climatology(ds):
        where = f"--climatology {climatology}"
        means, thresholds = {}, {}
        for f in fields:
            sub = ds.sel(level=f[1], drop=True) if f[1] is not None and "level" in ds.dims else ds
            means[f] = wb2_climatology_at(sub, f[0], vt, where).load()
            if len(q) and f"{f[0]}_quantile" in sub.data_vars:
                thresholds[f] = wb2_climatology_at(sub, f[0], vt, where, q).transpose("quantile", ...).load()
        return _in_truth_units(means, ds, truth, where), _in_truth_units(thresholds, ds, truth, where), "wb2"
    means, thresholds = {}, {}
    for f, da in training_fields(str(climatology), fields, years).items():
        means[f] = climatology_at(doy_climatology(da), vt, f"climatology of {field_name(f)} from {climatology}"
                                  ).astype(np.float64)
        if len(q):
            thresholds[f] = doy_quantiles(da, q, vt)
    if truth is not None and (means or thresholds):
        store, where = open_canonical(climatology, storage_options), f"--climatology {climatology}"
        means, thresholds = _in_truth_units(means, store, truth, where), _in_truth_units(thresholds, store, truth,
                                                                                         where)
    return means, thresholds, "store"


def climatology_units(ds: xr.Dataset, name: str) -> str:
    """The units of the climatology's ``name`` (a WB2 climatology's ``name_mean`` where ``name`` is absent)."""
    var = name if name in ds.variables else f"{name}_mean"
    return units_of(ds[var]) if var in ds.variables else ""


def _in_truth_units(per_field: dict[Field, xr.DataArray], clim: xr.Dataset, inp: Inputs | None, where: str
                    ) -> dict[Field, xr.DataArray]:
    """{field: values of the climatology ``clim`` (``where``)} in the units of ``inp``'s truth."""
    if inp is None:
        return per_field
    return {f: convert(da, units_of(inp.truth[f[0]]), f[0], where, inp.where_truth, have=climatology_units(clim, f[0]))
            for f, da in per_field.items()}


def event_thresholds(inp: Inputs, given: Mapping[str, Sequence[float | Quantity]] | None
                     ) -> dict[Field, np.ndarray]:
    """{field: sorted thresholds (units of the truth's field)} whose exceedance is scored: those of the probability
    forecasts (their ``threshold`` coordinate, for the fields and levels they hold) and those ``given`` by field
    name (``--thresholds``; a value with units converted to the truth's); a field neither names has none."""
    given = dict(given or {})
    names = {field_name(f): f for f in inp.fields}
    unknown = [k for k in given if k not in names]
    if unknown:
        raise ValueError(f"--thresholds names unknown field(s) {unknown}; the forecasts' fields are {list(names)}")
    from smoeweather.forecast.output import forecast_fields

    out: dict[Field, set[float]] = {
        names[k]: set(values_in(v, units_of(inp.truth[names[k][0]]), k, "--thresholds", inp.where_truth).tolist())
        for k, v in given.items()}
    for m, ds in inp.forecasts.items():
        if inp.kinds[m] != "probability":
            continue
        held = set(forecast_fields(ds))  # (variable, level): a store of temperature_850 is no temperature_500
        for f in inp.fields:
            if f in held:
                add_thresholds(out.setdefault(f, set()), ds["threshold"].values)
    return {f: np.array(sorted(v)) for f, v in out.items() if v}


def climatological_probabilities(climatology: Source | None, events: dict[Field, np.ndarray],
                                 years: tuple[int, int] | None, inits: np.ndarray, leads: np.ndarray,
                                 clim_kind: str | None, truth: Mapping[str, str] | None = None
                                 ) -> dict[Field, xr.DataArray]:
    """{field: probability of each event in the training store's day-of-year window at the valid times}
    (threshold, time, lead, lat, lon); empty without a training-store climatology (a WB2 climatology holds no
    samples to count). ``truth``: {variable: the truth's units} the events are in (the samples converted)."""
    from smoeweather.forecast.climatology import doy_exceedance
    from smoeweather.forecast.reference import training_fields

    if climatology is None or clim_kind != "store" or not events:
        return {}
    vt = xr.DataArray(inits[:, None] + leads[None, :], dims=("time", "prediction_timedelta"),
                      coords={"time": inits, "prediction_timedelta": leads})
    store, where = open_canonical(climatology), f"--climatology {climatology}"
    truth = truth or {}
    return {f: doy_exceedance(convert(da, truth.get(f[0], ""), f[0], where, "the truth",
                                      have=climatology_units(store, f[0]), quiet=True) if truth else da,
                              events[f], vt)
            for f, da in training_fields(str(climatology), list(events), years).items()}


def align_forecast(ds: xr.Dataset, kind: str, truth: xr.Dataset, variables: Sequence[str], where: str,
                   truth_where: str) -> xr.Dataset:
    """A forecast ``ds`` of ``kind`` (``smoeweather.data.forecast_stores.FORECAST_KINDS``) with each of ``variables``
    it holds in the units of ``truth``'s: values (members, quantiles, μ) as values, a Gaussian's ``<name>_std``
    as a spread, a probability forecast's ``threshold`` coordinate as values; noted, a mismatch refused."""
    out = ds
    for v in dict.fromkeys(variables):
        if v not in ds.data_vars or v not in truth.data_vars:
            continue
        want = units_of(truth[v])
        if kind == "probability":
            if "threshold" in ds.coords:
                out = convert_threshold_coord(out, want, v, where, truth_where)
            continue
        have = units_of(ds[v])
        out = out.assign({v: convert(ds[v], want, v, where, truth_where)})
        std = f"{v}{STD_SUFFIX}"
        if kind == "gaussian" and std in ds.data_vars:
            out = out.assign({std: convert(ds[std], want, v, where, truth_where, spread=True,
                                           have=units_of(ds[std]) or have, quiet=True)})
    return out
