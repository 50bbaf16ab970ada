"""``smoe evaluate``: score forecast stores against a truth store, references beside the models.

Orchestration above :mod:`smoeweather.metrics` (pure xarray), in small steps: open and align the inputs
(:func:`open_inputs`), add the reference forecasts (:func:`add_references`), the climatology at the valid times
(:func:`climatology_inputs`), score every (method, field) (:func:`score_field`), and join the results with
xarray (:func:`assemble`) into ONE tidy ``xarray.Dataset`` over (method, field, prediction_timedelta [, region])
with one variable per metric. scores.json, scores.md and WeatherBench 2's evaluation files are rendered from it
(:mod:`smoeweather.evaluate_files`).

Every forecast is matched with the truth at its VALID time ``time + prediction_timedelta``; all methods are scored
on the same initialisations (those common to every forecast). Weights are WeatherBench 2's cell areas
(:func:`~smoeweather.metrics.wb2.cell_area_weights`). Scores per (method, field, lead): ``rmse`` — the square root
AFTER the mean over initialisations, √(mean_t MSE_t), i.e. √ of WB2's ``mse``; WB2's
``rmse_sqrt_before_time_avg`` (mean_t √MSE_t, never larger) is in WB2's ``deterministic_temporal`` file per
initialisation — and bias, ACC, fair and ECDF CRPS, spread–skill, debiased ensemble-mean MSE, energy score,
pinball loss by forecast kind (:mod:`smoeweather.metrics.scores`), plus the per-initialisation WB2 terms
(``wb2_<metric>``, :mod:`smoeweather.metrics.wb2`) from which the WB2 files are written.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from pipelines.progress import progress_bar
from smoeweather.data.ensembles import (
    check_grid,
    describe,
    forecast_kind,
    is_forecast_file,
    is_url,
    lead_hours,
    open_canonical,
    open_forecast,
    open_truth,
    split_gaussian,
    truth_at_valid_times,
)
from smoeweather.data.weather import Field, field_name
from smoeweather.evaluate_files import (
    ESTIMATORS,
    headline,
    scores_json,
    scores_markdown,
    wb2_results,
    write_scores,
)
from smoeweather.metrics import wb2
from smoeweather.metrics.regions import Region, describe_regions, parse_regions, region_weights
from smoeweather.metrics.scores import METRICS, PER_INIT, forecast_scores, median_of_quantiles
from smoeweather.metrics.spectra import DEFAULT_BAND, zonal_energy_spectrum

HEADLINE_REGION = "global"
Source = str | Path


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
    return open_canonical(truth, storage_options), False


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
        name = name or str(ds.attrs.get("method") or stem)
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
                storage_options: dict[str, Any] | None = None, ensemble_dim: str | None = None) -> Inputs:
    """Open forecasts and truth (local or fsspec URLs), check grids and dims, and find the common fields,
    initialisations and leads."""
    named = _named(forecasts, storage_options, ensemble_dim)
    if not named:
        raise ValueError("evaluate needs at least one forecast")
    truth_ds, in_file = open_truth_source(truth, storage_options)
    where_truth = f"truth {describe(truth)}"
    fcs = {n: ds for n, (_, ds) in named.items()}
    for n, (p, ds) in named.items():
        _check_extra_dims(ds, n, p)
        check_grid(ds, truth_ds["latitude"].values, truth_ds["longitude"].values, f"forecast {p}", "the truth's")
    fields = _common_fields(fcs, truth_ds, where_truth)
    inits, leads = _common_times(fcs, truth_ds, where_truth, list(named))
    return Inputs(paths={n: p for n, (p, _) in named.items()}, forecasts=fcs,
                  kinds={n: forecast_kind(ds, named[n][0]) for n, ds in fcs.items()}, truth=truth_ds,
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
                                                 progress=False)
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
        inp.forecasts["climatology"] = make_forecast(truth, inp.inits, method="climatology",
                                                     leads_h=lead_hours(inp.leads),
                                                     fields=[field_name(f) for f in inp.fields],
                                                     climatology_from=str(climatology),
                                                     climatology_years=climatology_years, beyond_data=True,
                                                     progress=False)
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
                       storage_options: dict[str, Any] | None = None
                       ) -> tuple[dict[Field, xr.DataArray], dict[Field, xr.DataArray], str | None]:
    """({field: climatological mean at the valid times (time, lead, lat, lon)}, {field: climatological quantile
    thresholds (quantile, time, lead, lat, lon)}, kind: ``"wb2"`` for a WB2 climatology zarr (dims
    ``dayofyear``, ``hour``), ``"store"`` for a training store (31-day day-of-year window), None without)."""
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
        return means, thresholds, "wb2"
    means, thresholds = {}, {}
    for f, da in training_fields(str(climatology), fields, years).items():
        means[f] = climatology_at(doy_climatology(da), vt, f"climatology of {field_name(f)} from {climatology}"
                                  ).astype(np.float64)
        if len(q):
            thresholds[f] = doy_quantiles(da, q, vt)
    return means, thresholds, "store"


def _point_and_sigma(ds: xr.Dataset, kind: str, f: Field) -> tuple[xr.DataArray, xr.DataArray | None]:
    if kind == "gaussian":  # μ as <name>, σ as <name>_std
        mu_ds, sigma_ds = split_gaussian(ds)
        return _select(mu_ds, f), _select(sigma_ds, f)
    return _select(ds, f), None


def wb2_terms(point: xr.DataArray, kind: str, truth: xr.DataArray, weights: xr.DataArray,
              sigma: xr.DataArray | None, clim_mean: xr.DataArray | None, thresholds: xr.DataArray | None
              ) -> dict[str, xr.DataArray]:
    """{``wb2_<metric>``: per-initialisation value (time, lead, region [, quantile])} of one forecast field for
    the WB2 evaluations its kind has (:data:`smoeweather.metrics.wb2.EVALUATIONS`), computed."""
    da = point.astype(np.float64)
    center = da.mean("member") if kind == "ensemble" else median_of_quantiles(da) if kind == "quantiles" else da
    terms = wb2.deterministic_terms(center, truth, weights, clim_mean)
    if kind == "ensemble":
        terms.update(wb2.ensemble_terms(da, truth, weights))
        if thresholds is not None:
            terms.update(wb2.ensemble_binary_terms(da, truth, thresholds, weights))
    elif kind == "gaussian" and sigma is not None:
        sd = sigma.astype(np.float64)
        terms.update(wb2.gaussian_terms(da, sd, truth, weights))
        if thresholds is not None:
            terms.update(wb2.gaussian_binary_terms(da, sd, truth, thresholds, weights))
    import dask

    names = list(terms)
    return {f"wb2_{k}": v for k, v in zip(names, dask.compute(*terms.values()))}


@dataclass
class FieldScores:
    """The scores of one (method, field): {metric: DataArray} over the lead, region and time dims it has."""

    values: dict[str, xr.DataArray]
    n_missing: int = 0


@dataclass
class FieldContext:
    """What every forecast of one field is scored against: the truth at the valid times (time, lead, lat, lon),
    the weights (latitude; ``regions``: region, lat, lon), the climatological mean and quantile thresholds, the
    event thresholds (dim ``threshold``, units of the field) with the climatological probability of each
    event, and the spectra settings ((lat0, lat1), recipe)."""

    truth: xr.DataArray
    weights: xr.DataArray
    regions: xr.DataArray | None = None
    clim_mean: xr.DataArray | None = None
    thresholds: xr.DataArray | None = None
    event_thresholds: xr.DataArray | None = None
    clim_probability: xr.DataArray | None = None
    spectra_band: tuple[tuple[float, float], str] | None = None

    @property
    def area(self) -> xr.DataArray:
        """Area weights with a ``region`` dim (the global one alone without regions)."""
        if self.regions is not None:
            return self.regions
        template = self.truth.isel(time=0, prediction_timedelta=0, drop=True)
        return self.weights.broadcast_like(template).expand_dims(region=[HEADLINE_REGION])


def _complete(point: xr.DataArray, truth: xr.DataArray, own_leads: np.ndarray, leads: np.ndarray, f: Field,
              allow_missing: bool, where: str) -> tuple[xr.DataArray, int]:
    """(truth blanked where the forecast is incomplete, number of such (init, lead) pairs); ValueError naming
    ``where`` and the field unless ``allow_missing``."""
    space = [d for d in point.dims if d not in ("time", "prediction_timedelta")]
    has_lead = xr.DataArray(np.isin(leads, own_leads), dims="prediction_timedelta",
                            coords={"prediction_timedelta": leads})
    incomplete = point.isnull().any(space).compute() & truth.notnull().any(["latitude", "longitude"]) & has_lead
    n_missing = int(incomplete.sum())
    if n_missing and not allow_missing:
        bad = incomplete.any("prediction_timedelta")
        first = str(bad["time"].values[bad.values][0])[:16]
        raise ValueError(f"{where}: {field_name(f)} misses values at {n_missing} (initialisation, lead) pairs of "
                         f"{int(bad.sum())} initialisations (first {first}) where the truth has values; pass "
                         "--allow-missing to score only the complete initialisations")
    return (truth.where(~incomplete) if n_missing else truth), n_missing


def calibration_scores(point: xr.DataArray, kind: str, ctx: FieldContext, truth: xr.DataArray,
                       sigma: xr.DataArray | None, relative_to: str) -> dict[str, xr.DataArray]:
    """Brier score per threshold (and per initialisation), the reliability table (global, unweighted cases) and,
    for Gaussian forecasts, the PIT histogram; computed."""
    import dask

    from smoeweather.metrics import calibration as cal

    out: dict[str, xr.DataArray] = {}
    if ctx.event_thresholds is not None and kind != "quantiles":
        p = cal.exceedance_probability(point.astype(np.float64), kind, ctx.event_thresholds, sigma, relative_to)
        if kind == "probability":
            p = p.reindex(threshold=ctx.event_thresholds.values)
        o = cal.event(truth, ctx.event_thresholds)
        per_init = cal.brier_terms(p, o, ctx.area)
        table = cal.reliability_table(p, o, ("time", "latitude", "longitude"))
        per_init, table = dask.compute(per_init, table)
        out["per_init_brier_score"] = per_init
        out["brier_score"] = per_init.mean("time")
        out.update({f"reliability_{k}": v for k, v in table.data_vars.items()})
    if kind == "gaussian" and sigma is not None:
        pit = cal.pit_values(point.astype(np.float64), kind, truth, sigma.astype(np.float64))
        out["pit_histogram"] = cal.pit_histogram(pit, ("time", "latitude", "longitude")).compute()
    return out


def score_field(ds: xr.Dataset, kind: str, f: Field, ctx: FieldContext, inits: np.ndarray, leads: np.ndarray,
                allow_missing: bool = False, where: str = "forecast") -> FieldScores:
    """Every score of one forecast field against ``ctx`` (:class:`FieldContext`): our table's metrics, the
    per-initialisation terms, the WB2 terms, the Brier scores, reliability and PIT, and the zonal spectrum.
    A forecast missing values where the truth has them is refused (ValueError naming ``where``, the field and
    the count) unless ``allow_missing``: then those initialisations are left out of every score (NaN per init)
    and counted in ``n_missing``."""
    own_leads = ds["prediction_timedelta"].values.astype("timedelta64[ns]")
    relative_to = str(ds[f[0]].attrs.get("spp__relative_to_threshold", "greater_than"))
    ds = ds.sel(time=inits).reindex(prediction_timedelta=leads)  # a lead it lacks: NaN scores
    point, sigma = _point_and_sigma(ds, kind, f)
    truth, n_missing = _complete(point, ctx.truth, own_leads, leads, f, allow_missing, where)
    out = calibration_scores(point, kind, ctx, truth, sigma, relative_to)
    if kind == "probability":  # probabilities of events: the Brier score and reliability are its scores
        return FieldScores(out, n_missing)
    out.update(forecast_scores(point, kind, truth, ctx.weights, sigma, ctx.clim_mean, regions=ctx.regions,
                               per_init=True))
    out.update(wb2_terms(point, kind, truth, ctx.area, sigma, ctx.clim_mean, ctx.thresholds))
    if ctx.spectra_band is not None:
        sp_in = point if kind != "quantiles" else median_of_quantiles(point)
        out["spectrum"] = zonal_energy_spectrum(sp_in.astype(np.float64), band=ctx.spectra_band[0],
                                                mean_dims=("time", "member"), recipe=ctx.spectra_band[1])
    return FieldScores(out, n_missing)


def _tidy(fs: FieldScores, method: str, fname: str) -> xr.Dataset:
    """One (method, field)'s scores as a Dataset with length-1 ``method`` and ``field`` dims."""
    values = dict(fs.values)
    if "rank_histogram" in values:
        rh = values["rank_histogram"]
        values["rank_histogram"] = rh.assign_coords(rank=np.arange(1, rh.sizes["rank"] + 1))
    ds = xr.Dataset({k: v.drop_vars([c for c in v.coords if c not in v.dims and c != "wavelength"],
                                    errors="ignore") for k, v in values.items()})
    return ds.expand_dims(method=[method], field=[fname])


