"""Post-processing speed: EMOS fit in grid points per second (the batched per-group Newton solver
against the earlier L-BFGS implementation, same run, same arrays), apply throughput (EMOS + ECC-Q members),
and network training samples/s (forward + backward of ``PostprocessingUNet`` with and without SMoE at 32×64).

Data: the shared gcm_ens 2005 stream when present (per-grid-point groups: 2 fields × 2 leads × 2 levels ×
2,048 points, 150 inits), else a seeded synthetic set of the same shape. The reference solver is timed on a
subset of the groups (it is slow; its cost per group does not depend on how many groups share its L-BFGS, up
to the shared line search); both are reported per group, and both fits' mean CRPS on the same subset is
recorded. The 0.5° projection (361 × 720 points × 8 field/lead/level groups) divides by the measured rate.
The reference solver is :mod:`smoeweather.postprocess.emos_reference`. Writes benchmarks/results/postprocess.{json,md}.

    python -m benchmarks.postprocess [--reference-groups 512] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from benchmarks.harness import RESULTS, Machine, block_seconds, timed, warm_up, write_results

SHARED = Path(os.environ.get("SMOE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
HALF_DEGREE_POINTS = 361 * 720


def _groups() -> tuple[np.ndarray, ...] | tuple[Any, ...]:
    """(m, v, y, w) (G, S) per-grid-point arrays and a description of the source."""
    from smoeweather.data import forecast_stores as stores

    path = SHARED / "gcm_ens" / "gcm_ens_2005.nc"
    if path.is_file():
        fc = stores.open_ensemble(path).load()
        truth = stores.truth_at_valid_times(fc, stores.open_truth(None, path)).load()
        src = str(path)
    else:
        rng = np.random.default_rng(0)
        shape = (150, 2, 10, 2, 32, 64)
        dims = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
        x = rng.standard_normal(shape)
        fc = xr.Dataset({"t": (dims, x)})
        truth = xr.Dataset({"t": (tuple(d for d in dims if d != "member"),
                                  x.mean(2) + 0.3 + 1.5 * rng.standard_normal((150, 2, 2, 32, 64)))})
        src = "synthetic (seeded), gcm_ens shape"
    parts = []
    for n in fc.data_vars:
        da = fc[n].transpose("prediction_timedelta", "level", "latitude", "longitude", "time", "member").values
        y = truth[n].transpose("prediction_timedelta", "level", "latitude", "longitude", "time").values
        s = da.shape[4]
        parts.append((da.mean(-1).reshape(-1, s), da.var(-1, ddof=1).reshape(-1, s), y.reshape(-1, s)))
    m, v, y = (np.concatenate([p[i] for p in parts]).astype(np.float64) for i in range(3))
    return m, v, y, np.ones_like(m), src


def _crps(coef: np.ndarray, m: np.ndarray, v: np.ndarray, y: np.ndarray) -> float:
    from smoeweather.metrics.probabilistic import crps_gaussian

    mu = coef[:, :1] + coef[:, 1:2] * m
    return float(crps_gaussian(mu, np.sqrt(coef[:, 2:3] + coef[:, 3:] * v), y).mean())


def bench_fit(reference_groups: int) -> dict[str, Any]:
    """The batched Newton fit of every group against the L-BFGS reference on a subset, per group."""
    from smoeweather.postprocess.emos import fit_groups_newton
    from smoeweather.postprocess.emos_reference import fit_groups_lbfgs

    m, v, y, w, src = _groups()
    g = m.shape[0]
    rng = np.random.default_rng(0)
    sub = np.sort(rng.choice(g, size=min(reference_groups, g), replace=False))
    (new, ok), t_new = timed(fit_groups_newton, m, v, y, w)
    ref, t_ref = timed(fit_groups_lbfgs, m[sub], v[sub], y[sub], w[sub], iterations=300)
    rate_new, rate_ref = g / t_new, len(sub) / t_ref
    return {"source": src, "groups": g, "samples_per_group": int(m.shape[1]), "newton_s": t_new,
            "newton_groups_per_s": rate_new, "newton_not_converged": int((~ok).sum()),
            "reference_groups": len(sub), "reference_s": t_ref, "reference_groups_per_s": rate_ref,
            "speedup": rate_new / rate_ref,
            "crps_subset_newton": _crps(new[sub], m[sub], v[sub], y[sub]),
            "crps_subset_reference": _crps(ref, m[sub], v[sub], y[sub]),
            "projected_half_degree_s_per_field_lead_level": HALF_DEGREE_POINTS / rate_new,
            "projected_half_degree_s_8_groups": 8 * HALF_DEGREE_POINTS / rate_new,
            "projected_half_degree_s_8_groups_reference": 8 * HALF_DEGREE_POINTS / rate_ref}


def bench_apply() -> dict[str, Any]:
    """EMOS apply and ECC-Q members on a synthetic gcm_ens-shaped forecast: values per second."""
    from smoeweather.postprocess.ecc import ecc_members
    from smoeweather.postprocess.emos import apply_emos

    rng = np.random.default_rng(1)
    dims = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
    shape = (150, 2, 10, 2, 32, 64)
    fc = xr.Dataset({n: (dims, rng.standard_normal(shape)) for n in ("geopotential", "temperature")})
    params = xr.Dataset({n: (("prediction_timedelta", "level", "latitude", "longitude", "coefficient"),
                             np.abs(rng.standard_normal((2, 2, 32, 64, 4)))) for n in fc.data_vars},
                        coords={"coefficient": ["a", "b", "c", "d"]})
    def emos() -> tuple[xr.Dataset, xr.Dataset]:
        mu, sigma = apply_emos(params, fc)
        return mu.load(), sigma.load()

    (mu, sigma), t_emos = timed(emos)
    _, t_ecc = timed(ecc_members, mu, sigma, fc, 10)
    values = int(np.prod(shape)) // 10 * 2  # forecast values (no member) calibrated
    return {"shape": dict(zip(dims, shape)), "fields": 2, "emos_s": t_emos, "emos_values_per_s": values / t_emos,
            "ecc_s": t_ecc, "ecc_member_values_per_s": values * 10 / t_ecc}


def bench_network(steps: int) -> dict[str, Any]:
    """Training samples/s of the U-Net and the SMoE-U-Net (one warm-up step, then ``steps`` timed)."""
    from smoeweather.models.unet import PostprocessingUNet

    out = {}
    for smoe in (False, True):
        torch.manual_seed(0)
        model = PostprocessingUNet(4, levels=3, widths=(16, 32, 64), smoe=smoe, grid=(32, 64))
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        x = torch.randn(8, 4, 32, 64)

        def step(model: torch.nn.Module = model, opt: torch.optim.Optimizer = opt, x: torch.Tensor = x) -> None:
            opt.zero_grad()
            y = model(x)
            y.square().mean().backward()
            opt.step()

        warm_up(step, 1)
        out["smoe_unet" if smoe else "unet"] = {"samples_per_s": 8 / block_seconds(step, steps), "batch": 8,
                                                "steps": steps}
    out["smoe_over_unet_time"] = out["unet"]["samples_per_s"] / out["smoe_unet"]["samples_per_s"]
    out["note"] = ("forward+backward+Adam of PostprocessingUNet widths 16/32/64, 4 input channels, 32x64, "
                   "synthetic batch")
    return out


def markdown(r: dict[str, Any]) -> str:
    f, a, n = r["fit"], r["apply"], r["network"]
    return "\n".join([
        f"# Post-processing benchmark ({r['machine']}, {r['threads']} torch threads)", "",
        f"EMOS per-grid-point fit, {f['groups']} groups × {f['samples_per_group']} inits ({f['source']}):", "",
        "| solver | groups | time [s] | groups/s | mean CRPS on the reference subset (field units, Z and T pooled) |",
        "|---|---:|---:|---:|---:|",
        f"| batched Newton (new) | {f['groups']} | {f['newton_s']:.1f} | {f['newton_groups_per_s']:.0f} | "
        f"{f['crps_subset_newton']:.6g} |",
        f"| L-BFGS (reference solver) | {f['reference_groups']} | {f['reference_s']:.1f} | "
        f"{f['reference_groups_per_s']:.1f} | {f['crps_subset_reference']:.6g} |", "",
        f"Speed-up {f['speedup']:.0f}×; not converged: {f['newton_not_converged']}. Projected 0.5° grid "
        f"(260k points): {f['projected_half_degree_s_per_field_lead_level'] / 60:.1f} min per field/lead/level, "
        f"{f['projected_half_degree_s_8_groups'] / 60:.1f} min for 2 fields × 2 leads × 2 levels "
        f"(reference: {f['projected_half_degree_s_8_groups_reference'] / 3600:.1f} h).", "",
        f"Apply (2 fields, 150 inits × 2 leads × 2 levels × 32 × 64): EMOS {a['emos_values_per_s']:.3g} values/s, "
        f"ECC-Q members {a['ecc_member_values_per_s']:.3g} member values/s.", "",
        f"Network training (batch 8, 32×64): U-Net {n['unet']['samples_per_s']:.1f} samples/s, SMoE-U-Net "
        f"{n['smoe_unet']['samples_per_s']:.1f} samples/s (SMoE step {n['smoe_over_unet_time']:.2f}× the U-Net's "
        "time).", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference-groups", type=int, default=512, help="groups timed with the L-BFGS reference")
    p.add_argument("--steps", type=int, default=5, help="network training steps timed per arm")
    args = p.parse_args()
    machine = Machine()
    r = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {machine.load_start[0]:.1f} at start",
         "threads": torch.get_num_threads(), "fit": bench_fit(args.reference_groups), "apply": bench_apply(),
         "network": bench_network(args.steps)}
    write_results(RESULTS / "postprocess", r, markdown(r), machine=machine)
    print(markdown(r))


if __name__ == "__main__":
    main()
