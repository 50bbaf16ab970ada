"""Operational output forms of ``smoe postprocess apply``: probabilities of (non-)exceedance equal the
predictive distribution's CDF (scipy.stats.norm / truncnorm) at the thresholds, percentiles its ppf, ECC
realizations carry a ``realization`` coordinate; every store has its validity time, units and standard names,
sites keep their station ids and coordinates, and the CF netCDF twins pass compliance-checker's CF test with no
high-priority failure."""

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
from smoeweather.postprocess.distributions import Normal, TruncatedNormal, family
from smoeweather.postprocess.forms import parse_thresholds, thresholds_for

QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]
EPS32 = float(np.finfo(np.float32).eps)


def _pp(*args: object) -> None:
    assert main(["postprocess", *map(str, args), *QUIET]) == 0


def _prob_tol(mu: np.ndarray, sigma: np.ndarray, t: float) -> float:
    """Float32 storage of μ, σ and of the probability: dP ≤ φ_max (|μ| + |t|) ε₃₂ / σ + ε₃₂ (μ, σ rounded)."""
    return float(np.max((np.abs(mu) + abs(t)) * 4 * EPS32 / sigma / np.sqrt(2 * np.pi)) + 4 * EPS32)


def _check_time_coords(ds: xr.Dataset) -> None:
    assert ds["time"].attrs["standard_name"] == "forecast_reference_time"
    assert ds["prediction_timedelta"].attrs["standard_name"] == "forecast_period"
    assert ds["valid_time"].attrs["standard_name"] == "time"
    np.testing.assert_array_equal(ds["valid_time"].values,
                                  ds["time"].values[:, None] + ds["prediction_timedelta"].values[None, :])


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-grid-point EMOS applied with every form and the CF netCDF twins."""
    root = tmp_path_factory.mktemp("forms")
    old = gcm_ens_like(root / "a.nc", 2005, 1, n_init=12)
    new = gcm_ens_like(root / "b.nc", 2006, 2, n_init=6)
    _pp("fit", "--per-gridpoint", "--forecast", old, "--out", root / "m.nc")
    _pp("apply", "--emos", root / "m.nc", "--forecast", new, "--out", root / "pp.zarr", "--members", "6",
        "--thresholds", "temperature=265,275", "geopotential=54000", "--percentiles", "10", "50", "90", "--netcdf")
    return root


def test_grid_probabilities_are_the_normal_cdf(grid: Path) -> None:
    mu, sigma = ensembles.split_gaussian(xr.open_zarr(grid / "pp.zarr").load())
    for name, thresholds in (("temperature", [265.0, 275.0]), ("geopotential", [54000.0])):
        p = xr.open_zarr(grid / f"pp_probabilities_{name}.zarr")
        assert p.attrs["forecast_kind"] == "probability"
        da = p[name]
        assert da.dims[:3] == ("time", "prediction_timedelta", "threshold")
        assert da.attrs["spp__relative_to_threshold"] == "greater_than" and da.attrs["units"] == "1"
        assert "standard_name" not in da.attrs
        assert p["threshold"].attrs["units"] == mu[name].attrs["units"]
        assert list(p["threshold"].values) == thresholds
        _check_time_coords(p)
        m, s = mu[name].values.astype(np.float64), sigma[name].values.astype(np.float64)
        for t in thresholds:
            expect = stats.norm.sf(t, loc=m, scale=s)
            got = da.sel(threshold=t).transpose(*mu[name].dims).values
            np.testing.assert_allclose(got, expect, rtol=0, atol=_prob_tol(m, s, t))


def test_grid_percentiles_ppf_members_and_std_names(grid: Path) -> None:
    gauss = xr.open_zarr(grid / "pp.zarr").load()
    mu, sigma = ensembles.split_gaussian(gauss)
    pct = xr.open_zarr(grid / "pp_percentiles.zarr")
    assert list(pct["percentile"].values) == [10.0, 50.0, 90.0] and pct["percentile"].attrs["units"] == "%"
    for p in (10.0, 50.0, 90.0):
        expect = stats.norm.ppf(p / 100, loc=mu["temperature"].values.astype(np.float64),
                                scale=sigma["temperature"].values.astype(np.float64))
        got = pct["temperature"].sel(percentile=p).transpose(*mu["temperature"].dims).values
        np.testing.assert_allclose(got, expect, rtol=4 * EPS32)
    # read back by smoe's own reader as quantiles on 0-1
    q = ensembles.open_forecast(grid / "pp_percentiles.zarr")
    assert ensembles.forecast_kind(q) == "quantiles" and list(q["quantile"].values) == [0.1, 0.5, 0.9]
    ens = xr.open_zarr(grid / "pp_members.zarr")
    assert ens["realization"].attrs["standard_name"] == "realization" and ens["realization"].dims == ("member",)
    _check_time_coords(ens)
    assert "standard_name" not in gauss["temperature_std"].attrs
    assert "standard deviation" in gauss["temperature_std"].attrs["long_name"]
    nc = xr.open_dataset(grid / "pp_members.nc")
    assert "realization" in nc.dims and nc["time"].dims == ("forecast_reference_time", "forecast_period")
    assert nc["time"].attrs["standard_name"] == "time"


def _cf_high_failures(path: Path) -> list[str]:
    """compliance-checker's CF-1.8 test: messages of its failed high-priority checks."""
    why = "needs compliance-checker (the [dev] extra): pip install -e '.[dev]'"
    runner = pytest.importorskip("compliance_checker.runner", reason=why)
    suite = runner.CheckSuite()
    suite.load_all_available_checkers()
    results, errors = suite.run_all(suite.load_dataset(str(path)), ["cf:1.8"], skip_checks=[])["cf:1.8"]
    assert not errors, errors
    failed = [r for r in results if r.weight == 3 and (r.value is False or (
        isinstance(r.value, tuple) and r.value[0] < r.value[1]))]
    return [f"{r.name}: {m}" for r in failed for m in r.msgs]


