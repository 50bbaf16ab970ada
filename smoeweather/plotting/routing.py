"""Where the experts route, drawn: global maps and a usage chart of every tensor-routing gate of a trained SMoE
(``smoe plot routing``), from the routing Datasets of :mod:`smoeweather.models.routing` (which documents every
variable). Maps are drawn with latitude ascending.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from smoeweather.io import write_netcdf  # noqa: E402
from smoeweather.models.routing import area_weights, checkpoint_routing, routing_dataset, routing_summary  # noqa: E402
from smoeweather.plotting.cartography import draw_field, global_axes, save_png  # noqa: E402

MAX_LEGEND = 20  # categorical maps show at most this many classes; the rest are drawn grey as "other"
MIN_DOMINANT_SHARE = 0.005  # the dominant-expert map shows every expert dominating at least this share of the area


# ---- figures -----------------------------------------------------------------------------------------------
def _categorical(values: np.ndarray, weights: np.ndarray, labels: dict[int, str] | None = None,
                 max_classes: int = MAX_LEGEND, colours_of: dict[int, str] | None = None, min_share: float = 0.0,
                 pooled: tuple[str, str] = ("class", "classes"),
                 ) -> tuple[np.ndarray, ListedColormap, BoundaryNorm, list[Patch]]:
    """Remap category values to 0..m (m ≤ max_classes, each holding at least ``min_share`` of the area; the
    smallest-area rest → pooled, grey) with a qualitative colour map and legend handles labelled with each
    class's share of the globe's area; ``pooled``: what a class is called (singular, plural) in the pooled one."""
    classes, inverse = np.unique(values, return_inverse=True)
    area = np.bincount(inverse.reshape(-1), weights=weights.reshape(-1))
    area = area / area.sum()
    order = np.argsort(-area, kind="stable")
    shown = order[:max_classes]
    shown = shown[area[shown] >= min_share] if min_share > 0 and (area[shown] >= min_share).any() else shown
    code = np.full(len(classes), len(shown), np.int64)
    code[shown] = np.arange(len(shown))
    mapped = code[inverse].reshape(values.shape)
    # qualitative colours without the greys (grey is reserved for 'others')
    base = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)]
    base += list(plt.get_cmap("tab20b").colors)
    colours = [(colours_of or {}).get(int(classes[c]), base[i % len(base)]) for i, c in enumerate(shown)]
    handles = []
    for i, c in enumerate(shown):
        label = (labels or {}).get(int(classes[c]), str(classes[c]))
        handles.append(Patch(facecolor=colours[i], edgecolor="0.3", label=f"{label} ({100 * area[c]:.1f}%)"))
    if len(classes) > len(shown):
        # a mid grey with a hatched legend patch: a class of its own (the smaller experts pooled), which the
        # light grey of "no data" elsewhere must not be mistaken for
        colours.append((0.55, 0.55, 0.55))
        rest, k = area[order[len(shown):]].sum(), len(classes) - len(shown)
        under = f" (under {100 * min_share:g}% each)" if min_share > 0 and len(shown) < max_classes else ""
        handles.append(Patch(facecolor=colours[-1], edgecolor="0.2", hatch="///",
                             label=f"{k} smaller {pooled[k > 1]}{under}, pooled ({100 * rest:.1f}%)"))
    cmap = ListedColormap(colours)
    norm = BoundaryNorm(np.arange(len(colours) + 1) - 0.5, len(colours))
    return mapped, cmap, norm, handles


def _map_figure(title: str, longitude: np.ndarray, proj: str = "robinson") -> tuple[plt.Figure, Any]:
    fig = plt.figure(figsize=(11, 5.2))
    ax = global_axes(fig, proj=proj, longitude=longitude)
    ax.set_title(title, fontsize=11)
    return fig, ax


def plot_categorical_map(values: np.ndarray, latitude: np.ndarray, longitude: np.ndarray, title: str,
                         path: str | Path, legend_title: str, labels: dict[int, str] | None = None,
                         colours: dict[int, str] | None = None, proj: str = "robinson", max_classes: int = MAX_LEGEND,
                         min_share: float = 0.0, pooled: tuple[str, str] = ("class", "classes")) -> Path:
    """A categorical (lat, lon) map with a legend (class, % of the globe's area); ``colours``: class → colour;
    at most ``max_classes`` classes of at least ``min_share`` of the area each are shown, the rest pooled."""
    fig, ax = _map_figure(title, longitude, proj)
    weights = area_weights(latitude, len(longitude))
    mapped, cmap, norm, handles = _categorical(values, weights, labels, max_classes, colours, min_share, pooled)
    draw_field(ax, mapped, latitude, longitude, cmap=cmap, norm=norm)
    ax.legend(handles=handles, title=legend_title, loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7,
              title_fontsize=8, ncol=1 if len(handles) <= 14 else max(2, -(-len(handles) // 22)), frameon=False)
    return save_png(fig, path)


def plot_continuous_map(values: np.ndarray, latitude: np.ndarray, longitude: np.ndarray, title: str,
                        path: str | Path, label: str, cmap: str = "viridis", discrete: int | None = None,
                        proj: str = "robinson", **kwargs: Any) -> Path:
    """A continuous (lat, lon) map with a horizontal colour bar labelled ``label`` (quantity [unit]);
    ``discrete=n`` draws the integer values 0..n as n+1 colour steps."""
    fig, ax = _map_figure(title, longitude, proj)
    if discrete is not None:
        kwargs["norm"] = BoundaryNorm(np.arange(discrete + 2) - 0.5, plt.get_cmap(cmap).N)
    mesh = draw_field(ax, values, latitude, longitude, cmap=cmap, **kwargs)
    cbar = fig.colorbar(mesh, ax=ax, orientation="horizontal", fraction=0.05, pad=0.04, shrink=0.7)
    cbar.set_label(label)
    if discrete is not None and discrete <= 16:
        cbar.set_ticks(np.arange(discrete + 1))
    return save_png(fig, path)


def plot_usage(ds: xr.Dataset, title: str, path: str | Path) -> Path:
    """Bar chart per expert: % of the globe's area where it is in the top-E set and where it dominates."""
    n = ds.sizes["expert"]
    x = np.arange(n)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.18 * n + 2), 3.8))
    colours = ["tab:blue"] * n
    if "expert_prior_group" in ds:
        palette = ("tab:blue", "tab:brown", "tab:purple", "tab:green")  # sea blue, land brown, as in the maps
        colours = [palette[g % len(palette)] for g in ds["expert_prior_group"].values]
    ax.bar(x, 100 * ds["expert_usage_area"].values, color=colours, alpha=0.45, width=0.85)
    ax.bar(x, 100 * ds["expert_dominant_area"].values, color=colours, width=0.45)
    handles = [Patch(facecolor="0.5", alpha=0.45, label="in the top-E set"),
               Patch(facecolor="0.5", label="dominant (top-1)")]
    if "expert_prior_group" in ds:
        names = ("sea", "land") if int(ds["expert_prior_group"].max()) == 1 else None
        for g in np.unique(ds["expert_prior_group"].values):
            label = f"prior group: {names[g]}" if names else f"prior group {g}"
            handles.append(Patch(facecolor=colours[int(np.argmax(ds['expert_prior_group'].values == g))], label=label))
    e = ds.attrs["num_selected"]
    ax.axhline(100 * e / n, color="k", lw=0.8, ls="--")
    ax.text(n - 0.5, 100 * e / n, f" uniform E/|E| = {100 * e / n:.0f}%", va="bottom", ha="right", fontsize=7)
    ax.set_xlabel("expert")
    ax.set_ylabel("share of the globe's area [%]")
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    return save_png(fig, path)