def _ordered(scores: xr.Dataset, rdims: tuple[str, ...]) -> xr.Dataset:
    """Variables in table order with dims (method, field, prediction_timedelta, [region], ...)."""
    head = ("method", "field", "prediction_timedelta", *rdims)
    names = [m for m in METRICS if m in scores]
    names += sorted(k for k in scores.data_vars if str(k).startswith("per_init_"))
    names += sorted(k for k in scores.data_vars if str(k).startswith("wb2_"))
    names += [k for k in ("spectrum", "rank_histogram") if k in scores]
    names += [k for k in scores.data_vars if k not in names]  # calibration: Brier, reliability, PIT
    return xr.Dataset({k: scores[k].transpose(*[d for d in head if d in scores[k].dims], ...) for k in names},
                      attrs=scores.attrs)


def assemble(parts: list[xr.Dataset], methods: list[str], fields: list[str], rdims: tuple[str, ...]) -> xr.Dataset:
    """Join the per-(method, field) Datasets with xarray (outer join: a field a method lacks is NaN), in the
    order the methods and fields were given."""
    scores = xr.merge(parts, join="outer", compat="no_conflicts", combine_attrs="drop")
    scores = scores.reindex({"method": methods, "field": fields})  # dict: `method=` is reindex's own keyword
    # numpy unicode coordinates (as before): pandas' string-dtype index from the merge selects oddly
    scores = scores.assign_coords(method=np.array(methods, dtype=str), field=np.array(fields, dtype=str))
    return _ordered(scores, rdims)


