"""Our ensemble CRPS and RMSE against ``properscoring`` and ``scores`` on one year of 6-hourly 32×64 forecasts.

Same run, same arrays (seeded synthetic fields: truth ~ N(0, 1) plus a smooth pattern, 50 members with
location-dependent spread; float32 storage as in a forecast store):
- CRPS (standard/ECDF): ``smoeweather.metrics.probabilistic.crps_ensemble`` vs ``properscoring.crps_ensemble``
  (which without numba builds the (…, M, M) pairwise array; it is fed float64 time blocks so it fits in
  memory) and vs ``scores.probability.crps_for_ensemble(method="ecdf")``; fair vs ``scores`` ``method="fair"``.
- RMSE (latitude-weighted, over time/latitude/longitude) of the ensemble mean: ``smoeweather.metrics.
  deterministic.rmse`` vs ``scores.continuous.rmse`` with the same weights.
Targets: equal within 1e-6 relative; our CRPS ≥ 5× faster than properscoring, memory bounded
(peak extra memory of our CRPS call, measured with tracemalloc in a separate call, vs the input size).
Writes benchmarks/results/scores.json and prints one JSON line of the ratios.

    python -m benchmarks.score_agreement [--times 1460] [--members 50] [--repeats 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from benchmarks.harness import RESULTS, Machine, call_seconds, write_results


def make_data(n_times: int, members: int, seed: int = 0) -> tuple[xr.DataArray, xr.DataArray]:
    """(forecast (time, latitude, longitude, member), truth (time, latitude, longitude)), float32."""
    rng = np.random.default_rng(seed)
    lat = np.linspace(-87.1875, 87.1875, 32)
    lon = np.arange(64) * 5.625
    time_ = np.datetime64("2018-01-01") + np.arange(n_times) * np.timedelta64(6, "h")
    pattern = np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(lon))[None, :]
    spread = (0.5 + np.abs(pattern)).astype(np.float32)
    truth = rng.standard_normal((n_times, 32, 64), dtype=np.float32) + pattern.astype(np.float32)
    fc = rng.standard_normal((n_times, 32, 64, members), dtype=np.float32)
    fc *= spread[None, :, :, None]
    fc += (0.3 * pattern).astype(np.float32)[None, :, :, None]
    coords = {"time": time_, "latitude": lat, "longitude": lon}
    dims = ("time", "latitude", "longitude")
    return (xr.DataArray(fc, dims=(*dims, "member"), coords=coords, name="2m_temperature"),
            xr.DataArray(truth, dims=dims, coords=coords, name="2m_temperature"))


def timed(fn: Any, repeats: int) -> tuple[Any, float]:
    """(result, best wall seconds of ``repeats`` calls, each after a ``gc.collect``)."""
    out: list[Any] = []
    seconds = call_seconds(lambda: out.append(fn()), repeats, before=gc.collect)
    return out[-1], min(seconds)


def peak_mib(fn: Any) -> float:
    """Peak memory (MiB) numpy/python allocate during ``fn()`` above what was live before it."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2**20


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float64).tiny)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--times", type=int, default=1460, help="6-hourly initialisations (1460 = one year)")
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--block", type=int, default=4, help="time steps per properscoring call (its M² memory)")
    parser.add_argument("--out", type=Path, default=RESULTS / "scores.json")
    args = parser.parse_args(argv)
    machine = Machine()

    import properscoring
    from scores.continuous import rmse as scores_rmse
    from scores.probability import crps_for_ensemble

    from smoeweather.metrics.deterministic import rmse
    from smoeweather.metrics.probabilistic import crps_ensemble
    from smoeweather.metrics.weights import latitude_weights

    fc, truth = make_data(args.times, args.members)
    print(f"data: forecast {fc.shape} float32 ({fc.nbytes / 2**20:.0f} MiB), truth {truth.shape}", flush=True)

    ours, t_ours = timed(lambda: crps_ensemble(fc, truth, estimator="standard").values, args.repeats)
    ours_fair, t_ours_fair = timed(lambda: crps_ensemble(fc, truth, estimator="fair").values, args.repeats)
    print(f"ours: standard {t_ours:.2f} s, fair {t_ours_fair:.2f} s", flush=True)

    def run_properscoring() -> np.ndarray:
        f, y = fc.values, truth.values
        out = np.empty(y.shape, np.float64)
        for s in range(0, y.shape[0], args.block):
            out[s : s + args.block] = properscoring.crps_ensemble(
                y[s : s + args.block].astype(np.float64), f[s : s + args.block].astype(np.float64))
        return out

    ps, t_ps = timed(run_properscoring, args.repeats)
    print(f"properscoring: {t_ps:.2f} s", flush=True)
    fc64, truth64 = fc.astype(np.float64), truth.astype(np.float64)
    sc, t_sc = timed(lambda: crps_for_ensemble(fc64, truth64, "member", method="ecdf", preserve_dims="all")
                     .transpose(*truth.dims).values, args.repeats)
    sc_fair = crps_for_ensemble(fc64, truth64, "member", method="fair", preserve_dims="all").transpose(*truth.dims)
    print(f"scores: {t_sc:.2f} s", flush=True)

    w = latitude_weights(truth["latitude"])
    mean = fc.mean("member")
    our_rmse, t_rmse = timed(lambda: float(rmse(mean, truth, weights=w)), args.repeats)
    ref_rmse, t_rmse_ref = timed(lambda: float(scores_rmse(mean, truth, weights=w)), args.repeats)

    mem_ours = peak_mib(lambda: crps_ensemble(fc, truth, estimator="standard").values)
    block_in = args.block * 32 * 64 * args.members * 8 / 2**20
    out_mib = truth.size * 8 / 2**20
    result = {
        "data": {"times": args.times, "grid": [32, 64], "members": args.members, "dtype": "float32",
                 "forecast_mib": round(fc.nbytes / 2**20, 1)},
        "crps": {
            "ours_standard_s": t_ours, "ours_fair_s": t_ours_fair, "properscoring_s": t_ps, "scores_ecdf_s": t_sc,
            "speedup_vs_properscoring": t_ps / t_ours, "speedup_vs_scores": t_sc / t_ours,
            "max_rel_diff_vs_properscoring": max_rel(ours, ps),
            "max_rel_diff_vs_scores_ecdf": max_rel(ours, sc),
            "max_rel_diff_fair_vs_scores_fair": max_rel(ours_fair, sc_fair.values),
            "mean": float(ours.mean()),
            "ours_peak_extra_mib": mem_ours, "output_mib": out_mib,
            "properscoring_block_input_mib": block_in,
        },
        "rmse": {"ours": our_rmse, "scores": ref_rmse, "rel_diff": abs(our_rmse - ref_rmse) / ref_rmse,
                 "ours_s": t_rmse, "scores_s": t_rmse_ref},
    }
    c = result["crps"]
    result["targets"] = {
        "equal_within_1e-6": max(c["max_rel_diff_vs_properscoring"], c["max_rel_diff_vs_scores_ecdf"],
                                 c["max_rel_diff_fair_vs_scores_fair"], result["rmse"]["rel_diff"]) < 1e-6,
        "crps_speedup_ge_5": c["speedup_vs_properscoring"] >= 5.0,
        # bounded: the output plus a fixed block of temporaries, far below the input
        "memory_bounded": mem_ours < out_mib + 200.0,
    }
    write_results(args.out, result, machine=machine)
    print(json.dumps({"crps_speedup_vs_properscoring": round(c["speedup_vs_properscoring"], 2),
                      "crps_speedup_vs_scores": round(c["speedup_vs_scores"], 2),
                      "max_rel_diff": max(c["max_rel_diff_vs_properscoring"], c["max_rel_diff_vs_scores_ecdf"]),
                      "rmse_rel_diff": result["rmse"]["rel_diff"], "peak_extra_mib": round(mem_ours, 1),
                      **result["targets"]}))
    return result


if __name__ == "__main__":
    main()
