"""Calibration results of the post-processing guide, every number through the CLI a forecaster types:
Brier score (BS) and Brier skill score (BSS), reliability diagrams and PIT histograms of

- gcm_ens, Z500 at 48 h: the raw 10-member ensemble, per-grid-point EMOS and the recommended post-processing
  network (the U-Net 32/64/128, 400 steps, cosine schedule: the arm with the lowest validation loss of the
  gcm_ens frontier studies, one seed), at the 10th, 50th and 90th climatological percentiles of the truth
  at the 48 h valid times of the TRAINING inits (area-weighted, pooled over the grid). Split as the study:
  train 2005 + Jan–Apr 2006 (inits), validation May – mid-Jul 2006 (the network's best checkpoint), test
  mid-Jul – Oct 2006 (every score below);
- UWME (ensembleBMA ``srft``, 48 h 2 m temperature, 969 stations): the raw 8-member ensemble, per-site EMOS
  and the DRN, rolling window 25 days with a 2-day lag (each forecast date fitted on the 25 days before it
  only, as benchmarks/postprocess_drn_uwme.py), probability of frost P(T ≤ 273.15 K).

Climatological BSS reference: gcm_ens, the exceedance frequency of each event at each grid point over the
training valid times; UWME, the frost frequency over all stations on the days before the first forecast date
(the first training window). Paired differences: the per-initialisation (gcm_ens) or per-date (UWME) Brier
score, mean and 95 % interval (Student t over inits; bootstrap over dates for UWME).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m benchmarks.postprocess_calibration_results \
        [--data DIR] [--uwme TABLE.csv] [--work runs/calibration] [--reuse] [--part gcm|uwme|all]

``--data`` holds gcm_ens_2005.nc and gcm_ens_2006.nc (``smoe data gcm-ens``), ``--uwme`` the ensembleBMA
table (default: the shared data folder beside the repository). ``--reuse`` skips a command whose outputs exist
(same command, same folder). Writes benchmarks/results/postprocess_calibration.{json,md} and the figures
benchmarks/results/postprocess_calibration_*.png (copied to docs/assets/postprocess/ for the research page).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, RESULTS, Machine, thread_env, write_results

ASSETS = REPO / "docs" / "assets" / "postprocess"
SHARED = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))
SMOE = [str(REPO / ".venv" / "bin" / "smoe")]
PERCENTILES = (0.1, 0.5, 0.9)
TRAIN = ("2005-01-01", "2006-04-30")
TEST = ("2006-07-16", "2006-12-31")
LEAD = np.timedelta64(48, "h")
NETWORK = ["--config", "configs/postprocess/gcm_ens_unet.yaml", "training.lr_schedule=cosine",
           "training.warmup_steps=25", "training.min_lr_factor=0.0", "trainer.accelerator=cpu",
           "trainer.enable_progress_bar=false", "data.target_variables=[geopotential_500]", "data.leads_h=[48]",
           "model.widths=[32, 64, 128]", "trainer.max_time=null", "trainer.max_epochs=-1",
           "training.early_stopping_patience=1000000000", "trainer.max_steps=400", "trainer.val_check_interval=50",
           "trainer.check_val_every_n_epoch=null", "seed=0"]
UWME_VAR, FROST = "2m_temperature", 273.15
WINDOW, LAG = "25D", "2D"


def shown(cmd: list[str], subs: dict[str, str]) -> str:
    """The command as the page shows it: ``smoe`` for the venv's entry point, folders replaced by names."""
    text = shlex.join(["smoe", *cmd[1:]]) if cmd[0] == SMOE[0] else shlex.join(cmd)
    for path, name in subs.items():
        text = text.replace(path, name)
    return text


def run(cmd: list[str], outputs: list[Path], reuse: bool, log: list[str], subs: dict[str, str]) -> None:
    """Run one CLI command (skipped with ``reuse`` when all ``outputs`` exist); record it as shown."""
    log.append(shown(cmd, subs))
    if reuse and outputs and all(p.exists() for p in outputs):
        print("reused:", log[-1], flush=True)
        return
    print("running:", log[-1], flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, env=thread_env(1, ["OMP_NUM_THREADS"]))


def publish(src: Path, name: str) -> None:
    """Copy a figure beside the results (benchmarks/results/NAME) and to the docs' assets."""
    ASSETS.mkdir(parents=True, exist_ok=True)
    for folder in (RESULTS, ASSETS):
        shutil.copy(src, folder / name)