def _truth_spectra(truths: dict[str, xr.DataArray], band: tuple[tuple[float, float], str]) -> xr.DataArray:
    spectra = [zonal_energy_spectrum(t, band=band[0], mean_dims=("time", "member"), recipe=band[1])
               for t in truths.values()]
    return xr.concat([sp.drop_vars("wavelength").expand_dims(field=[n]) for n, sp in zip(truths, spectra)], "field")


def event_thresholds(inp: Inputs, given: Mapping[str, Sequence[float]] | None) -> dict[Field, np.ndarray]:
    """{field: sorted thresholds (units of the field)} whose exceedance is scored: those of the probability
    forecasts (their ``threshold`` coordinate) and those ``given`` by field name (``--thresholds``)."""
    given = dict(given or {})
    names = {field_name(f): f for f in inp.fields}
    unknown = [k for k in given if k not in names]
    if unknown:
        raise ValueError(f"--thresholds names unknown field(s) {unknown}; the forecasts' fields are {list(names)}")
    out: dict[Field, set[float]] = {names[k]: set(map(float, v)) for k, v in given.items()}
    for m, ds in inp.forecasts.items():
        if inp.kinds[m] != "probability":
            continue
        for f in inp.fields:
            if f[0] in ds.data_vars:
                out.setdefault(f, set()).update(map(float, ds["threshold"].values))
    return {f: np.array(sorted(v)) for f, v in out.items() if v}


