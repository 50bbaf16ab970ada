"""``smoe evaluate`` of site (station) forecasts: the raw ensemble of a site table or CF ``timeSeries`` file
(:mod:`smoeweather.data.sites`) and the stores ``smoe postprocess apply`` writes on sites (Gaussian μ/σ,
probabilities on a ``threshold`` dim, percentiles, ECC members), scored against the station observations.

Stations are matched by ``station_id``: every forecast and the truth are cut to the stations they all have (the
others are counted, warned about and recorded in the provenance; none in common is refused). Every method is
scored on the SAME cases: the (initialisation, station) pairs of each lead where the observation exists and
every method forecasts (a forecast lacking values where the observation exists is refused unless
``allow_missing``). Scores per (method, field, lead) are means over those cases, each counted once (every
station equally, no latitude weights; as ensembleBMA and ``benchmarks/postprocess_calibration_results.py``):
:func:`~smoeweather.metrics.scores.forecast_scores` with the case dim as its space dim, the Brier score, the
reliability table and PIT histogram of :mod:`smoeweather.metrics.calibration`. Grid-only options (regions,
land-sea mask, climatology, spectra) are refused; WeatherBench 2's evaluation files are for grids and are not
written; no persistence/climatology references are added.
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

from pipelines.readers._files import open_data
from smoeweather.data.forecast_stores import ENSEMBLE_DIMS, describe, forecast_kind, is_url, split_gaussian, store_names
from smoeweather.data.sites import OBS_SUFFIX, TABLE_SUFFIXES, open_sites, station_ids
from smoeweather.evaluate.inputs import (
    add_thresholds,
    align_forecast,
    at_thresholds,
    method_name,
    relative_to_threshold,
)
from smoeweather.units import Quantity, units_of, values_in

Source = str | Path
CASE = "case"
WEIGHTING = ("every (initialisation, station) case once, per lead: stations weighted equally, no latitude "
             "weights; only the cases every method forecasts and the truth observes")
NO_WB2 = "not written: WeatherBench 2's evaluation files are for gridded forecasts"
SITE_DROPPED = ("energy_score",)  # a multivariate score of one field vector: the pooled cases are no such vector


def _paths(source: Mapping[str, Source] | Source | Sequence[Source]) -> list[str]:
    if isinstance(source, Mapping):
        return [str(v) for v in source.values()]
    return [str(source)] if isinstance(source, str | Path) else [str(s) for s in source]


def _has_sites(path: str) -> bool:
    """A site table, or a local netCDF file or zarr store whose data has a ``site`` dim (other files, such as
    GRIB, are never opened here)."""
    if is_url(path) or any(c in path for c in "*?["):
        return False
    p = Path(path)
    if p.suffix.lower() in TABLE_SUFFIXES:
        return True
    if not p.exists() or not (p.is_dir() or p.suffix.lower() in (".nc", ".nc4", ".cdf", ".h5", ".netcdf")):
        return False
    try:
        with (xr.open_zarr(p) if p.is_dir() else xr.open_dataset(p)) as ds:
            return "site" in ds.dims
    except (OSError, ValueError, KeyError):
        return False


def is_site_run(forecasts: Mapping[str, Source] | Source | Sequence[Source],
                truth: Source | Sequence[Source]) -> bool:
    """Whether any forecast or truth source holds site data (then :func:`evaluate_sites` scores them)."""
    return any(_has_sites(p) for p in [*_paths(forecasts), *_paths(truth)])


def open_site_forecast(path: str, table: Mapping[str, Any], ensemble_dim: str | None
                       ) -> tuple[xr.Dataset, xr.Dataset | None]:
    """(forecast on (time = init, prediction_timedelta, [member | quantile | threshold], site), the observations
    on valid times it carries or None), station ids as the ``site`` coordinate, loaded."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"forecast {path} does not exist")
    obs = None
    if p.suffix.lower() in TABLE_SUFFIXES:
        ds, obs = open_sites(p, **table)
    else:
        with open_data(p, "site forecast") as raw:
            ds = raw.load()
        if any(str(v).endswith(OBS_SUFFIX) for v in ds.data_vars) and str(ds.attrs.get("featureType", "")
                                                                           ).lower() == "timeseries":
            ds, obs = open_sites(p)
        ds = store_names(ds, ensemble_dim, f"forecast {path}")  # IMPROVER's names, percentiles as quantiles
        dim = ensemble_dim or next((d for d in ENSEMBLE_DIMS if d in ds.dims), None)
        if dim is not None and dim in ds.dims and dim != "member":
            ds = ds.rename({dim: "member"})
    missing = [d for d in ("time", "prediction_timedelta", "site") if d not in ds.dims]
    if missing or "station_id" not in ds.coords:
        raise ValueError(f"forecast {path}: not a site forecast; expected dims time (init), prediction_timedelta and "
                         f"site with a station_id coordinate, got dims {dict(ds.sizes)} (a site table, a CF "
                         "timeSeries file or a `smoe postprocess apply` output on sites)")
    keep = [v for v in ds.data_vars if "prediction_timedelta" in ds[v].dims]
    ds = ds[keep].drop_vars([c for c in ds.coords if c not in ds.dims and c != "station_id"])
    return _by_station(ds, f"forecast {path}"), (_by_station(obs, f"forecast {path}") if obs is not None else None)


