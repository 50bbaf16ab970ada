"""Scorecards and spectrum-ratio plots from ``smoe evaluate``'s ``scores.nc``.

Scorecard (WeatherBench 2's headline view): one PNG per metric; rows = method × variable, columns = region ×
lead time; each cell the relative difference of the method's score to the baseline's in percent, coloured
blue where the method is better (lower error, higher ACC) and red where it is worse. Cells whose paired
difference over initialisations is not significant (:func:`smoeweather.metrics.significance.
paired_difference_test`, lag-1 autocorrelation allowed for, two-sided, level ``alpha``) are greyed out and
hatched. Needs the per-initialisation scores (``per_init_*``) that ``smoe evaluate`` writes.

Spectra: for every variable (rows) and lead (columns), the ratio of each forecast's zonal energy spectrum
to the truth's against wavenumber (log axis); 1 = the right energy at that scale, below 1 = smoothed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from smoeweather.metrics.scores import PER_INIT  # noqa: E402
from smoeweather.metrics.significance import paired_difference_test  # noqa: E402
from smoeweather.plotting.cartography import save_png  # noqa: E402
from smoeweather.plotting.fields import pretty_units  # noqa: E402
from smoeweather.plotting.scores import lead_hours, open_scores  # noqa: E402

HIGHER_IS_BETTER = {"acc"}
SCORECARD_METRICS = ("rmse", "acc", "crps", "crps_ecdf", "debiased_ensemble_mean_mse", "energy_score",
                     "quantile_loss")
LABELS = {"rmse": "RMSE", "acc": "ACC", "crps": "CRPS (fair)", "crps_ecdf": "CRPS (ECDF)",
          "debiased_ensemble_mean_mse": "debiased ensemble-mean MSE", "energy_score": "energy score",
          "quantile_loss": "quantile loss"}


def scorecard_table(scores: xr.Dataset, metric: str, baseline: str, alpha: float = 0.05) -> xr.Dataset:
    """``relative_difference`` (%) of every method's ``metric`` to ``baseline``'s and ``significant`` (paired
    test over the initialisations of the per-init quantity behind it), over (method, field, lead[, region]).
    ValueError naming the baseline or the metric when absent."""
    methods = scores["method"].values.tolist()
    if baseline not in methods:
        raise ValueError(f"--baseline {baseline!r} is not a method of the scores; methods: {methods}")
    q = f"per_init_{PER_INIT.get(metric, metric)}"
    if metric not in scores or q not in scores:
        have = [m for m in SCORECARD_METRICS if m in scores and f"per_init_{PER_INIT[m]}" in scores]
        raise ValueError(f"no per-initialisation scores for {metric!r} (re-run smoe evaluate); available: {have}")
    base = scores[metric].sel({"method": baseline}, drop=True)
    rel = 100.0 * (scores[metric] - base) / abs(base)
    test = paired_difference_test(scores[q], scores[q].sel({"method": baseline}, drop=True), dim="time")
    significant = test["p_value"] < alpha
    return xr.Dataset({"relative_difference": rel, "significant": significant, "p_value": test["p_value"],
                       "n_eff": test["n_eff"]})


def plot_scorecard(path: str | Path, out_dir: str | Path, baseline: str, methods: Sequence[str] | None = None,
                   metrics: Sequence[str] | None = None, alpha: float = 0.05, limit: float | None = None
                   ) -> list[Path]:
    """One PNG per metric (``scorecard_<metric>.png``) of ``scores.nc`` against ``baseline``; see the module
    docstring. ``methods``: the rows (default: every other method); ``metrics``: default those with per-init
    scores among :data:`SCORECARD_METRICS`; ``limit``: colour range ±limit % (default: the largest
    |difference|, at most 50 %)."""
    ds, _ = open_scores(path)
    out_dir = Path(out_dir)
    all_methods = [str(m) for m in ds["method"].values]
    rows_m = [m for m in (methods or all_methods) if m != baseline]
    unknown = [m for m in rows_m if m not in all_methods]
    if unknown:
        raise ValueError(f"--methods {unknown} not in the scores; methods: {all_methods}")
    if metrics is None:
        metrics = [m for m in SCORECARD_METRICS if m in ds and f"per_init_{PER_INIT[m]}" in ds
                   and np.isfinite(ds[m].sel({"method": baseline}).values).any()]
    if not metrics:
        raise ValueError(f"{path}: no metric with per-initialisation scores for the baseline {baseline!r}")
    fields = [str(f) for f in ds["field"].values]
    regions = [str(r) for r in ds["region"].values] if "region" in ds.dims else [None]
    leads = lead_hours(ds["prediction_timedelta"].values)
    paths = []
    for metric in metrics:
        table = scorecard_table(ds, metric, baseline, alpha)
        rows = [(m, f) for m in rows_m for f in fields
                if np.isfinite(table["relative_difference"].sel({"method": m, "field": f}).values).any()]
        if not rows:
            continue
        cols = [(r, i) for r in regions for i in range(len(leads))]
        val = np.full((len(rows), len(cols)), np.nan)
        sig = np.zeros((len(rows), len(cols)), bool)
        for a, (m, f) in enumerate(rows):
            for b, (r, i) in enumerate(cols):
                sel = {"method": m, "field": f}
                if r is not None:
                    sel["region"] = r
                cell = table.sel(sel).isel(prediction_timedelta=i)
                val[a, b] = float(cell["relative_difference"])
                sig[a, b] = bool(cell["significant"])
        cmap = "RdBu" if metric in HIGHER_IS_BETTER else "RdBu_r"  # blue: better, red: worse
        lim = limit or float(min(50.0, max(1.0, np.nanmax(np.abs(val)) if np.isfinite(val).any() else 1.0)))
        fig_w = max(6.0, 1.6 + 0.95 * len(cols))
        fig_h = max(2.8, 1.8 + 0.42 * len(rows))
        fig, ax = plt.subplots(figsize=(fig_w, fig_h))
        shown = np.where(sig, val, np.nan)
        im = ax.imshow(shown, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
        for a in range(len(rows)):
            for b in range(len(cols)):
                v = val[a, b]
                if not np.isfinite(v):
                    continue
                if not sig[a, b]:
                    ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, facecolor="0.88", edgecolor="0.6",
                                           hatch="///", lw=0))
                strong = sig[a, b] and abs(v) > 0.6 * lim
                box = None if sig[a, b] else dict(boxstyle="round,pad=0.15", facecolor="0.88", edgecolor="none")
                ax.text(b, a, f"{v:+.1f}", ha="center", va="center", fontsize=8, bbox=box,
                        color="white" if strong else ("0.3" if not sig[a, b] else "black"))
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{m}: {f}" for m, f in rows], fontsize=8)
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([f"{leads[i]:g} h" for _, i in cols], fontsize=8)
        if regions != [None]:
            top = ax.secondary_xaxis("top")
            top.set_xticks([k * len(leads) + (len(leads) - 1) / 2 for k in range(len(regions))])
            top.set_xticklabels(regions, fontsize=9, fontweight="bold")
            top.tick_params(length=0)
            for k in range(1, len(regions)):
                ax.axvline(k * len(leads) - 0.5, color="k", lw=1.2)
        for a in range(1, len(rows)):
            if rows[a][0] != rows[a - 1][0]:
                ax.axhline(a - 0.5, color="k", lw=1.2)
        ax.set_xlim(-0.5, len(cols) - 0.5)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
        cb.set_label(f"% difference to {baseline} (blue: better)", fontsize=8)
        better = "higher is better" if metric in HIGHER_IS_BETTER else "lower is better"
        ax.set_title(f"{LABELS.get(metric, metric)}: % difference to {baseline} ({better})\nhatched grey: not "
                     f"significant (p ≥ {alpha:g}, paired t-test over inits, autocorrelation allowed for)",
                     fontsize=9, pad=8)
        fig.tight_layout()
        paths.append(save_png(fig, out_dir / f"scorecard_{metric}.png"))
    if not paths:
        raise ValueError(f"{path}: nothing to compare with {baseline!r}")
    return paths


def plot_spectra(path: str | Path, out_dir: str | Path, methods: Sequence[str] | None = None) -> list[Path]:
    """``spectra.png``: forecast / truth zonal energy spectrum against wavenumber per variable (rows) and lead
    (columns), one line per method; and ``spectra_energy.png``: the spectra themselves (log–log)."""
    ds, units = open_scores(path)
    if "spectrum" not in ds or "truth_spectrum" not in ds:
        raise ValueError(f"{path} holds no spectra: run smoe evaluate with --spectra")
    out_dir = Path(out_dir)
    ms = [str(m) for m in (methods or ds["method"].values)]
    fields = [str(f) for f in ds["field"].values]
    leads = lead_hours(ds["prediction_timedelta"].values)
    k = ds["wavenumber"].values
    keep = k >= 1
    wavelength_km = ds["wavelength"].values / 1000.0 if "wavelength" in ds.coords else None
    band = ""
    try:
        import json

        b = json.loads(ds.attrs.get("provenance", "{}")).get("spectra_band")
        band = f", latitudes {b[0]:g}–{b[1]:g}°" if b else ""
    except (ValueError, TypeError):
        pass
    colours = dict(zip(ms, plt.get_cmap("tab10").colors))
    paths = []
    for kind in ("ratio", "energy"):
        fig, axes = plt.subplots(len(fields), len(leads), figsize=(4.4 * len(leads), 3.2 * len(fields)),
                                 squeeze=False)
        for a, f in enumerate(fields):
            truth = ds["truth_spectrum"].sel(field=f)
            for b in range(len(leads)):
                ax = axes[a][b]
                t = truth.isel(prediction_timedelta=b).values
                for m in ms:
                    s = ds["spectrum"].sel({"method": m, "field": f}).isel(prediction_timedelta=b).values
                    if not np.isfinite(s[keep]).any():
                        continue
                    y = s[keep] / t[keep] if kind == "ratio" else s[keep]
                    ax.plot(k[keep], y, label=m, color=colours[m], lw=1.4)
                if kind == "ratio":
                    ax.axhline(1.0, color="k", lw=0.8, ls="--")
                    ax.set_yscale("log")  # ratios of 1/10 and 10 are equally far from 1
                    ax.set_ylabel("forecast / truth energy")
                else:
                    ax.plot(k[keep], t[keep], label="truth", color="k", lw=1.6, ls="--")
                    ax.set_yscale("log")
                    u = pretty_units(units.get(f, ""))
                    ax.set_ylabel(f"energy [({u})² m]" if u else "energy")
                ax.set_xscale("log")
                ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.set_xlabel("zonal wavenumber")
                ax.grid(alpha=0.3, which="both")
                if wavelength_km is not None:  # wavelength at the band's mean circumference, on top
                    c_km = float(wavelength_km[k == 1][0])
                    top = ax.secondary_xaxis("top", functions=(lambda x, c=c_km: c / np.maximum(x, 1e-9),
                                                               lambda x, c=c_km: c / np.maximum(x, 1e-9)))
                    top.set_xlabel("wavelength [km]", fontsize=8)
                    top.tick_params(labelsize=7)
                ax.set_title(f"{f}, {leads[b]:g} h", fontsize=10)
        axes[0][0].legend(fontsize=8)
        what = "forecast / truth zonal energy spectrum" if kind == "ratio" else "zonal energy spectra"
        fig.suptitle(f"{what} (mean over initialisations{band})", fontsize=11)
        fig.tight_layout()
        paths.append(save_png(fig, out_dir / ("spectra.png" if kind == "ratio" else "spectra_energy.png")))
    return paths


__all__ = ["plot_scorecard", "plot_spectra", "scorecard_table"]