@pytest.mark.parametrize("name", ["pp", "pp_members", "pp_percentiles", "pp_probabilities_temperature"])
def test_grid_cf_netcdf_passes_compliance_checker(grid: Path, name: str) -> None:
    assert _cf_high_failures(grid / f"{name}.nc") == []


def test_sites_truncnormal_below_keep_station_ids_and_pass_cf(tmp_path: Path) -> None:
    table = tmp_path / "uwme.csv"
    _table(table, n_sites=5, n_days=30)
    _pp("fit", "--per-site", "--distribution", "truncnormal", "--forecast", table, "--units", "K",
        "--out", tmp_path / "m.nc")
    _pp("apply", "--emos", tmp_path / "m.nc", "--forecast", table, "--units", "K", "--out", tmp_path / "pp.zarr",
        "--members", "5", "--thresholds", "274", "--below", "--percentiles", "25", "75", "--netcdf")
    mu, sigma = ensembles.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    m, s = mu["2m_temperature"].values.astype(np.float64), sigma["2m_temperature"].values.astype(np.float64)
    dist = stats.truncnorm(-m / s, np.inf, loc=m, scale=s)
    prob = xr.open_zarr(tmp_path / "pp_probabilities.zarr")
    assert prob["2m_temperature"].attrs["spp__relative_to_threshold"] == "less_than"
    got = prob["2m_temperature"].sel(threshold=274.0).transpose(*mu["2m_temperature"].dims).values
    np.testing.assert_allclose(got, dist.cdf(274.0), rtol=0, atol=_prob_tol(m, s, 274.0))
    pct = xr.open_zarr(tmp_path / "pp_percentiles.zarr")
    got = pct["2m_temperature"].sel(percentile=75.0).transpose(*mu["2m_temperature"].dims).values
    np.testing.assert_allclose(got, dist.ppf(0.75), rtol=4 * EPS32)
    ids = xr.open_zarr(tmp_path / "pp.zarr")["station_id"].values
    for name in ("pp", "pp_members", "pp_percentiles", "pp_probabilities"):
        ds = xr.open_zarr(tmp_path / f"{name}.zarr")
        assert list(ds["station_id"].values) == list(ids)
        assert {"latitude", "longitude"} <= set(ds.coords)
        _check_time_coords(ds)
        assert _cf_high_failures(tmp_path / f"{name}.nc") == []
    assert "location parameter" in xr.open_zarr(tmp_path / "pp.zarr")["2m_temperature"].attrs["long_name"]


