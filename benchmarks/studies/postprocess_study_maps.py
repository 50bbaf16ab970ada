"""Where post-processing helps: per-grid-point CRPS of the post-processing study's arms on its test block, split
into land and sea (the diagnosis of the SMoE-U-Net against the U-Net and per-grid-point EMOS).

    python -m benchmarks.studies.postprocess_study_maps --study runs/studies/gcm_ens_postprocess \
        --out benchmarks/studies/results/gcm_ens_postprocess_maps

For every network arm (best checkpoint of each seed, CRPS averaged over seeds), per-grid-point EMOS (fitted on
the train split) and the raw ensemble (fair CRPS): the time-mean CRPS map of Z500 and T850 at 48 h, and
latitude-weighted means over land and sea points (land fraction ≥ 0.5). Writes ``OUT.json`` and ``OUT.png``
(CRPS maps of raw, EMOS, U-Net and the CRPS difference SMoE-U-Net − U-Net).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import xarray as xr

from benchmarks.harness import Machine, write_results
from smoeweather.config import read_config
from smoeweather.data.forecast_stores import open_static
from smoeweather.metrics import probabilistic
from smoeweather.postprocess.emos import apply_emos, fit_emos
from smoeweather.postprocess.neural import apply_checkpoint
from smoeweather.postprocess.scoring import open_config_data, split_forecast

ARMS = ("unet", "unet_static", "smoe_prior_coherent", "smoe_coherent", "smoe_paper")
TARGETS = (("geopotential", 500), ("temperature", 850))
LEAD_H = 48


def _sel(ds: xr.Dataset, name: str, level: int) -> xr.DataArray:
    lead = np.timedelta64(LEAD_H, "h").astype("timedelta64[ns]")
    return ds[name].sel(level=level, prediction_timedelta=lead).astype(np.float64)


def crps_maps(study: Path) -> tuple[dict[str, dict[str, np.ndarray]], xr.DataArray, dict[str, str]]:
    """{method: {target: (H, W) time-mean CRPS}}, the land fraction, {method: source}."""
    record = json.loads((study / "study.json").read_text())
    cfg = read_config(Path(record["variants"]["unet"]["config"]))
    opened = open_config_data(cfg["data"])
    test_fc, test_truth, _ = split_forecast(cfg["data"], "test", opened)
    train_fc, train_truth, _ = split_forecast(cfg["data"], "train", opened)
    names = [n for n, _ in TARGETS]
    out: dict[str, dict[str, np.ndarray]] = {}
    sources = {}

    def add(method: str, maps: dict[str, xr.DataArray]) -> None:
        out.setdefault(method, {})
        for key, m in maps.items():
            out[method].setdefault(key, []).append(m.mean("time").values)  # type: ignore[union-attr]

    for name, level in TARGETS:
        x, y = _sel(test_fc, name, level), _sel(test_truth, name, level)
        add("raw", {f"{name}_{level}": probabilistic.crps_ensemble(x, y, estimator="fair")})
    params = fit_emos(train_fc[names], train_truth[names], per_gridpoint=True)
    mu, sigma = apply_emos(params, test_fc[names])
    for name, level in TARGETS:
        add("emos_gridpoint", {f"{name}_{level}": probabilistic.crps_gaussian(
            _sel(mu, name, level), _sel(sigma, name, level), _sel(test_truth, name, level))})
    sources["emos_gridpoint"] = "per-grid-point EMOS fitted on the train split"
    for arm in ARMS:
        runs = [r for r in record["runs"] if r["variant"] == arm]
        for r in runs:
            mu, sigma, _ = apply_checkpoint(study / r["best_checkpoint"], test_fc)  # relative to the study folder
            for name, level in TARGETS:
                add(arm, {f"{name}_{level}": probabilistic.crps_gaussian(
                    _sel(mu, name, level), _sel(sigma, name, level), _sel(test_truth, name, level))})
        sources[arm] = f"mean over seeds {[r['seed'] for r in runs]}"
    land = open_static(cfg["data"]["source"], ["land_sea_mask"])["land_sea_mask"]
    return {m: {k: np.mean(v, axis=0) for k, v in d.items()} for m, d in out.items()}, land, sources


def summary(maps: dict[str, dict[str, np.ndarray]], land: xr.DataArray) -> dict[str, dict[str, dict[str, float]]]:
    """{method: {target: {land, sea, all}}} latitude-weighted means of the CRPS maps."""
    w = np.cos(np.deg2rad(land["latitude"].values))[:, None] * np.ones(land.shape)
    is_land = land.values >= 0.5
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method, d in maps.items():
        out[method] = {}
        for key, m in d.items():
            out[method][key] = {part: float((w * m)[mask].sum() / w[mask].sum())
                                for part, mask in (("land", is_land), ("sea", ~is_land),
                                                   ("all", np.ones_like(is_land)))}
    return out


def plot(maps: dict[str, dict[str, np.ndarray]], land: xr.DataArray, path: Path) -> None:
    """A 2 × 4 panel PNG: raw, EMOS, U-Net CRPS and SMoE-U-Net − U-Net per target."""
    import matplotlib.pyplot as plt

    from smoeweather.plotting.cartography import draw_field, global_axes, save_png

    lat, lon = land["latitude"].values, land["longitude"].values
    fig = plt.figure(figsize=(20, 7.5))
    for row, (name, level) in enumerate(TARGETS):
        key = f"{name}_{level}"
        units = "m² s⁻²" if name == "geopotential" else "K"
        vmax = float(np.nanpercentile(maps["raw"][key], 98))
        panels = [("raw ensemble (fair)", maps["raw"][key], "viridis", 0, vmax),
                  ("EMOS per grid point", maps["emos_gridpoint"][key], "viridis", 0, vmax),
                  ("U-Net (3 seeds)", maps["unet"][key], "viridis", 0, vmax)]
        diff = maps["smoe_prior_coherent"][key] - maps["unet"][key]
        lim = float(np.nanpercentile(np.abs(diff), 98))
        panels.append(("SMoE-U-Net (prior, coherent) − U-Net", diff, "RdBu_r", -lim, lim))
        for col, (title, values, cmap, lo, hi) in enumerate(panels):
            ax = global_axes(fig, 241 + 4 * row + col, longitude=lon)
            mesh = draw_field(ax, values, lat, lon, cmap=cmap, vmin=lo, vmax=hi)
            ax.set_title(f"{key} +{LEAD_H} h: {title}", fontsize=9)
            fig.colorbar(mesh, ax=ax, orientation="horizontal", shrink=0.8, pad=0.04, label=f"CRPS [{units}]")
    fig.suptitle("gcm_ens test block (mid-Jul – Oct 2006): time-mean CRPS per grid point", fontsize=12)
    save_png(fig, path)


def main() -> None:
    """The CRPS maps, their land and sea means (``OUT.json``) and the figure (``OUT.png``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="output path without suffix")
    args = parser.parse_args()
    machine = Machine()
    maps, land, sources = crps_maps(args.study)
    result = {"lead_h": LEAD_H, "land": "land fraction ≥ 0.5", "sources": sources, "crps": summary(maps, land)}
    write_results(args.out, result, machine=machine)
    plot(maps, land, args.out.with_suffix(".png"))
    print(json.dumps(result["crps"], indent=1))


if __name__ == "__main__":
    main()

