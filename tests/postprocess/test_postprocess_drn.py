"""The distributional regression network (DRN): the (μ, σ) it writes equal an independent numpy forward pass of
the weights in its model file, the station embedding learns station biases that a pooled EMOS cannot, seeds make
it deterministic, new sites fall back to the mean embedding, rolling windows, the truncated normal, gridded
forecasts through the CLI, and refusals that name the option."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import properscoring
import pytest
import torch
import xarray as xr
from conftest import float_tol
from test_postprocess_cli import gcm_ens_like

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.data.sites import read_site_table
from smoeweather.metrics.probabilistic import crps_gaussian
from smoeweather.postprocess.distributions import crps_torch
from smoeweather.postprocess.drn import DRNSettings, apply_drn, fit_drn
from smoeweather.postprocess.model_file import read_drn_model

MEMBERS = ["A", "B", "C", "D", "E"]
VAR = "2m_temperature"
FAST = ["--drn-epochs", "8", "--drn-seeds", "2", "--drn-hidden", "8", "--drn-batch-size", "64"]


def _table(path: Path, n_sites: int = 12, n_days: int = 50, seed: int = 0) -> None:
    """Stations with their own bias (−3 … +3 K, unknown to the ensemble) and a spread that tells the error."""
    rng = np.random.default_rng(seed)
    bias = np.linspace(-3.0, 3.0, n_sites)
    rows = []
    for s in range(n_sites):
        for d in pd.date_range("2004-01-01", periods=n_days):
            spread = 0.5 + rng.gamma(2.0, 0.4)
            obs = 275.0 + 4.0 * np.sin(d.day_of_year / 6.0 + s) + spread * rng.normal()
            mem = obs - bias[s] + spread * rng.normal(size=len(MEMBERS))
            rows.append([*mem, obs, int(d.strftime("%Y%m%d00")), f"ST{s}", 45.0 + 0.3 * s, -120.0 + 0.2 * s,
                         50.0 * s])
    pd.DataFrame(rows, columns=[*MEMBERS, "observation", "date", "station", "latitude", "longitude",
                                "elevation"]).to_csv(path, index=False)


def _cli(*args: object) -> None:
    assert main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet", "--overwrite"]) == 0


def _numpy_drn(model: xr.Dataset, fc: xr.Dataset, sel: dict) -> tuple[np.ndarray, np.ndarray]:
    """(μ, σ) (T, P) of the model-file weights by a plain numpy forward pass (the documented network)."""
    x = fc[VAR].isel(prediction_timedelta=0).transpose("time", "member", "site").values.astype(np.float64)
    cov = np.stack([fc[c].values for c in ("latitude", "longitude", "altitude")], -1)
    feats = np.concatenate([x.mean(1)[..., None], x.std(1, ddof=1)[..., None],
                            np.broadcast_to(cov, (x.shape[0], *cov.shape))], -1)
    m = {k: model[f"{VAR}_{k}"].isel(prediction_timedelta=0).sel(sel).values.astype(np.float64)
         for k in ("w1", "b1", "w2", "b2", "embedding", "feature_mean", "feature_scale")}
    z = (feats - m["feature_mean"]) / m["feature_scale"]
    mus, sds = [], []
    for s in range(m["w1"].shape[0]):
        inp = np.concatenate([z, np.broadcast_to(m["embedding"][s], (*z.shape[:2], m["embedding"].shape[-1]))], -1)
        out = np.maximum(inp @ m["w1"][s] + m["b1"][s], 0.0) @ m["w2"][s] + m["b2"][s]
        mus.append(z[..., 0] + out[..., 0])
        sds.append(np.logaddexp(0.0, out[..., 1]) + 1e-3)
    sc, mn = m["feature_scale"][0], m["feature_mean"][0]
    return np.mean(mus, 0) * sc + mn, np.mean(sds, 0) * sc


def test_training_loss_is_the_closed_form_crps() -> None:
    rng = np.random.default_rng(0)
    mu, sd, y = rng.normal(size=50), rng.gamma(2.0, 0.5, 50), rng.normal(size=50)
    got = crps_torch("normal", *(torch.from_numpy(a) for a in (mu, sd, y))).numpy()
    np.testing.assert_allclose(got, properscoring.crps_gaussian(y, mu, sd), **float_tol(np.float64, 50))


def test_drn_cli_sites_matches_numpy_and_learns_station_biases(tmp_path: Path) -> None:
    _table(tmp_path / "t.csv")
    _cli("fit", "--method", "drn", "--forecast", tmp_path / "t.csv", "--drn-epochs", "40", "--drn-seeds", "2",
         "--drn-hidden", "8", "--drn-batch-size", "32", "--drn-learning-rate", "0.01", "--train-period",
         "2003-12-30", "2004-01-30", "--out", tmp_path / "drn.nc")
    _cli("fit", "--forecast", tmp_path / "t.csv", "--train-period", "2003-12-30", "2004-01-30",
         "--out", tmp_path / "emos.nc")
    for flag, m in (("--drn", "drn"), ("--emos", "emos")):
        _cli("apply", flag, tmp_path / f"{m}.nc", "--forecast", tmp_path / "t.csv", "--apply-period", "2004-01-31",
             "2004-02-20", "--out", tmp_path / f"{m}.zarr", "--members", "5", "--quantiles", "0.25", "0.75")
    model, attrs = read_drn_model(tmp_path / "drn.nc")
    assert attrs["method"] == "drn" and int(attrs["seeds"]) == 2 and "mean of the trained" in attrs["new_locations"]
    # weights and plain metadata only: a netCDF of float32 arrays and scalar/string attributes (no pickled objects)
    assert (tmp_path / "drn.nc").read_bytes()[:4] in (b"CDF\x01", b"CDF\x02", b"\x89HDF")
    assert all(isinstance(v, str | int | float | np.number) for v in model.attrs.values())
    assert all(model[v].dtype == np.float32 for v in model.data_vars)
    fc, obs = read_site_table(tmp_path / "t.csv")
    fc = fc.sel(time=slice("2004-01-31", "2004-02-20"))
    pp = xr.open_zarr(tmp_path / "drn.zarr").isel(prediction_timedelta=0).load()
    mu, sd = _numpy_drn(model, fc, {})
    np.testing.assert_allclose(pp[VAR].values, mu, **float_tol(np.float32, 200, 300.0))
    np.testing.assert_allclose(pp[f"{VAR}_std"].values, sd, **float_tol(np.float32, 200, 3.0))
    # the quantile store holds μ + σ Φ⁻¹(q) of the same distribution
    q = xr.open_zarr(tmp_path / "drn_quantiles.zarr")[VAR].isel(prediction_timedelta=0).load()
    np.testing.assert_allclose(q.sel(quantile=0.75).values - q.sel(quantile=0.25).values,
                               2 * 0.6744897501960817 * pp[f"{VAR}_std"].values, **float_tol(np.float32, 20, 300.0))
    # the embedding learns each station's bias, which a pooled EMOS cannot: DRN CRPS well below global EMOS
    y = forecast_stores.truth_at_valid_times(fc, obs, gaps="nan")[VAR].isel(prediction_timedelta=0).values
    em = xr.open_zarr(tmp_path / "emos.zarr").isel(prediction_timedelta=0).load()
    c_drn = crps_gaussian(pp[VAR].values, pp[f"{VAR}_std"].values, y)
    c_emos = crps_gaussian(em[VAR].values, em[f"{VAR}_std"].values, y)
    ok = np.isfinite(c_drn) & np.isfinite(c_emos)
    assert c_drn[ok].mean() < 0.8 * c_emos[ok].mean()


def test_deterministic_for_a_seed_and_new_sites_get_the_mean_embedding(tmp_path: Path) -> None:
    _table(tmp_path / "t.csv", n_sites=5, n_days=30)
    fc, obs = read_site_table(tmp_path / "t.csv")
    truth = forecast_stores.truth_at_valid_times(fc, obs, gaps="nan")
    s = DRNSettings(hidden=4, epochs=3, seeds=2, batch_size=32)
    a, b = fit_drn(fc, truth, s), fit_drn(fc, truth, s)
    c = fit_drn(fc, truth, DRNSettings(hidden=4, epochs=3, seeds=2, batch_size=32, seed=1))
    for v in a.data_vars:
        # the same seed through the same code on one machine: a rerun is bit-identical
        np.testing.assert_array_equal(a[v].values, b[v].values)
    assert not np.array_equal(a[f"{VAR}_w1"].values, c[f"{VAR}_w1"].values)
    a.attrs["fields"] = VAR
    known, _ = apply_drn(a, fc, np.arange(5))
    new, _ = apply_drn(a, fc, np.array([0, 1, -1, 3, -1]))  # sites 2 and 4 unknown to the model
    # a row of a batched matmul does not depend on the other rows' values: the known sites' bits are unchanged
    np.testing.assert_array_equal(new[VAR].values[..., [0, 1, 3]], known[VAR].values[..., [0, 1, 3]])
    mean_emb = a.copy()
    e = mean_emb[f"{VAR}_embedding"]
    mean_emb[f"{VAR}_embedding"] = e * 0 + e.mean("site")
    ref, _ = apply_drn(mean_emb, fc, np.arange(5))
    np.testing.assert_allclose(new[VAR].values[..., [2, 4]], ref[VAR].values[..., [2, 4]],
                               **float_tol(np.float32, 50, 300.0))


def test_rolling_drn_one_network_set_per_date_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    _table(tmp_path / "t.csv", n_sites=4, n_days=30)
    _cli("fit", "--method", "drn", "--forecast", tmp_path / "t.csv", *FAST, "--window", "10D", "--lag", "2D",
         "--out", tmp_path / "roll.nc")
    model, attrs = read_drn_model(tmp_path / "roll.nc")
    assert attrs["window"] == "10D" and model[f"{VAR}_w1"].dims[:3] == ("prediction_timedelta", "time", "seed")
    assert str(model["time"].values[0])[:10] == "2004-01-10"
    _cli("fit", "--method", "drn", "--forecast", tmp_path / "t.csv", *FAST, "--window", "10D", "--lag", "2D",
         "--drn-warm-start", "2", "--out", tmp_path / "warm.nc")
    warm, _ = read_drn_model(tmp_path / "warm.nc")
    assert warm.sizes["time"] == model.sizes["time"] and int(warm.attrs["warm_start_epochs"]) == 2

    def refused(pattern: str, *args: object) -> None:
        assert main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert re.search(pattern, err), err

    refused(r"no coefficients for the forecast date\(s\) \['2003-12-30", "apply", "--drn", tmp_path / "roll.nc",
            "--forecast", tmp_path / "t.csv", "--out", tmp_path / "pp.zarr")
    refused(r"--drn-hidden must be >= 1, got 0; set e\.g\. --drn-hidden 32", "fit", "--method", "drn", "--forecast",
            tmp_path / "t.csv", "--drn-hidden", "0", "--out", tmp_path / "x.nc")
    refused(r"--drn-learning-rate must be > 0, got -0\.1", "fit", "--method", "drn", "--forecast",
            tmp_path / "t.csv", "--drn-learning-rate", "-0.1", "--out", tmp_path / "x.nc")
    refused(r"--drn-extra humidity: no such forecast variable", "fit", "--method", "drn", "--forecast",
            tmp_path / "t.csv", "--drn-extra", "humidity", *FAST, "--out", tmp_path / "x.nc")
    _cli("fit", "--forecast", tmp_path / "t.csv", "--out", tmp_path / "emos.nc")
    refused(r"not a DRN model file.*--emos", "apply", "--drn", tmp_path / "emos.nc", "--forecast",
            tmp_path / "t.csv", "--out", tmp_path / "pp.zarr")
    refused(r"--method drn: --predictors members and --per-site", "fit", "--method", "drn", "--per-site",
            "--forecast", tmp_path / "t.csv", "--out", tmp_path / "x.nc")
    assert not (tmp_path / "pp.zarr").exists() and not (tmp_path / "x.nc").exists()


def test_truncated_normal_drn_never_below_zero(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = []
    for s in range(4):
        for d in pd.date_range("2004-01-01", periods=30):
            obs = max(0.0, 1.0 + s * 0.5 + rng.normal(0, 1.5))
            rows.append([*np.maximum(0, obs + rng.normal(0.5, 1.0, 4)), obs, int(d.strftime("%Y%m%d00")), f"W{s}",
                         45.0, -120.0 + s, 10.0])
    pd.DataFrame(rows, columns=["A", "B", "C", "D", "observation", "date", "station", "latitude", "longitude",
                                "elevation"]).to_csv(tmp_path / "w.csv", index=False)
    wind = ["--table-variable", "10m_wind_speed"]  # non-negative values: what the truncated normal is for
    _cli("fit", "--method", "drn", "--distribution", "truncnormal", "--forecast", tmp_path / "w.csv", *FAST, *wind,
         "--out", tmp_path / "tn.nc")
    _cli("apply", "--drn", tmp_path / "tn.nc", "--forecast", tmp_path / "w.csv", *wind, "--out",
         tmp_path / "pp.zarr", "--members", "4", "--quantiles", "0.01", "0.5")
    assert xr.open_zarr(tmp_path / "pp.zarr").attrs["distribution"] == "truncnormal"
    assert float(xr.open_zarr(tmp_path / "pp_quantiles.zarr")["10m_wind_speed"].min()) >= 0
    assert float(xr.open_zarr(tmp_path / "pp_members.zarr")["10m_wind_speed"].min()) >= 0


def test_gridded_drn_through_the_cli(tmp_path: Path) -> None:
    """gcm_ens layout: one network per variable, lead and level with a grid-point embedding and the land-sea mask
    as a covariate; the output has the forecast's grid, the model file the training grid."""
    train = gcm_ens_like(tmp_path / "a.nc", 2005, 0)
    new = gcm_ens_like(tmp_path / "b.nc", 2006, 1)
    _cli("fit", "--method", "drn", "--forecast", train, *FAST, "--variables", "temperature", "--drn-extra",
         "geopotential", "--out", tmp_path / "g.nc")
    model, attrs = read_drn_model(tmp_path / "g.nc")
    assert attrs["fields"] == "temperature"  # the extra predictor is read, not fitted
    assert "land_sea_mask" in list(model["temperature_feature"].values)
    assert "geopotential_mean" in list(model["temperature_feature"].values)
    assert model["temperature_embedding"].dims[-3:] == ("latitude", "longitude", "embedding")
    _cli("apply", "--drn", tmp_path / "g.nc", "--forecast", new, "--out", tmp_path / "g.zarr", "--members", "6")
    pp = xr.open_zarr(tmp_path / "g.zarr")
    raw = forecast_stores.open_ensemble([new])
    assert pp["temperature"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert np.isfinite(pp["temperature"].values).all() and (pp["temperature_std"].values > 0).all()
    np.testing.assert_allclose(pp["latitude"].values, raw["latitude"].values)
    truth = forecast_stores.truth_at_valid_times(raw, forecast_stores.open_truth(None, [new]))
    y = truth["temperature"].transpose(*pp["temperature"].dims).values
    c = crps_gaussian(pp["temperature"].values, pp["temperature_std"].values, y)
    mean = raw["temperature"].mean("member").transpose(*pp["temperature"].dims).values
    assert c.mean() < np.abs(mean - y).mean()  # better than the ensemble mean as a point forecast