def plot_gate(ds: xr.Dataset, out_dir: str | Path, label: str = "", proj: str = "robinson") -> list[Path]:
    """All maps of one gate's routing Dataset (from :func:`routing_dataset`) into ``out_dir``; returns paths."""
    out_dir = Path(out_dir)
    g, n, e = ds.attrs["gate"], ds.attrs["num_experts"], ds.attrs["num_selected"]
    lat, lon = ds["latitude"].values, ds["longitude"].values
    head = f"{label}gate {g} (|E|={n}, E={e})"
    colours, legend, names = None, "expert (% of area)", None
    if "expert_prior_group" in ds and int(ds["expert_prior_group"].max()) == 1:
        # sea-group experts in blues, land-group experts in browns: misrouted cells stand out at a glance
        group = ds["expert_prior_group"].values
        colours = {}
        for k, cmap in ((0, plt.get_cmap("GnBu")), (1, plt.get_cmap("YlOrBr"))):
            members = np.flatnonzero(group == k)
            shades = np.linspace(0.35, 0.95, len(members)) if len(members) > 1 else [0.7]
            order = np.argsort((np.arange(len(members)) * 7) % len(members))  # neighbours get distant shades
            colours.update({int(e): cmap(float(shades[i])) for e, i in zip(members, order)})
        legend = "expert, prior group (% of area)\nblue: sea group, brown: land group"
        names = {int(k): f"{k} {('sea', 'land')[int(grp)]}" for k, grp in enumerate(group)}
    paths = [  # every expert dominating a meaningful share drawn in its own colour; only tiny ones pooled
        plot_categorical_map(ds["dominant_expert"].values, lat, lon, f"{head}: dominant (top-1) expert",
                             out_dir / f"routing_{g}_dominant.png", legend, names, colours, proj, max_classes=n,
                             min_share=MIN_DOMINANT_SHARE, pooled=("expert", "experts")),
        plot_categorical_map(ds["routing_region"].values, lat, lon,
                             f"{head}: regions of equal top-E set ({ds.attrs['n_distinct_sets']} distinct sets)",
                             out_dir / f"routing_{g}_regions.png", "top-E set (% of area)", proj=proj,
                             pooled=("top-E set", "top-E sets")),
    ]
    if e < n:
        paths.append(plot_continuous_map(
            ds["routing_margin"].values, lat, lon,
            f"{head}: routing margin (score of E-th − (E+1)-th expert)",
            out_dir / f"routing_{g}_margin.png", "routing margin [gate-score units]", cmap="magma", proj=proj))
    if "prior_category" in ds:
        group = ds["expert_prior_group"].values
        labels = {k: f"{name}: experts {np.flatnonzero(group == k).min()}–{np.flatnonzero(group == k).max()}"
                  for k, name in enumerate(("sea", "land"))} if int(group.max()) == 1 else None
        paths.append(plot_categorical_map(
            ds["prior_category"].values, lat, lon,
            f"{head}: land-sea prior at initialisation (land fraction > 0.5)",
            out_dir / f"routing_{g}_prior.png", "prior category", labels,
            colours={0: "#6baed6", 1: "#c7a26b"} if labels else None, proj=proj))
        paths.append(plot_continuous_map(
            ds["n_experts_outside_prior_group"].values, lat, lon,
            f"{head}: selected experts outside the prior's group (0 = routing as initialised)",
            out_dir / f"routing_{g}_outside_prior.png", f"experts outside the prior's group (of E = {e})",
            cmap="viridis", discrete=e, proj=proj))
    if "order_off_common" in ds:
        paths.append(plot_continuous_map(
            ds["order_off_common"].values, lat, lon,
            f"{head}: learned rank order (share of output planes fed by another expert than the category's usual)",
            out_dir / f"routing_{g}_order.png", "share of the E output planes", cmap="viridis", proj=proj,
            vmin=0.0, vmax=1.0))
    paths.append(plot_usage(ds, f"{head}: expert usage", out_dir / f"routing_{g}_usage.png"))
    return paths


def plot_routing(checkpoint: str | Path, out_dir: str | Path, land_sea: str | Path | None = None,
                 proj: str = "robinson", member: int | None = None) -> dict[str, Any]:
    """``smoe plot routing``: maps, usage histogram and netCDF of every gate of a trained checkpoint.

    ``member``: only the gates of that E³ member (0-based; ``model.name: e3``, gates ``M<m>_…``, each routing
    within its member's expert group).
    Returns {"netcdf": [paths], "png": [paths], "gates": {name: {"n_distinct_sets", ...}}}.
    """
    found = checkpoint_routing(checkpoint, land_sea, member)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"netcdf": [], "png": [], "gates": {}}
    for r in found.routings:
        ds = routing_dataset(r, found.provenance)
        result["netcdf"].append(str(write_netcdf(ds, out_dir / f"routing_{r.name}.nc")))
        result["png"] += [str(p) for p in plot_gate(ds, out_dir, label=f"{found.run_name}, ", proj=proj)]
        result["gates"][r.name] = routing_summary(r, ds)
    return result