def _by_station(ds: xr.Dataset, where: str) -> xr.Dataset:
    """``ds`` with the station ids as its ``site`` index, blanks around them stripped (a site table's ids are
    read stripped, a CF file's fixed-width ids may be padded: "K001 " is station "K001"); ValueError naming
    ``where`` for repeated ids."""
    ids = station_ids(np.char.strip(station_ids(ds["station_id"].values)))
    if len(set(ids.tolist())) < len(ids):
        raise ValueError(f"{where}: station ids repeat; each station must appear once on the site dim")
    return ds.drop_vars([c for c in ds.coords if c not in ds.dims or c == "site"]).assign_coords(site=ids)


def open_site_truth(truth: Source | Sequence[Source], table: Mapping[str, Any],
                    carried: Mapping[str, xr.Dataset]) -> xr.Dataset:
    """The observations on valid times (time, site) of ``truth``: a site table or CF site file (the one a
    forecast already opened is reused)."""
    paths = _paths(truth)
    if len(paths) != 1:
        raise ValueError(f"--truth {paths}: site forecasts are verified against one site table or CF timeSeries "
                         "file (its observations)")
    p = paths[0]
    if p in carried:
        return carried[p]
    path = Path(p)
    if not path.exists():
        raise FileNotFoundError(f"truth {p} does not exist")
    if not (path.suffix.lower() in TABLE_SUFFIXES or (path.is_file() and _has_sites(p))):
        raise ValueError(f"--truth {p}: the forecasts are site forecasts, so the truth must hold station "
                         "observations: a site table (CSV/Parquet) or a CF timeSeries file with <name>_observation")
    _, obs = open_sites(path, **table)
    return _by_station(obs, f"truth {p}")


@dataclass
class SiteInputs:
    """The aligned site inputs: forecasts by method (on the common stations), kinds, observations, fields,
    initialisations, leads and the stations each source lost."""

    paths: dict[str, str]
    forecasts: dict[str, xr.Dataset]
    kinds: dict[str, str]
    truth: xr.Dataset
    where_truth: str
    fields: list[str]
    inits: np.ndarray
    leads: np.ndarray
    stations: np.ndarray
    dropped: dict[str, int] = field(default_factory=dict)


def _named(forecasts: Mapping[str, Source] | Source | Sequence[Source]) -> list[tuple[str | None, str]]:
    if isinstance(forecasts, Mapping):
        return [(str(k), str(v)) for k, v in forecasts.items()]
    return [(None, p) for p in _paths(forecasts)]


