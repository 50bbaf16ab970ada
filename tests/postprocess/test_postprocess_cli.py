"""Fit once, apply many: `smoe postprocess fit/apply` on files in the exact gcm_ens layout (int16
CF-packed, truth_* on valid_time) and on the shared gcm_ens streams; refusals before anything is written; ECC-Q
members and quantile stores scored by `smoe evaluate`; the batched Newton EMOS fit against the L-BFGS reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import properscoring
import pytest
import scores.continuous
import xarray as xr
from scipy.special import ndtri

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.metrics.probabilistic import crps_ensemble, crps_gaussian, quantile_loss
from smoeweather.postprocess import emos
from smoeweather.postprocess.ecc import ecc_levels, ecc_members, gaussian_quantiles, ranks
from smoeweather.postprocess.emos import apply_emos, fit_emos, fit_groups_newton
from smoeweather.postprocess.emos_reference import fit_groups_lbfgs

LAT = np.linspace(-78.75, 78.75, 8)
LON = np.arange(12) * 30.0
EPS64 = float(np.finfo(np.float64).eps)


def gcm_ens_like(path: Path, year: int, seed: int, n_init: int = 24, members: int = 6,
                 lat: np.ndarray = LAT, lon: np.ndarray = LON, leads: tuple[int, ...] = (24, 48)) -> Path:
    """A file in the exact gcm_ens layout: geopotential/temperature (time, prediction_timedelta, member, level,
    latitude, longitude) int16-packed (scale 10 m² s⁻², 0.02 K), truth_* on daily valid_time, land_sea_mask;
    the ensemble has a land bias and is under-dispersive."""
    rng = np.random.default_rng(seed)
    init = pd.date_range(f"{year}-01-01", periods=n_init, freq="2D")
    valid = pd.date_range(init[0], init[-1] + pd.Timedelta(hours=max(leads)), freq="D")
    land = (np.sin(np.deg2rad(lon))[None, :] * np.cos(np.deg2rad(lat))[:, None] > 0.2).astype(np.float32)
    nv = len(valid)
    base = {"geopotential": (np.array([54000.0, 14000.0]), 300.0, 20.0),
            "temperature": (np.array([250.0, 275.0]), 3.0, 0.4)}
    ds = xr.Dataset(coords={"time": init, "prediction_timedelta": pd.to_timedelta(list(leads), "h"),
                            "member": np.arange(members), "level": np.array([500, 850], np.int32),
                            "latitude": lat, "longitude": lon, "valid_time": valid})
    for name, (mean, amp, bias) in base.items():
        truth = (mean[None, :, None, None] + amp * rng.standard_normal((nv, 2, len(lat), len(lon))))
        ens = np.empty((n_init, len(leads), members, 2, len(lat), len(lon)))
        for j, h in enumerate(leads):
            yv = truth[np.searchsorted(valid, init + pd.Timedelta(hours=h))]
            err = 0.5 * amp * np.sqrt(h / 24) * rng.standard_normal(yv.shape)
            ens[:, j] = (yv + bias * land + err)[:, None] + 0.3 * amp * rng.standard_normal(
                (n_init, members, *yv.shape[1:]))
        scale = 10.0 if name == "geopotential" else 0.02
        units = "m**2 s**-2" if name == "geopotential" else "K"
        enc = {"dtype": "int16", "scale_factor": scale, "add_offset": float(mean.mean()), "_FillValue": -32768}
        ds[name] = (("time", "prediction_timedelta", "member", "level", "latitude", "longitude"), ens,
                    {"units": units})
        ds[name].encoding = enc
        ds[f"truth_{name}"] = (("valid_time", "level", "latitude", "longitude"), truth, {"units": units})
        ds[f"truth_{name}"].encoding = dict(enc)
    ds["land_sea_mask"] = (("latitude", "longitude"), land)
    ds.to_netcdf(path)
    return path


@pytest.fixture
def streams(tmp_path: Path) -> tuple[Path, Path]:
    return gcm_ens_like(tmp_path / "ens_2005.nc", 2005, 1), gcm_ens_like(tmp_path / "ens_2006.nc", 2006, 2)


def _crps_raw_and_pp(new: Path, pp: Path) -> tuple[float, float]:
    fc = forecast_stores.open_ensemble(new)
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, new))
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(pp))
    return (float(crps_ensemble(fc, truth)["temperature"].mean()),
            float(crps_gaussian(mu, sigma, truth)["temperature"].mean()))


# expected: the streams hold their truth inside the forecast file and have no land-sea mask (evaluate says so)
@pytest.mark.filterwarnings("ignore:.*truth held inside a forecast file:UserWarning",
                            "ignore:.*has no land_sea_mask:UserWarning")
def test_fit_apply_members_quantiles_evaluate(streams: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = streams
    model, pp = tmp_path / "emos.nc", tmp_path / "pp.zarr"
    assert main(["postprocess", "fit", "--per-gridpoint", "--forecast", str(old), "--out", str(model)]) == 0
    with xr.open_dataset(model) as m:
        assert m.attrs["members"] == 6 and m.attrs["fields"] == "geopotential temperature"
        assert m.attrs["leads_hours"] == "24 48" and m.attrs["levels"] == "500 850"
        assert m["temperature_a"].dims == ("prediction_timedelta", "level", "latitude", "longitude")
        assert m["temperature_c"].attrs["units"] == "(K)**2" and m["temperature_b"].attrs["units"] == "1"
        np.testing.assert_allclose(m["latitude"].values, LAT)
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(new), "--out", str(pp),
                 "--members", "6", "--quantiles", "0.1", "0.5", "0.9"]) == 0
    gauss = xr.open_zarr(pp)
    ens = xr.open_zarr(tmp_path / "pp_members.zarr")
    qs = xr.open_zarr(tmp_path / "pp_quantiles.zarr")
    assert (gauss.attrs["forecast_kind"], ens.attrs["forecast_kind"], qs.attrs["forecast_kind"]) == (
        "gaussian", "ensemble", "quantiles")
    assert ens["temperature"].dims == ("time", "prediction_timedelta", "realization", "level", "latitude", "longitude")
    assert list(qs["quantile"].values) == [0.1, 0.5, 0.9]
    raw, emos = _crps_raw_and_pp(new, pp)
    assert emos < raw  # a land bias learnt on one stream corrects the other
    # the members' marginals are the Gaussian's ECC-Q quantiles (float32 store: relative 2⁻²³ of the field)
    mu, sigma = forecast_stores.split_gaussian(gauss.load())
    expect = np.sort((mu["temperature"] + sigma["temperature"] * xr.DataArray(
        ndtri(ecc_levels(6)), dims="realization")).transpose(*ens["temperature"].dims).values, axis=2)
    got = np.sort(ens["temperature"].values, axis=2)
    np.testing.assert_allclose(got, expect, rtol=4 * 2.0**-23)
    # evaluate: the truth inside the gcm_ens file; every product gets its score
    out = tmp_path / "scores"
    assert main(["evaluate", f"raw={new}", f"emos={pp}", f"ecc={tmp_path / 'pp_members.zarr'}",
                 f"q={tmp_path / 'pp_quantiles.zarr'}", "--truth", str(new), "--out", str(out)]) == 0
    sc = xr.load_dataset(out / "scores.nc")
    crps = sc["crps"].sel(field="temperature_850")
    assert (crps.sel({"method": "emos"}) < crps.sel({"method": "raw"})).all()
    assert np.isfinite(sc["crps"].sel({"method": "ecc"})).all()
    assert np.isfinite(sc["spread_skill"].sel({"method": "ecc"})).all()
    assert np.isfinite(sc["quantile_loss"].sel({"method": "q"})).all()
    assert np.isnan(sc["quantile_loss"].sel({"method": "emos"})).all()
    # the quantile loss equals the `scores` package's quantile score, level by level
    truth = forecast_stores.truth_at_valid_times(forecast_stores.open_ensemble(new),
                                                 forecast_stores.open_truth(None, new))["temperature"]
    t850 = truth.sel(level=850)
    q850 = qs["temperature"].sel(level=850).load()
    ours = quantile_loss(q850, t850)
    for q in q850["quantile"].values:
        ref = scores.continuous.quantile_score(q850.sel(quantile=q), t850, alpha=float(q), preserve_dims="all")
        np.testing.assert_allclose(ours.sel(quantile=q).transpose(*ref.dims).values, ref.values,
                                   rtol=8 * EPS64, atol=8 * EPS64 * 300)


def test_refusals_name_the_mismatch_and_write_nothing(streams: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    old, new = streams
    model = tmp_path / "emos.nc"
    assert main(["postprocess", "fit", "--forecast", str(old), "--out", str(model)]) == 0
    other = {
        "grid": gcm_ens_like(tmp_path / "grid.nc", 2006, 3, lon=LON + 1.0),
        "lead": gcm_ens_like(tmp_path / "lead.nc", 2006, 3, leads=(24, 72)),
        "members": gcm_ens_like(tmp_path / "members.nc", 2006, 3, members=5),
    }
    xr.load_dataset(new).drop_vars(["temperature", "truth_temperature"]).to_netcdf(tmp_path / "field.nc")
    other["field"] = tmp_path / "field.nc"
    xr.load_dataset(new).sel(level=[500]).to_netcdf(tmp_path / "level.nc")
    other["level"] = tmp_path / "level.nc"
    words = {"grid": "longitude grid", "lead": "lead(s) [72]", "members": "5 members", "field": "['temperature']",
             "level": "level(s) [850]"}
    for what, path in other.items():
        out = tmp_path / f"pp_{what}.zarr"
        assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(path), "--out", str(out),
                     "--members", "6" if what != "members" else "5", "--quantiles", "0.5"]) == 2, what
        err = capsys.readouterr().err
        assert words[what] in err, (what, err)
        assert not any(tmp_path.glob(f"pp_{what}*")), what
    # ECC needs N = raw member count; bad levels; an existing output: refused before anything is written
    for argv, word in ((["--members", "4"], "--members 4"), (["--quantiles", "0", "0.5"], "--quantiles")):
        assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(new),
                     "--out", str(tmp_path / "x.zarr"), *argv]) == 2
        assert word in capsys.readouterr().err and not any(tmp_path.glob("x*"))
    (tmp_path / "y_quantiles.zarr").mkdir()
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(new),
                 "--out", str(tmp_path / "y.zarr"), "--quantiles", "0.5"]) == 2
    assert "already exists" in capsys.readouterr().err and not (tmp_path / "y.zarr").exists()
    assert main(["postprocess", "apply", "--emos", str(tmp_path / "none.nc"), "--forecast", str(new), "--out",
                 str(tmp_path / "z.zarr")]) == 2


def test_ecc_q_marginals_exact_and_rank_order_kept() -> None:
    rng = np.random.default_rng(0)
    m, shape = 7, (5, 2, 3, 4)
    raw = np.round(rng.normal(size=(shape[0], shape[1], m, *shape[2:])), 1)  # rounding makes ties
    dims = ("time", "prediction_timedelta", "member", "latitude", "longitude")
    raw_ds = xr.Dataset({"t": (dims, raw)})
    mu = xr.Dataset({"t": (("time", "prediction_timedelta", "latitude", "longitude"), rng.normal(size=shape))})
    sigma = xr.Dataset({"t": (mu["t"].dims, rng.uniform(0.5, 2.0, size=shape))})
    out = ecc_members(mu, sigma, raw_ds, m)["t"].transpose(*dims).values.astype(np.float64)
    expect = mu["t"].values[:, :, None] + sigma["t"].values[:, :, None] * ndtri(
        (np.arange(1, m + 1) - 0.5) / m)[None, None, :, None, None]
    np.testing.assert_allclose(np.sort(out, axis=2), expect, rtol=2 * 2.0**-23)  # float32 output
    # same rank order as the raw members, ties broken by member index (stable)
    np.testing.assert_array_equal(ranks(out, 2), ranks(raw, 2))
    tie = np.array([[1.0, 0.5, 1.0, 0.5]])
    np.testing.assert_array_equal(ranks(tie, 1), [[2, 0, 3, 1]])
    with pytest.raises(ValueError, match="member count"):
        ecc_members(mu, sigma, raw_ds, m + 1)
    # quantiles: μ + σ Φ⁻¹(q)
    q = gaussian_quantiles(mu, sigma, [0.9, 0.1])
    assert list(q["quantile"].values) == [0.1, 0.9]
    np.testing.assert_allclose(q["t"].sel(quantile=0.9).values, mu["t"].values + 1.2815515655446004 *
                               sigma["t"].values, rtol=8 * EPS64)


def test_quantile_loss_closed_form_and_crps_limit() -> None:
    """Mean pinball loss over K levels (k − ½)/K of the Gaussian's own quantiles → ½ CRPS (properscoring)."""
    mu, sd, y = 1.0, 2.0, np.array([0.3, 4.0, -2.5])
    k = 2000
    lv = (np.arange(1, k + 1) - 0.5) / k
    fc = xr.DataArray(mu + sd * ndtri(lv)[None, :] + 0 * y[:, None], dims=("p", "quantile"),
                      coords={"quantile": lv})
    ql = quantile_loss(fc, xr.DataArray(y, dims="p")).mean("quantile").values
    ref = properscoring.crps_gaussian(y, mu, sd)
    # midpoint rule on Φ⁻¹: error O(log K / K) relative
    np.testing.assert_allclose(2 * ql, ref, rtol=10 * np.log(k) / k)
    one = quantile_loss(xr.DataArray([2.0], dims="quantile", coords={"quantile": [0.25]}), xr.DataArray(1.0))
    assert float(one[0]) == pytest.approx(0.75)  # y < x: (1 − 2)·(0.25 − 1)
    with pytest.raises(ValueError, match="quantile"):
        quantile_loss(xr.DataArray([1.0], dims="x"), xr.DataArray(1.0))


