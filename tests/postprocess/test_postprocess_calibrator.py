"""One calibrator interface: ``fit(forecast, truth, options) -> Calibrator``, ``apply`` gives the
predictive distribution, ``save``/``load`` round-trip the data-only model files; the interface computes the
same numbers as the ``smoe postprocess`` file drivers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import stats
from test_postprocess_cli import gcm_ens_like
from test_postprocess_drn import _table

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.postprocess.calibrator import DRNCalibrator, EMOSCalibrator, fit, load

QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]


def _ens(path: Path) -> tuple[xr.Dataset, xr.Dataset]:
    fc = forecast_stores.open_ensemble(path).load()
    return fc, forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, path)).load()


def test_emos_fit_save_load_apply_and_forms(tmp_path: Path) -> None:
    fc, truth = _ens(gcm_ens_like(tmp_path / "a.nc", 2005, 1, n_init=12))
    new, _ = _ens(gcm_ens_like(tmp_path / "b.nc", 2006, 2, n_init=4))
    cal = fit(fc, truth, {"method": "emos", "per_gridpoint": True})
    assert isinstance(cal, EMOSCalibrator)
    pred = cal.apply(new)
    cal.save(tmp_path / "m.nc")
    again = load(tmp_path / "m.nc")
    assert isinstance(again, EMOSCalibrator)
    back = again.apply(new)
    xr.testing.assert_equal(pred.mu, back.mu)  # float64 coefficients in the file: exact round trip
    xr.testing.assert_equal(pred.sigma, back.sigma)
    p = pred.probabilities({"temperature": [270.0]})["temperature"]["temperature"].sel(threshold=270.0)
    mu, sd = pred.mu["temperature"], pred.sigma["temperature"].transpose(*pred.mu["temperature"].dims)
    np.testing.assert_allclose(p.transpose(*mu.dims).values, stats.norm.sf(270.0, mu.values, sd.values),
                               rtol=0, atol=8 * np.finfo(np.float64).eps)
    d = pred.distribution("temperature")
    np.testing.assert_allclose(d.ppf(0.5), mu.values, rtol=8 * np.finfo(np.float64).eps)


def test_drn_loaded_calibrator_equals_the_file_driver(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    _table(table, n_sites=4, n_days=30)
    assert main(["postprocess", "fit", "--method", "drn", "--forecast", str(table), "--drn-epochs", "2",
                 "--drn-seeds", "1", "--drn-hidden", "4", "--out", str(tmp_path / "drn.nc"), *QUIET]) == 0
    assert main(["postprocess", "apply", "--drn", str(tmp_path / "drn.nc"), "--forecast", str(table),
                 "--out", str(tmp_path / "pp.zarr"), *QUIET]) == 0
    cal = load(tmp_path / "drn.nc")
    assert isinstance(cal, DRNCalibrator)
    from smoeweather.data.sites import open_sites

    fc, _ = open_sites(table)
    pred = cal.apply(fc)
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    name = "2m_temperature"
    # the CLI runs the same Calibrator.apply and stores its float32: the same bits on one machine
    np.testing.assert_array_equal(pred.mu[name].transpose(*mu[name].dims).values.astype(np.float32), mu[name].values)
    np.testing.assert_array_equal(pred.sigma[name].transpose(*mu[name].dims).values.astype(np.float32),
                                  sigma[name].values)


def test_fit_refuses_unknown_method_and_options(tmp_path: Path) -> None:
    fc, truth = _ens(gcm_ens_like(tmp_path / "a.nc", 2005, 1, n_init=4))
    with pytest.raises(ValueError, match="method 'bma' is not one of"):
        fit(fc, truth, {"method": "bma"})
    with pytest.raises(ValueError, match=r"unknown config key 'emos\.window'"):
        fit(fc, truth, {"method": "emos", "window": "25D"})
    with pytest.raises(ValueError, match=r"unknown config key 'drn\.epoch' \(did you mean 'epochs'\?\)"):
        fit(fc, truth, {"method": "drn", "epoch": 2})
    with pytest.raises(ValueError, match=r"'drn\.hidden' must be >= 1, got 0"):
        fit(fc, truth, {"method": "drn", "hidden": 0})


def test_network_calibrator_equals_the_cli_with_probabilities(tmp_path: Path) -> None:
    """A tiny U-Net checkpoint: load(CKPT).apply equals `apply --network`, whose probabilities are its CDF."""
    from test_postprocess import _ens10_store, _world

    from smoeweather.config import read_config
    from smoeweather.postprocess.calibrator import NetworkCalibrator
    from smoeweather.postprocess.synthetic import synthetic_ensemble
    from smoeweather.training.run import train

    truth = xr.open_zarr(_world(tmp_path / "w.zarr"))
    ens = synthetic_ensemble(truth, members=5, leads=("48h",), every="96h", seed=0,
                             variables=["geopotential_500", "temperature_850"])
    store = _ens10_store(ens, truth, tmp_path / "ens10.zarr")
    ens.to_zarr(tmp_path / "ens.zarr", mode="w", zarr_format=2)  # the project's format (v3 warns on consolidation)
    overrides = [f"data.store={store}", "data.variables=[geopotential_500, temperature_850]",
                 "data.target_variables=[geopotential_500]", "data.train_years=[2001, 2001]",
                 "data.valid_years=[2002, 2002]", "data.test_years=[2002, 2002]", "data.batch_size=8",
                 "data.num_workers=0", "model.levels=2", "model.widths=[4, 8]", "trainer.max_epochs=1",
                 "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", f"output_dir={tmp_path / 'run'}"]
    ckpt = train(read_config(Path(__file__).resolve().parents[2] / "configs" / "ens10" / "unet_z500.yaml",
                             overrides)).last_checkpoint
    assert main(["postprocess", "apply", "--network", str(ckpt), "--forecast", str(tmp_path / "ens.zarr"),
                 "--out", str(tmp_path / "pp.zarr"), "--thresholds", "54000", "--overwrite"]) == 0
    cal = load(ckpt)
    assert isinstance(cal, NetworkCalibrator)
    pred = cal.apply(forecast_stores.open_forecast(tmp_path / "ens.zarr"))
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    m = mu["geopotential"].sel(level=500)
    # the CLI runs the same NetworkCalibrator.apply and stores its float32: the same bits on one machine
    np.testing.assert_array_equal(pred.mu["geopotential"].sel(level=500).values.astype(np.float32), m.values)
    # IMPROVER's name
    prob = forecast_stores.store_names(xr.open_zarr(tmp_path / "pp_probabilities.zarr"))["geopotential"]
    prob = prob.sel(threshold=54000.0, level=500)
    s = sigma["geopotential"].sel(level=500).values.astype(np.float64)
    expect = stats.norm.sf(54000.0, m.values.astype(np.float64), s)
    tol = float(np.max((np.abs(m.values) + 54000.0) * 4 * 2.0**-23 / s)) + 4 * 2.0**-23
    np.testing.assert_allclose(prob.transpose(*m.dims).values, expect, rtol=0, atol=tol)
    with pytest.raises(ValueError, match="smoe train"):
        fit(xr.Dataset(), xr.Dataset(), {"method": "network"})


def test_emos_in_memory_is_the_file_driver_and_a_loaded_model_saves_itself(tmp_path: Path) -> None:
    """One EMOS implementation: a per-site rolling fit in memory (``Training.of``) gives the coefficients of the
    model file `smoe postprocess fit` writes, bit for bit; the saved and the loaded model apply alike."""
    from smoeweather.data.sites import open_sites
    from smoeweather.postprocess.calibrator import Training, calibrator
    from smoeweather.postprocess.options import EMOSSettings

    table = tmp_path / "t.csv"
    _table(table, n_sites=4, n_days=30)
    roll = ["--window", "10D", "--lag", "2D"]
    assert main(["postprocess", "fit", "--per-site", *roll, "--forecast", str(table), "--out", str(tmp_path / "m.nc"),
                 *QUIET]) == 0
    fc, obs = open_sites(table)
    truth = forecast_stores.truth_at_valid_times(fc, obs, gaps="nan")
    cal = calibrator("emos", EMOSSettings(per_gridpoint=True)).fit(Training.of(fc, truth, window="10D", lag="2D"))
    assert isinstance(cal, EMOSCalibrator) and "(per site, mean, 21 forecast dates)" in cal.description
    loaded = load(tmp_path / "m.nc")
    assert isinstance(loaded, EMOSCalibrator) and loaded.settings == EMOSSettings(per_gridpoint=True)
    for n in cal.params.data_vars:
        np.testing.assert_array_equal(cal.params[n].values, loaded.params[n].transpose(*cal.params[n].dims).values)
    new = fc.isel(time=np.isin(fc["time"].values, cal.params["time"].values))  # the inits with coefficients
    xr.testing.assert_equal(cal.apply(new).mu, loaded.apply(new).mu)
    loaded.save(tmp_path / "copy.nc")  # a loaded model is its file
    assert (tmp_path / "copy.nc").read_bytes() == (tmp_path / "m.nc").read_bytes()
    pred = loaded.apply(new)
    assert pred.members(new).sizes["member"] == new.sizes["member"]
    assert list(pred.quantiles([0.25, 0.75])["quantile"].values) == [0.25, 0.75]
    with pytest.raises(ValueError, match=r"method 'bma' is not one of \['emos', 'drn'\]"):
        calibrator("bma")
