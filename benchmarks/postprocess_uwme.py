"""Real-data check of site EMOS: 48 h 2 m temperature of the 8-member University of Washington
mesoscale ensemble at 969 stations (ensembleBMA ``srft``, Jan–Feb 2004; GPL, read from ../shared/data, never
copied), rolling training window 25 days, lag 2 days, through the CLI (default scheduler):

- raw ensemble (fair CRPS);
- EMOS global (pooled over stations), mean/spread:  ``fit --window 25D --lag 2D``;
- EMOS global with one weight per member (the UWME members are different models): ``--predictors members``;
- EMOS per site, mean/spread: ``--per-site`` (a site needs 8 valid days in its window, else no forecast).

Every form is scored on the same cases: forecast dates with a full window, stations with an observation and
every form's forecast; the CRPS of a Gaussian in closed form (properscoring), of the raw members fair.
Writes benchmarks/results/postprocess_uwme.{json,md}.

    .venv/bin/python -m benchmarks.postprocess_uwme
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO, RESULTS, Machine, Stopwatch, write_results

SHARED = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))
TABLE = SHARED / "ensembleBMA_srft_uwme_t2m.csv"
FORMS = {"EMOS global, mean/spread": [], "EMOS global, member weights": ["--predictors", "members"],
         "EMOS per site, mean/spread": ["--per-site"]}
WINDOW, LAG = "25D", "2D"


def fair_crps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fair CRPS (..., ) of members x (..., M) against y (...)."""
    m = x.shape[-1]
    return np.abs(x - y[..., None]).mean(-1) - np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2)) / (
        2 * m * (m - 1))


def main() -> None:
    """Fit, apply and score every form; write the results."""
    import properscoring
    import xarray as xr

    from smoeweather.cli import main as smoe
    from smoeweather.data.sites import read_site_table

    if not TABLE.is_file():
        raise SystemExit(f"needs {TABLE} (../shared/data)")
    fc, obs = read_site_table(TABLE)
    machine = Machine()
    out: dict[str, Any] = {"table": str(TABLE), "window": WINDOW, "lag": LAG, "forms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        preds = {}
        for k, (name, extra) in enumerate(FORMS.items()):
            watch = Stopwatch()
            assert smoe(["postprocess", "fit", "--forecast", str(TABLE), "--window", WINDOW, "--lag", LAG, *extra,
                         "--out", str(d / f"m{k}.nc"), "--quiet"]) == 0
            with xr.open_dataset(d / f"m{k}.nc") as m:
                first = str(m["time"].values[0])[:10]
            last = str(fc["time"].values[-1])[:10]
            assert smoe(["postprocess", "apply", "--emos", str(d / f"m{k}.nc"), "--forecast", str(TABLE),
                         "--apply-period", first, last, "--out", str(d / f"p{k}.zarr"), "--quiet"]) == 0
            pp = xr.open_zarr(d / f"p{k}.zarr").isel(prediction_timedelta=0).load()
            preds[name] = pp
            out["forms"][name] = {"fit_apply_s": watch.elapsed(), "dates": f"{first} .. {last}"}
        times = preds[next(iter(preds))]["time"].values
        x = fc["2m_temperature"].sel(time=times).isel(prediction_timedelta=0).values  # (t, member, site)
        y = obs["2m_temperature"].sel(time=times + np.timedelta64(48, "h")).values
        scores = {"raw ensemble (fair)": fair_crps(np.moveaxis(x, 1, -1), y)}
        for name, pp in preds.items():
            scores[name] = properscoring.crps_gaussian(y, pp["2m_temperature"].values,
                                                       pp["2m_temperature_std"].values)
    ok = np.isfinite(y) & np.all([np.isfinite(s) for s in scores.values()], 0)
    raw = float(scores["raw ensemble (fair)"][ok].mean())
    out["cases"] = int(ok.sum())
    out["cases_without_a_per_site_fit"] = int((np.isfinite(y) & ~np.isfinite(scores["EMOS per site, mean/spread"])
                                               ).sum())
    out["forecast_dates"] = [str(times[0])[:10], str(times[-1])[:10]]
    out["crps_K"] = {k: float(v[ok].mean()) for k, v in scores.items()}
    out["improvement_vs_raw"] = {k: 1 - v / raw for k, v in out["crps_K"].items()}
    # paired: bootstrap over forecast dates (cases within a date are correlated)
    rng = np.random.default_rng(0)
    nt = len(times)
    boots = {}
    for k, v in scores.items():
        per_date = np.array([np.nanmean(np.where(ok[t], v[t] - scores["raw ensemble (fair)"][t], np.nan))
                             for t in range(nt)])
        draws = [np.nanmean(per_date[rng.integers(0, nt, nt)]) for _ in range(2000)]
        boots[k] = [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]
    out["paired_difference_vs_raw_95ci_K"] = boots
    lines = [f"UWME 48 h 2 m temperature, {out['cases']} station-days, forecast dates {out['forecast_dates'][0]} .. "
             f"{out['forecast_dates'][1]}, rolling window {WINDOW}, lag {LAG}:", "",
             "| forecast | CRPS [K] | vs raw | paired difference to raw, 95 % CI (bootstrap over dates) [K] |",
             "|---|---:|---:|---:|"]
    for k, v in out["crps_K"].items():
        ci = boots[k]
        raw_row = k.startswith("raw")
        lines.append(f"| {k} | {v:.3f} | " + ("–" if raw_row else f"{-out['improvement_vs_raw'][k]:+.1%}") + " | "
                     + ("–" if raw_row else f"{ci[0]:+.3f} … {ci[1]:+.3f}") + " |")
    write_results(RESULTS / "postprocess_uwme", out, lines, machine=machine,
                  replace={str(REPO.parent) + "/": "../"})  # the shared data folder beside the repository
    print("\n".join(lines))


if __name__ == "__main__":
    main()