def _common_stations(fcs: dict[str, xr.Dataset], truth: xr.Dataset, paths: dict[str, str], where_truth: str
                     ) -> tuple[np.ndarray, dict[str, int]]:
    """(station ids every forecast and the truth have, in the truth's order; {source: stations it loses})."""
    sets = {paths[m]: set(ds["site"].values.tolist()) for m, ds in fcs.items()}
    common = set(truth["site"].values.tolist()).intersection(*sets.values())
    if not common:
        firsts = {s: sorted(v)[:3] for s, v in {**sets, where_truth: set(truth["site"].values.tolist())}.items()}
        raise ValueError(f"no station (station_id) is common to every forecast and the truth; first ids of each: "
                         f"{firsts}; score forecasts of the same stations")
    dropped = {s: len(v - common) for s, v in {**sets, where_truth: set(truth["site"].values.tolist())}.items()}
    if any(dropped.values()):
        warnings.warn(f"stations not common to every forecast and the truth are not scored: "
                      f"{ {k: v for k, v in dropped.items() if v} } dropped, {len(common)} scored", stacklevel=4)
    order = [s for s in truth["site"].values.tolist() if s in common]
    return np.array(order, dtype=truth["site"].dtype), dropped


def open_site_inputs(forecasts: Mapping[str, Source] | Source | Sequence[Source], truth: Source | Sequence[Source],
                     table: Mapping[str, Any] | None = None, ensemble_dim: str | None = None) -> SiteInputs:
    """Open the site forecasts and observations, match the stations, and find the common fields,
    initialisations (those every forecast has) and leads (their union)."""
    table = dict(table or {})
    fcs, paths, carried = {}, {}, {}
    for name, p in _named(forecasts):
        ds, obs = open_site_forecast(p, table, ensemble_dim)
        name = name or method_name(ds, p)
        name = name if name not in fcs else f"{name} ({p})"
        fcs[name], paths[name] = ds, p
        if obs is not None:
            carried[p] = obs
    if not fcs:
        raise ValueError("evaluate needs at least one forecast")
    obs = open_site_truth(truth, table, carried)
    where_truth = f"truth {describe(truth)}"
    kinds = {m: forecast_kind(ds, paths[m]) for m, ds in fcs.items()}
    stations, dropped = _common_stations(fcs, obs, paths, where_truth)
    names = list(dict.fromkeys(str(v) for ds in fcs.values() for v in ds.data_vars if not str(v).endswith("_std")))
    fields = [n for n in names if n in obs.data_vars]
    if not fields:
        raise ValueError(f"{where_truth} holds none of the forecast fields {names} (it has {list(obs.data_vars)})")
    if len(fields) < len(names):
        warnings.warn(f"{where_truth} lacks {[n for n in names if n not in fields]}: not scored", stacklevel=3)
    inits = np.array(sorted(set.intersection(*(set(ds["time"].values.astype("datetime64[ns]").tolist())
                                               for ds in fcs.values()))), dtype="datetime64[ns]")
    if not len(inits):
        raise ValueError(f"the forecasts {list(fcs)} share no initialisation time (coordinate 'time')")
    leads = np.unique(np.concatenate([ds["prediction_timedelta"].values.astype("timedelta64[ns]")
                                      for ds in fcs.values()]))
    if not np.isin(inits[:, None] + leads[None, :], obs["time"].values).any():
        raise ValueError(f"no valid time (time + prediction_timedelta) of the forecasts lies in {where_truth}")
    # every forecast in the observations' units (the units of the scores): converted with a note, else refused
    fcs = {m: align_forecast(ds.sel(site=stations), kinds[m], obs, fields, f"forecast {paths[m]}", where_truth)
           for m, ds in fcs.items()}
    return SiteInputs(paths, fcs, kinds, obs.sel(site=stations), where_truth, fields, inits, leads, stations,
                      dropped)