def _contexts(inp: Inputs, base: FieldContext, clim: tuple[dict, dict], events: dict[Field, np.ndarray],
              clim_prob: dict[Field, xr.DataArray]) -> dict[Field, FieldContext]:
    """One :class:`FieldContext` per field (the truth at the valid times loaded here)."""
    valid_at = xr.Dataset(coords={"time": inp.inits, "prediction_timedelta": inp.leads})
    out = {}
    for f in inp.fields:
        t = truth_at_valid_times(valid_at, _select(inp.truth, f), gaps="nan").astype(np.float64).load()
        thr = xr.DataArray(events[f], dims="threshold", coords={"threshold": events[f]}) if f in events else None
        out[f] = FieldContext(t, base.weights, base.regions, clim[0].get(f), clim[1].get(f), thr, clim_prob.get(f),
                              base.spectra_band)
    return out


def _score_all(inp: Inputs, contexts: dict[Field, FieldContext], allow_missing: bool, progress: bool
               ) -> tuple[list[xr.Dataset], dict]:
    """Score every (method, field): (per-pair Datasets, {(method, field name): n missing})."""
    from smoeweather.forecast.output import forecast_fields

    parts, missing = [], {}
    has = {m: forecast_fields(ds) for m, ds in inp.forecasts.items()}
    bar = progress_bar(len(inp.forecasts) * len(inp.fields), "evaluate: scoring", unit="fields",
                       enabled=progress)
    with bar:
        for f, ctx in contexts.items():
            for m, ds in inp.forecasts.items():
                bar.update(1)
                if f not in has[m]:
                    continue
                fs = score_field(ds, inp.kinds[m], f, ctx, inp.inits, inp.leads, allow_missing, inp.paths.get(m, m))
                missing[m, field_name(f)] = fs.n_missing
                parts.append(_tidy(fs, m, field_name(f)))
    return parts, missing


