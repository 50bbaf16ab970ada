"""``smoe evaluate``: score forecast stores against a truth store, references beside the models.

Orchestration above :mod:`smoeweather.metrics` (which is pure xarray): open the forecasts and the truth, build
the reference forecasts, compute :func:`~smoeweather.metrics.scores.forecast_scores` for every (method, field),
and gather them in ONE tidy table, an ``xarray.Dataset`` over (method, field, prediction_timedelta) with one
variable per metric, from which scores.json (:func:`scores_json`) and scores.md (:func:`scores_markdown`) are
rendered.

Every forecast (convention of :mod:`smoeweather.data.ensembles`) is matched with the
truth at its VALID time ``time + prediction_timedelta``; all methods are scored on the same
initialisations (those common to every forecast), so the table compares like with like. Scores per
(method, field, lead): latitude-weighted RMSE (square root after the time mean) and bias of the
deterministic forecast or ensemble mean / Gaussian μ, ACC against a day-of-year climatology (with
``climatology``), and for ensembles the fair CRPS and the spread–skill ratio, for Gaussian forecasts
(``<name>``, ``<name>_std``) the closed-form Gaussian CRPS and spread–skill, for quantile forecasts (dim
``quantile``) the pinball loss averaged over the levels (RMSE/bias of their median). The truth may be a
prepared store, canonical files, or the truth held inside an ensemble forecast file (gcm_ens, SEAS5).
Unless ``references=False``, persistence (from the truth) and, with ``climatology``, the day-of-year
climatology are added as methods for the same initialisations and leads.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from smoeweather.data.ensembles import (
    check_grid,
    describe,
    forecast_kind,
    is_forecast_file,
    lead_hours,
    lead_label,
    open_canonical,
    open_forecast,
    open_truth,
    split_gaussian,
    truth_at_valid_times,
)
from smoeweather.data.weather import Field, field_name
from smoeweather.metrics.regions import Region, describe_regions, parse_regions, region_weights
from smoeweather.metrics.scores import METRICS, PER_INIT, forecast_scores, median_of_quantiles
from smoeweather.metrics.spectra import DEFAULT_BAND, zonal_energy_spectrum
from smoeweather.metrics.weights import latitude_weights

UNITLESS = ("acc", "spread_skill", "diversity_ratio")
SQUARED = ("debiased_ensemble_mean_mse",)
HEADLINE_REGION = "global"
ESTIMATORS = {"crps": "fair (Ferro 2014); Gaussian: closed form; deterministic: MAE",
              "crps_ecdf": "standard (members' empirical CDF); Gaussian: closed form; deterministic: MAE",
              "spread_skill": "sqrt((M + 1)/M) * sqrt(mean unbiased member variance) / RMSE of the ensemble mean",
              "debiased_ensemble_mean_mse": "(ensemble mean - truth)**2 - s**2/M per point, s**2 unbiased "
                                            "(WeatherBench 2 DebiasedEnsembleMeanMSE)",
              "energy_score": "E||X - Y|| - E||X - X'||/2 per field, area-weighted L2 norm, all M(M - 1) member "
                              "pairs (fair)",
              "rmse": "sqrt of the mean over initialisations of the area-mean squared error"}


def open_truth_source(truth: str | Path | Sequence[str | Path]) -> tuple[xr.Dataset, bool]:
    """(truth Dataset on valid times, whether it came from inside a forecast file).

    A single forecast file with an ensemble dim (gcm_ens: ``truth_<name>`` on ``valid_time``; SEAS5: the
    verifying analysis on init/lead) gives the truth it holds; anything else opens as a prepared store or
    canonical file(s).
    """
    if isinstance(truth, str | Path) and is_forecast_file(truth):
        return open_truth(truth).sortby(["latitude", "longitude"]), True
    return open_canonical(truth), False


def _named(forecasts: Mapping[str, str | Path] | str | Path | Sequence[str | Path]) -> dict[str, Path]:
    if isinstance(forecasts, Mapping):
        return {str(k): Path(v) for k, v in forecasts.items()}
    paths = [forecasts] if isinstance(forecasts, str | Path) else list(forecasts)
    out: dict[str, Path] = {}
    for p in map(Path, paths):
        name = str(open_forecast(p).attrs.get("method") or p.stem)
        if name in out:
            name = f"{name} ({p.stem})" if f"{name} ({p.stem})" not in out else str(p)
        out[name] = p
    return out


def land_sea_mask_of(source: str | Path | Sequence[str | Path] | None, truth_ds: xr.Dataset | None = None
                     ) -> xr.DataArray | None:
    """Land fraction (latitude, longitude) from a store or netCDF (``land_sea_mask`` or ``lsm``), else from the
    truth Dataset; None when neither has one. Only this 2-D constant is loaded."""
    ds = open_canonical(source) if source is not None else truth_ds
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
                 land_sea_mask: str | Path | None, land_threshold: float | None, where: str
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
            check_grid(lsm.to_dataset(name="land_sea_mask"), truth_ds["latitude"].values,
                       truth_ds["longitude"].values, f"land-sea mask {lsm_from}", "the truth's")
    rw = region_weights(parsed, truth_ds["latitude"], truth_ds["longitude"], lsm, land_threshold)
    return parsed, rw, lsm_from


def _spectrum_of(point: xr.DataArray, kind: str, band: tuple[float, float]) -> xr.DataArray:
    """Mean zonal spectrum of a forecast over its inits (and members, for ensembles: each member's own)."""
    return zonal_energy_spectrum(point, band=band, mean_dims=("time", "member"))


def _select(ds: xr.Dataset, f: Field, var: str | None = None) -> xr.DataArray:
    da = ds[var or f[0]]
    return da.sel(level=f[1], drop=True) if f[1] is not None else da


def evaluate(
    forecasts: Mapping[str, str | Path] | str | Path | Sequence[str | Path],
    truth: str | Path | Sequence[str | Path],
    climatology: str | Path | None = None,
    out_dir: str | Path | None = None,
    references: bool = True,
    climatology_years: tuple[int, int] | None = None,
    regions: Sequence[str | Region] | str | None = None,
    land_sea_mask: str | Path | None = None,
    land_threshold: float | None = None,
    spectra: bool = False,
    spectra_band: tuple[float, float] = DEFAULT_BAND,
) -> xr.Dataset:
    """Scores Dataset (vars ``rmse``, ``bias``, [``acc``, ``crps``, ``spread_skill``, ...], ``n_time``) over
    dims ``method``, ``field``, ``prediction_timedelta`` [, ``region``]; written to
    ``out_dir``/scores.{nc,json,md} (and ``out_dir``/wb2/METHOD.nc, :func:`wb2_results`) if given.

    ``forecasts``: {name: path}, one path or a list (names from ``attrs["method"]`` or the file name).
    ``truth``: prepared store or canonical file(s). ``climatology``: a training store (day-of-year
    climatology for ACC and the climatology reference).

    ``regions``: region specifications (:mod:`smoeweather.metrics.regions`; ``"default"`` = global, land,
    sea; ``"wb2"`` = WeatherBench 2's list): every metric gets a ``region`` dim. None: the global mean only,
    without a region dim. Land and sea weight points by the land fraction of ``land_sea_mask`` (a store or
    netCDF; default: the truth's ``land_sea_mask``), or by ``land_sea_mask > land_threshold``.
    The per-initialisation area means (``per_init_<q>``, dim ``time``) are always kept (scorecards test
    differences over initialisations with them). ``spectra``: zonal energy spectra of every forecast and the
    truth per lead, averaged over ``spectra_band`` (latitudes, °), as ``spectrum`` and ``truth_spectrum``
    (dim ``wavenumber``).
    """
    from smoeweather.data.ensembles import code_version
    from smoeweather.forecast.climatology import climatology_at, doy_climatology
    from smoeweather.forecast.output import forecast_fields

    named = _named(forecasts)
    if not named:
        raise ValueError("evaluate needs at least one forecast")
    truth_ds, in_file = open_truth_source(truth)
    where_truth = f"truth {describe(truth)}"
    if in_file and references:
        warnings.warn(f"{where_truth}: truth held inside a forecast file; no persistence/climatology references",
                      stacklevel=2)
        references = False
    fcs = {n: open_forecast(p) for n, p in named.items()}
    kinds = {n: forecast_kind(ds) for n, ds in fcs.items()}
    for n, ds in fcs.items():
        check_grid(ds, truth_ds["latitude"].values, truth_ds["longitude"].values, f"forecast {named[n]}",
                   "the truth's")

    # fields: those of the forecasts that the truth holds

    fields: list[Field] = list(dict.fromkeys(f for ds in fcs.values() for f in forecast_fields(ds)))
    levels = [int(v) for v in truth_ds["level"].values] if "level" in truth_ds.dims else []
    in_truth = [f for f in fields if f[0] in truth_ds.data_vars and (f[1] is None or f[1] in levels)]
    if len(in_truth) < len(fields):
        warnings.warn(f"{where_truth} lacks {[field_name(f) for f in fields if f not in in_truth]}: not scored",
                      stacklevel=2)
    if not in_truth:
        raise ValueError(f"{where_truth} holds none of the forecast fields {[field_name(f) for f in fields]}")
    fields = in_truth
    for f in fields:
        if "member" in truth_ds[f[0]].dims:
            raise ValueError(f"{where_truth}: {f[0]!r} has a member dim; the truth must be deterministic")

    # like with like: the initialisations every forecast has; leads: the union
    inits = np.array(sorted(set.intersection(*(set(ds["time"].values.astype("datetime64[ns]").tolist())
                                               for ds in fcs.values()))), dtype="datetime64[ns]")
    all_leads = np.concatenate([ds["prediction_timedelta"].values.astype("timedelta64[ns]") for ds in fcs.values()])
    leads = np.unique(all_leads)
    if len(inits) == 0:
        raise ValueError(f"the forecasts {list(named)} share no initialisation time (coordinate 'time')")
    tt = truth_ds["time"].values
    valid = inits[:, None] + leads[None, :]
    if not np.isin(valid, tt).any():
        raise ValueError(
            f"no valid time (time + prediction_timedelta) of the forecasts ({str(valid.min())[:16]} .. "
            f"{str(valid.max())[:16]}) lies in the time coordinate of {where_truth} "
            f"({str(tt.min())[:16]} .. {str(tt.max())[:16]})"
        )

    # reference forecasts for the same inits and leads
    if references:
        from smoeweather.forecast import make_forecast

        names = [field_name(f) for f in fields]
        leads_h = lead_hours(leads)
        ref_inits = inits[np.isin(inits, tt)]
        if "persistence" not in fcs and len(ref_inits):
            fcs["persistence"] = make_forecast(truth, ref_inits, method="persistence", leads_h=leads_h, fields=names,
                                               beyond_data=True, progress=False)
            kinds["persistence"] = "deterministic"
            inits = ref_inits
        elif "persistence" not in fcs:
            warnings.warn(f"{where_truth} holds none of the initialisation times: no persistence", stacklevel=2)
        if climatology is not None and "climatology" not in fcs:
            fcs["climatology"] = make_forecast(truth, inits, method="climatology", leads_h=leads_h, fields=names,
                                               climatology_from=climatology, climatology_years=climatology_years,
                                               beyond_data=True, progress=False)
            kinds["climatology"] = "deterministic"

    w = latitude_weights(truth_ds["latitude"])
    rw, region_list, lsm_from = None, None, None
    if regions is not None:
        region_list, rw, lsm_from = _regions_for(regions, truth_ds, land_sea_mask, land_threshold, where_truth)
    clim_fields: dict[Field, xr.DataArray] = {}
    if climatology is not None:
        from smoeweather.forecast.reference import training_fields

        vt = xr.DataArray(inits[:, None] + leads[None, :], dims=("time", "prediction_timedelta"),
                          coords={"time": inits, "prediction_timedelta": leads})
        for f, da in training_fields(str(climatology), fields, climatology_years).items():
            clim_fields[f] = climatology_at(doy_climatology(da), vt, f"climatology of {field_name(f)} "
                                            f"from {climatology}").astype(np.float64)

    methods = list(fcs)
    shape = (len(methods), len(fields), len(leads))
    rdims = ("region",) if rw is not None else ()
    rshape = (rw.sizes["region"],) if rw is not None else ()
    arrays = {m: np.full(shape + rshape, np.nan) for m in METRICS}
    per_init = {q: np.full(shape + rshape + (len(inits),), np.nan) for q in dict.fromkeys(PER_INIT.values())}
    n_time = np.zeros((len(fields), len(leads)), np.int64)
    ranks: dict[tuple[int, int], np.ndarray] = {}  # (method, field) → (lead, M + 1) rank histogram
    spectrum: np.ndarray | None = None
    truth_spectrum: np.ndarray | None = None
    wavenumber = wavelength = None
    ensemble_size = np.zeros(len(methods), np.int64)
    valid_at = xr.Dataset(coords={"time": inits, "prediction_timedelta": leads})
    for j, f in enumerate(fields):
        t = truth_at_valid_times(valid_at, _select(truth_ds, f), gaps="nan").astype(np.float64).load()
        n_time[j] = t.notnull().any(["latitude", "longitude"]).sum("time").values
        if spectra:
            ts = _spectrum_of(t, "deterministic", spectra_band).transpose("prediction_timedelta", "wavenumber")
            if truth_spectrum is None:
                wavenumber, wavelength = ts["wavenumber"].values, ts["wavelength"].values
                truth_spectrum = np.full((len(fields), len(leads), ts.sizes["wavenumber"]), np.nan)
                spectrum = np.full(shape + (ts.sizes["wavenumber"],), np.nan)
            truth_spectrum[j] = ts.values
        for i, m in enumerate(methods):
            ds = fcs[m].sel(time=inits).reindex(prediction_timedelta=leads)  # a lead it lacks: NaN scores
            if f not in forecast_fields(ds):
                continue
            if kinds[m] == "gaussian":  # μ as <name>, σ as <name>_std
                mu_ds, sigma_ds = split_gaussian(ds)
                point, sigma = _select(mu_ds, f), _select(sigma_ds, f)
            else:
                point, sigma = _select(ds, f), None
            ensemble_size[i] = point.sizes.get("member", 1) if kinds[m] in ("ensemble", "deterministic") else 0
            for metric, v in forecast_scores(point, kinds[m], t, w, sigma, clim_fields.get(f), regions=rw,
                                             per_init=True).items():
                if metric == "rank_histogram":
                    ranks[i, j] = v.transpose("prediction_timedelta", "rank").values
                elif metric.startswith("per_init_"):
                    per_init[metric.removeprefix("per_init_")][i, j] = v.transpose(
                        "prediction_timedelta", *rdims, "time").values
                else:
                    arrays[metric][i, j] = v.transpose("prediction_timedelta", *rdims).values
            if spectra and spectrum is not None:
                sp_in = point if kinds[m] != "quantiles" else median_of_quantiles(point)
                spectrum[i, j] = _spectrum_of(sp_in.astype(np.float64), kinds[m], spectra_band).transpose(
                    "prediction_timedelta", "wavenumber").values
    units = [str(truth_ds[f[0]].attrs.get("units", "")) for f in fields]
    field_names = [field_name(f) for f in fields]
    coords = {"method": methods, "field": field_names, "prediction_timedelta": leads,
              "units": ("field", units), "ensemble_size": ("method", ensemble_size)}
    dims3 = ("method", "field", "prediction_timedelta", *rdims)
    data = {m: (dims3, a) for m, a in arrays.items() if not np.all(np.isnan(a))}
    for q, a in per_init.items():
        if not np.all(np.isnan(a)):
            data[f"per_init_{q}"] = ((*dims3, "time"), a)
    if any(k.startswith("per_init_") for k in data):
        coords["time"] = inits
    if rw is not None:
        coords["region"] = [str(r) for r in rw["region"].values]
    data["n_time"] = (("field", "prediction_timedelta"), n_time)
    if spectra and spectrum is not None:
        data["spectrum"] = (("method", "field", "prediction_timedelta", "wavenumber"), spectrum)
        data["truth_spectrum"] = (("field", "prediction_timedelta", "wavenumber"), truth_spectrum)
        coords["wavenumber"] = wavenumber
        coords["wavelength"] = ("wavenumber", wavelength, {"units": "m"})
    if ranks:  # NaN-padded to the largest ensemble: rank 1 … M + 1 of each method
        n_rank = max(r.shape[-1] for r in ranks.values())
        rh = np.full((*shape, n_rank), np.nan)
        for (i, j), r in ranks.items():
            rh[i, j, :, : r.shape[-1]] = r
        data["rank_histogram"] = (("method", "field", "prediction_timedelta", "rank"), rh)
        coords["rank"] = np.arange(1, n_rank + 1)
    scores = xr.Dataset(data, coords=coords)
    long = {"rmse": "latitude-weighted RMSE (sqrt after time mean)", "bias": "latitude-weighted mean error",
            "acc": "anomaly correlation coefficient (WeatherBench 2)",
            "crps": "latitude-weighted CRPS (fair for ensembles, closed form for Gaussian forecasts, MAE for "
                    "deterministic ones: one-member ensembles)",
            "crps_ecdf": "latitude-weighted CRPS of the members' empirical distribution (standard estimator; "
                         "closed form for Gaussian forecasts, MAE for deterministic ones)",
            "quantile_loss": "latitude-weighted pinball loss, mean over the quantile levels",
            "spread_skill": "spread-skill ratio", "n_time": "initialisations with truth",
            "diversity_ratio": "mean pairwise member distance / mean member error (1: calibrated, 0: collapsed)",
            "rank_histogram": "relative frequency of the truth's rank among the members (latitude-weighted, global)",
            "debiased_ensemble_mean_mse": "latitude-weighted ensemble-mean MSE minus the member variance / M "
                                          "(WeatherBench 2)",
            "energy_score": "energy score per field (area-weighted L2 norm), mean over initialisations",
            "spectrum": f"zonal energy spectrum of the forecast, mean over {spectra_band[0]:g}..{spectra_band[1]:g} "
                        "degrees latitude, initialisations and members",
            "truth_spectrum": f"zonal energy spectrum of the truth at the valid times, mean over "
                              f"{spectra_band[0]:g}..{spectra_band[1]:g} degrees latitude and initialisations"}
    per_init_long = {"mse": "area-mean squared error", "bias": "area-mean error", "acc": "anomaly correlation",
                     "crps": "area-mean fair CRPS", "crps_ecdf": "area-mean ECDF CRPS",
                     "quantile_loss": "area-mean pinball loss",
                     "debiased_ensemble_mean_mse": "area-mean debiased ensemble-mean squared error",
                     "energy_score": "energy score"}
    for k in scores.data_vars:
        if k.startswith("per_init_"):
            q = k.removeprefix("per_init_")
            scores[k].attrs["long_name"] = f"{per_init_long[q]} of each initialisation (time = init)"
            scores[k].attrs["units"] = ("1" if q == "acc" else "(units of the field)**2" if q in ("mse", *SQUARED)
                                        else "units of the field (coordinate units)")
            continue
        scores[k].attrs["long_name"] = long[k]
        scores[k].attrs["units"] = ("1" if k in (*UNITLESS, "n_time") else "(units of the field)**2" if k in SQUARED
                                    else "(units of the field)**2 m" if "spectrum" in k
                                    else "units of the field (coordinate units)")
        if k in ESTIMATORS:
            scores[k].attrs["estimator"] = ESTIMATORS[k]
    scores["ensemble_size"].attrs = {"long_name": "members M (1: deterministic, 0: Gaussian or quantiles)"}
    provenance = {
        "truth": describe(truth),
        "climatology": describe(climatology) if climatology is not None else None,
        "forecasts": {n: str(p.resolve()) for n, p in named.items()},
        "checkpoint_sha256": {n: fcs[n].attrs["checkpoint_sha256"] for n in named
                              if "checkpoint_sha256" in fcs[n].attrs},
        "inits": [str(inits.min()), str(inits.max()), int(len(inits))],
        "code_version": code_version(),
        "latitude_weights": "cos(lat)/mean(cos(lat))",
    }
    if region_list is not None:
        provenance["regions"] = describe_regions(region_list, land_threshold)
        provenance["land_sea_mask"] = lsm_from
    if spectra:
        provenance["spectra_band"] = list(spectra_band)
    scores.attrs = {"provenance": json.dumps(provenance)}
    if "rank_histogram" in scores:
        scores["rank_histogram"].attrs["units"] = "1"
    if out_dir is not None:
        write_scores(scores, out_dir)
    return scores


def headline(scores: xr.Dataset) -> xr.Dataset:
    """The scores of the headline region (``global``, else the first) without a region dim; ``scores``
    itself when it has none."""
    if "region" not in scores.dims:
        return scores
    names = scores["region"].values.tolist()
    return scores.sel(region=HEADLINE_REGION if HEADLINE_REGION in names else names[0], drop=True)


def _json_table(scores: xr.Dataset) -> dict[str, Any]:
    out: dict[str, Any] = {}
    metrics = [m for m in METRICS if m in scores]
    for m in scores["method"].values.tolist():
        out[m] = {}
        for metric in metrics:
            out[m][metric] = {}
            for f in scores["field"].values.tolist():
                vals = scores[metric].sel({"method": m, "field": f})
                out[m][metric][f] = {lead_label(td): (None if np.isnan(v) else float(v))
                                     for td, v in zip(vals["prediction_timedelta"].values, vals.values)}
    return out


def scores_json(scores: xr.Dataset) -> dict[str, Any]:
    """``{"scores": {method: {metric: {field: {"72h": value}}}}, "units": {field: unit}, "provenance"}``;
    with regions, ``scores`` holds the headline (global) region and ``regions`` every region the same way."""
    units = dict(zip(scores["field"].values.tolist(), scores["units"].values.tolist()))
    out = {"scores": _json_table(headline(scores)), "units": units,
           "provenance": json.loads(scores.attrs.get("provenance", "{}"))}
    if "region" in scores.dims:
        out["regions"] = {r: _json_table(scores.sel(region=r, drop=True))
                          for r in scores["region"].values.tolist()}
    return out


def _markdown_tables(scores: xr.Dataset) -> list[str]:
    fields = scores["field"].values.tolist()
    units = dict(zip(fields, scores["units"].values.tolist()))
    leads = [lead_label(td) for td in scores["prediction_timedelta"].values]
    lines: list[str] = []
    for metric in (m for m in METRICS if m in scores):
        if np.all(np.isnan(scores[metric].values)):
            continue
        lines += [f"**{metric}** ({scores[metric].attrs['long_name']})", ""]
        cols = [f"{f} {lead}" + ("" if metric in UNITLESS else f" [({units[f]})²]" if metric in SQUARED
                                 else f" [{units[f]}]") for f in fields for lead in leads]
        lines += ["| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for m in scores["method"].values.tolist():
            vals = scores[metric].sel({"method": m}).transpose("field", "prediction_timedelta").values.ravel()
            lines.append(f"| {m} | " + " | ".join("–" if np.isnan(v) else f"{v:.4g}" for v in vals) + " |")
        lines.append("")
    return lines


def scores_markdown(scores: xr.Dataset) -> str:
    """One markdown table per metric: rows = methods, columns = field × lead; with regions, the headline
    (global) region first, then one section per other region."""
    lines = _markdown_tables(headline(scores))
    if "region" in scores.dims:
        names = scores["region"].values.tolist()
        first = HEADLINE_REGION if HEADLINE_REGION in names else names[0]
        lines[:0] = [f"### region: {first}", ""]
        for r in names:
            if r != first:
                lines += [f"### region: {r}", "", *_markdown_tables(scores.sel(region=r, drop=True))]
    n = scores["n_time"].values
    lines.append(f"Initialisations scored per lead: {sorted(set(n.ravel().tolist()))}.")
    return "\n".join(lines) + "\n"


def wb2_results(scores: xr.Dataset) -> dict[str, xr.Dataset]:
    """{method: Dataset in WeatherBench 2's results layout}: one data variable per weather variable
    (``geopotential``, ``temperature``, ... with a ``level`` dim where it has levels), dims ``metric``,
    ``region``, ``lead_time``; metric names as WB2 writes them (``rmse`` is WB2's
    ``rmse_sqrt_before_time_avg``, our RMSE; ``mse`` the mean of per-init MSEs; ``crps`` fair).
    Attributes: the estimator of every metric and the ensemble size."""
    sc = scores if "region" in scores.dims else scores.expand_dims(region=[HEADLINE_REGION])
    names = {"rmse": "rmse_sqrt_before_time_avg", "bias": "bias", "acc": "acc", "crps": "crps",
             "crps_ecdf": "crps_ecdf", "spread_skill": "spread_skill_ratio",
             "debiased_ensemble_mean_mse": "debiased_ensemble_mean_mse", "energy_score": "energy_score",
             "quantile_loss": "quantile_loss", "diversity_ratio": "diversity_ratio"}
    metrics = [m for m in METRICS if m in sc]
    extra = {}
    if "per_init_mse" in sc:
        extra["mse"] = sc["per_init_mse"].mean("time")
    out: dict[str, xr.Dataset] = {}
    for method in sc["method"].values.tolist():
        stack = [sc[m].sel({"method": method}, drop=True).expand_dims(metric=[names[m]]) for m in metrics]
        stack += [v.sel({"method": method}, drop=True).expand_dims(metric=[k]) for k, v in extra.items()]
        table = xr.concat(stack, "metric").rename(prediction_timedelta="lead_time")
        table = table.drop_vars([c for c in table.coords if c not in ("metric", "region", "lead_time", "field")])
        per_var: dict[str, list[xr.DataArray]] = {}
        for f in table["field"].values.tolist():
            var, _, lev = f.rpartition("_")
            da = table.sel(field=f, drop=True)
            if var and lev.isdigit():
                per_var.setdefault(var, []).append(da.expand_dims(level=[int(lev)]))
            else:
                per_var.setdefault(f, []).append(da)
        ds = xr.Dataset({v: (xr.concat(das, "level") if "level" in das[0].dims else das[0])
                         for v, das in per_var.items()})
        ds = ds.transpose("metric", "region", "lead_time", ...)
        m_size = int(scores["ensemble_size"].sel({"method": method})) if "ensemble_size" in scores.coords else 0
        ds.attrs = {"method": method, "ensemble_size": m_size,
                    "estimators": json.dumps({names[k]: ESTIMATORS[k] for k in metrics if k in ESTIMATORS}),
                    "units": json.dumps(dict(zip(scores["field"].values.tolist(), scores["units"].values.tolist()))),
                    "provenance": scores.attrs.get("provenance", "{}"),
                    "Conventions": "WeatherBench 2 results layout (metric, region, lead_time)"}
        out[method] = ds
    return out


def write_scores(scores: xr.Dataset, out_dir: str | Path) -> Path:
    """``out_dir``/scores.nc, scores.json, scores.md and wb2/METHOD.nc (each written atomically)."""
    from smoeweather.io import write_json, write_netcdf, write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_netcdf(scores, out_dir / "scores.nc")
    write_json(out_dir / "scores.json", scores_json(scores))
    write_text(out_dir / "scores.md", scores_markdown(scores))
    (out_dir / "wb2").mkdir(exist_ok=True)
    for method, ds in wb2_results(scores).items():
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in method)
        write_netcdf(ds, out_dir / "wb2" / f"{safe}.nc")
    if "rank_histogram" in scores:  # ensembles: rank histograms also as a figure
        from smoeweather.plotting.ensembles import plot_rank_histograms

        plot_rank_histograms(scores, out_dir / "rank_histograms.png")
    return out_dir


__all__ = ["evaluate", "headline", "land_sea_mask_of", "open_truth_source", "scores_json", "scores_markdown",
           "wb2_results", "write_scores"]