def _cases(da: xr.DataArray) -> xr.DataArray:
    """(..., time, site) → (..., case), float64: the (initialisation, station) pairs as one dim."""
    da = da.transpose(..., "time", "site")
    other = list(da.dims[:-2])
    return xr.DataArray(da.values.astype(np.float64).reshape(*da.shape[:-2], -1), dims=(*other, CASE),
                        coords={d: da[d].values for d in other if d in da.coords})


@dataclass
class FieldData:
    """One method's forecast of one field on the common axes: the point forecast (time, prediction_timedelta,
    [member | quantile | threshold], site), σ for Gaussian forecasts, the leads it has, how P is meant."""

    point: xr.DataArray
    sigma: xr.DataArray | None
    has_lead: xr.DataArray
    relative_to: str


def field_data(inp: SiteInputs, name: str) -> tuple[xr.DataArray, dict[str, FieldData]]:
    """(the observations at the valid times (time, prediction_timedelta, site), {method: its forecast})."""
    from smoeweather.data.forecast_stores import truth_at_valid_times

    valid_at = xr.Dataset(coords={"time": inp.inits, "prediction_timedelta": inp.leads})
    truth = truth_at_valid_times(valid_at, inp.truth[name], gaps="nan").astype(np.float64)
    out = {}
    for m, ds in inp.forecasts.items():
        if name not in ds.data_vars:
            continue
        own = ds["prediction_timedelta"].values.astype("timedelta64[ns]")
        sub = ds.sel(time=inp.inits).reindex(prediction_timedelta=inp.leads)
        if inp.kinds[m] == "gaussian":
            mu, sd = split_gaussian(sub)
            point, sigma = mu[name], sd[name]
        else:
            point, sigma = sub[name], None
        has = xr.DataArray(np.isin(inp.leads, own), dims="prediction_timedelta",
                           coords={"prediction_timedelta": inp.leads})
        out[m] = FieldData(point, sigma, has, relative_to_threshold(ds, name))
    return truth, out


def case_mask(truth: xr.DataArray, data: dict[str, FieldData], paths: dict[str, str], name: str,
              allow_missing: bool) -> tuple[xr.DataArray, dict[str, int]]:
    """(the cases every method forecasts and the truth observes (time, prediction_timedelta, site), {method:
    cases it lacks where the truth observes}); ValueError naming the forecast unless ``allow_missing``."""
    ok = truth.notnull()
    missing = {}
    for m, d in data.items():
        extra = [x for x in d.point.dims if x not in ("time", "prediction_timedelta", "site")]
        complete = d.point.notnull().all(extra) if extra else d.point.notnull()
        if d.sigma is not None:
            complete = complete & d.sigma.notnull()
        lacks = truth.notnull() & ~complete & d.has_lead
        missing[m] = int(lacks.sum())
        if missing[m] and not allow_missing:
            first = lacks.any(["prediction_timedelta", "site"])
            when = str(first["time"].values[first.values][0])[:16]
            raise ValueError(f"forecast {paths[m]}: {name} misses values at {missing[m]} (initialisation, lead, "
                             f"station) cases where the truth has an observation (first initialisation {when}); "
                             "pass --allow-missing to score every method on the cases all of them forecast")
        ok = ok & (complete | ~d.has_lead)
    return ok, missing


