"""Scorecards and spectrum plots: the paired test over autocorrelated initialisations (against scipy and by
its false-alarm rate), the relative differences, and `smoe plot scorecard|spectra` end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import stats

from pipelines.prepare import write_store
from smoeweather.cli import main
from smoeweather.evaluate.run import evaluate
from smoeweather.metrics.significance import effective_sample_size, paired_difference_test
from smoeweather.plotting.scorecard import scorecard_table

EPS64 = float(np.finfo(np.float64).eps)
LAT = np.linspace(-87.1875, 87.1875, 32)
LON = np.arange(64) * 5.625


def _ar1(rng: np.random.Generator, n: int, phi: float, size: int) -> np.ndarray:
    x = np.empty((size, n))
    x[:, 0] = rng.normal(size=size) / np.sqrt(1 - phi**2)
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + rng.normal(size=size)
    return x


def test_paired_test_is_scipy_ttest_rel_without_autocorrelation() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 1, 40), rng.normal(0, 1, 40)
    # an alternating difference series has r1 < 0: no inflation, the ordinary paired t-test
    d = np.where(np.arange(40) % 2, 1.0, -1.0) + 0.2
    b = a - d
    res = paired_difference_test(xr.DataArray(a, dims="time"), xr.DataArray(b, dims="time"))
    assert float(res["lag1_autocorrelation"]) < 0 and float(res["n_eff"]) == 40
    assert float(res["p_value"]) == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-10)
    assert float(res["mean_difference"]) == pytest.approx(0.2, rel=1e-12)
    assert effective_sample_size(100, 0.5) == pytest.approx(100 / 3)
    assert effective_sample_size(10, 0.99) == 2.0  # clamped at 2: exact


def test_autocorrelation_keeps_the_false_alarm_rate() -> None:
    """AR(1) differences with φ = 0.8 and mean 0: the naive paired t-test rejects far more often than 5 %,
    the n_eff-corrected one close to 5 % (600 series of 200 inits; binomial sd of the rate ≈ 0.9 %)."""
    rng = np.random.default_rng(1)
    d = _ar1(rng, 200, 0.8, 600)
    res = paired_difference_test(xr.DataArray(d, dims=("series", "time")), xr.zeros_like(
        xr.DataArray(d, dims=("series", "time"))))
    corrected = float((res["p_value"] < 0.05).mean())
    naive = float((stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05).mean())
    assert naive > 0.3 and corrected < 0.1
    assert float(res["lag1_autocorrelation"].mean()) == pytest.approx(0.8, abs=0.05)


def _store(path: Path, rng: np.random.Generator, days: int = 40) -> Path:
    """A red-noise world: Z500 autocorrelated in time (φ = 0.9 per 6 h) with large scales, a land-sea mask."""
    times = np.arange(np.datetime64("2000-01-01", "ns"), np.datetime64("2000-01-01", "ns") + np.timedelta64(days, "D"),
                      np.timedelta64(6, "h"))
    k = np.arange(1, 9)
    amp = rng.normal(size=(len(times), len(k)))
    for i in range(1, len(times)):
        amp[i] = 0.9 * amp[i - 1] + np.sqrt(1 - 0.81) * amp[i]
    waves = np.cos(np.deg2rad(LON)[None, :] * k[:, None] + rng.uniform(0, 6.3, size=(len(k), 1)))  # (k, lon)
    z = 50000.0 + 300.0 * np.einsum("tk,kx->tx", amp / k, waves)[:, None, None, :] * np.cos(np.deg2rad(LAT))[
        None, None, :, None]
    lsm = (rng.uniform(size=(32, 64)) > 0.7).astype(np.float32)
    ds = xr.Dataset(
        {"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32), {"units": "m**2 s**-2"}),
         "land_sea_mask": (("latitude", "longitude"), lsm, {"units": "1"})},
        coords={"time": times, "level": [500], "latitude": LAT, "longitude": LON},
    )
    write_store(lambda: ds, path, args={"test": "red"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return path


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three forecasts of the red-noise world scored with regions and spectra: persistence, a smoothed
    truth (the 2-point zonal mean of the truth at the valid time: better than persistence, wave k damped by
    cos(πk/64), so its energy by cos²) and persistence plus tiny noise (no significant difference)."""
    from smoeweather.forecast import make_forecast

    tmp = tmp_path_factory.mktemp("scorecard")
    rng = np.random.default_rng(2)
    store = _store(tmp / "red.zarr", rng)
    kw = dict(init=("2000-01-03", "2000-02-01"), leads_h=(24, 48), fields=["geopotential_500"], progress=False)
    pers = make_forecast(store, method="persistence", **kw)
    pers.to_zarr(tmp / "persistence.zarr", zarr_format=2)
    truth = xr.open_zarr(store)["geopotential"]
    valid = pers["time"] + pers["prediction_timedelta"]
    at_valid = truth.sel(time=valid.values.ravel()).values.reshape(*valid.shape, 1, 32, 64)
    smooth = 0.5 * (at_valid + np.roll(at_valid, 1, axis=-1))  # a 2-point zonal mean: damps the small scales
    good = pers.copy(deep=True)
    good["geopotential"] = pers["geopotential"].copy(data=smooth.astype(np.float32))  # keeps its units
    good.attrs["method"] = "smooth"
    good.to_zarr(tmp / "smooth.zarr", zarr_format=2)
    same = pers.copy(deep=True)
    same["geopotential"] = pers["geopotential"].copy(data=pers["geopotential"].values + rng.normal(
        0, 1e-3, size=pers["geopotential"].shape).astype(np.float32))
    same.to_zarr(tmp / "same.zarr", zarr_format=2)
    out = tmp / "scores"
    assert main(["evaluate", f"persistence={tmp / 'persistence.zarr'}", f"smooth={tmp / 'smooth.zarr'}",
                 f"same={tmp / 'same.zarr'}", "--truth", str(store), "--no-references", "--spectra",
                 "--out", str(out)]) == 0
    return out


