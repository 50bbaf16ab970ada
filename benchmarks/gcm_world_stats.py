"""Generated GCM worlds beside the published ones: is `smoe data gcm-world` / `gcm-ens` a world of the same kind?

gcm-world files (6-hourly) are compared over the same calendar window (the first DAYS days from 1 January of
each; default: all the generated days):
- Z500 and T850 mean and standard deviation (latitude-weighted), globally, by latitude band and by season;
- the land-sea T850 contrast (land fraction > 0.5 minus < 0.5, latitude-weighted), globally and 30–70° N;
- latitude-weighted persistence RMSE at 24, 48, 72 and 120 h;
- climatology RMSE: against the window's own mean state at each grid point (both worlds), and — where a world
  has two or more years — against its day-of-year climatology (the published value).
gcm-ens files: raw-ensemble CRPS (standard estimator, mean |X − y| − ½ mean |X − X'|; scores latitude-weighted),
spread/skill (spread = √ mean member variance, skill = RMSE of the ensemble mean) at 24 and 48 h, Z500 and T850;
and the CRPS gain of per-grid-point EMOS (N(a + b·mean, c² + d²·var) fitted by minimum CRPS) fitted on one set
of inits and applied to another: first half → second half of the first stream (both worlds), and stream 1 →
stream 2 (2005 → 2006) where two streams are given on both sides.

    python -m benchmarks.gcm_world_stats --world data/gcm_world/gcm_5.625deg_year*.nc \
        --shared-world ../shared/data/gcm_world/gcm_5.625deg_year1.nc ../shared/data/gcm_world/gcm_5.625deg_year2.nc \
        --ens data/gcm_ens/gcm_ens_2005.nc \
        --shared-ens ../shared/data/gcm_ens/gcm_ens_2005.nc ../shared/data/gcm_ens/gcm_ens_2006.nc \
        --label "generated" --out benchmarks/results/gcm_world_stats.md
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from benchmarks.harness import Machine, pin_threads, write_results

BANDS = ((-90, -60), (-60, -30), (-30, 30), (30, 60), (60, 90))
SEASONS = {"DJF": (12, 1, 2), "MAM": (3, 4, 5), "JJA": (6, 7, 8), "SON": (9, 10, 11)}
PERSISTENCE_H = (24, 48, 72, 120)
VARS = (("Z500", "geopotential", 500), ("T850", "temperature", 850))


def _weights(lat: np.ndarray, nlon: int, mask: np.ndarray | None = None) -> np.ndarray:
    w = np.cos(np.deg2rad(lat))[:, None] * np.ones(nlon)
    if mask is not None:
        w = w * mask
    return w / w.sum()


def open_world(paths: Sequence[Path], days: int | None) -> xr.Dataset:
    ds = xr.open_mfdataset([str(p) for p in sorted(paths)], combine="by_coords") if len(paths) > 1 \
        else xr.open_dataset(paths[0])
    if days is not None:
        ds = ds.isel(time=slice(0, 4 * days))
    return ds[["geopotential", "temperature", "land_sea_mask"]].sel(level=[500, 850]).load()


def world_stats(ds: xr.Dataset) -> dict[str, float]:
    """The statistics of one world over its window (see the module docstring)."""
    lat = ds["latitude"].values
    nlon = ds.sizes["longitude"]
    w = _weights(lat, nlon)
    land = ds["land_sea_mask"].values > 0.5
    months = ds["time"].dt.month.values
    out: dict[str, float] = {"days": ds.sizes["time"] / 4}
    for name, var, level in VARS:
        x = ds[var].sel(level=level).values.astype(np.float64)  # (time, lat, lon)
        mean = float((x.mean(0) * w).sum())
        out[f"{name} mean"] = mean
        out[f"{name} std"] = float(np.sqrt((((x - mean) ** 2).mean(0) * w).sum()))
        for lo, hi in BANDS:
            band = ((lat >= lo) & (lat < hi))[:, None] * np.ones(nlon)
            wb = _weights(lat, nlon, band)
            m = float((x.mean(0) * wb).sum())
            out[f"{name} mean {lo}..{hi}"] = m
            out[f"{name} std {lo}..{hi}"] = float(np.sqrt((((x - m) ** 2).mean(0) * wb).sum()))
        for season, ms in SEASONS.items():
            sel = np.isin(months, ms)
            if sel.sum() < 4 * 10:  # fewer than 10 days of the season in the window
                continue
            xs = x[sel]
            m = float((xs.mean(0) * w).sum())
            out[f"{name} mean {season}"] = m
            out[f"{name} std {season}"] = float(np.sqrt((((xs - m) ** 2).mean(0) * w).sum()))
        for hours in PERSISTENCE_H:
            k = hours // 6
            out[f"{name} persistence {hours} h RMSE"] = float(np.sqrt(((x[k:] - x[:-k]) ** 2 * w).sum((1, 2))).mean())
        out[f"{name} window-mean climatology RMSE"] = float(np.sqrt(((x - x.mean(0)) ** 2 * w).sum((1, 2))).mean())
        years = ds["time"].dt.year.values
        if len(np.unique(years)) >= 2 and ds.sizes["time"] >= 2 * 1460:
            doy = ds["time"].dt.dayofyear.values * 4 + ds["time"].dt.hour.values // 6
            clim = xr.DataArray(x, dims=("t", "lat", "lon")).groupby(xr.DataArray(doy, dims="t")).mean()
            anom = x - clim.sel(group=doy).values
            out[f"{name} day-of-year climatology RMSE"] = float(np.sqrt((anom**2 * w).sum((1, 2))).mean())
    t850 = ds["temperature"].sel(level=850).values.astype(np.float64)
    t = t850.mean(0)
    for label, rows in (("global", np.ones_like(lat, bool)), ("30..70N", (lat >= 30) & (lat <= 70))):
        region = rows[:, None] * np.ones(nlon, bool)
        wl, ws = _weights(lat, nlon, region & land), _weights(lat, nlon, region & ~land)
        out[f"T850 land-sea contrast {label}"] = float((t * wl).sum() - (t * ws).sum())
        for season, ms in SEASONS.items():
            sel = np.isin(months, ms)
            if sel.sum() < 4 * 10:
                continue
            ts = t850[sel].mean(0)
            out[f"T850 land-sea contrast {label} {season}"] = float((ts * wl).sum() - (ts * ws).sum())
    return out


# ---------------------------------------------------------------------------------------------- gcm-ens
def crps_ensemble(members: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Standard-estimator ensemble CRPS per case; members (..., M), y (...)."""
    a = np.abs(members - y[..., None]).mean(-1)
    b = np.abs(members[..., :, None] - members[..., None, :]).mean((-1, -2))
    return a - 0.5 * b