def brier_skill_scores(scores: xr.Dataset, contexts: dict[Field, FieldContext], reference: str | None
                       ) -> xr.Dataset:
    """Add ``brier_score_climatology`` (the climatological probability's Brier score) and ``brier_skill_score``
    (dim ``reference``: climatology and/or the ``reference`` method, e.g. the raw ensemble) to ``scores``."""
    from smoeweather.metrics import calibration as cal

    if "brier_score" not in scores:
        return scores
    refs: dict[str, xr.DataArray] = {}
    clim = [cal.brier_terms(ctx.clim_probability, cal.event(ctx.truth, ctx.event_thresholds), ctx.area).mean(
        "time").expand_dims(field=[field_name(f)]) for f, ctx in contexts.items()
        if ctx.clim_probability is not None and ctx.event_thresholds is not None]
    rdims = "region" in scores.dims
    if clim:
        bs_clim = xr.concat(clim, "field").reindex({"field": scores["field"].values,
                                                    "threshold": scores["threshold"].values})
        scores["brier_score_climatology"] = bs_clim if rdims else bs_clim.squeeze("region", drop=True)
        refs["climatology"] = scores["brier_score_climatology"]
    if reference is not None:
        if reference not in scores["method"].values.tolist():
            raise ValueError(f"--bss-reference {reference!r} is not one of the methods "
                             f"{scores['method'].values.tolist()}")
        refs[reference] = scores["brier_score"].sel({"method": reference}, drop=True)
    if refs:
        scores["brier_skill_score"] = xr.concat([cal.brier_skill(scores["brier_score"], r).expand_dims(reference=[n])
                                                 for n, r in refs.items()], "reference")
    return scores


def _provenance(inp: Inputs, truth: Any, climatology: Any, clim_kind: str | None, region_list: Any,
                land_threshold: float | None, lsm_from: str | None, spectra_band: tuple | None,
                quantiles: Sequence[float], missing: dict) -> dict[str, Any]:
    from smoeweather.data.ensembles import code_version

    prov: dict[str, Any] = {
        "truth": describe(truth),
        "climatology": describe(climatology) if climatology is not None else None,
        "forecasts": {n: (p if is_url(p) else str(Path(p).resolve())) for n, p in inp.paths.items()},
        "checkpoint_sha256": {n: inp.forecasts[n].attrs["checkpoint_sha256"] for n in inp.paths
                              if "checkpoint_sha256" in inp.forecasts[n].attrs},
        "inits": [str(inp.inits.min()), str(inp.inits.max()), int(len(inp.inits))],
        "code_version": code_version(),
        "latitude_weights": "WeatherBench 2 cell areas between mid-latitudes, mean 1 (cos(lat)/mean cos(lat) on "
                            "grids without pole rows)",
        "rmse": "sqrt of the mean over initialisations of the area-mean squared error (sqrt after the time mean)",
    }
    if clim_kind is not None:
        prov["climatology_kind"] = ("WeatherBench 2 climatology (dayofyear, hour)" if clim_kind == "wb2" else
                                    "day-of-year climatology of the training store, 31-day window per hour")
        prov["binary_thresholds"] = f"climatological quantiles {list(map(float, quantiles))} at the valid time"
    if any(missing.values()):
        prov["incomplete_not_scored"] = {f"{m}/{f}": n for (m, f), n in missing.items() if n}
    if region_list is not None:
        prov["regions"] = describe_regions(region_list, land_threshold)
        prov["land_sea_mask"] = lsm_from
    if spectra_band is not None:
        prov["spectra_band"] = list(spectra_band[0])
        prov["spectra_recipe"] = spectra_band[1]
    return prov


