"""Calibration figures from ``smoe evaluate``'s scores.nc: reliability diagrams (observed frequency against
forecast probability, the diagonal, and the count of cases per bin as the sharpness histogram) and PIT
histograms (with the flat line of a calibrated forecast)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from smoeweather.data.forecast_stores import lead_label  # noqa: E402


def _open(path: str | Path, needs: str, hint: str) -> xr.Dataset:
    """The scores of a scores.nc or an evaluate folder (:func:`~smoeweather.plotting.scores.scores_file`)
    holding ``needs``; ValueError with ``hint`` otherwise."""
    from smoeweather.plotting.scores import scores_file

    path = scores_file(path)
    try:
        ds = xr.load_dataset(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a scores.nc of `smoe evaluate` ({type(err).__name__})") from None
    if needs not in ds:
        raise ValueError(f"{path} has no {needs}: {hint}")
    return ds


def _methods(ds: xr.Dataset, var: str, methods: list[str] | None) -> list[str]:
    have = [m for m in ds["method"].values.tolist() if not bool(ds[var].sel({"method": m}).isnull().all())]
    if methods is None:
        return have
    unknown = [m for m in methods if m not in have]
    if unknown:
        raise ValueError(f"--methods {unknown} have no {var} in the scores; choose from {have}")
    return methods


def _save(fig: plt.Figure, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (PNG, 110 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_reliability(scores: str | Path, out_dir: str | Path, methods: list[str] | None = None) -> list[Path]:
    """One PNG per (field, threshold) with cases: a reliability panel per lead (a line per method, the diagonal)
    above the count of cases per probability bin (log scale: the forecasts' sharpness). A method without cases
    at a lead is only named in the legend."""
    ds = _open(scores, "reliability_observed_frequency",
               "score probability forecasts, or pass --thresholds FIELD=T to `smoe evaluate`")
    methods = _methods(ds, "reliability_count", methods)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    leads = ds["prediction_timedelta"].values
    units = dict(zip(ds["field"].values.tolist(), ds["units"].values.tolist()))
    paths = []
    for f in ds["field"].values.tolist():
        for t in ds["threshold"].values.tolist():
            n_all = ds["reliability_count"].sel({"method": methods, "field": f, "threshold": t})
            if not bool((n_all > 0).any()):  # an event of another field (thresholds are per field)
                continue
            fig, axes = plt.subplots(2, len(leads), figsize=(4.2 * len(leads), 6.4), squeeze=False,
                                     gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
            for j, lead in enumerate(leads):
                ax, bar = axes[0, j], axes[1, j]
                ax.plot([0, 1], [0, 1], color="0.5", ls="--", lw=1, label="perfect reliability")
                width = 1.0 / ds.sizes["probability_bin"] / (len(methods) + 1)
                for i, m in enumerate(methods):
                    sel = {"method": m, "field": f, "threshold": t, "prediction_timedelta": lead}
                    p = ds["reliability_forecast_probability"].sel(sel).values
                    o = ds["reliability_observed_frequency"].sel(sel).values
                    n = np.nan_to_num(ds["reliability_count"].sel(sel).values)
                    ok = n > 0
                    if not ok.any():  # no cases at this lead (a network of one lead): in the legend only
                        ax.plot([], [], marker="o", ms=4, label=f"{m} (none at {lead_label(lead)})")
                        continue
                    line, = ax.plot(p[ok], o[ok], marker="o", ms=4, label=m)
                    centres = ds["probability_bin"].values
                    bar.bar(centres - 0.5 / ds.sizes["probability_bin"] + (i + 0.5) * width, n, width=width,
                            color=line.get_color())
                ax.set(xlim=(0, 1), ylim=(0, 1), title=f"{f} > {t:g} {units.get(f, '')}, {lead_label(lead)}",
                       ylabel="observed frequency" if j == 0 else None)
                bar.set(yscale="log" if bar.containers else "linear", xlabel="forecast probability",
                        ylabel="cases" if j == 0 else None)
            axes[0, 0].legend(fontsize=8, loc="upper left")
            paths.append(_save(fig, out_dir / f"reliability_{f}_gt_{t:g}.png"))
    return paths


def plot_pit(scores: str | Path, out_dir: str | Path, methods: list[str] | None = None) -> list[Path]:
    """One PNG per field: PIT histograms per lead (a step line per method; flat at 1 = calibrated), as densities."""
    ds = _open(scores, "pit_histogram", "score a Gaussian (μ/σ) forecast, e.g. the output of `smoe postprocess "
                                        "apply`")
    methods = _methods(ds, "pit_histogram", methods)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    leads = ds["prediction_timedelta"].values
    n_bins = ds.sizes["pit_bin"]
    edges = np.linspace(0, 1, n_bins + 1)
    paths = []
    for f in ds["field"].values.tolist():
        fig, axes = plt.subplots(1, len(leads), figsize=(4.2 * len(leads), 3.4), squeeze=False, sharey=True)
        for j, lead in enumerate(leads):
            ax = axes[0, j]
            ax.axhline(1.0, color="0.5", ls="--", lw=1, label="calibrated")
            for m in methods:
                h = ds["pit_histogram"].sel({"method": m, "field": f, "prediction_timedelta": lead}).values * n_bins
                if not (np.nan_to_num(h) > 0).any():  # no forecast at this lead (a network of one lead)
                    ax.plot([], [], label=f"{m} (none at {lead_label(lead)})")
                    continue
                ax.stairs(h, edges, label=m, lw=1.6)
            ax.set(xlim=(0, 1), title=f"{f}, {lead_label(lead)}", xlabel="PIT",
                   ylabel="density" if j == 0 else None)
        axes[0, 0].legend(fontsize=8)
        paths.append(_save(fig, out_dir / f"pit_{f}.png"))
    return paths


__all__ = ["plot_pit", "plot_reliability"]
