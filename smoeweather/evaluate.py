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
from smoeweather.metrics.scores import METRICS, forecast_scores
from smoeweather.metrics.weights import latitude_weights

UNITLESS = ("acc", "spread_skill", "diversity_ratio")


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
) -> xr.Dataset:
    """Scores Dataset (vars ``rmse``, ``bias``, [``acc``, ``crps``, ``spread_skill``], ``n_time``) over dims
    ``method``, ``field``, ``prediction_timedelta``; written to ``out_dir``/scores.{nc,json,md} if given.

    ``forecasts``: {name: path}, one path or a list (names from ``attrs["method"]`` or the file name).
    ``truth``: prepared store or canonical file(s). ``climatology``: a training store (day-of-year
    climatology for ACC and the climatology reference).
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
    arrays = {m: np.full(shape, np.nan) for m in METRICS}
    n_time = np.zeros((len(fields), len(leads)), np.int64)
    ranks: dict[tuple[int, int], np.ndarray] = {}  # (method, field) → (lead, M + 1) rank histogram
    valid_at = xr.Dataset(coords={"time": inits, "prediction_timedelta": leads})
    for j, f in enumerate(fields):
        t = truth_at_valid_times(valid_at, _select(truth_ds, f), gaps="nan").astype(np.float64).load()
        n_time[j] = t.notnull().any(["latitude", "longitude"]).sum("time").values
        for i, m in enumerate(methods):
            ds = fcs[m].sel(time=inits).reindex(prediction_timedelta=leads)  # a lead it lacks: NaN scores
            if f not in forecast_fields(ds):
                continue
            if kinds[m] == "gaussian":  # μ as <name>, σ as <name>_std
                mu_ds, sigma_ds = split_gaussian(ds)
                point, sigma = _select(mu_ds, f), _select(sigma_ds, f)
            else:
                point, sigma = _select(ds, f), None
            for metric, v in forecast_scores(point, kinds[m], t, w, sigma, clim_fields.get(f)).items():
                if metric == "rank_histogram":
                    ranks[i, j] = v.transpose("prediction_timedelta", "rank").values
                    continue
                arrays[metric][i, j] = v.transpose("prediction_timedelta").values
    units = [str(truth_ds[f[0]].attrs.get("units", "")) for f in fields]
    field_names = [field_name(f) for f in fields]
    coords = {"method": methods, "field": field_names, "prediction_timedelta": leads,
              "units": ("field", units)}
    data = {m: (("method", "field", "prediction_timedelta"), a) for m, a in arrays.items()
            if not np.all(np.isnan(a))}
    data["n_time"] = (("field", "prediction_timedelta"), n_time)
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
            "rank_histogram": "relative frequency of the truth's rank among the members (latitude-weighted)"}
    for k in scores.data_vars:
        scores[k].attrs["long_name"] = long[k]
        scores[k].attrs["units"] = "1" if k in (*UNITLESS, "n_time") else "units of the field (coordinate units)"
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
    scores.attrs = {"provenance": json.dumps(provenance)}
    if "rank_histogram" in scores:
        scores["rank_histogram"].attrs["units"] = "1"
    if out_dir is not None:
        write_scores(scores, out_dir)
    return scores


def scores_json(scores: xr.Dataset) -> dict[str, Any]:
    """``{"scores": {method: {metric: {field: {"72h": value}}}}, "units": {field: unit}, "provenance"}``."""
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
    units = dict(zip(scores["field"].values.tolist(), scores["units"].values.tolist()))
    return {"scores": out, "units": units, "provenance": json.loads(scores.attrs.get("provenance", "{}"))}


def scores_markdown(scores: xr.Dataset) -> str:
    """One markdown table per metric: rows = methods, columns = field × lead."""
    fields = scores["field"].values.tolist()
    units = dict(zip(fields, scores["units"].values.tolist()))
    leads = [lead_label(td) for td in scores["prediction_timedelta"].values]
    lines: list[str] = []
    for metric in (m for m in METRICS if m in scores):
        lines += [f"**{metric}** ({scores[metric].attrs['long_name']})", ""]
        cols = [f"{f} {lead}" + ("" if metric in UNITLESS else f" [{units[f]}]") for f in fields for lead in leads]
        lines += ["| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for m in scores["method"].values.tolist():
            vals = scores[metric].sel({"method": m}).transpose("field", "prediction_timedelta").values.ravel()
            lines.append(f"| {m} | " + " | ".join("–" if np.isnan(v) else f"{v:.4g}" for v in vals) + " |")
        lines.append("")
    n = scores["n_time"].values
    lines.append(f"Initialisations scored per lead: {sorted(set(n.ravel().tolist()))}.")
    return "\n".join(lines) + "\n"


def write_scores(scores: xr.Dataset, out_dir: str | Path) -> Path:
    """``out_dir``/scores.nc, scores.json, scores.md (each written atomically)."""
    from smoeweather.io import atomic_path, write_json, write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "scores.nc", overwrite=True) as tmp:
        scores.to_netcdf(tmp)
    write_json(out_dir / "scores.json", scores_json(scores))
    write_text(out_dir / "scores.md", scores_markdown(scores))
    if "rank_histogram" in scores:  # ensembles: rank histograms also as a figure
        from smoeweather.plotting.ensembles import plot_rank_histograms

        plot_rank_histograms(scores, out_dir / "rank_histograms.png")
    return out_dir


__all__ = ["evaluate", "open_truth_source", "scores_json", "scores_markdown", "write_scores"]
