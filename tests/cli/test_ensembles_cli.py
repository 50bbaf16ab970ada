"""Ensemble networks end to end through the CLI a user types: `smoe train` (E³, deep ensemble,
Gaussian head) → `smoe forecast` (a member dim, or μ and σ) → `smoe evaluate` (fair CRPS, spread/skill,
ensemble-mean RMSE, rank histograms, diversity) checked against properscoring / numpy on the written store;
`smoe plot routing --member`; `smoe postprocess fit/apply` on an E³ ensemble store."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import properscoring
import pytest
import xarray as xr

from smoeweather.cli import main

REPO = Path(__file__).resolve().parents[2]
VARIABLES = "[geopotential_500, temperature_850]"
TEST_INIT = ("2000-03-21", "2000-04-01")


def _smoe(*args: str) -> str:
    """``smoe ARGS`` in this process (the CLI's own parser and error handling); returns its stdout."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert code == 0, f"smoe {' '.join(args)}:\n{out.getvalue()[-2000:]}\n{err.getvalue()[-4000:]}"
    return out.getvalue()


def _train(config: str, world_store: str, out: Path, *extra: str) -> Path:
    """`smoe train` of a GCM ensemble config on the tiny world: 2 steps, width 4, one block."""
    _smoe("train", "--config", str(REPO / "configs" / "weatherbench" / f"{config}.yaml"),
          f"output_dir={out}", f"data.store={world_store}", "data.sources=null", "data.store_variables=null",
          "data.statistics_years=null", f"data.variables={VARIABLES}", "data.batch_size=4",
          "data.train_period=[2000-01-01, 2000-02-29T18:00]", "data.valid_period=[2000-03-01, 2000-03-20]",
          "data.test_period=[2000-03-21, 2000-04-09]", "data.lead_choices_h=[24, 48]", "model.width=4",
          "model.blocks=1", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
          "trainer.max_time=null", "trainer.enable_progress_bar=false", *extra)
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def e3(world_store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train("gcm_e3_crps", world_store, tmp_path_factory.mktemp("e3"))


def _forecast(ckpt: Path, world_store: str, out: Path) -> Path:
    _smoe("forecast", str(ckpt), "--data", world_store, "--init", *TEST_INIT, "--lead", "24h", "48h", "--out", str(out),
          "--no-progress")
    return out


def _truth(world_store: str, fc: xr.Dataset, name: str, level: int) -> xr.DataArray:
    truth = xr.open_zarr(world_store)[name].sel(level=level)
    valid = fc["time"] + fc["prediction_timedelta"]
    return truth.sel(time=valid).drop_vars("time").assign_coords(time=fc["time"])


def test_e3_forecast_evaluate_and_routing_per_member(e3: Path, world_store: str, tmp_path: Path) -> None:
    fc_path = _forecast(e3, world_store, tmp_path / "e3.zarr")
    fc = xr.open_zarr(fc_path)
    assert fc.attrs["forecast_kind"] == "ensemble" and fc.sizes["member"] == 4
    assert fc["member"].attrs["standard_name"] == "realization"
    z = fc["geopotential"].sel(level=500).load()
    assert float(z.std("member").mean()) > 0  # the members differ
    out = tmp_path / "scores"
    _smoe("evaluate", str(fc_path), "--truth", world_store, "--out", str(out))
    scores = xr.load_dataset(out / "scores.nc")
    method = fc.attrs["method"]
    # fair CRPS against properscoring's ECDF CRPS corrected to the fair estimator, latitude-weighted
    truth = _truth(world_store, fc, "geopotential", 500)
    x = z.transpose("time", "prediction_timedelta", "latitude", "longitude", "member").values.astype(np.float64)
    y = truth.transpose("time", "prediction_timedelta", "latitude", "longitude").values.astype(np.float64)
    m = x.shape[-1]
    spread = np.abs(x[..., :, None] - x[..., None, :]).sum(axis=(-1, -2))
    fair = properscoring.crps_ensemble(y, x) + spread / (2 * m * m) - spread / (2 * m * (m - 1))
    w = np.cos(np.deg2rad(fc["latitude"].values))
    w = w / w.mean()
    expected = (fair * w[None, None, :, None]).mean(axis=(0, 2, 3))
    ours = scores["crps"].sel({"method": method, "field": "geopotential_500", "region": "global"}).values
    np.testing.assert_allclose(ours, expected, rtol=1e-9)
    # spread/skill with √((M+1)/M) and the rank histogram (sums to 1 over M + 1 ranks) are in the scores
    assert np.all(np.isfinite(scores["spread_skill"].sel({"method": method}).values))
    rh = scores["rank_histogram"].sel({"method": method, "field": "geopotential_500"})
    assert rh.sizes["rank"] == m + 1
    np.testing.assert_allclose(rh.sum("rank").values, 1.0, rtol=1e-12)
    assert (out / "rank_histograms.png").is_file()
    assert np.all(scores["diversity_ratio"].sel({"method": method}).values > 0)
    # routing maps of one member: only its own gate (M1_…), routing within its group of experts
    r = _smoe("plot", "routing", str(e3), "--out", str(tmp_path / "routing"), "--member", "1")
    gates = json.loads(r[: r.rindex("}") + 1])
    assert list(gates) == ["M1_E8_H32_W64"] and gates["M1_E8_H32_W64"]["num_experts"] == 8


def test_deep_ensemble_gaussian_mc_dropout_and_dense_are_scored(world_store: str, tmp_path: Path) -> None:
    de = _train("gcm_deep_ensemble", world_store, tmp_path / "de", "model.members=2")
    gauss = _train("gcm_gaussian", world_store, tmp_path / "g")
    dense = _train("gcm_dense", world_store, tmp_path / "d")
    mc = _train("gcm_mc_dropout", world_store, tmp_path / "mc", "model.members=3")
    paths = [_forecast(c, world_store, tmp_path / f"{n}.zarr") for n, c in (("de", de), ("g", gauss), ("d", dense),
                                                                      ("mc", mc))]
    assert xr.open_zarr(paths[3]).sizes["member"] == 3
    g = xr.open_zarr(paths[1])
    assert g.attrs["forecast_kind"] == "gaussian" and "geopotential_std" in g
    assert float(g["geopotential_std"].sel(level=500).min()) > 0
    assert xr.open_zarr(paths[0]).sizes["member"] == 2
    out = tmp_path / "scores"
    _smoe("evaluate", *map(str, paths), "--truth", world_store, "--out", str(out))
    scores = xr.load_dataset(out / "scores.nc")
    methods = [str(m) for m in scores["method"].values]
    for p in paths:
        name = xr.open_zarr(p).attrs["method"]
        assert name in methods and np.all(np.isfinite(scores["crps"].sel({"method": name}).values))
    # a deterministic network is a one-member ensemble: its CRPS is its MAE
    d = xr.open_zarr(paths[2])
    z = d["geopotential"].sel(level=500).load()
    truth = _truth(world_store, d, "geopotential", 500)
    w = np.cos(np.deg2rad(d["latitude"].values))
    mae = (abs(z - truth) * xr.DataArray(w / w.mean(), dims="latitude")).mean(["time", "latitude", "longitude"])
    np.testing.assert_allclose(scores["crps"].sel({"method": d.attrs["method"], "field": "geopotential_500",
                                                   "region": "global"}).values,
                               mae.transpose("prediction_timedelta").values, rtol=1e-9)


def test_postprocess_fit_apply_accepts_the_e3_store(e3: Path, world_store: str, tmp_path: Path) -> None:
    """EMOS fitted on E³ forecasts of the first inits and applied to the later ones: Gaussian store plus
    ECC-Q members from the E³ members."""
    fc = _forecast(e3, world_store, tmp_path / "e3.zarr")
    model = tmp_path / "emos.nc"
    _smoe("postprocess", "fit", "--forecast", str(fc), "--truth", world_store, "--train-period", "2000-03-21",
          "2000-03-26T12:00", "--out", str(model))
    out = tmp_path / "pp.zarr"
    _smoe("postprocess", "apply", "--emos", str(model), "--forecast", str(fc), "--apply-period", "2000-03-27",
          "2000-04-01", "--out", str(out), "--members", "4")
    pp = xr.open_zarr(out)
    assert pp.attrs["forecast_kind"] == "gaussian" and "geopotential_std" in pp
    assert pp["time"].values.min() >= np.datetime64("2000-03-27")
    members = xr.open_zarr(tmp_path / "pp_members.zarr")
    assert members.attrs["forecast_kind"] == "ensemble" and members.sizes["realization"] == 4
    z = members["geopotential"].sel(level=500).values
    axis = members["geopotential"].dims.index("realization")  # IMPROVER's name of the member dim
    assert np.all(np.isfinite(z)) and float(np.std(z, axis=axis).mean()) > 0