def crps_gaussian(mu: Any, sigma: Any) -> Any:
    import torch

    def f(y: Any) -> Any:
        z = (y - mu) / sigma
        pdf = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
        return sigma * (z * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi))

    return f


def _pairs(ds: xr.Dataset, var: str, level: int, lead_h: int) -> tuple[np.ndarray, np.ndarray]:
    """(members (init, lat, lon, M), truth (init, lat, lon)) of one variable, level and lead."""
    lead = np.timedelta64(lead_h, "h")
    fc = ds[var].sel(level=level, prediction_timedelta=lead).transpose("time", "latitude", "longitude", "member")
    valid = ds["time"].values + lead
    truth = ds[f"truth_{var}"].sel(level=level).sel(valid_time=valid)
    return fc.values.astype(np.float64), truth.values.astype(np.float64)


def _moment_fit(mean: np.ndarray, var: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-grid-point least squares: y ≈ a + b·mean, then residual² ≈ c² + d²·var (the starting point)."""
    def ols(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        xm, tm = x.mean(0), t.mean(0)
        slope = ((x - xm) * (t - tm)).mean(0) / np.maximum(((x - xm) ** 2).mean(0), 1e-12)
        return tm - slope * xm, slope

    a, b = ols(mean, y)
    c2, d2 = ols(var, (y - a - b * mean) ** 2)
    d2 = np.clip(d2, 0.01, None)
    c2 = np.clip(c2, 1e-6, None)
    return a, b, np.sqrt(c2), np.sqrt(d2)


def emos_gridpoint(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   steps: int = 40) -> np.ndarray:
    """Per-grid-point EMOS fitted by minimum Gaussian CRPS on ``train`` (L-BFGS from the least-squares fit);
    CRPS (init, lat, lon) on ``test``."""
    import torch

    pin_threads(1)
    (xm, y), (xm_t, y_t) = train, test
    scale = float(np.std(y)) or 1.0
    t = lambda a: torch.as_tensor(a / scale, dtype=torch.float64)  # noqa: E731
    mean, sd, yy = t(xm.mean(-1)), t(xm.std(-1, ddof=1)), t(y)
    start = _moment_fit(mean.numpy(), sd.numpy() ** 2, yy.numpy())
    a, b, c, d = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in start)
    opt = torch.optim.LBFGS([a, b, c, d], max_iter=steps, line_search_fn="strong_wolfe")

    def loss() -> Any:
        opt.zero_grad()
        sigma = torch.sqrt(c**2 + d**2 * sd**2 + 1e-12)
        value = crps_gaussian(a + b * mean, sigma)(yy).mean(0).sum()
        value.backward()
        return value

    opt.step(loss)
    with torch.no_grad():
        mean_t, sd_t = t(xm_t.mean(-1)), t(xm_t.std(-1, ddof=1))
        sigma = torch.sqrt(c**2 + d**2 * sd_t**2 + 1e-12)
        return crps_gaussian(a + b * mean_t, sigma)(t(y_t)).numpy() * scale


def _wmean(field: np.ndarray, lat: np.ndarray) -> float:
    w = _weights(lat, field.shape[-1])
    return float((field.mean(0) * w).sum())


def ens_stats(streams: Sequence[Path | xr.Dataset], inits: int | None = None) -> dict[str, float]:
    """Raw CRPS and spread/skill of the first stream; EMOS gain first half → second half of the first stream
    and, with two streams, first stream → second stream. ``inits`` keeps the first stream's first inits."""
    dss = [s if isinstance(s, xr.Dataset) else xr.open_dataset(s).load() for s in streams]
    if inits is not None:
        dss[0] = dss[0].isel(time=slice(0, inits))
    lat = dss[0]["latitude"].values
    out: dict[str, float] = {"inits": dss[0].sizes["time"]}
    for name, var, level in VARS:
        for lead in (24, 48):
            xm, y = _pairs(dss[0], var, level, lead)
            key = f"{name} {lead} h"
            out[f"{key} raw CRPS"] = _wmean(crps_ensemble(xm, y), lat)
            skill = math.sqrt(_wmean((xm.mean(-1) - y) ** 2, lat))
            spread = math.sqrt(_wmean(xm.var(-1, ddof=1), lat))
            out[f"{key} spread/skill"] = spread / skill
            half = xm.shape[0] // 2
            raw = crps_ensemble(xm[half:], y[half:])
            emos = emos_gridpoint((xm[:half], y[:half]), (xm[half:], y[half:]))
            out[f"{key} EMOS CRPS gain, half → half (%)"] = 100 * (1 - _wmean(emos, lat) / _wmean(raw, lat))
            if len(dss) > 1:
                xm2, y2 = _pairs(dss[1], var, level, lead)
                raw2 = crps_ensemble(xm2, y2)
                emos2 = emos_gridpoint((xm, y), (xm2, y2))
                out[f"{key} raw CRPS, stream 2"] = _wmean(raw2, lat)
                out[f"{key} EMOS CRPS, stream 1 → 2"] = _wmean(emos2, lat)
                out[f"{key} EMOS CRPS gain, stream 1 → 2 (%)"] = 100 * (1 - _wmean(emos2, lat) / _wmean(raw2, lat))
    return out


# ---------------------------------------------------------------------------------------------- report
def _table(title: str, gen: dict[str, float], ref: dict[str, float], label: str, ref_label: str) -> list[str]:
    lines = [f"### {title}", "", f"| statistic | {label} | {ref_label} | difference |", "|---|---:|---:|---:|"]
    for k in gen:
        if k in ref:
            g, r = gen[k], ref[k]
            diff = f"{100 * (g - r) / abs(r):+.1f} %" if r and "contrast" not in k and "gain" not in k \
                else f"{g - r:+.3g}"
            lines.append(f"| {k} | {g:.5g} | {r:.5g} | {diff} |")
    extra = [k for k in ref if k not in gen]
    if extra:
        lines += ["", f"{ref_label} only: " + "; ".join(f"{k} {ref[k]:.5g}" for k in extra)]
    return lines + [""]


def main() -> None:
    """The statistics of the generated and the published worlds side by side; write the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", nargs="*", type=Path, default=[], help="generated gcm_5.625deg_yearN.nc files")
    ap.add_argument("--shared-world", nargs="*", type=Path, default=[], help="the published world's files")
    ap.add_argument("--days", type=int, default=None, help="compare the first DAYS days (default: all generated)")
    ap.add_argument("--ens", nargs="*", type=Path, default=[], help="generated gcm_ens_<year>.nc stream(s)")
    ap.add_argument("--shared-ens", nargs="*", type=Path, default=[], help="the published streams")
    ap.add_argument("--ens-inits", type=int, default=None,
                    help="for the like-for-like EMOS half → half, cut the published stream to this many inits "
                    "(default: as many as the generated stream)")
    ap.add_argument("--label", default="generated", help="column name of the generated worlds")
    ap.add_argument("--note", default="", help="a line saying how the generated files were made")
    ap.add_argument("--out", type=Path, required=True, help="markdown report (a .json beside it)")
    args = ap.parse_args()
    machine = Machine()
    result: dict[str, Any] = {"note": args.note}
    lines = [f"# Generated GCM worlds beside the published ones ({args.label})", "", args.note, ""]
    if args.world:
        gen_ds = open_world(args.world, args.days)
        days = int(gen_ds.sizes["time"] / 4)
        gen = world_stats(gen_ds)
        result["world"] = {"generated": gen, "files": [p.name for p in args.world]}
        if args.shared_world:
            ref = world_stats(open_world(args.shared_world, days))
            full = world_stats(open_world(args.shared_world, None))
            result["world"].update(shared_same_window=ref, shared_full=full)
            lines += _table(f"gcm-world: the first {days} days from 1 January", gen, ref, args.label,
                            f"published, same {days} days")
            lines += [f"Published world over all its {full['days']:.0f} days: "
                      + "; ".join(f"{k} {full[k]:.5g}" for k in full if "by" not in k and ".." not in k
                                  and not any(s in k for s in SEASONS)), ""]
    if args.ens:
        gen = ens_stats(args.ens)
        result["ens"] = {"generated": gen, "files": [p.name for p in args.ens]}
        if args.shared_ens:
            n = args.ens_inits or int(gen["inits"])
            shared = [xr.open_dataset(p).load() for p in args.shared_ens]
            like = ens_stats(shared[:1], inits=n)
            full = ens_stats(shared)
            result["ens"].update(shared_same_inits=like, shared_full=full)
            if len(args.ens) > 1 and len(shared) > 1 and n == full["inits"]:  # stream 1 → 2 on both sides
                lines += _table("gcm-ens: two streams each (EMOS fitted on the first, applied to the second)", gen,
                                full, args.label, "published 2005 → 2006")
            else:
                lines += _table(f"gcm-ens: the first {n} inits of one stream", gen, like, args.label,
                                f"published 2005, first {n} inits")
                lines += ["### gcm-ens: the published streams in full", "", "| statistic | published |",
                          "|---|---:|"]
                lines += [f"| {k} | {v:.5g} |" for k, v in full.items()] + [""]
    write_results(args.out, result, lines, machine=machine)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