def test_drn_sites_probabilities(tmp_path: Path) -> None:
    table = tmp_path / "uwme.csv"
    _table(table, n_sites=4, n_days=30)
    _pp("fit", "--method", "drn", "--forecast", table, "--drn-epochs", "2", "--drn-seeds", "1", "--drn-hidden", "4",
        "--out", tmp_path / "drn.nc")
    _pp("apply", "--drn", tmp_path / "drn.nc", "--forecast", table, "--out", tmp_path / "pp.zarr",
        "--thresholds", "272", "278")
    mu, sigma = ensembles.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    prob = xr.open_zarr(tmp_path / "pp_probabilities.zarr")
    assert "station_id" in prob.coords
    m, s = mu["2m_temperature"].values.astype(np.float64), sigma["2m_temperature"].values.astype(np.float64)
    for t in (272.0, 278.0):
        got = prob["2m_temperature"].sel(threshold=t).transpose(*mu["2m_temperature"].dims).values
        np.testing.assert_allclose(got, stats.norm.sf(t, m, s), rtol=0, atol=_prob_tol(m, s, t))


def test_distribution_families_match_scipy() -> None:
    rng = np.random.default_rng(0)
    mu, sd = rng.normal(1.0, 2.0, 50), rng.gamma(2.0, 0.5, 50)
    x, q = rng.normal(1.0, 3.0, 50), rng.uniform(0.01, 0.99, 50)
    n, t = family("normal", mu, sd), family("truncnormal", mu, sd)
    assert isinstance(n, Normal) and isinstance(t, TruncatedNormal)
    ref = stats.truncnorm(-mu / sd, np.inf, loc=mu, scale=sd)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(n.cdf(x), stats.norm.cdf(x, mu, sd), **tol)
    np.testing.assert_allclose(n.ppf(q), stats.norm.ppf(q, mu, sd), **tol)
    np.testing.assert_allclose(t.cdf(x), ref.cdf(x), **tol)
    np.testing.assert_allclose(t.ppf(q), ref.ppf(q), rtol=1e-9)
    np.testing.assert_allclose(t.mean(), ref.mean(), rtol=1e-9)
    np.testing.assert_allclose(t.std(), ref.std(), rtol=1e-8)


def test_threshold_options_refused_by_name(grid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert list(parse_thresholds(["275,265", "270"])[None]) == [265.0, 270.0, 275.0]
    with pytest.raises(ValueError, match="--thresholds 'warm'"):
        parse_thresholds(["warm"])
    with pytest.raises(ValueError, match="not both"):
        parse_thresholds(["265", "temperature=270"])
    with pytest.raises(ValueError, match="per variable, e.g. --thresholds geopotential=T1,T2 temperature=T1,T2"):
        thresholds_for({None: np.array([1.0])}, ["geopotential", "temperature"])
    with pytest.raises(ValueError, match=r"no variable\(s\) \['temp'\]"):
        thresholds_for({"temp": np.array([1.0])}, ["temperature"])
    base = ["postprocess", "apply", "--emos", str(grid / "m.nc"), "--forecast", str(grid / "b.nc"),
            "--out", str(tmp_path / "o.zarr")]
    for argv, word in ((["--percentiles", "0.5", "100"], "--percentiles"), (["--below"], "--below needs"),
                       (["--thresholds", "265"], "give the thresholds per variable"),
                       (["--thresholds", "temp=265"], "no variable(s) ['temp']")):
        assert main([*base, *argv]) == 2
        assert word in capsys.readouterr().err and not any(tmp_path.glob("o*"))