def _gaussian_groups(g: int, s: int, seed: int) -> tuple[np.ndarray, ...]:
    """(G, S) ensemble mean/variance and truth drawn from N(a + b·m, c + d·v) with known per-group coefficients."""
    rng = np.random.default_rng(seed)
    coef = np.stack([rng.normal(0, 2, g), rng.uniform(0.6, 1.4, g), rng.uniform(0.1, 2.0, g),
                     rng.uniform(0.0, 2.0, g)], 1)
    m = 10.0 + 3.0 * rng.standard_normal((g, s))
    v = rng.uniform(0.2, 3.0, (g, s))
    y = coef[:, :1] + coef[:, 1:2] * m + np.sqrt(coef[:, 2:3] + coef[:, 3:] * v) * rng.standard_normal((g, s))
    return m, v, y, np.ones((g, s)), coef


def _mean_crps(coef: np.ndarray, m: np.ndarray, v: np.ndarray, y: np.ndarray) -> np.ndarray:
    mu = coef[:, :1] + coef[:, 1:2] * m
    sd = np.sqrt(coef[:, 2:3] + coef[:, 3:] * v)
    return properscoring.crps_gaussian(y, mu, sd).mean(1)


def test_newton_fit_reaches_lbfgs_crps_and_recovers_coefficients() -> None:
    m, v, y, w, coef = _gaussian_groups(64, 150, seed=0)
    new, ok = fit_groups_newton(m, v, y, w)
    ref = fit_groups_lbfgs(m, v, y, w, iterations=300)
    assert ok.all()
    c_new, c_ref = _mean_crps(new, m, v, y), _mean_crps(ref, m, v, y)
    # every group at its own minimum: not above the reference's CRPS beyond float64 summation of 150 terms
    # (the Newton stop tolerance 1e-12 in standardised units is below that)
    tol = 150 * 4 * EPS64 * np.abs(y - y.mean(1, keepdims=True)).max(1)
    assert np.all(c_new <= c_ref + tol)
    assert np.all(new[:, 2:] >= 0)
    # recovery: 4000 samples per group; tolerances 6 standard errors of a minimum-CRPS estimate
    m, v, y, w, coef = _gaussian_groups(16, 4000, seed=1)
    new, ok = fit_groups_newton(m, v, y, w)
    assert ok.all()
    sd = np.sqrt(coef[:, 2] + coef[:, 3] * v.mean(1))
    se_b = sd / (3.0 * np.sqrt(4000))
    np.testing.assert_array_less(np.abs(new[:, 1] - coef[:, 1]), 6 * se_b)
    np.testing.assert_array_less(np.abs((new[:, 0] + 10 * new[:, 1]) - (coef[:, 0] + 10 * coef[:, 1])),
                                 6 * sd / np.sqrt(4000))
    # variance σ² = c + d·v̄ at the mean spread: relative error ≈ √(2/n), ×2 for the CRPS estimator's efficiency
    var_new, var_true = new[:, 2] + new[:, 3] * v.mean(1), coef[:, 2] + coef[:, 3] * v.mean(1)
    np.testing.assert_array_less(np.abs(var_new / var_true - 1), 6 * 2 * np.sqrt(2 / 4000))