def test_scorecard_table_relative_difference_and_significance(scored: Path) -> None:
    s = xr.load_dataset(scored / "scores.nc")
    t = scorecard_table(s, "rmse", "persistence")
    want = 100 * (s["rmse"] / s["rmse"].sel({"method": "persistence"}) - 1)
    np.testing.assert_allclose(t["relative_difference"].values, want.values, rtol=1e3 * EPS64, atol=1e3 * EPS64)
    smooth = t.sel({"method": "smooth", "region": "global"})
    assert bool((smooth["relative_difference"] < -20).all()) and bool(smooth["significant"].all())
    assert not bool(t["significant"].sel({"method": "same", "region": "global"}).any())
    with pytest.raises(ValueError, match="--baseline 'nope'.*persistence"):
        scorecard_table(s, "rmse", "nope")


def test_cli_scorecard_and_spectra_pngs(scored: Path, tmp_path: Path) -> None:
    s = xr.load_dataset(scored / "scores.nc")
    ratio = (s["spectrum"] / s["truth_spectrum"]).sel({"method": "smooth", "field": "geopotential_500"})
    k = np.arange(1, 9)
    # the world's waves k = 1 … 8 (amplitude ~300/k m² s⁻² on 5e4, stored as float32: ~3e-3/(300/8) relative)
    np.testing.assert_allclose(ratio.sel(wavenumber=k).values, np.broadcast_to(np.cos(np.pi * k / 64) ** 2, (2, 8)),
                               rtol=2e-3)
    figs = tmp_path / "figs"
    assert main(["plot", "scorecard", str(scored / "scores.nc"), "--baseline", "persistence", "--out",
                 str(figs)]) == 0
    assert (figs / "scorecard_rmse.png").stat().st_size > 10_000 and (figs / "scorecard_crps.png").is_file()
    assert main(["plot", "spectra", str(scored / "scores.nc"), "--out", str(figs)]) == 0
    assert (figs / "spectra.png").is_file() and (figs / "spectra_energy.png").is_file()
    assert main(["plot", "scores", str(scored / "scores.nc"), "--out", str(figs)]) == 0
    assert (figs / "scores_rmse.png").is_file()
    assert main(["plot", "scorecard", str(scored / "scores.nc"), "--baseline", "dense", "--out", str(figs)]) == 2
    plain = evaluate(scored.parent / "persistence.zarr", scored.parent / "red.zarr", references=False)
    assert "region" not in plain.dims and "per_init_mse" in plain