def score_site_field(d: FieldData, kind: str, truth: xr.DataArray, thresholds: xr.DataArray | None
                     ) -> dict[str, xr.DataArray]:
    """Every score of one method's field over the cases (``truth``: NaN outside the scored cases): the
    Brier score and reliability table per threshold, the PIT histogram (Gaussian), and
    :func:`~smoeweather.metrics.scores.forecast_scores` with the case dim as its space (each case once)."""
    from smoeweather.metrics import calibration as cal
    from smoeweather.metrics.scores import area_mean, forecast_scores

    point, y = _cases(d.point), _cases(truth)
    sigma = _cases(d.sigma) if d.sigma is not None else None
    out: dict[str, xr.DataArray] = {}
    if thresholds is not None and kind != "quantiles":
        p = cal.exceedance_probability(point, kind, thresholds, sigma, d.relative_to)
        if kind == "probability":
            p = at_thresholds(p, thresholds)
        o = cal.event(y, thresholds)
        out["brier_score"] = area_mean((p - o) ** 2, xr.DataArray(np.ones(y.sizes[CASE]), dims=CASE), [CASE])
        table = cal.reliability_table(p, o, (CASE,))
        out.update({f"reliability_{k}": v for k, v in table.data_vars.items()})
    if kind == "gaussian" and sigma is not None:
        out["pit_histogram"] = cal.pit_histogram(cal.pit_values(point, kind, y, sigma), (CASE,))
    if kind == "probability":  # probabilities of events: the Brier score and reliability are its scores
        return out
    with warnings.catch_warnings():  # cases without an observation (NaN, not scored) hold no forecast either
        warnings.filterwarnings("ignore", message="Encountered a NaN in `fcst`")
        scores = forecast_scores(point, kind, y, None, sigma, dims=(CASE,), space=(CASE,))
    out.update({k: v for k, v in scores.items() if k not in SITE_DROPPED})
    return out


def event_thresholds(inp: SiteInputs, given: Mapping[str, Sequence[float | Quantity]] | None
                     ) -> dict[str, xr.DataArray]:
    """{field: thresholds (dim ``threshold``, units of the observations)}: ``given`` (``--thresholds``; a value
    with units converted) and those of the probability forecasts."""
    given = dict(given or {})
    unknown = [k for k in given if k not in inp.fields]
    if unknown:
        raise ValueError(f"--thresholds names unknown field(s) {unknown}; the site forecasts' fields are "
                         f"{inp.fields}")
    out: dict[str, set[float]] = {k: set(values_in(v, units_of(inp.truth[k]), k, "--thresholds", inp.where_truth
                                                   ).tolist()) for k, v in given.items()}
    for m, ds in inp.forecasts.items():
        if inp.kinds[m] == "probability":
            for f in inp.fields:
                if f in ds.data_vars:
                    add_thresholds(out.setdefault(f, set()), ds["threshold"].values)
    return {f: xr.DataArray(np.array(sorted(v)), dims="threshold", coords={"threshold": np.array(sorted(v))})
            for f, v in out.items() if v}


def _score_all(inp: SiteInputs, events: dict[str, xr.DataArray], allow_missing: bool
               ) -> tuple[list[xr.Dataset], dict[str, xr.DataArray], dict[tuple[str, str], int]]:
    """(per-(method, field) score Datasets, {field: scored cases (time, lead, site)}, {(method, field): cases
    missing})."""
    from smoeweather.evaluate.assemble import FieldScores, tidy

    parts, masks, missing = [], {}, {}
    for name in inp.fields:
        truth, data = field_data(inp, name)
        mask, lacking = case_mask(truth, data, inp.paths, name, allow_missing)
        masks[name] = mask
        scored = truth.where(mask)
        for m, d in data.items():
            missing[m, name] = lacking[m]
            values = score_site_field(d, inp.kinds[m], scored, events.get(name))
            parts.append(tidy(FieldScores(values), m, name))
    return parts, masks, missing