def training_thresholds(files: list[Path]) -> tuple[list[float], Any]:
    """Area-weighted 10/50/90th percentiles of Z500 truth at the 48 h valid times of the training inits
    [m² s⁻²], and the per-grid-point exceedance frequency of each (threshold, lat, lon) over those times."""
    import xarray as xr

    fields, weights = [], []
    for f in files:
        with xr.open_dataset(f) as ds:
            t = ds["time"].values
            t = t[(t >= np.datetime64(TRAIN[0])) & (t < np.datetime64(TRAIN[1]) + np.timedelta64(1, "D"))]
            z = ds["truth_geopotential"].sel(level=500).sel(valid_time=t + LEAD).load()
        fields.append(z.rename(valid_time="time"))
        weights.append(np.broadcast_to(np.cos(np.deg2rad(z["latitude"].values))[None, :, None], z.shape).ravel())
    z = xr.concat(fields, "time")
    v, w = z.values.ravel(), np.concatenate(weights)
    order = np.argsort(v, kind="stable")
    cdf = np.cumsum(w[order]) / w.sum()
    thresholds = [float(v[order][np.searchsorted(cdf, q)]) for q in PERCENTILES]
    thr = xr.DataArray(thresholds, dims="threshold", coords={"threshold": thresholds})
    return thresholds, (z > thr).mean("time")


def t_interval(d: np.ndarray) -> dict[str, float]:
    """Mean of paired differences ``d`` with its 95 % Student-t interval (n − 1 dof)."""
    from scipy import stats

    d = d[np.isfinite(d)]
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return {"mean": float(d.mean()), "lo": float(d.mean() - half), "hi": float(d.mean() + half), "n": int(len(d))}


def gcm_part(data: Path, work: Path, reuse: bool, subs: dict[str, str]) -> dict[str, Any]:
    """Train, fit, apply, evaluate and plot on gcm_ens; the BS/BSS table of Z500 at 48 h on the test inits."""
    import xarray as xr

    from smoeweather.metrics.calibration import brier_skill, brier_terms, event

    files = [data / "gcm_ens_2005.nc", data / "gcm_ens_2006.nc"]
    thresholds, clim_freq = training_thresholds(files)
    thr = [f"{t:g}" for t in thresholds]
    g, log = work / "gcm", []
    net_dir = work / "unet_32_64_128"
    run([*SMOE, "train", *NETWORK, f"data.source=[{files[0]}, {files[1]}]", f"output_dir={net_dir}"],
        [net_dir / "checkpoints" / "last.ckpt"], reuse, log, subs)
    best = sorted((net_dir / "checkpoints").glob("best-*.ckpt"))[-1]
    quiet = ["--scheduler", "threads", "--quiet"]
    run([*SMOE, "postprocess", "fit", "--per-gridpoint", "--forecast", *map(str, files), "--train-period", *TRAIN,
         "--variables", "geopotential", "--out", str(g / "emos.nc"), *quiet], [g / "emos.nc"], reuse, log, subs)
    forms = ["--thresholds", *thr, "--percentiles", "10", "50", "90"]
    run([*SMOE, "postprocess", "apply", "--emos", str(g / "emos.nc"), "--forecast", str(files[1]), "--apply-period",
         *TEST, "--out", str(g / "emos.zarr"), *forms, "--members", "10", *quiet],
        [g / "emos_probabilities.zarr"], reuse, log, subs)
    # no --members for the network: ECC of a 48 h-only network on the two-lead file fails (reported)
    run([*SMOE, "postprocess", "apply", "--network", str(best), "--forecast", str(files[1]), "--apply-period", *TEST,
         "--out", str(g / "unet.zarr"), *forms, *quiet], [g / "unet_probabilities.zarr"], reuse, log, subs)
    scores = g / "scores"
    run([*SMOE, "evaluate", f"raw={files[1]}", f"emos={g / 'emos.zarr'}", f"unet={g / 'unet.zarr'}",
         f"emos_p={g / 'emos_probabilities.zarr'}", f"unet_p={g / 'unet_probabilities.zarr'}", "--truth",
         str(files[1]), "--no-references", "--regions", "global", "--out", str(scores), "--overwrite", "--quiet"],
        [scores / "scores.nc"], reuse, log, subs)
    figs = g / "figures"
    for kind, methods in (("reliability", ["raw", "emos", "unet"]), ("pit", ["emos", "unet"])):
        run([*SMOE, "plot", kind, str(scores / "scores.nc"), "--methods", *methods, "--out", str(figs),
             "--overwrite"], [], False, log, subs)
    publish(figs / f"reliability_geopotential_500_gt_{thr[1]}.png", "postprocess_calibration_gcm_reliability.png")
    publish(figs / "pit_geopotential_500.png", "postprocess_calibration_gcm_pit.png")

    ds = xr.load_dataset(scores / "scores.nc")
    sel = {"field": "geopotential_500", "prediction_timedelta": LEAD}
    if "region" in ds.dims:
        sel["region"] = "global"
    per_init = ds["per_init_brier_score"].sel(sel)
    with xr.open_dataset(files[1]) as truth_ds:
        inits = per_init["time"].values
        y = truth_ds["truth_geopotential"].sel(level=500, valid_time=inits + LEAD).load()
    y = y.rename(valid_time="time").assign_coords(time=inits)
    thr_da = xr.DataArray(thresholds, dims="threshold", coords={"threshold": thresholds})
    weights = np.cos(np.deg2rad(y["latitude"])).broadcast_like(y.isel(time=0, drop=True))
    bs_clim_init = brier_terms(clim_freq.broadcast_like(y), event(y, thr_da), weights)
    bs = {m: per_init.sel({"method": m}) for m in ("raw", "emos", "unet", "emos_p", "unet_p")}
    out: dict[str, Any] = {"thresholds_m2s2": thresholds, "percentiles": list(PERCENTILES), "test_inits": len(inits),
                           "network_checkpoint": best.name, "commands": log, "by_threshold": {}}
    for k, t in enumerate(thresholds):
        row: dict[str, Any] = {"percentile": PERCENTILES[k] * 100,
                               "bs_climatology": float(bs_clim_init.sel(threshold=t).mean())}
        for m, v in bs.items():
            b = v.sel(threshold=t)
            row[m] = {"bs": float(b.mean()),
                      "bss_vs_climatology": float(brier_skill(b.mean(), bs_clim_init.sel(threshold=t).mean())),
                      "bss_vs_raw": float(brier_skill(b.mean(), bs["raw"].sel(threshold=t).mean()))}
        bss = ds["brier_skill_score"].sel(sel).sel({"reference": "raw", "threshold": t})
        row["bss_vs_raw_evaluate"] = {m: float(bss.sel({"method": m})) for m in ("emos", "unet")}
        for a, b_ in (("unet", "emos"), ("emos", "raw"), ("unet", "raw")):
            row[f"bs_{a}_minus_{b_}"] = t_interval((bs[a] - bs[b_]).sel(threshold=t).values)
        out["by_threshold"][f"{t:g}"] = row
    return out


