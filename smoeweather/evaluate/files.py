"""The files ``smoe evaluate`` writes, rendered from its scores Dataset: scores.nc, scores.json, scores.md and
WeatherBench 2's evaluation files (``wb2/METHOD/EVALUATION.nc``).

WB2's evaluation files (:data:`smoeweather.metrics.wb2.EVALUATIONS`): ``deterministic`` (``mse``, ``acc``,
``bias``, ``mae``), ``deterministic_temporal`` (the same per initialisation plus ``rmse_sqrt_before_time_avg``,
dim ``time``), ``probabilistic`` and ``ensemble_binary`` for ensembles, ``gaussian_probabilistic`` and
``gaussian_binary`` for μ/σ forecasts; one data variable per weather variable (``level`` dim where it has
levels), dims ``metric``, ``region``, ``lead_time`` [, ``quantile``]. Only WB2's names appear in them; our own
scores (``rmse`` = √ of the time-mean ``mse``, ``crps_ecdf``, our finite-ensemble ``spread_skill``,
``diversity_ratio``) stay in scores.nc/json/md under names WB2 does not use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from smoeweather.data.forecast_stores import lead_label
from smoeweather.metrics import wb2
from smoeweather.metrics.scores import METRICS

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
              "rmse": "sqrt of the mean over initialisations of the area-mean squared error (sqrt AFTER the time "
                      "mean; WB2's rmse_sqrt_before_time_avg is in wb2/METHOD/deterministic_temporal.nc)"}
LONG_NAMES = {
    "rmse": "latitude-weighted RMSE (sqrt after time mean)", "bias": "latitude-weighted mean error",
    "acc": "anomaly correlation coefficient (WeatherBench 2)",
    "crps": "latitude-weighted CRPS (fair for ensembles, closed form for Gaussian forecasts, MAE for "
            "deterministic ones: one-member ensembles)",
    "crps_ecdf": "latitude-weighted CRPS of the members' empirical distribution (standard estimator; "
                 "closed form for Gaussian forecasts, MAE for deterministic ones)",
    "quantile_loss": "latitude-weighted pinball loss, mean over the quantile levels",
    "spread_skill": "spread-skill ratio", "n_time": "initialisations with truth",
    "n_scored": "initialisations scored (truth present, forecast complete)",
    "diversity_ratio": "mean pairwise member distance / mean member error (1: calibrated, 0: collapsed)",
    "rank_histogram": "relative frequency of the truth's rank among the members (latitude-weighted, global)",
    "debiased_ensemble_mean_mse": "latitude-weighted ensemble-mean MSE minus the member variance / M "
                                  "(WeatherBench 2)",
    "energy_score": "energy score per field (area-weighted L2 norm), mean over initialisations",
    "brier_score": "Brier score of the event truth > threshold: (p - 1{y > t})**2, area mean per "
                   "initialisation, then the mean over initialisations",
    "brier_score_climatology": "Brier score of the climatological probability of the event (training store, "
                               "31-day day-of-year window)",
    "brier_skill_score": "1 - Brier score / Brier score of the reference (climatology or a method)",
    "reliability_forecast_probability": "mean forecast probability in the bin (all points and initialisations)",
    "reliability_observed_frequency": "observed frequency of the event in the bin",
    "reliability_count": "number of cases (grid points x initialisations) in the bin",
    "pit_histogram": "relative frequency of the PIT F(y) per bin of [0, 1] (flat: calibrated)"}
PER_INIT_LONG = {"mse": "area-mean squared error", "bias": "area-mean error", "acc": "anomaly correlation",
                 "crps": "area-mean fair CRPS", "crps_ecdf": "area-mean ECDF CRPS",
                 "quantile_loss": "area-mean pinball loss",
                 "debiased_ensemble_mean_mse": "area-mean debiased ensemble-mean squared error",
                 "energy_score": "energy score", "brier_score": "area-mean Brier score"}
WB2_SQUARED = ("mse", "ensemble_mean_mse", "debiased_ensemble_mean_mse", "ensemble_variance")
WB2_UNITLESS = ("acc", "brier_score", "debiased_brier_score", "ignorance_score")


def _units_of(name: str, squared: tuple[str, ...], unitless: tuple[str, ...]) -> str:
    if name in unitless:
        return "1"
    return "(units of the field)**2" if name in squared else "units of the field (coordinate units)"


def describe_scores(scores: xr.Dataset, spectra_band: tuple[float, float]) -> None:
    """Set ``long_name``, ``units`` and ``estimator`` attributes of every score variable (in place)."""
    band = f"{spectra_band[0]:g}..{spectra_band[1]:g} degrees latitude"
    for k in scores.data_vars:
        name = str(k)
        da = scores[k]
        if name.startswith("per_init_"):
            q = name.removeprefix("per_init_")
            da.attrs = {"long_name": f"{PER_INIT_LONG[q]} of each initialisation (time = init)",
                        "units": "1" if q in ("acc", "brier_score") else _units_of(q, ("mse", *SQUARED), ())}
        elif name.startswith("wb2_"):
            q = name.removeprefix("wb2_")
            da.attrs = {"long_name": f"WeatherBench 2 {q} of each initialisation (time = init)",
                        "units": _units_of(q, WB2_SQUARED, WB2_UNITLESS)}
        elif name == "spectrum":
            da.attrs = {"long_name": f"zonal energy spectrum of the forecast, mean over {band}, initialisations "
                                     "and members", "units": "(units of the field)**2 m"}
        elif name == "truth_spectrum":
            da.attrs = {"long_name": f"zonal energy spectrum of the truth at the valid times, mean over {band} "
                                     "and initialisations", "units": "(units of the field)**2 m"}
        else:
            da.attrs = {"long_name": LONG_NAMES[name],
                        "units": "1" if name in (*UNITLESS, "n_time", "n_scored", "rank_histogram") or
                        name.startswith(("brier", "reliability", "pit"))
                        else _units_of(name, SQUARED, ())}
            if name in ESTIMATORS:
                da.attrs["estimator"] = ESTIMATORS[name]
    scores["ensemble_size"].attrs = {"long_name": "members M (1: deterministic, 0: Gaussian or quantiles)"}


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
    h = headline(scores)
    if "brier_score" in h:  # {method: {field: {threshold: {lead: value}}}}, each field's own thresholds
        events = scored_events(h)
        out["brier_score"] = {m: {f: {f"{t:g}": {lead_label(td): (None if np.isnan(v) else float(v)) for td, v in zip(
            h["prediction_timedelta"].values, h["brier_score"].sel({"method": m, "field": f, "threshold": t}).values)}
            for t in ts} for f, ts in events.items()} for m in h["method"].values.tolist()}
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
        cols = [f"{f} {lead}" + ("" if metric in UNITLESS or not units[f] else f" [({units[f]})²]"
                                 if metric in SQUARED else f" [{units[f]}]") for f in fields for lead in leads]
        lines += ["| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for m in scores["method"].values.tolist():
            vals = scores[metric].sel({"method": m}).transpose("field", "prediction_timedelta").values.ravel()
            lines.append(f"| {m} | " + " | ".join("–" if np.isnan(v) else f"{v:.4g}" for v in vals) + " |")
        lines.append("")
    return lines


def scored_events(h: xr.Dataset) -> dict[str, list[float]]:
    """{field: the thresholds scored for it}: the (field, threshold) pairs of ``h["brier_score"]`` with a value
    for some method and lead (the ``threshold`` dim is the union over fields; another field's thresholds are NaN)."""
    bs = h["brier_score"]
    scored = bs.notnull().any([d for d in bs.dims if d not in ("field", "threshold")])
    events = {f: [float(t) for t, ok in zip(h["threshold"].values, scored.sel(field=f).values) if ok]
              for f in h["field"].values.tolist()}
    return {f: ts for f, ts in events.items() if ts}


def _brier_tables(scores: xr.Dataset) -> list[str]:
    """Brier score and skill tables (rows: methods; columns: field × threshold × lead), headline region."""
    h = headline(scores)
    if "brier_score" not in h:
        return []
    cols = [(f, t, td) for f, ts in scored_events(h).items() for t in ts for td in h["prediction_timedelta"].values]
    head = "| method | " + " | ".join(f"{f} > {t:g} {lead_label(td)}" for f, t, td in cols) + " |"
    lines = []
    tables = [("brier_score", h["brier_score"])]
    if "brier_skill_score" in h:
        tables += [(f"brier_skill_score vs {r}", h["brier_skill_score"].sel(reference=r))
                   for r in h["reference"].values.tolist()]
    for title, da in tables:
        lines += [f"**{title}**", "", head, "|---|" + "---:|" * len(cols)]
        for m in h["method"].values.tolist():
            row = da.sel({"method": m})
            vals = [float(row.sel({"field": f, "threshold": t, "prediction_timedelta": td})) for f, t, td in cols]
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
    lines += _brier_tables(scores)
    n = scores["n_time"].values
    lines.append(f"RMSE is the square root after the mean over initialisations (√ of WB2's mse). "
                 f"Initialisations scored per lead: {sorted(set(n.ravel().tolist()))}.")
    return "\n".join(lines) + "\n"


def _per_variable(table: xr.DataArray) -> xr.Dataset:
    """(metric, field, ...) → one data variable per weather variable (``temperature_850`` → ``temperature`` at
    level 850)."""
    per_var: dict[str, list[xr.DataArray]] = {}
    for f in table["field"].values.tolist():
        var, _, lev = f.rpartition("_")
        da = table.sel(field=f, drop=True)
        if var and lev.isdigit():
            per_var.setdefault(var, []).append(da.expand_dims(level=[int(lev)]))
        else:
            per_var.setdefault(f, []).append(da)
    return xr.Dataset({v: (xr.concat(das, "level") if "level" in das[0].dims else das[0])
                       for v, das in per_var.items()})


def wb2_results(scores: xr.Dataset) -> dict[str, dict[str, xr.Dataset]]:
    """{method: {evaluation: Dataset in WeatherBench 2's results layout}} from the ``wb2_<metric>`` variables:
    one data variable per weather variable, dims ``metric``, ``region``, ``lead_time`` [, ``quantile``]
    [, ``level``] (``time`` too in ``deterministic_temporal``). Attributes: units, ensemble size, provenance."""
    sc = scores if "region" in scores.dims else scores.expand_dims(region=[HEADLINE_REGION])
    out: dict[str, dict[str, xr.Dataset]] = {}
    units = json.dumps(dict(zip(scores["field"].values.tolist(), scores["units"].values.tolist())))
    for method in sc["method"].values.tolist():
        row = sc.sel({"method": method})
        kind = str(row["kind"].values) if "kind" in row.coords else "deterministic"
        per_init = {fam: {m: row[f"wb2_{m}"].drop_vars([c for c in row[f"wb2_{m}"].coords
                                                         if c not in row[f"wb2_{m}"].dims])
                          for m in names if f"wb2_{m}" in row and not bool(row[f"wb2_{m}"].isnull().all())}
                    for fam, names in ((f, wb2.EVALUATIONS[f]) for f in wb2.families(kind))}
        files = wb2.evaluation_files(per_init)
        out[method] = {}
        for evaluation, ds in files.items():
            table = ds["value"].rename(prediction_timedelta="lead_time")
            res = _per_variable(table).transpose("metric", "region", "lead_time", ...)
            res.attrs = {"method": method, "evaluation": evaluation,
                         "ensemble_size": int(row["ensemble_size"]) if "ensemble_size" in row.coords else 0,
                         "units": units, "provenance": scores.attrs.get("provenance", "{}"),
                         "Conventions": "WeatherBench 2 results layout (metric, region, lead_time)"}
            out[method][evaluation] = res
    return out


def _safe(name: str) -> str:
    """The folder name of method ``name`` under wb2/ (:func:`smoeweather.io.safe_component`: never '.' or '..')."""
    from smoeweather.io import safe_component

    return safe_component(name, "method name")


def write_scores(scores: xr.Dataset, out_dir: str | Path, overwrite: bool = True) -> Path:
    """``out_dir``/scores.nc, scores.json, scores.md and wb2/METHOD/EVALUATION.nc, written into a staging folder
    and moved into place as a whole (an existing ``out_dir`` is replaced only with ``overwrite``; never a part
    of it, so no stale file of an earlier run survives)."""
    from pipelines.atomic import atomic_output
    from smoeweather.io import write_netcdf

    out_dir = Path(out_dir)
    with atomic_output(out_dir, overwrite, kind="dir") as tmp:
        write_netcdf(scores, tmp / "scores.nc")
        (tmp / "scores.json").write_text(json.dumps(scores_json(scores), indent=2, default=float) + "\n")
        (tmp / "scores.md").write_text(scores_markdown(scores))
        for method, files in wb2_results(scores).items():
            (tmp / "wb2" / _safe(method)).mkdir(parents=True, exist_ok=True)
            for evaluation, ds in files.items():
                write_netcdf(ds, tmp / "wb2" / _safe(method) / f"{evaluation}.nc")
    return out_dir


__all__ = ["ESTIMATORS", "describe_scores", "headline", "scores_json", "scores_markdown", "wb2_results",
           "write_scores"]
