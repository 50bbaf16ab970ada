"""Gridded DRN on the gcm_ens reforecasts (../shared/data/gcm_ens, synthetic, Apache-2.0), beside per-grid-point
EMOS, on the split of the post-processing study (docs/postprocessing-study.md, configs/postprocess/
gcm_ens_unet.yaml): fit on 2005 and Jan–Apr 2006, score the test block, mid-Jul to Oct 2006. Both through the CLI;
DRN with its default settings plus the files' land-sea mask and surface geopotential as covariates (one network
per variable, lead and level, a grid-point embedding). Latitude-weighted closed-form Gaussian CRPS of Z500 and
T850 at 24 h and 48 h (smoeweather.postprocess.scoring), raw ensemble fair CRPS, and the paired difference DRN −
EMOS with a 95 % interval by a bootstrap over init dates. Writes benchmarks/results/postprocess_drn_gcm_ens.{json,md}.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.postprocess_drn_gcm_ens [--drn-seeds 3]
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
FILES = [SHARED / "gcm_ens" / "gcm_ens_2005.nc", SHARED / "gcm_ens" / "gcm_ens_2006.nc"]
TRAIN = ["2005-01-01", "2006-04-30T23"]
TEST = ["2006-07-16", "2006-12-31T23"]
TARGETS = [("geopotential", 500), ("temperature", 850)]


def main() -> None:
    """Fit, apply and score per-grid-point EMOS and the DRN (options: the DRN's); write the results."""
    import xarray as xr

    from smoeweather.cli import main as smoe
    from smoeweather.data import forecast_stores as ensembles
    from smoeweather.metrics.probabilistic import crps_gaussian as crps_normal
    from smoeweather.metrics.weights import latitude_weights

    if not all(f.is_file() for f in FILES):
        raise SystemExit(f"needs {FILES} (../shared/data)")
    extra = sys.argv[1:]
    machine = Machine()
    out: dict[str, Any] = {"train_period": TRAIN, "test_period": TEST, "drn_options": extra,
                           "load_average_at_start": machine.load_start, "forms": {}}
    forms = {"EMOS per grid point": ["--per-gridpoint"], "DRN": ["--method", "drn", *extra]}
    raw = ensembles.select_period(ensembles.open_ensemble([FILES[1]]), TEST)
    truth = ensembles.truth_at_valid_times(raw, ensembles.open_truth(None, [FILES[1]])).load()
    raw = raw.load()
    crps: dict[str, dict[str, np.ndarray]] = {}
    w = latitude_weights(raw["latitude"]).values
    w = w / w.mean()

    def field(ds: xr.Dataset, name: str, level: int, lead: int) -> np.ndarray:
        da = ds[name].sel(level=level, prediction_timedelta=np.timedelta64(lead, "h"))
        return da.transpose("time", ..., "latitude", "longitude").values

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for k, (name, opts) in enumerate(forms.items()):
            watch = Stopwatch()
            assert smoe(["postprocess", "fit", "--forecast", *map(str, FILES), "--train-period", *TRAIN, *opts,
                         "--out", str(d / f"m{k}.nc"), "--quiet", "--scheduler", "threads"]) == 0
            fit_s = watch.elapsed()
            flag = "--drn" if "drn" in opts else "--emos"
            assert smoe(["postprocess", "apply", flag, str(d / f"m{k}.nc"), "--forecast", str(FILES[1]),
                         "--apply-period", *TEST, "--out", str(d / f"p{k}.zarr"), "--quiet",
                         "--scheduler", "threads"]) == 0
            out["forms"][name] = {"fit_s": round(fit_s, 1), "apply_s": round(watch.elapsed() - fit_s, 1),
                                  "options": opts}
            pp = xr.open_zarr(d / f"p{k}.zarr").load()
            crps[name] = {f"{n[0]}{lv}_{h}h": crps_normal(field(pp, n, lv, h), field(pp, f"{n}_std", lv, h),
                                                          field(truth, n, lv, h))
                          for n, lv in TARGETS for h in (24, 48)}
            print(name, out["forms"][name], flush=True)
    # raw ensemble, fair CRPS
    crps["raw ensemble (fair)"] = {}
    for n, lv in TARGETS:
        for h in (24, 48):
            x = raw[n].sel(level=lv, prediction_timedelta=np.timedelta64(h, "h")).transpose(
                "time", "latitude", "longitude", "member").values
            y = field(truth, n, lv, h)
            m = x.shape[-1]
            crps["raw ensemble (fair)"][f"{n[0]}{lv}_{h}h"] = np.abs(x - y[..., None]).mean(-1) - np.abs(
                x[..., :, None] - x[..., None, :]).sum((-1, -2)) / (2 * m * (m - 1))
    keys = list(crps["DRN"])
    out["inits"] = int(raw.sizes["time"])
    out["crps"] = {f: {k: float((v[k] * w[None, :, None]).mean()) for k in keys} for f, v in crps.items()}
    rng = np.random.default_rng(0)
    out["drn_minus_emos"] = {}
    for k in keys:
        per_date = ((crps["DRN"][k] - crps["EMOS per grid point"][k]) * w[None, :, None]).mean((1, 2))
        boot = per_date[rng.integers(0, len(per_date), (4000, len(per_date)))].mean(1)
        out["drn_minus_emos"][k] = {"mean": float(per_date.mean()), "se": float(boot.std(ddof=1)),
                                    "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]}
    lines = [f"gcm_ens, fit {TRAIN[0]} .. {TRAIN[1]}, scored on {out['inits']} inits {TEST[0]} .. {TEST[1]}; "
             "latitude-weighted CRPS (m² s⁻² for Z500, K for T850).", "",
             "| forecast | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for f, v in out["crps"].items():
        lines.append(f"| {f} | " + " | ".join(f"{v[k]:.4g}" for k in keys) + " |")
    lines.append("| DRN − EMOS per grid point (95 % CI) | " + " | ".join(
        f"{p['mean']:+.3g} ({p['ci95'][0]:+.3g} … {p['ci95'][1]:+.3g})" for p in out["drn_minus_emos"].values())
        + " |")
    lines += ["", "| form | fit [s] | apply [s] |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['fit_s']} | {v['apply_s']} |" for k, v in out["forms"].items()]
    lines += ["", f"load average at start {out['load_average_at_start'][0]:.1f}"]
    write_results(RESULTS / "postprocess_drn_gcm_ens", out, lines, machine=machine)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