def _finish(scores: xr.Dataset, inp: SiteInputs, masks: dict[str, xr.DataArray]) -> xr.Dataset:
    """Add the counts (initialisations, cases and stations scored), units, ensemble sizes and kinds."""
    fields = scores["field"].values.tolist()

    def per_field(fn: Any) -> xr.DataArray:
        return xr.concat([fn(masks[f]).expand_dims(field=[f]) for f in fields], "field").astype(np.int64)

    scores["n_time"] = per_field(lambda k: k.any("site").sum("time"))
    scores["n_scored"] = scores["n_time"]
    units = [str(inp.truth[f].attrs.get("units", "")) for f in fields]
    methods = scores["method"].values.tolist()
    sizes = [inp.forecasts[m].sizes.get("member", 1) if inp.kinds[m] in ("ensemble", "deterministic") else 0
             for m in methods]
    scores = scores.assign_coords(units=("field", units), ensemble_size=("method", np.asarray(sizes, np.int64)),
                                  kind=("method", [inp.kinds[m] for m in methods]))
    from smoeweather.evaluate.files import describe_scores
    from smoeweather.metrics.spectra import DEFAULT_BAND

    describe_scores(scores, DEFAULT_BAND)
    for v in scores.data_vars.values():
        text = str(v.attrs.get("long_name", ""))
        v.attrs["long_name"] = text.replace("latitude-weighted", "case-mean").replace(
            " (sqrt after time mean)", "").replace("grid points", "stations")
    scores["n_cases"] = per_field(lambda k: k.sum(["time", "site"]))
    scores["n_cases"].attrs = {"long_name": "(initialisation, station) cases scored", "units": "1"}
    scores["n_sites"] = per_field(lambda k: k.any(["time", "prediction_timedelta"]).sum("site"))
    scores["n_sites"].attrs = {"long_name": "stations with at least one case scored", "units": "1"}
    return scores


GRID_ONLY = {"--climatology": "ACC, the climatology reference and the climatological thresholds need a gridded "
                              "climatology", "--climatology-years": "it selects the years of --climatology",
             "--regions": "regions are areas of a grid (select the stations of a region in the table instead)",
             "--land-sea-mask": "it weights grid points of regions", "--land-threshold": "it weights grid points "
             "of regions", "--spectra": "zonal spectra need a regular latitude-longitude grid",
             "--scheduler": "station tables are read whole and scored in memory, with nothing for a dask cluster to "
                            "split"}


def refuse_grid_options(given: Mapping[str, Any]) -> None:
    """ValueError naming the first grid-only option that is set (not None or False) and why."""
    for option, value in given.items():
        if value is not None and value is not False:
            raise ValueError(f"{option} is for gridded forecasts and these are site (station) forecasts: "
                             f"{GRID_ONLY[option]}; leave {option} out")


def _provenance(inp: SiteInputs, truth: Any, masks: dict[str, xr.DataArray], missing: dict) -> dict[str, Any]:
    from smoeweather.data.forecast_stores import code_version

    prov: dict[str, Any] = {
        "truth": describe(truth),
        "forecasts": {n: str(Path(p).resolve()) for n, p in inp.paths.items()},
        "inits": [str(inp.inits.min()), str(inp.inits.max()), int(len(inp.inits))],
        "code_version": code_version(),
        "sites": {"scored": int(len(inp.stations)), "dropped_not_common": {k: v for k, v in inp.dropped.items()}},
        "cases": {f: int(k.sum()) for f, k in masks.items()},
        "weights": WEIGHTING,
        "rmse": "sqrt of the mean squared error over the scored cases",
        "references": "none: no persistence or climatology reference for site forecasts",
        "wb2_evaluation_files": NO_WB2,
    }
    if any(missing.values()):
        prov["incomplete_not_scored"] = {f"{m}/{f}": n for (m, f), n in missing.items() if n}
    return prov


def _markdown(scores: xr.Dataset) -> str:
    from smoeweather.evaluate.files import scores_markdown

    prov = json.loads(scores.attrs.get("provenance", "{}"))
    dropped = {k: v for k, v in prov.get("sites", {}).get("dropped_not_common", {}).items() if v}
    lines = ["## Site (station) forecasts", "",
             f"Stations scored: {prov.get('sites', {}).get('scored')}"
             + (f"; not common to every forecast and the truth, dropped: {dropped}" if dropped else "") + ".",
             f"Cases scored per field: {prov.get('cases')}. Weights: {WEIGHTING}.",
             f"WeatherBench 2 evaluation files: {NO_WB2}. No persistence/climatology references.", ""]
    return "\n".join(lines) + "\n" + scores_markdown(scores).replace(
        "RMSE is the square root after the mean over initialisations (√ of WB2's mse). Initialisations",
        "RMSE is the square root of the mean squared error over the scored cases. Initialisations")


