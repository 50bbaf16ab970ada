"""Leave-one-out cross-validation of EMOS against the raw ensemble (CRPS, latitude-weighted).

Folds are the init times' calendar years (``fold="year"``, leave-one-year-out) or months (``"month"``, for
a single-year reforecast set). For each fold EMOS is fitted on every other fold and applied to the held-out
one; the held-out scores are pooled. Scores per field (``<name>`` or ``<name>_<level>``) and lead (hours):
raw ensemble CRPS (fair and standard estimators), EMOS Gaussian CRPS (global and per-grid-point fits),
spread–skill ratio of the raw ensemble, all latitude-weighted means over time/latitude/longitude.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from smoeweather.data.forecast_stores import lead_label
from smoeweather.metrics.probabilistic import crps_ensemble, crps_gaussian, spread_skill_ratio
from smoeweather.metrics.weights import cell_area_weights, weighted_mean
from smoeweather.postprocess.emos import apply_emos, fit_emos

FOLDS = ("year", "month")
METHODS = ("raw_fair", "raw_standard", "emos_global", "emos_gridpoint")


def fold_labels(times: xr.DataArray, fold: str) -> np.ndarray:
    """Fold label per init time: the year, or year·100 + month."""
    if fold == "year":
        return times.dt.year.values
    if fold == "month":
        return times.dt.year.values * 100 + times.dt.month.values
    raise ValueError(f"fold must be one of {FOLDS}, got {fold!r}")


def _fields(ds: xr.Dataset) -> list[tuple[str, str, dict[str, Any]]]:
    """(field label, variable, selection) for every variable × level."""
    out = []
    for name in ds.data_vars:
        if "level" in ds[name].dims:
            out += [(f"{name}_{int(lv)}", name, {"level": lv}) for lv in ds["level"].values]
        else:
            out.append((name, name, {}))
    return out


def crossvalidate(forecast: xr.Dataset, truth: xr.Dataset, fold: str = "year", iterations: int | None = None,
                  source: str = "") -> dict[str, Any]:
    """Cross-validated CRPS of the raw ensemble and of EMOS (see module docstring).

    ``forecast``: ensemble Dataset; ``truth``: at the forecast's valid times (same dims without member).
    Returns {"scores": {field: {lead: {method: value}}}, "units", "folds", "fold", "source"}.
    """
    forecast, truth = forecast.load(), truth.load()
    labels = fold_labels(forecast["time"], fold)
    folds = np.unique(labels)
    if len(folds) < 2:
        t = pd.DatetimeIndex(forecast["time"].values)
        hint = ("; try --fold month" if fold == "year" and len(np.unique(fold_labels(forecast["time"], "month"))) > 1
                else "; give a forecast spanning more time")
        raise ValueError(f"--fold {fold}: the init times of {source or 'the forecast'} ({t.min():%Y-%m-%d} .. "
                         f"{t.max():%Y-%m-%d}) lie in one {fold}, and leave-one-{fold}-out needs at least two{hint}")
    held: dict[str, list[xr.Dataset]] = {m: [] for m in METHODS}
    for f in folds:
        test, train = labels == f, labels != f
        fc_test, tr_test = forecast.isel(time=test), truth.isel(time=test)
        held["raw_fair"].append(crps_ensemble(fc_test, tr_test, estimator="fair"))
        held["raw_standard"].append(crps_ensemble(fc_test, tr_test, estimator="standard"))
        for method, per_gridpoint in (("emos_global", False), ("emos_gridpoint", True)):
            params = fit_emos(forecast.isel(time=train), truth.isel(time=train), per_gridpoint, iterations)
            mu, sigma = apply_emos(params, fc_test)
            held[method].append(crps_gaussian(mu, sigma, tr_test))
    w = cell_area_weights(forecast["latitude"])
    dims = ("time", "latitude", "longitude")
    pooled = {m: weighted_mean(xr.concat(v, "time"), dims, w) for m, v in held.items()}
    ssr = spread_skill_ratio(forecast, truth, weights=w, dims=dims)
    scores: dict[str, Any] = {}
    units: dict[str, str] = {}
    for label, name, sel in _fields(forecast):
        units[label] = str(forecast[name].attrs.get("units", ""))
        scores[label] = {}
        for td in forecast["prediction_timedelta"].values:
            at = {**sel, "prediction_timedelta": td}
            row = {m: float(pooled[m][name].sel(at)) for m in METHODS}
            row["raw_spread_skill"] = float(ssr[name].sel(at))
            scores[label][lead_label(td)] = row
    return {"source": source, "fold": fold, "folds": [int(f) for f in folds], "n_inits": int(forecast.sizes["time"]),
            "members": int(forecast.sizes["member"]), "iterations": iterations, "scores": scores,
            "units": units}


def markdown(result: dict[str, Any]) -> str:
    """Table: field, lead, raw CRPS (fair/standard), EMOS global / per grid point, change vs raw (fair)."""
    lines = [f"Leave-one-{result['fold']}-out ({len(result['folds'])} folds, {result['n_inits']} inits, "
             f"{result['members']} members): {Path(result['source']).name}", "",
             "| field | lead | raw CRPS fair | raw CRPS standard | EMOS global | EMOS per grid point | "
             "best vs raw (fair) | raw spread-skill |", "|---|---|---|---|---|---|---|---|"]
    for field, leads in result["scores"].items():
        for lead, r in leads.items():
            best = min(r["emos_global"], r["emos_gridpoint"])
            change = 100.0 * (best / r["raw_fair"] - 1.0)
            lines.append(f"| {field} ({result['units'][field]}) | {lead} | {r['raw_fair']:.4g} | "
                         f"{r['raw_standard']:.4g} | {r['emos_global']:.4g} | {r['emos_gridpoint']:.4g} | "
                         f"{change:+.1f}% | {r['raw_spread_skill']:.3g} |")
    return "\n".join(lines) + "\n"


def crossvalidate_files(forecast_paths: list[Path], out: Path, *, truth: Path | None = None,
                        variables: list[str] | None = None, fold: str = "year", iterations: int | None = None,
                        overwrite: bool = False) -> str:
    """``smoe postprocess crossval``: :func:`crossvalidate` on gridded ensemble files (their own truth, or
    ``truth``), written to the folder ``out`` (``crossval.json``, ``crossval.md``) atomically; the table."""
    import json

    from smoeweather.data import forecast_stores
    from smoeweather.io import atomic_output, check_output
    from smoeweather.postprocess.pipeline import open_gridded, open_gridded_truth
    from smoeweather.units import align_truth

    check_output(out, overwrite, inputs=[forecast_paths, truth])
    forecast = open_gridded(forecast_paths, variables)
    truth_at = forecast_stores.truth_at_valid_times(forecast, open_gridded_truth(truth, forecast_paths))
    sources = " ".join(map(str, forecast_paths))  # scored in the forecast's units: the truth converted (noted)
    truth_at = align_truth(truth_at, forecast, f"--truth {truth}" if truth else f"the truth in {sources}",
                           f"--forecast {sources}")
    result = crossvalidate(forecast, truth_at, fold=fold, iterations=iterations, source=sources)
    with atomic_output(out, overwrite, kind="dir") as tmp:  # the whole folder, never a part of it
        (tmp / "crossval.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        (tmp / "crossval.md").write_text(markdown(result))
    return markdown(result)