def uwme_scores_file(p: dict[str, np.ndarray], o: np.ndarray, path: Path) -> None:
    """A scores.nc in `smoe evaluate`'s layout (method, field, threshold, lead; probability_bin) holding the
    reliability table of the frost event, so that `smoe plot reliability` draws it (evaluate scores grids only)."""
    import xarray as xr

    from smoeweather.metrics.calibration import reliability_table

    tables = []
    for m, prob in p.items():
        pr = xr.DataArray(1.0 - prob, dims=("time", "site"))  # exceedance, as evaluate stores it
        tables.append(reliability_table(pr, xr.DataArray(1.0 - o, dims=("time", "site")), ("time", "site"))
                      .expand_dims(method=[m]))
    t = xr.concat(tables, "method").expand_dims(field=[UWME_VAR], threshold=[FROST], prediction_timedelta=[LEAD])
    ds = xr.Dataset({f"reliability_{k}": v for k, v in t.data_vars.items()})
    ds["units"] = xr.DataArray(["K"], dims="field")
    ds.to_netcdf(path)


def uwme_part(table: Path, work: Path, reuse: bool, subs: dict[str, str]) -> dict[str, Any]:
    """Per-site EMOS and the DRN through fit/apply --thresholds 273.15 --below; BS/BSS of frost on the cases
    every form forecasts."""
    import xarray as xr

    from smoeweather.data.sites import read_site_table

    u, log = work / "uwme", []
    fc, obs = read_site_table(table)
    probs: dict[str, np.ndarray] = {}
    times = None
    for name, extra in (("emos_site", ["--per-site"]), ("drn", ["--method", "drn"])):
        model = u / f"{name}.nc"
        run([*SMOE, "postprocess", "fit", "--forecast", str(table), "--window", WINDOW, "--lag", LAG, *extra,
             "--units", "K", "--out", str(model), "--scheduler", "threads", "--quiet"], [model], reuse, log, subs)
        with xr.open_dataset(model) as m:
            start = str(m["time"].values[0])[:10]
        end = str(fc["time"].values[-1])[:10]
        flag = "--drn" if name == "drn" else "--emos"
        run([*SMOE, "postprocess", "apply", flag, str(model), "--forecast", str(table), "--units", "K",
             "--apply-period", start, end, "--out", str(u / f"{name}.zarr"), "--thresholds", f"{FROST:g}", "--below",
             "--percentiles", "10", "50", "90", "--members", "8", "--scheduler", "threads", "--quiet"],
            [u / f"{name}_probabilities.zarr"], reuse, log, subs)
        pr = xr.open_zarr(u / f"{name}_probabilities.zarr")[UWME_VAR].isel(prediction_timedelta=0)
        pr = pr.sel(threshold=FROST).transpose("time", "site").load()
        assert times is None or np.array_equal(times, pr["time"].values), name
        times = pr["time"].values
        probs[name] = pr.values.astype(np.float64)
    x = fc[UWME_VAR].sel(time=times).isel(prediction_timedelta=0).values  # (time, member, site)
    y = obs[UWME_VAR].sel(time=times + LEAD).values  # (time, site)
    probs = {"raw": np.where(np.isfinite(x).all(1), (x <= FROST).mean(1), np.nan), **probs}
    ok = np.isfinite(y) & np.all([np.isfinite(v) for v in probs.values()], 0)
    o = (y <= FROST).astype(np.float64)
    # climatology: the frost frequency over all stations on the valid days before the first forecast date
    before = obs[UWME_VAR].sel(time=obs["time"].values < times[0]).values
    clim = float((before[np.isfinite(before)] <= FROST).mean())
    probs_ok = {m: np.where(ok, v, np.nan) for m, v in probs.items()}
    uwme_scores_file(probs_ok, np.where(ok, o, np.nan), u / "scores.nc")
    figs = u / "figures"
    run([*SMOE, "plot", "reliability", str(u / "scores.nc"), "--out", str(figs), "--overwrite"], [], False, log,
        subs)
    publish(figs / f"reliability_{UWME_VAR}_gt_{FROST:g}.png", "postprocess_calibration_uwme_reliability.png")
    bs = {m: float(((v - o) ** 2)[ok].mean()) for m, v in probs.items()}
    bs_clim = float(((clim - o) ** 2)[ok].mean())
    rng = np.random.default_rng(0)
    per_date = {m: np.array([((v - o) ** 2)[i][ok[i]].sum() for i in range(len(times))]) for m, v in probs.items()}
    counts = ok.sum(1)
    draws = rng.integers(0, len(times), (4000, len(times)))

    def boot(a: str, b: str) -> dict[str, float]:
        """Mean BS difference a − b over the cases, 95 % bootstrap interval over forecast dates."""
        d = per_date[a] - per_date[b]
        stat = d[draws].sum(1) / counts[draws].sum(1)
        return {"mean": float(d.sum() / counts.sum()), "lo": float(np.percentile(stat, 2.5)),
                "hi": float(np.percentile(stat, 97.5))}

    return {"threshold_K": FROST, "event": "T <= 273.15 K (frost)", "cases": int(ok.sum()),
            "frost_frequency": float(o[ok].mean()), "climatological_probability": clim,
            "forecast_dates": [str(times[0])[:10], str(times[-1])[:10]], "commands": log,
            "bs": bs, "bs_climatology": bs_clim,
            "bss_vs_climatology": {m: 1 - v / bs_clim for m, v in bs.items()},
            "bss_vs_raw": {m: 1 - v / bs["raw"] for m, v in bs.items()},
            "bs_drn_minus_emos_site": boot("drn", "emos_site"), "bs_emos_site_minus_raw": boot("emos_site", "raw"),
            "bs_drn_minus_raw": boot("drn", "raw")}