def write_site_scores(scores: xr.Dataset, out_dir: Source, overwrite: bool = True) -> Path:
    """``out_dir``/scores.nc, scores.json and scores.md (no WB2 files: they are for grids), written into a
    staging folder and moved into place as a whole (a failed run leaves nothing)."""
    from pipelines.atomic import atomic_output
    from smoeweather.evaluate.files import scores_json
    from smoeweather.io import write_netcdf

    out_dir = Path(out_dir)
    with atomic_output(out_dir, overwrite, kind="dir") as tmp:
        write_netcdf(scores, tmp / "scores.nc")
        (tmp / "scores.json").write_text(json.dumps(scores_json(scores), indent=2, default=float) + "\n")
        (tmp / "scores.md").write_text(_markdown(scores))
    return out_dir


def evaluate_sites(forecasts: Mapping[str, Source] | Source | Sequence[Source], truth: Source | Sequence[Source],
                   out_dir: Source | None = None, *, thresholds: Mapping[str, Sequence[float]] | None = None,
                   bss_reference: str | None = None, allow_missing: bool = False, ensemble_dim: str | None = None,
                   table: Mapping[str, Any] | None = None, overwrite: bool = True,
                   grid_options: Mapping[str, Any] | None = None) -> xr.Dataset:
    """Scores Dataset of site forecasts over (method, field, prediction_timedelta): ``rmse``, ``bias``, ``crps``,
    ``crps_ecdf``, ``spread_skill``, ... by kind, ``brier_score``, ``reliability_*`` and ``brier_skill_score``
    (against ``bss_reference``, by default the first ensemble) per threshold, ``pit_histogram``,
    ``rank_histogram``, ``n_time``, ``n_cases``, ``n_sites``; written to ``out_dir`` (scores.{nc,json,md}).

    ``forecasts``: {name: path}, a path or a list: site tables (``table``: their column options, as
    :func:`smoeweather.data.sites.read_site_table`), CF timeSeries files, ``smoe postprocess apply`` stores on
    sites. ``truth``: a site table or file with the observations. ``grid_options``: {option: value} of the
    grid-only options given (refused by name)."""
    refuse_grid_options(dict(grid_options or {}))
    if out_dir is not None:
        from pipelines.atomic import check_output

        check_output(out_dir, overwrite, inputs=[forecasts, truth])  # before anything is computed, never over an input
    from smoeweather.evaluate.assemble import assemble, brier_skill_scores

    inp = open_site_inputs(forecasts, truth, table, ensemble_dim)
    events = event_thresholds(inp, thresholds)
    parts, masks, missing = _score_all(inp, events, allow_missing)
    scores = assemble(parts, list(inp.forecasts), inp.fields, ())
    reference = bss_reference or (next((m for m, k in inp.kinds.items() if k == "ensemble"), None) if events
                                  else None)
    scores = brier_skill_scores(scores, {}, reference)
    scores = _finish(scores, inp, masks)
    scores.attrs = {"provenance": json.dumps(_provenance(inp, truth, masks, missing))}
    if out_dir is not None:
        write_site_scores(scores, out_dir, overwrite=overwrite)
    return scores


__all__ = ["GRID_ONLY", "SiteInputs", "case_mask", "evaluate_sites", "event_thresholds", "field_data",
           "is_site_run", "open_site_forecast", "open_site_inputs", "open_site_truth", "refuse_grid_options",
           "score_site_field", "write_site_scores"]
