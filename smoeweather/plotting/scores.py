"""Score-vs-lead curves from ``smoe evaluate``'s ``scores.nc`` (one PNG per metric, one panel per field and
region, one line per method).

``scores.nc``: data variables named by metric (``rmse``, ``bias``, ``acc``, ``crps``, ...) over dims
``method``, ``field``, ``prediction_timedelta``. Units of the fields come from ``scores.json`` beside it
(``{"units": {field: unit}}``), a ``units`` coordinate along ``field`` or ``units_<field>`` attributes.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from smoeweather.plotting.cartography import save_png  # noqa: E402
from smoeweather.plotting.fields import pretty_units  # noqa: E402

DIMENSIONLESS = {"acc", "spread_skill", "spread_skill_ratio", "efi", "skill_score"}
LABELS = {"rmse": "RMSE", "bias": "bias (forecast − truth)", "acc": "anomaly correlation (ACC)",
          "crps": "CRPS", "spread_skill": "spread–skill ratio", "mae": "MAE"}
OWN_PLOTS = {"wavenumber", "rank", "threshold", "reference", "probability_bin", "pit_bin"}  # dims not drawn here
REFERENCE_STYLE = {"persistence": dict(color="0.35", ls="--", marker="s"),
                   "climatology": dict(color="0.55", ls=":", marker="^")}


def lead_hours(values: np.ndarray) -> np.ndarray:
    """Lead times in hours from timedelta64 values, numbers (hours) or strings like ``72h``."""
    v = np.asarray(values)
    if np.issubdtype(v.dtype, np.timedelta64):
        return v.astype("timedelta64[s]").astype(np.int64) / 3600.0
    if np.issubdtype(v.dtype, np.number):
        return v.astype(float)
    return np.array([float(str(s).rstrip("h")) for s in v])


def scores_file(path: str | Path) -> Path:
    """The scores.nc that ``path`` names: the file itself, or ``path/scores.nc`` when ``path`` is the folder
    ``smoe evaluate --out`` wrote; FileNotFoundError naming what was expected otherwise."""
    path = Path(path)
    if path.is_dir():
        if (path / "scores.nc").is_file():
            return path / "scores.nc"
        raise FileNotFoundError(f"{path} is a folder without a scores.nc; expected the scores.nc of `smoe evaluate` "
                                "or the folder its --out wrote it into")
    if not path.is_file():
        raise FileNotFoundError(f"scores file {path} does not exist (write it with `smoe evaluate --out DIR`: "
                                "DIR/scores.nc)")
    if path.suffix == ".json":
        raise ValueError(f"{path}: the JSON summary of `smoe evaluate`; the plots read its scores.nc: pass "
                         f"{path.with_suffix('.nc')} or the folder {path.parent}")
    return path


def open_scores(path: str | Path) -> tuple[xr.Dataset, dict[str, str]]:
    """The scores Dataset of a scores.nc or an evaluate folder (:func:`scores_file`) and the field units;
    FileNotFoundError/ValueError naming the file."""
    from pipelines.readers._files import open_data

    path = scores_file(path)
    ds = open_data(path, "scores").load()
    for dim in ("method", "field", "prediction_timedelta"):
        if dim not in ds.dims:
            raise ValueError(f"{path}: expected dims method, field, prediction_timedelta; got {dict(ds.sizes)}")
    units: dict[str, str] = {}
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        units = dict(json.loads(sidecar.read_text()).get("units", {}))
    if "units" in ds.coords and ds["units"].dims == ("field",):  # a units coordinate along field
        for f, u in zip(ds["field"].values, ds["units"].values):
            units.setdefault(str(f), str(u))
    for f in ds["field"].values:
        units.setdefault(str(f), str(ds.attrs.get(f"units_{f}", "")))
    return ds, units


def plot_scores(path: str | Path, out_dir: str | Path) -> list[Path]:
    """One PNG per metric of ``scores.nc``: score vs lead time (h), a panel per field (columns) and region
    (rows, when the scores have a ``region`` dim), a line per method. Per-initialisation scores, spectra and
    rank histograms are left to their own plots."""
    ds, units = open_scores(path)
    out_dir = Path(out_dir)
    leads = lead_hours(ds["prediction_timedelta"].values)
    methods = [str(m) for m in ds["method"].values]
    fields = [str(f) for f in ds["field"].values]
    model_colours = iter(plt.get_cmap("tab10").colors)
    style = {m: REFERENCE_STYLE.get(m) or dict(color=next(model_colours), ls="-", marker="o") for m in methods}
    paths = []
    regions = [str(r) for r in ds["region"].values] if "region" in ds.dims else [None]
    for metric, da in ds.data_vars.items():
        if not {"method", "field", "prediction_timedelta"} <= set(da.dims) or metric.startswith(("per_init_", "wb2_")):
            continue
        extra = [d for d in da.dims if d not in ("method", "field", "prediction_timedelta", "region")]
        if extra:
            if set(extra) <= OWN_PLOTS:  # spectra, rank histograms, Brier scores and reliability: their own plots
                continue
            raise ValueError(f"{path}: {metric} has extra dims {extra}; expected method × field × lead")
        if np.all(np.isnan(da.values)) or metric == "n_scored":
            continue
        fig, axes = plt.subplots(len(regions), len(fields), figsize=(4.6 * len(fields), 3.4 * len(regions) + 0.4),
                                 squeeze=False)
        for (ax, (region, field)) in zip(axes.ravel(), [(r, f) for r in regions for f in fields]):
            for method in methods:
                sel = {"method": method, "field": field}  # dict: sel has a method= arg
                if region is not None and "region" in da.dims:
                    sel["region"] = region
                y = da.sel(sel).values.astype(float)
                if np.all(np.isnan(y)):
                    continue
                ax.plot(leads, y, label=method, **style[method])
            unit = "1" if metric in DIMENSIONLESS else pretty_units(units.get(field, ""))
            if metric == "debiased_ensemble_mean_mse" and unit:
                unit = f"({unit})²"
            ax.set_title(field if region is None else f"{field}, {region}", fontsize=10)
            ax.set_xlabel("lead time [h]")
            ax.set_ylabel(f"{LABELS.get(metric, metric)} [{unit}]" if unit else LABELS.get(metric, metric))
            ax.set_xticks(leads)
            ax.grid(alpha=0.3)
            if metric == "bias":
                ax.axhline(0, color="k", lw=0.6)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{LABELS.get(metric, metric)} vs lead time ({Path(path).parent.name or Path(path).name})",
                     fontsize=11)
        fig.tight_layout()
        paths.append(save_png(fig, out_dir / f"scores_{metric}.png"))
    if not paths:
        raise ValueError(f"{path}: no metric over (method, field, prediction_timedelta) to plot")
    return paths
