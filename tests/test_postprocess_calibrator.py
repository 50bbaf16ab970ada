"""One calibrator interface (issue #55): ``fit(forecast, truth, options) -> Calibrator``, ``apply`` gives the
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
from smoeweather.data import ensembles
from smoeweather.postprocess.calibrator import DRNCalibrator, EMOSCalibrator, fit, load

QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]


def _ens(path: Path) -> tuple[xr.Dataset, xr.Dataset]:
    fc = ensembles.open_ensemble(path).load()
    return fc, ensembles.truth_at_valid_times(fc, ensembles.open_truth(None, path)).load()


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
    mu, sigma = ensembles.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    name = "2m_temperature"
    np.testing.assert_array_equal(pred.mu[name].transpose(*mu[name].dims).values.astype(np.float32), mu[name].values)
    np.testing.assert_array_equal(pred.sigma[name].transpose(*mu[name].dims).values.astype(np.float32),
                                  sigma[name].values)


def test_fit_refuses_unknown_method_and_options(tmp_path: Path) -> None:
    fc, truth = _ens(gcm_ens_like(tmp_path / "a.nc", 2005, 1, n_init=4))
    with pytest.raises(ValueError, match="method 'bma' is not one of"):
        fit(fc, truth, {"method": "bma"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['window'\]"):
        fit(fc, truth, {"method": "emos", "window": "25D"})