def ci(d: dict[str, float], digits: int = 4) -> str:
    """``mean [lo, hi]``, bold when the interval excludes zero."""
    text = f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]"
    return f"**{text}**" if d["lo"] > 0 or d["hi"] < 0 else text


def markdown(out: dict[str, Any]) -> str:
    """The results page's tables."""
    lines = ["# Calibration of post-processed forecasts: Brier skill, reliability, PIT", "",
             "Written by `benchmarks/postprocess_calibration_results.py` (the commands below, run in this order).", ""]
    if "gcm_ens" in out:
        g = out["gcm_ens"]
        lines += [f"## gcm_ens, Z500 at 48 h ({g['test_inits']} test inits, mid-Jul – Oct 2006)", "",
                  "Thresholds: the 10th/50th/90th area-weighted percentiles of the truth at the training valid "
                  "times. BSS = 1 − BS / BS_ref; climatology = the per-grid-point training frequency.", "",
                  "| threshold [m² s⁻²] | BS climatology | BS raw | BS EMOS | BS U-Net | BSS raw (clim) | "
                  "BSS EMOS (clim) | BSS U-Net (clim) | BSS EMOS (raw) | BSS U-Net (raw) | BS U-Net − EMOS [95 %] |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for t, r in g["by_threshold"].items():
            lines.append(f"| {t} (p{r['percentile']:.0f}) | {r['bs_climatology']:.4f} | {r['raw']['bs']:.4f} | "
                         f"{r['emos']['bs']:.4f} | {r['unet']['bs']:.4f} | {r['raw']['bss_vs_climatology']:.3f} | "
                         f"{r['emos']['bss_vs_climatology']:.3f} | {r['unet']['bss_vs_climatology']:.3f} | "
                         f"{r['emos']['bss_vs_raw']:.3f} | {r['unet']['bss_vs_raw']:.3f} | "
                         f"{ci(r['bs_unet_minus_emos'])} |")
        lines += ["", "Probability stores (`*_probabilities.zarr`) give the same Brier scores as the (μ, σ) "
                  "stores: " + ", ".join(f"{t}: EMOS {r['emos_p']['bs']:.6f} / {r['emos']['bs']:.6f}, U-Net "
                                          f"{r['unet_p']['bs']:.6f} / {r['unet']['bs']:.6f}"
                                          for t, r in g["by_threshold"].items()) + ".", "",
                  "```bash", *g["commands"], "```", ""]
    if "uwme" in out:
        u = out["uwme"]
        lines += [f"## UWME, frost P(T ≤ 273.15 K) at 48 h ({u['cases']} station-days, "
                  f"{u['forecast_dates'][0]} .. {u['forecast_dates'][1]})", "",
                  f"Observed frost frequency {u['frost_frequency']:.3f}; climatological probability "
                  f"{u['climatological_probability']:.3f} (all stations, days before the first forecast date).", "",
                  "| forecast | BS | BSS vs climatology | BSS vs raw |", "|---|---:|---:|---:|"]
        for m, name in (("raw", "raw ensemble"), ("emos_site", "EMOS per site"), ("drn", "DRN")):
            lines.append(f"| {name} | {u['bs'][m]:.4f} | {u['bss_vs_climatology'][m]:.3f} | "
                         f"{u['bss_vs_raw'][m]:.3f} |")
        lines += ["", f"BS DRN − EMOS per site: {ci(u['bs_drn_minus_emos_site'])}; EMOS per site − raw: "
                  f"{ci(u['bs_emos_site_minus_raw'])}; DRN − raw: {ci(u['bs_drn_minus_raw'])} (95 % bootstrap "
                  "over forecast dates).", "", "```bash", *u["commands"], "```", ""]
    return "\n".join(lines)


def main() -> None:
    """Run the parts asked for and write the results (the other part's results kept from the file)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED / "gcm_ens")
    ap.add_argument("--uwme", type=Path, default=SHARED / "ensembleBMA_srft_uwme_t2m.csv")
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "calibration")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--part", choices=("gcm", "uwme", "all"), default="all")
    a = ap.parse_args()
    work = a.work.resolve()
    subs = {str(a.data.resolve()): "DIR", str(a.uwme.resolve()): "UWME.csv", str(work): "runs/calibration",
            str(REPO) + "/": ""}
    path = RESULTS / "postprocess_calibration.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    machine = Machine()
    out["load_average_at_start"] = machine.load_start
    if a.part in ("gcm", "all"):
        out["gcm_ens"] = gcm_part(a.data.resolve(), work, a.reuse, subs)
    if a.part in ("uwme", "all"):
        out["uwme"] = uwme_part(a.uwme.resolve(), work, a.reuse, subs)
    write_results(path, out, markdown(out), machine=machine)
    print(markdown(out))


if __name__ == "__main__":
    sys.exit(main())
