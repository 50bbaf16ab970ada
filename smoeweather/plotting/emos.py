"""Maps of per-grid-point EMOS coefficients (``smoe plot emos MODEL.nc``): where the forecast model needs
a bias correction and where its spread is too small.

One PNG per field (variable × level) and lead, four panels: a (intercept, units of the field; diverging
around 0), b (slope on the ensemble mean; diverging around 1), √c (spread floor, units of the field) and d
(weight of the ensemble variance; 1 = raw spread kept, > 1 raw ensemble too narrow). Coastlines on top. The
colour bars carry the units the model file records for each coefficient (:func:`coefficient_labels`).
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr

from smoeweather.plotting.cartography import draw_field, global_axes, save_png


def _span(values: np.ndarray, centre: float) -> float:
    dev = np.abs(values[np.isfinite(values)] - centre)
    return float(np.quantile(dev, 0.98)) if dev.size else 1.0


def _root_units(units: str) -> str:
    """The units of √c from those of c: ``(K)**2`` or ``K**2`` → ``K``, ``(m**2 s**-2)**2`` → ``m**2 s**-2``."""
    match = re.fullmatch(r"\((.+)\)\*\*2|([^\s()*]+)\*\*2", units.strip())
    return (match.group(1) or match.group(2)) if match else f"({units})**0.5"


def coefficient_labels(model: xr.Dataset, name: str, where: str = "the model file") -> dict[str, str]:
    """Colour-bar labels of the a, b, √c and d maps of field ``name``, each from the ``units`` attribute the
    model file gives its coefficient variable (``<name>_a`` ...): a and √c in the field's units, b and d
    dimensionless (said so); a coefficient without units is labelled as such, never given assumed ones."""
    from smoeweather.plotting.fields import pretty_units

    def units(c: str) -> str | None:
        u = model[f"{name}_{c}"].attrs.get("units") if f"{name}_{c}" in model else None
        return None if u is None or not str(u).strip() else str(u)

    def label(symbol: str, u: str | None, dimensionless: str = "") -> str:
        if u is None:
            return f"{symbol} [no units in {where}]"
        return f"{symbol} [1: dimensionless {dimensionless}]" if u == "1" else f"{symbol} [{pretty_units(u)}]"

    c = units("c")
    return {"a": label("a", units("a")), "b": label("b", units("b"), "slope"),
            "sqrt_c": label("√c", None if c is None else _root_units(c)), "d": label("d", units("d"), "weight")}


def plot_emos(model: str | Path, out_dir: str | Path, proj: str = "robinson") -> list[Path]:
    """PNG maps of the coefficients of a per-grid-point EMOS model file; returns their paths.

    ValueError for a global fit (one coefficient set: nothing to map).
    """
    from smoeweather.postprocess.model_file import open_model_file, read_model

    params, attrs = read_model(model)
    raw = open_model_file(model, "MODEL", "EMOS model")  # each coefficient's own units attribute
    if not int(attrs.get("per_gridpoint", 0)):
        raise ValueError(f"{model} is a global EMOS fit (one coefficient set per field and lead): nothing to map; "
                         "fit with --per-gridpoint")
    out_dir = Path(out_dir)
    paths = []
    period = f"{str(attrs.get('train_first_init'))[:10]}..{str(attrs.get('train_last_init'))[:10]}"
    for name in params.data_vars:
        da = params[name]
        labels = coefficient_labels(raw, str(name), Path(model).name)
        levels = da["level"].values.tolist() if "level" in da.dims else [None]
        for level in levels:
            sel = da.sel(level=level) if level is not None else da
            field = f"{name}_{level}" if level is not None else str(name)
            for td in sel["prediction_timedelta"].values:
                hours = int(pd.Timedelta(td) / pd.Timedelta("1h"))
                c = sel.sel(prediction_timedelta=td)
                a, b = c.sel(coefficient="a").values, c.sel(coefficient="b").values
                sc, d = np.sqrt(c.sel(coefficient="c").values), c.sel(coefficient="d").values
                fig = plt.figure(figsize=(13, 7.2))
                panels = [
                    (a, "a: intercept", labels["a"], "RdBu_r", -_span(a, 0), _span(a, 0)),
                    (b, "b: slope on the ensemble mean", labels["b"], "PuOr_r", 1 - _span(b, 1), 1 + _span(b, 1)),
                    (sc, "√c: spread floor", labels["sqrt_c"], "viridis", 0.0,
                     float(np.nanquantile(sc, 0.98)) or 1.0),
                    (d, "d: weight of the ensemble variance", labels["d"], "magma", 0.0,
                     float(np.nanquantile(d, 0.98)) or 1.0),
                ]
                for i, (vals, title, unit, cmap, lo, hi) in enumerate(panels):
                    ax = global_axes(fig, 221 + i, proj, c["longitude"].values)
                    mesh = draw_field(ax, vals, c["latitude"].values, c["longitude"].values, cmap=cmap, vmin=lo,
                                      vmax=hi)
                    fig.colorbar(mesh, ax=ax, orientation="horizontal", shrink=0.7, pad=0.04, label=unit)
                    ax.set_title(title, fontsize=10)
                fig.suptitle(f"EMOS per grid point: {field}, +{hours} h (fit {period}, {attrs.get('members')} "
                             f"members): μ = a + b·mean, σ² = c + d·var", fontsize=11)
                paths.append(save_png(fig, out_dir / f"emos_{field}_{hours}h.png"))
    return paths