def test_newton_bounds_and_degenerate_groups() -> None:
    """Truth independent of the spread (d → 0 on the bound), all members tied (v = 0), a group with no data."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(3, 300))
    v = np.stack([rng.uniform(0.5, 2, 300), np.zeros(300), np.ones(300)])
    y = m + 0.7 * rng.standard_normal((3, 300))
    w = np.ones((3, 300))
    w[2] = 0.0
    coef, ok = fit_groups_newton(m, v, y, w)
    assert ok[:2].all() and np.isfinite(coef[:2]).all()
    assert 0.0 <= coef[0, 3] < 0.05 and coef[0, 2] == pytest.approx(0.49, rel=0.2)
    assert coef[1, 2] == pytest.approx(0.49, rel=0.2)


def test_fit_emos_global_is_the_same_minimum_as_the_reference_solver(
    streams: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, _ = streams
    fc = forecast_stores.open_ensemble(old).load()
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, old)).load()
    crps = {}
    for solver in ("newton", "lbfgs"):
        if solver == "lbfgs":  # the same groups and weights, solved by the independent reference
            monkeypatch.setattr(emos, "fit_groups_newton", lambda m, v, y, w, iterations: (
                fit_groups_lbfgs(m, v, y, w, iterations=300), np.ones(m.shape[0], bool)))
        p = fit_emos(fc, truth, per_gridpoint=False)
        mu, sigma = apply_emos(p, fc)
        crps[solver] = crps_gaussian(mu, sigma, truth)["temperature"].mean(("time", "latitude", "longitude"))
    # relative: float64 sums over ~2,000 samples, and L-BFGS's own stop (tolerance_change 1e-12)
    np.testing.assert_array_less(crps["newton"].values, crps["lbfgs"].values * (1 + 1e-6))


@pytest.mark.shared_data
def test_gcm_ens_2005_to_2006_through_the_cli(shared_data: Path, tmp_path: Path) -> None:
    """Per-grid-point EMOS fitted on 40 inits of the 2005 stream calibrates 2006 (T850, Z500 subset)."""
    src = shared_data / "gcm_ens"
    old = tmp_path / "old.nc"
    new = tmp_path / "new.nc"
    for a, b, sl in ((src / "gcm_ens_2005.nc", old, slice(0, 40)), (src / "gcm_ens_2006.nc", new, slice(0, 12))):
        with xr.open_dataset(a) as ds:
            sub = ds.isel(time=sl, level=[1]).isel(prediction_timedelta=[1])
            sub = sub.sel(valid_time=slice(None, sub["time"].values[-1] + np.timedelta64(3, "D")))
            sub.to_netcdf(b)
    model, pp = tmp_path / "m.nc", tmp_path / "pp.zarr"
    assert main(["postprocess", "fit", "--per-gridpoint", "--forecast", str(old), "--out", str(model)]) == 0
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(new), "--out", str(pp),
                 "--members", "10"]) == 0
    raw, emos = _crps_raw_and_pp(new, pp)
    assert emos < raw
    ens = xr.open_zarr(tmp_path / "pp_members.zarr")
    assert ens.sizes["realization"] == 10 and ens.attrs["forecast_kind"] == "ensemble"