def evaluate(
    forecasts: Mapping[str, Source] | Source | Sequence[Source],
    truth: Source | Sequence[Source],
    climatology: Source | None = None,
    out_dir: Source | None = None,
    references: bool = True,
    climatology_years: tuple[int, int] | None = None,
    regions: Sequence[str | Region] | str | None = None,
    land_sea_mask: Source | None = None,
    land_threshold: float | None = None,
    spectra: bool = False,
    spectra_band: tuple[float, float] = DEFAULT_BAND,
    spectra_recipe: str = "wavenumber",
    storage_options: dict[str, Any] | None = None,
    ensemble_dim: str | None = None,
    binary_quantiles: Sequence[float] = wb2.DEFAULT_QUANTILES,
    allow_missing: bool = False,
    thresholds: Mapping[str, Sequence[float]] | None = None,
    bss_reference: str | None = None,
    overwrite: bool = True,
    progress: bool = False,
) -> xr.Dataset:
    """Scores Dataset (vars ``rmse``, ``bias``, [``acc``, ``crps``, ...], ``per_init_<q>``, ``wb2_<metric>``,
    ``n_time``, ``n_scored``) over dims ``method``, ``field``, ``prediction_timedelta`` [, ``region``]; written
    to ``out_dir`` (scores.{nc,json,md} and WB2's evaluation files, :func:`write_scores`) if given.

    ``forecasts``: {name: path}, one path or a list (local or fsspec URLs, ``storage_options`` for fsspec; the
    ensemble dim is found by name or given as ``ensemble_dim``). ``truth``: prepared store or canonical file(s).
    ``climatology``: a training store (31-day day-of-year climatology) or a WB2 climatology zarr, for ACC, the
    climatology reference and the binary scores at its ``binary_quantiles``. ``regions``: region specs
    (:mod:`smoeweather.metrics.regions`); None: global only, without a region dim. ``allow_missing``: score the
    complete initialisations of a forecast with missing values instead of refusing it. ``thresholds``
    ({field name: values in its units}) and the ``threshold`` coordinates of probability forecasts: the events
    whose Brier score, reliability table and Brier skill score (against the climatological probability and
    ``bss_reference``, by default the first ensemble) are computed. ``progress``: a bar on a terminal, stage
    lines when piped.
    """
    if out_dir is not None:
        from pipelines.atomic import check_output

        check_output(out_dir, overwrite)  # before anything is computed
    inp = open_inputs(forecasts, truth, storage_options, ensemble_dim)
    if inp.truth_in_file and references:
        warnings.warn(f"{inp.where_truth}: truth held inside a forecast file; no persistence/climatology "
                      "references", stacklevel=2)
        references = False
    if references:
        add_persistence(inp, truth)
    clim_means, clim_thresholds, clim_kind = climatology_inputs(climatology, inp.fields, climatology_years, inp.inits,
                                                          inp.leads, binary_quantiles, storage_options)
    if references and climatology is not None:
        add_climatology_reference(inp, truth, climatology, climatology_years, clim_means, clim_kind)
    weights = wb2.cell_area_weights(inp.truth["latitude"])
    rw, region_list, lsm_from = None, None, None
    if regions is not None:
        region_list, rw, lsm_from = _regions_for(regions, inp.truth, land_sea_mask, land_threshold,
                                                 inp.where_truth)
    band = (spectra_band, spectra_recipe) if spectra else None
    events = event_thresholds(inp, thresholds)
    clim_prob = climatological_probabilities(climatology, events, climatology_years, inp.inits, inp.leads,
                                             clim_kind)
    contexts = _contexts(inp, FieldContext(xr.DataArray(), weights, rw, spectra_band=band),
                         (clim_means, clim_thresholds), events, clim_prob)
    parts, missing = _score_all(inp, contexts, allow_missing, progress)
    rdims = ("region",) if rw is not None else ()
    methods, fields = list(inp.forecasts), [field_name(f) for f in inp.fields]
    scores = assemble(parts, methods, fields, rdims)
    if rw is None:
        squeezed = {k: v.squeeze("region", drop=True) for k, v in scores.data_vars.items() if "region" in v.dims}
        scores = _ordered(scores.drop_vars(list(squeezed)).merge(xr.Dataset(squeezed)), rdims)
    scores = brier_skill_scores(scores, contexts, bss_reference or _default_reference(inp, events))
    scores = _finish(scores, inp, {field_name(f): c.truth for f, c in contexts.items()}, band)
    prov = _provenance(inp, truth, climatology, clim_kind, region_list, land_threshold, lsm_from, band,
                       binary_quantiles, missing)
    scores.attrs = {"provenance": json.dumps(prov)}
    from smoeweather.evaluate_files import describe_scores

    describe_scores(scores, spectra_band)
    if out_dir is not None:
        write_scores(scores, out_dir, overwrite=overwrite)
    return scores


