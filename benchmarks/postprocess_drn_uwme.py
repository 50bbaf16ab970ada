"""Site post-processing on real data, EMOS against the distributional regression network (DRN): 48 h 2 m
temperature of the 8-member University of Washington mesoscale ensemble at 969 stations (ensembleBMA ``srft``,
Jan–Feb 2004; GPL, read from ../shared/data, never copied), rolling training window 25 days, lag 2 days, every
form through the CLI:

- raw ensemble (fair CRPS);
- EMOS global (pooled over stations), mean/spread; EMOS global with one weight per member; EMOS per site;
- DRN (``fit --method drn``, default settings: chosen on the January forecast dates only, then fixed),
  refitted per forecast date; its fit and apply are timed (wall clock, with the machine's load average).

All forms are scored on the same cases (forecast dates with a full window, stations with an observation and a
forecast from every form), closed-form Gaussian CRPS (properscoring) and the raw members' fair CRPS. Paired
differences to per-site EMOS: mean, standard error and 95 % interval by a bootstrap over forecast dates (cases
within a date are correlated), on all dates and on the February dates alone (never seen while choosing the DRN
settings). Writes benchmarks/results/postprocess_drn_uwme.{json,md}.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.postprocess_drn_uwme [--drn-only]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, RESULTS, Machine, Stopwatch, write_results

SHARED = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))
TABLE = SHARED / "ensembleBMA_srft_uwme_t2m.csv"
WINDOW, LAG = "25D", "2D"
FORMS = {"EMOS global, mean/spread": ["--method", "emos"],
         "EMOS global, member weights": ["--method", "emos", "--predictors", "members"],
         "EMOS per site, mean/spread": ["--method", "emos", "--per-site"],
         "DRN (embedding, 3 seeds)": ["--method", "drn"]}
REF = "EMOS per site, mean/spread"
RAW = "raw ensemble (fair)"
VAR = "2m_temperature"


def fair_crps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fair CRPS (...) of members x (..., M) against y (...)."""
    m = x.shape[-1]
    return np.abs(x - y[..., None]).mean(-1) - np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2)) / (
        2 * m * (m - 1))


def paired(diff: np.ndarray, ok: np.ndarray, rng: np.random.Generator, n_boot: int = 4000) -> dict[str, float]:
    """Mean paired difference over the cases ``ok`` (dates × sites), its bootstrap-over-dates standard error and
    95 % percentile interval (a date's cases resampled together)."""
    dates = np.flatnonzero(ok.any(1))
    sums, counts = np.where(ok, diff, 0.0).sum(1)[dates], ok.sum(1)[dates]
    draws = rng.integers(0, len(dates), (n_boot, len(dates)))
    boot = sums[draws].sum(1) / counts[draws].sum(1)
    mean = float(sums.sum() / counts.sum())
    se = float(boot.std(ddof=1))
    return {"mean": mean, "se": se, "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
            "mean_over_se": mean / se if se > 0 else float("nan"), "dates": int(len(dates)),
            "cases": int(counts.sum())}


