"""Post-processing: EMOS recovers known coefficients, forecast-file reader, synthetic ensemble, CLI end to end,
and leave-one-year-out EMOS on real SEAS5 hindcasts (skipped without ../shared/data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from pipelines.readers.forecast_nc import open_forecast_nc, open_forecast_truth
from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.metrics.probabilistic import crps_ensemble, crps_gaussian
from smoeweather.postprocess.emos import apply_emos, fit_emos
from smoeweather.postprocess.synthetic import synthetic_ensemble

LAT = np.linspace(-80.0, 80.0, 6)
LON = np.arange(8) * 45.0


def _gaussian_world(n: int, coef: tuple[float, float, float, float], m: int = 8, seed: int = 0):
    """Ensemble and truth where y ~ N(a + b·mean, c + d·var) exactly, on (time, latitude, longitude)."""
    rng = np.random.default_rng(seed)
    a, b, c, d = coef
    centre = rng.normal(280.0, 5.0, size=(n, len(LAT), len(LON)))
    spread = rng.uniform(0.5, 3.0, size=centre.shape)
    members = centre[..., None] + spread[..., None] * rng.standard_normal((*centre.shape, m))
    mean, var = members.mean(-1), members.var(-1, ddof=1)
    truth = a + b * mean + np.sqrt(c + d * var) * rng.standard_normal(centre.shape)
    time = pd.date_range("2001-01-01", periods=n, freq="D")
    coords = {"time": time, "latitude": LAT, "longitude": LON}
    fc = xr.Dataset({"t": (("time", "latitude", "longitude", "member"), members)}, coords=coords)
    fc = fc.transpose("time", "member", "latitude", "longitude")
    return fc, xr.Dataset({"t": (("time", "latitude", "longitude"), truth)}, coords=coords)


def test_emos_recovers_known_coefficients() -> None:
    coef = (-20.0, 1.07, 0.5, 1.8)
    fc, truth = _gaussian_world(400, coef)  # 400·48 = 19,200 samples
    p = fit_emos(fc, truth, per_gridpoint=False)["t"].values
    n = 400 * len(LAT) * len(LON)
    # minimum-CRPS estimates are √n-consistent; the truth noise (σ ≈ 2) over a mean spread of ≈ 5 K sets the
    # scale: 6 standard errors of each coefficient (a through b: the intercept trades off with b·mean ≈ 280 b)
    se_b = 2.0 / (5.0 * np.sqrt(n))
    assert abs(p[1] - coef[1]) < 6 * se_b
    assert abs((p[0] + p[1] * 280.0) - (coef[0] + coef[1] * 280.0)) < 6 * 2.0 / np.sqrt(n) + 280.0 * 6 * se_b
    assert p[2] >= 0 and p[3] >= 0
    # variance coefficients: relative error of a variance estimate ≈ √(2/n), times the c–d trade-off (≈ 5)
    assert abs(p[3] - coef[3]) < 5 * 6 * np.sqrt(2 / n) * coef[3]
    mu, sigma = apply_emos(fit_emos(fc, truth), fc)
    assert mu["t"].dims == ("time", "latitude", "longitude") and float(sigma["t"].min()) > 0


def test_emos_positivity_when_spread_is_uninformative() -> None:
    """Truth noise independent of the ensemble spread: d → 0 (never negative), c carries the variance."""
    fc, _ = _gaussian_world(200, (0.0, 1.0, 4.0, 0.0), seed=1)
    rng = np.random.default_rng(2)
    truth = fc.mean("member") + 2.0 * rng.standard_normal(fc.mean("member")["t"].shape)
    p = fit_emos(fc, truth)["t"].values
    assert p[3] >= 0.0 and p[3] < 0.1 and p[2] == pytest.approx(4.0, rel=0.15)


def test_emos_per_gridpoint_learns_location_bias_and_beats_global() -> None:
    fc, truth = _gaussian_world(120, (0.0, 1.0, 0.2, 1.0), seed=3)
    bias = xr.DataArray(np.linspace(-3, 3, len(LON)), dims="longitude", coords={"longitude": LON})
    truth = truth + bias
    train, test = slice(0, 80), slice(80, None)
    crps = {}
    for per_gridpoint in (False, True):
        p = fit_emos(fc.isel(time=train), truth.isel(time=train), per_gridpoint=per_gridpoint)
        mu, sigma = apply_emos(p, fc.isel(time=test))
        crps[per_gridpoint] = float(crps_gaussian(mu, sigma, truth.isel(time=test))["t"].mean())
        if per_gridpoint:
            assert p["t"].dims == ("latitude", "longitude", "coefficient")
            fitted = p["t"].sel(coefficient="a") + (p["t"].sel(coefficient="b") - 1.0) * 280.0
            np.testing.assert_allclose(fitted.mean("latitude"), bias, atol=0.6)
    raw = float(crps_ensemble(fc.isel(time=test), truth.isel(time=test))["t"].mean())
    assert crps[True] < crps[False] < raw


def _seas5_like(path: Path) -> xr.Dataset:
    """A SEAS5/CSTools-like file: member, sdate, ftime (1..3), lat descending, lon crossing Greenwich."""
    rng = np.random.default_rng(0)
    sdate = pd.DatetimeIndex([f"{y}-11-01" for y in range(2000, 2004)])
    valid = np.array([[s, s + pd.DateOffset(months=1), s + pd.DateOffset(months=2)] for s in sdate],
                     dtype="datetime64[ns]")
    lat, lon = np.array([45.0, 40.0, 35.0]), np.array([0.0, 10.0, 350.0])
    era5 = 280.0 + rng.normal(size=(4, 3, 3, 3))
    seas5 = era5[None] + 1.0 + rng.normal(size=(5, 4, 3, 3, 3))
    ds = xr.Dataset(
        {"tas_seas5": (("member", "sdate", "ftime", "lat", "lon"), seas5.astype(np.float32)),
         "tas_era5": (("sdate", "ftime", "lat", "lon"), era5.astype(np.float32)),
         "valid_time": (("sdate", "ftime"), valid)},
        coords={"member": np.arange(1, 6), "sdate": sdate, "ftime": [1, 2, 3], "lat": lat, "lon": lon})
    ds.to_netcdf(path)
    return ds


def test_forecast_nc_reader_seas5_layout(tmp_path: Path) -> None:
    raw = _seas5_like(tmp_path / "seas5.nc")
    fc = open_forecast_nc(tmp_path / "seas5.nc")
    da = fc["2m_temperature"]
    assert da.dims == ("time", "prediction_timedelta", "member", "latitude", "longitude")
    assert fc.attrs["forecast_kind"] == "ensemble" and da.attrs["units"] == "K"
    assert list(fc["latitude"].values) == [35.0, 40.0, 45.0] and list(fc["longitude"].values) == [0.0, 10.0, 350.0]
    assert list(pd.to_timedelta(fc["prediction_timedelta"].values).days) == [0, 30, 61]  # Nov 1 → Dec 1, Jan 1
    np.testing.assert_array_equal(
        da.isel(time=1, prediction_timedelta=2, member=3).sel(latitude=35.0, longitude=350.0).values,
        raw["tas_seas5"].isel(member=3, sdate=1, ftime=2).sel(lat=35.0, lon=350.0).values)  # copied
    truth = forecast_stores.truth_at_valid_times(fc, open_forecast_truth(tmp_path / "seas5.nc"))
    np.testing.assert_array_equal(truth["2m_temperature"].transpose("time", "prediction_timedelta", ...).values,
                                  raw["tas_era5"].sortby("lat").values)
    raw.rename(sdate="start").to_netcdf(tmp_path / "bad.nc")
    with pytest.raises(ValueError, match="initialisation time"):
        open_forecast_nc(tmp_path / "bad.nc")


def _world(path: Path) -> Path:
    """A tiny canonical store (time = valid time, 6-hourly) with a land-sea mask."""
    rng = np.random.default_rng(5)
    time = pd.date_range("2001-01-01", "2002-12-31T18", freq="6h")
    n = len(time)
    wave = np.sin(np.arange(n)[:, None, None] * 2 * np.pi / 20 + np.deg2rad(LON)[None, None, :])
    z = 54000 + 800 * wave * np.cos(np.deg2rad(LAT))[None, :, None] + 100 * rng.standard_normal((n, 6, 8))
    t = 275 + 5 * wave + rng.standard_normal((n, 6, 8))
    ds = xr.Dataset(
        {"geopotential": (("time", "level", "latitude", "longitude"), np.stack([z, z - 40000], 1).astype(np.float32)),
         "temperature": (("time", "level", "latitude", "longitude"), np.stack([t - 20, t], 1).astype(np.float32)),
         "land_sea_mask": (("latitude", "longitude"), (rng.uniform(size=(6, 8)) > 0.6).astype(np.float32))},
        coords={"time": time, "level": [500, 850], "latitude": LAT, "longitude": LON})
    ds["geopotential"].attrs["units"] = "m**2 s**-2"
    ds["temperature"].attrs["units"] = "K"
    ds.to_zarr(path, mode="w", zarr_format=2)  # the project's store format (v3 warns on consolidation)
    return path


def test_synthetic_ensemble_is_seeded_biased_and_underdispersive(tmp_path: Path) -> None:
    truth = xr.open_zarr(_world(tmp_path / "w.zarr"))
    a = synthetic_ensemble(truth, members=6, init=("2001-01-01", "2001-06-30"), seed=1)
    b = synthetic_ensemble(truth, members=6, init=("2001-01-01", "2001-06-30"), seed=1)
    xr.testing.assert_identical(a, b)  # the same seed through the same code: a rerun is bit-identical
    assert a["geopotential"].dims == ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
    assert list(a["level"].values) == [500, 850] and not bool(a["temperature"].isnull().any())
    obs = forecast_stores.truth_at_valid_times(a, truth)
    err = (a.mean("member") - obs)["temperature"].mean(("time", "prediction_timedelta", "level"))
    land = truth["land_sea_mask"] > 0.5
    assert float(err.where(land).mean()) > 0 > float(err.where(~land).mean())  # warm over land, cold over sea
    from smoeweather.metrics.probabilistic import spread_skill_ratio

    assert float(spread_skill_ratio(a, obs)["temperature"].max()) < 0.9


def test_cli_synthetic_emos_crossval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = _world(tmp_path / "w.zarr")
    ens, pp = tmp_path / "ens.zarr", tmp_path / "pp.zarr"
    assert main(["postprocess", "synthetic", str(world), "--out", str(ens), "--members", "5",
                 "--every", "96h", "--seed", "0"]) == 0
    model = tmp_path / "emos.nc"
    assert main(["postprocess", "fit", "--method", "emos", "--per-gridpoint", "--forecast", str(ens), "--truth",
                 str(world), "--train-period", "2001", "2001", "--out", str(model)]) == 0
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(ens), "--apply-period", "2002", "2002",
                 "--out", str(pp)]) == 0
    out = xr.open_zarr(pp)
    assert out.attrs["forecast_kind"] == "gaussian" and {"geopotential_std", "temperature_std"} <= set(out.data_vars)
    assert pd.DatetimeIndex(out["time"].values).year.min() == 2002  # applied outside the training period
    assert out["temperature_std"].attrs["units"] == "K" and float(out["temperature_std"].min()) > 0
    fc = forecast_stores.open_ensemble(ens).sel(time=out["time"])
    truth = forecast_stores.truth_at_valid_times(fc, xr.open_zarr(world))
    mu, sigma = forecast_stores.split_gaussian(out)
    assert float(crps_gaussian(mu, sigma, truth)["temperature"].mean()) < float(
        crps_ensemble(fc, truth)["temperature"].mean())
    assert main(["postprocess", "crossval", "--forecast", str(ens), "--truth", str(world),
                 "--out", str(tmp_path / "cv")]) == 0
    result = json.loads((tmp_path / "cv" / "crossval.json").read_text())
    assert result["folds"] == [2001, 2002]
    for field in ("geopotential_500", "temperature_850"):
        for row in result["scores"][field].values():
            assert min(row["emos_global"], row["emos_gridpoint"]) < row["raw_fair"]
    assert "| temperature_850 (K) | 24h |" in (tmp_path / "cv" / "crossval.md").read_text()
    # user errors: one clear line, exit 2
    assert main(["postprocess", "fit", "--forecast", str(ens), "--out", str(model)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["postprocess", "fit", "--forecast", str(tmp_path / "nope.zarr"), "--out",
                 str(tmp_path / "m2.nc"), "--train-period", "2001", "2001"]) == 2
    assert "nope.zarr" in capsys.readouterr().err


def test_seas5_leave_one_year_out_emos_beats_raw(shared_data: Path) -> None:
    from smoeweather.postprocess.crossval import crossvalidate

    path = shared_data / "cstools_seas5_era5_tas_med.nc"
    fc = forecast_stores.open_ensemble(path)
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, path))
    result = crossvalidate(fc, truth, fold="year", iterations=100, source=str(path))
    assert len(result["folds"]) == 6 and result["members"] == 15
    for row in result["scores"]["2m_temperature"].values():
        assert row["emos_global"] < row["raw_fair"] and row["emos_global"] < row["raw_standard"]


def _ens10_store(ens: xr.Dataset, truth: xr.Dataset, path: Path) -> Path:
    """An ENS-10-like prepared store (one lead, ``<name>_truth`` at the valid time, statistics group)."""
    from pipelines.statistics import compute_statistics

    obs = forecast_stores.truth_at_valid_times(ens, truth).isel(prediction_timedelta=0, drop=True)
    # the one lead stays a scalar coordinate, as `smoe data prepare ens10` writes it
    ds = ens.isel(prediction_timedelta=0).transpose("time", "member", "level", "latitude", "longitude")
    for n in list(ds.data_vars):
        ds[n + "_truth"] = obs[n].transpose("time", "level", "latitude", "longitude")
    for v in ds.variables.values():
        v.encoding = {}
    ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True)
    compute_statistics(ds).compute().to_zarr(path, group="statistics", mode="w", zarr_format=2)
    return path


@pytest.mark.parametrize("config", ["unet_z500.yaml", "smoe_unet_z500.yaml"])
def test_ens10_checkpoint_applied_to_ensemble_store(tmp_path: Path, config: str) -> None:
    """Train a tiny U-Net / SMoE-U-Net on an ENS-10 store (one lead, ``<name>_truth``) for a few steps, apply it
    with ``smoe postprocess apply --network CKPT`` to the same forecasts as a WeatherBench-2 ensemble zarr and
    check μ, σ against the network run on the training store's own samples (one ensemble convention for both
    layouts)."""
    import torch

    from smoeweather.config import read_config
    from smoeweather.data.ensemble_dataset import open_ensemble_dataset
    from smoeweather.training.checkpoint import load_trained
    from smoeweather.training.run import train

    repo = Path(__file__).resolve().parents[2]
    truth = xr.open_zarr(_world(tmp_path / "w.zarr"))
    ens = synthetic_ensemble(truth, members=5, leads=("48h",), every="96h", seed=0,
                             variables=["geopotential_500", "temperature_850"])
    store = _ens10_store(ens, truth, tmp_path / "ens10.zarr")
    ens_path = tmp_path / "ens.zarr"
    ens.to_zarr(ens_path, mode="w", zarr_format=2)
    overrides = [f"data.store={store}", "data.variables=[geopotential_500, temperature_850]",
                 "data.target_variables=[geopotential_500]", "data.train_years=[2001, 2001]",
                 "data.valid_years=[2002, 2002]", "data.test_years=[2002, 2002]", "data.batch_size=8",
                 "data.num_workers=0", "model.levels=2", "model.widths=[4, 8]", "trainer.max_epochs=1",
                 "trainer.accelerator=cpu", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
                 f"output_dir={tmp_path / 'run'}"]
    result = train(read_config(repo / "configs" / "ens10" / config, overrides))
    ckpt = result.last_checkpoint
    out = tmp_path / "pp.zarr"
    assert main(["postprocess", "apply", "--network", str(ckpt), "--forecast", str(ens_path), "--out", str(out)]) == 0
    pp = xr.open_zarr(out)
    assert pp.attrs["forecast_kind"] == "gaussian" and pp.attrs["members"] == 5
    assert pp["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert float(pp["geopotential_std"].min()) > 0
    trained = load_trained(ckpt)
    stats = {k: tuple(v) for k, v in trained.metadata["stats"].items()}
    data = open_ensemble_dataset(store, trained.metadata["spec"], stats=stats)
    mean, std = stats["geopotential_500"]
    for i in (0, len(data) - 1):
        x, _, m, s = data[i]
        with torch.no_grad():
            mu, sigma = trained.model(x[None], m[None], s[None])
        mu = mu[0, 0].numpy().astype(np.float64) * std + mean
        sigma = sigma[0, 0].numpy().astype(np.float64) * std
        got = pp.sel(time=data.init_time(i), level=500).isel(prediction_timedelta=0)
        # the same float32 network on features read from two layouts of the same (float32) values: the
        # outputs agree to a few float32 ulps of the field's magnitude (Z ≈ 5e4 m² s⁻²)
        tol = 64 * np.finfo(np.float32).eps * float(abs(got["geopotential"]).max())
        np.testing.assert_allclose(got["geopotential"].values, mu, rtol=0, atol=tol)
        np.testing.assert_allclose(got["geopotential_std"].values, sigma, rtol=0, atol=tol)
    # a non-ens10 checkpoint / a missing field are clear errors
    assert main(["postprocess", "apply", "--network", str(tmp_path / "none.ckpt"), "--forecast", str(ens_path),
                 "--out", str(tmp_path / "x.zarr")]) == 2