def _default_reference(inp: Inputs, events: dict) -> str | None:
    """The raw ensemble the Brier skill score is measured against by default: the first ensemble method."""
    if not events:
        return None
    return next((m for m, k in inp.kinds.items() if k == "ensemble"), None)


def climatological_probabilities(climatology: Source | None, events: dict[Field, np.ndarray],
                                 years: tuple[int, int] | None, inits: np.ndarray, leads: np.ndarray,
                                 clim_kind: str | None) -> dict[Field, xr.DataArray]:
    """{field: probability of each event in the training store's day-of-year window at the valid times}
    (threshold, time, lead, lat, lon); empty without a training-store climatology (a WB2 climatology holds no
    samples to count)."""
    from smoeweather.forecast.climatology import doy_exceedance
    from smoeweather.forecast.reference import training_fields

    if climatology is None or clim_kind != "store" or not events:
        return {}
    vt = xr.DataArray(inits[:, None] + leads[None, :], dims=("time", "prediction_timedelta"),
                      coords={"time": inits, "prediction_timedelta": leads})
    return {f: doy_exceedance(da, events[f], vt)
            for f, da in training_fields(str(climatology), list(events), years).items()}


def _finish(scores: xr.Dataset, inp: Inputs, truths: dict[str, xr.DataArray], band: tuple | None) -> xr.Dataset:
    """Add the counts, units, ensemble sizes, kinds and the truth's spectra."""
    n_time = xr.concat([t.notnull().any(["latitude", "longitude"]).sum("time").expand_dims(field=[n])
                        for n, t in truths.items()], "field")
    scores["n_time"] = n_time.reindex(field=scores["field"].values).astype(np.int64)
    if "per_init_mse" in scores:
        pm = scores["per_init_mse"]
        scores["n_scored"] = pm.isel(region=0, drop=True).notnull().sum("time") if "region" in pm.dims else \
            pm.notnull().sum("time")
    unit_of = {field_name(f): str(inp.truth[f[0]].attrs.get("units", "")) for f in inp.fields}
    units = [unit_of[n] for n in scores["field"].values.tolist()]
    sizes = [inp.forecasts[m].sizes.get("member", 1) if inp.kinds[m] in ("ensemble", "deterministic") else 0
             for m in scores["method"].values.tolist()]
    scores = scores.assign_coords(units=("field", units), ensemble_size=("method", np.asarray(sizes, np.int64)),
                                  kind=("method", [inp.kinds[m] for m in scores["method"].values.tolist()]))
    if band is not None:
        scores["truth_spectrum"] = _truth_spectra(truths, band).reindex(field=scores["field"].values)
    return scores


__all__ = ["add_climatology_reference", "add_persistence", "assemble", "climatology_inputs", "evaluate", "headline",
           "land_sea_mask_of", "open_inputs", "open_truth_source", "score_field", "scores_json", "scores_markdown",
           "wb2_results", "wb2_terms", "write_scores", "ESTIMATORS", "PER_INIT", "HEADLINE_REGION"]