def main() -> None:
    """Fit, apply and score every form (``--drn-only``: the DRN and per-site EMOS); write the results."""
    import properscoring
    import xarray as xr

    from smoeweather.cli import main as smoe
    from smoeweather.data.sites import read_site_table

    if not TABLE.is_file():
        raise SystemExit(f"needs {TABLE} (../shared/data)")
    forms = {k: v for k, v in FORMS.items() if "--drn-only" not in sys.argv or k.startswith("DRN") or k == REF}
    fc, obs = read_site_table(TABLE)
    machine = Machine()
    out: dict[str, Any] = {"table": TABLE.name, "window": WINDOW, "lag": LAG, "forms": {},
                           "cpu_count": os.cpu_count(), "load_average_at_start": machine.load_start,
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        preds = {}
        for k, (name, extra) in enumerate(forms.items()):
            watch = Stopwatch()
            assert smoe(["postprocess", "fit", "--forecast", str(TABLE), "--window", WINDOW, "--lag", LAG, *extra,
                         "--out", str(d / f"m{k}.nc"), "--quiet", "--scheduler", "threads"]) == 0
            fit_s = watch.elapsed()
            with xr.open_dataset(d / f"m{k}.nc") as m:
                first = str(m["time"].values[0])[:10]
            last = str(fc["time"].values[-1])[:10]
            flag = "--drn" if "drn" in extra else "--emos"
            assert smoe(["postprocess", "apply", flag, str(d / f"m{k}.nc"), "--forecast", str(TABLE),
                         "--apply-period", first, last, "--out", str(d / f"p{k}.zarr"), "--quiet",
                         "--scheduler", "threads"]) == 0
            apply_s = watch.elapsed() - fit_s
            preds[name] = xr.open_zarr(d / f"p{k}.zarr").isel(prediction_timedelta=0).load()
            out["forms"][name] = {"fit_s": round(fit_s, 1), "apply_s": round(apply_s, 1),
                                  "dates": f"{first} .. {last}", "command": " ".join(
                                      ["smoe postprocess fit --forecast", TABLE.name, "--window", WINDOW, "--lag",
                                       LAG, *extra])}
            print(name, out["forms"][name], flush=True)
        times = preds[REF]["time"].values
        for name, pp in preds.items():
            assert np.array_equal(pp["time"].values, times), name
            assert list(pp["station_id"].values) == list(fc["station_id"].values), name
        x = fc[VAR].sel(time=times).isel(prediction_timedelta=0).values  # (t, member, site)
        y = obs[VAR].sel(time=times + np.timedelta64(48, "h")).values
        scores = {RAW: fair_crps(np.moveaxis(x, 1, -1), y)}
        for name, pp in preds.items():
            scores[name] = properscoring.crps_gaussian(y, pp[VAR].values, pp[f"{VAR}_std"].values)
    ok = np.isfinite(y) & np.all([np.isfinite(s) for s in scores.values()], 0)
    feb = (times >= np.datetime64("2004-02-01"))[:, None] & ok
    out["cases"], out["cases_february"] = int(ok.sum()), int(feb.sum())
    out["forecast_dates"] = [str(times[0])[:10], str(times[-1])[:10]]
    out["crps_K"] = {k: float(v[ok].mean()) for k, v in scores.items()}
    out["crps_K_february"] = {k: float(v[feb].mean()) for k, v in scores.items()}
    rng = np.random.default_rng(0)
    out["paired_vs_per_site_emos_K"] = {k: paired(v - scores[REF], ok, rng) for k, v in scores.items() if k != REF}
    out["paired_vs_raw_K"] = {k: paired(v - scores[RAW], ok, rng) for k, v in scores.items() if k != RAW}
    out["paired_vs_per_site_emos_K_february"] = {k: paired(v - scores[REF], feb, rng) for k, v in scores.items()
                                                 if k != REF}
    suffix = "_drn_only" if "--drn-only" in sys.argv else ""
    lines = [f"UWME 48 h 2 m temperature, rolling window {WINDOW}, lag {LAG}, forecast dates "
             f"{out['forecast_dates'][0]} .. {out['forecast_dates'][1]}: {out['cases']} station-days "
             f"({out['cases_february']} in February). Paired differences to per-site EMOS, bootstrap over dates.", "",
             "| forecast | CRPS [K] | − per-site EMOS [K] (95 % CI) | diff / SE | February CRPS [K] | "
             "February − per-site EMOS (95 % CI) |", "|---|---:|---:|---:|---:|---:|"]
    for k, v in out["crps_K"].items():
        if k == REF:
            lines.append(f"| {k} | {v:.3f} | – | – | {out['crps_K_february'][k]:.3f} | – |")
            continue
        p, q = out["paired_vs_per_site_emos_K"][k], out["paired_vs_per_site_emos_K_february"][k]
        lines.append(f"| {k} | {v:.3f} | {p['mean']:+.3f} ({p['ci95'][0]:+.3f} … {p['ci95'][1]:+.3f}) | "
                     f"{p['mean_over_se']:+.1f} | {out['crps_K_february'][k]:.3f} | {q['mean']:+.3f} "
                     f"({q['ci95'][0]:+.3f} … {q['ci95'][1]:+.3f}) |")
    lines += ["", "| form | fit [s] | apply [s] |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['fit_s']} | {v['apply_s']} |" for k, v in out["forms"].items()]
    lines += ["", f"{out['cpu_count']} cores, load average at start {out['load_average_at_start'][0]:.1f}, "
              f"OMP_NUM_THREADS={out['omp_num_threads']}."]
    write_results(RESULTS / f"postprocess_drn_uwme{suffix}", out, lines, machine=machine)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
