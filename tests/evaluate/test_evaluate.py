"""Deterministic scores and `smoe evaluate`: agreement with the independent `scores` package, closed forms
(weights, persistence of a linear trend, day-of-year climatology), WB2 valid-time matching, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scores.continuous
import xarray as xr

from pipelines.prepare import write_store
from smoeweather.evaluate.run import evaluate, scores_json
from smoeweather.forecast import make_forecast, run_forecast
from smoeweather.forecast.climatology import climatology_at, day_of_year, doy_climatology
from smoeweather.metrics import deterministic as det
from smoeweather.metrics.weights import latitude_weights

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
LAT = np.linspace(-87.1875, 87.1875, 32)
LON = np.arange(64) * 5.625


def _fields(rng: np.random.Generator, t: int = 12, lead: int = 2) -> tuple[xr.DataArray, xr.DataArray, xr.DataArray]:
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    coords = {"time": np.arange(t), "prediction_timedelta": np.arange(lead), "latitude": LAT, "longitude": LON}
    truth = xr.DataArray(rng.normal(size=(t, lead, 32, 64)), dims=dims, coords=coords)
    fc = truth + xr.DataArray(rng.normal(0.3, 1.0, size=truth.shape), dims=dims, coords=coords)
    clim = xr.DataArray(rng.normal(size=(1, 1, 32, 64)) * 0.5, dims=dims, coords={"latitude": LAT, "longitude": LON})
    return fc, truth, clim.squeeze(("time", "prediction_timedelta"), drop=True)


def test_latitude_weights_mean_one_and_area_integration() -> None:
    w = latitude_weights(xr.DataArray(LAT, dims="latitude", coords={"latitude": LAT}))
    assert float(w.mean()) == pytest.approx(1.0, rel=32 * EPS64)
    # a fine regular grid integrates area fractions: cap north of 30°N = (1 − sin 30°)/2 = 1/4
    lat = np.arange(-89.875, 90, 0.25)
    wf = latitude_weights(xr.DataArray(lat, dims="latitude", coords={"latitude": lat}))
    cap = float(det.bias(xr.DataArray((lat > 30).astype(float), dims="latitude", coords={"latitude": lat}), 0.0,
                         weights=wf, dims=("latitude",)))
    assert cap == pytest.approx(0.25, abs=0.25 * 0.25 / 90)  # one 0.25° row of 720 straddles the cut at most


def test_rmse_bias_agree_with_scores_package() -> None:
    fc, truth, _ = _fields(np.random.default_rng(0))
    w = latitude_weights(fc["latitude"])
    dims = ("time", "latitude", "longitude")
    ref = scores.continuous.rmse(fc, truth, reduce_dims=dims, weights=w)
    np.testing.assert_allclose(det.rmse(fc, truth).values, ref.values, rtol=100 * EPS64)
    ref_t = scores.continuous.rmse(fc, truth, reduce_dims=("latitude", "longitude"), weights=w)
    np.testing.assert_allclose(det.rmse_per_time(fc, truth).transpose(*ref_t.dims).values, ref_t.values,
                               rtol=100 * EPS64)
    ref_b = scores.continuous.additive_bias(fc, truth, reduce_dims=dims, weights=w)
    # float64 means of ~1e3 terms summed in another order; atol for biases near 0, scaled by the error size
    np.testing.assert_allclose(det.bias(fc, truth).values, ref_b.values, rtol=100 * EPS64,
                               atol=100 * EPS64 * float(abs(fc - truth).max()))
    # unweighted: plain means
    ref_u = scores.continuous.rmse(fc, truth, reduce_dims=dims)
    np.testing.assert_allclose(det.rmse(fc, truth, latitude_weighted=False).values, ref_u.values, rtol=100 * EPS64)
    # sqrt AFTER the time mean: not the mean of per-time RMSEs (Jensen: strictly larger here)
    assert np.all(det.rmse(fc, truth).values > det.rmse_per_time(fc, truth).mean("time").values)


def test_acc_is_wb2_uncentred_anomaly_correlation() -> None:
    fc, truth, clim = _fields(np.random.default_rng(1))
    got = det.acc(fc, truth, clim)
    w = np.cos(np.deg2rad(LAT))[:, None]
    fa, oa = (fc - clim).values, (truth - clim).values
    num = (w * fa * oa).sum((-2, -1))
    den = np.sqrt((w * fa**2).sum((-2, -1)) * (w * oa**2).sum((-2, -1)))
    np.testing.assert_allclose(got.values, (num / den).mean(0), rtol=1e-12)
    # a perfect forecast has ACC 1; a forecast of the climatology itself is undefined (NaN, as WB2)
    np.testing.assert_allclose(det.acc(truth, truth, clim).values, 1.0, rtol=1e-12)
    assert bool(det.acc(truth * 0 + clim, truth, clim).isnull().all())


def test_day_of_year_no_leap_and_windowed_climatology_closed_form() -> None:
    t = np.array(["2000-02-28", "2000-02-29", "2000-03-01", "2001-03-01", "2000-12-31"], "datetime64[ns]")
    assert day_of_year(t).tolist() == [59, 59, 60, 60, 365]
    # value = day of year, two non-leap years of daily data: the 31-day window mean of day d is d away from
    # the year's end; near the end it wraps circularly (day 1 averages days 351…365 and 1…16)
    times = np.arange("2001-01-01", "2003-01-01", dtype="datetime64[D]").astype("datetime64[ns]")
    da = xr.DataArray(day_of_year(times).astype(float), dims="time", coords={"time": times})
    clim = doy_climatology(da)
    assert clim.sel(dayofyear=100, hour=0).item() == pytest.approx(100.0, rel=4 * EPS32)
    wrap = (sum(range(351, 366)) + sum(range(1, 17))) / 31
    assert clim.sel(dayofyear=1, hour=0).item() == pytest.approx(wrap, rel=4 * EPS32)
    valid = xr.DataArray(np.array(["2004-02-29", "2004-04-10"], "datetime64[ns]"), dims="time")
    np.testing.assert_allclose(climatology_at(clim, valid).values, [59.0, 100.0], rtol=4 * EPS32)
    with pytest.raises(ValueError, match="hour"):
        climatology_at(clim, xr.DataArray(np.array(["2004-04-09T06"], "datetime64[ns]"), dims="time"))


def _linear_store(path: Path, start: str = "2000-01-01", days: int = 40, slope: float = 2.5) -> Path:
    """6-hourly store where Z500 = 50000 + slope·(hours since start) + a lat pattern (Z850 the same − 36000);
    T = 280 − 0.01·h at both levels."""
    times = np.arange(np.datetime64(start, "ns"), np.datetime64(start, "ns") + np.timedelta64(days, "D"),
                      np.timedelta64(6, "h"))
    hours = ((times - times[0]) / np.timedelta64(1, "h")).astype(np.float64)
    pattern = 100.0 * np.cos(np.deg2rad(LAT))[:, None] * np.ones(64)
    z = (50000.0 + slope * hours)[:, None, None, None] + pattern[None, None]
    t = (280.0 - 0.01 * hours)[:, None, None, None] + 0 * pattern[None, None]
    ds = xr.Dataset(
        {"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32),
                          {"units": "m**2 s**-2"}),
         "temperature": (("time", "level", "latitude", "longitude"), t.astype(np.float32), {"units": "K"})},
        coords={"time": times, "latitude": LAT, "longitude": LON},
    )
    lower = ds.assign(geopotential=ds["geopotential"] - 36000.0)  # Z850 near 14,000 m² s⁻², where it lies
    ds = xr.concat([ds.assign_coords(level=[500]), lower.assign_coords(level=[850])], "level", combine_attrs="override")
    write_store(lambda: ds, path, args={"test": "linear"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return path


@pytest.fixture(scope="module")
def linear_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _linear_store(tmp_path_factory.mktemp("linear") / "linear.zarr")


def test_persistence_of_a_linear_trend_closed_form(linear_store: Path, tmp_path: Path) -> None:
    fc = run_forecast(linear_store, method="persistence", init=("2000-01-03", "2000-01-20"), every="12h",
                      leads_h=("24h", "72h"), out=tmp_path / "p.zarr")
    s = evaluate(fc, linear_store, out_dir=tmp_path / "scores")
    rmse = s["rmse"].sel({"method": "persistence"})
    bias = s["bias"].sel({"method": "persistence"})
    # the error of persistence at lead τ is −slope·τ everywhere (float32 storage of values ~5e4)
    z_tol = 2 * 5.1e4 * EPS32
    for lead in (24, 72):
        td = np.timedelta64(lead, "h")
        assert rmse.sel(field="geopotential_500", prediction_timedelta=td).item() == pytest.approx(2.5 * lead,
                                                                                                   abs=z_tol)
        assert bias.sel(field="geopotential_500", prediction_timedelta=td).item() == pytest.approx(-2.5 * lead,
                                                                                                   abs=z_tol)
        assert bias.sel(field="temperature_850", prediction_timedelta=td).item() == pytest.approx(0.01 * lead,
                                                                                                  abs=2 * 290 * EPS32)
    assert int(s["n_time"].min()) == 35  # 2000-01-03 … 2000-01-20 every 12 h
    js = scores_json(s)
    assert js["units"]["temperature_850"] == "K" and js["scores"]["persistence"]["rmse"]["geopotential_500"]["72h"]
    assert (tmp_path / "scores" / "scores.md").read_text().count("persistence") >= 2
    # the written file round-trips
    np.testing.assert_allclose(xr.load_dataset(tmp_path / "scores" / "scores.nc")["rmse"].values, s["rmse"].values)


def test_valid_time_matching_and_no_overlap_error(linear_store: Path, tmp_path: Path) -> None:
    # a forecast labelled in another year verifies against nothing: refuse, naming the fields
    ds = make_forecast(linear_store, method="persistence", init=("2000-01-03", "2000-01-05"), leads_h=(24,),
                       progress=False)
    ds = ds.assign_coords(time=ds["time"].values + np.timedelta64(3 * 365, "D"))
    ds.to_zarr(tmp_path / "late.zarr", zarr_format=2)
    with pytest.raises(ValueError, match=r"time \+ prediction_timedelta"):
        evaluate(tmp_path / "late.zarr", linear_store)
    # leads past the truth's end: those pairs are left out (n_time counts only verified inits)
    fc = make_forecast(linear_store, method="persistence", init=("2000-02-05", "2000-02-08"), leads_h=(24, 96),
                       beyond_data=True, progress=False)
    fc.to_zarr(tmp_path / "edge.zarr", zarr_format=2)
    s = evaluate(tmp_path / "edge.zarr", linear_store)
    n = s["n_time"].sel(field="geopotential_500").values.tolist()
    assert n == [7, 2]  # last time 2000-02-09T18: 24 h fits all 7 inits, 96 h only 02-05T00 and 02-05T12


def test_climatology_reference_and_missing_truth_errors(linear_store: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="climatology-from"):
        make_forecast(linear_store, method="climatology", init=("2000-01-20", "2000-01-21"), leads_h=(24,))
    with pytest.raises(ValueError, match="truth"):
        make_forecast(linear_store, method="persistence", init=("2000-02-08", "2000-02-09"), leads_h=(72,))
    with pytest.raises(ValueError, match="2m_temperature"):
        make_forecast(linear_store, method="persistence", init=("2000-01-08", "2000-01-09"), leads_h=(24,),
                      fields=["2m_temperature"])
    fc = make_forecast(linear_store, method="climatology", init=("2000-01-20", "2000-01-21"), leads_h=(24,),
                       climatology_from=linear_store, progress=False)
    # climatology of a linear trend = mean of the window's samples at that hour = the value at the centre
    # day, as the window of valid time 2000-01-21T00 (01-06 … 02-05) lies inside the store's 40 days
    z = fc["geopotential"].sel(level=500).isel(time=0, prediction_timedelta=0, latitude=16, longitude=0).item()
    hours = (np.datetime64("2000-01-21T00") - np.datetime64("2000-01-01T00")) / np.timedelta64(1, "h")
    assert z == pytest.approx(50000 + 2.5 * hours + 100 * np.cos(np.deg2rad(LAT[16])), abs=2 * 5.1e4 * EPS32)
    assert fc.attrs["forecast_kind"] == "deterministic" and fc.attrs["method"] == "climatology"


def test_gaussian_forecast_crps_closed_form(linear_store: Path, tmp_path: Path) -> None:
    """A Gaussian (μ, σ) store as `smoe postprocess` writes it: μ = persistence, σ constant; the error is
    −slope·τ everywhere, so the area-mean CRPS is properscoring's CRPS of that one error."""
    import properscoring

    fc = make_forecast(linear_store, method="persistence", init=("2000-01-03", "2000-01-10"), leads_h=(24,),
                       fields=["geopotential_500"], progress=False)
    sigma = 40.0
    fc["geopotential_std"] = xr.full_like(fc["geopotential"], sigma)
    fc.attrs["forecast_kind"] = "gaussian"
    fc.to_zarr(tmp_path / "g.zarr", zarr_format=2)
    s = evaluate({"emos": tmp_path / "g.zarr"}, linear_store, references=False)
    expected = properscoring.crps_gaussian(0.0, mu=-2.5 * 24, sig=sigma)
    got = s["crps"].sel({"method": "emos", "field": "geopotential_500"}).item()
    assert got == pytest.approx(expected, abs=2 * 5.1e4 * EPS32)
    # spread–skill of N(μ, σ²): σ / RMSE(μ) = 40 / 60 here (the error is −60 everywhere); the error carries the
    # float32 rounding of ~5e4-sized fields
    ratio = s["spread_skill"].sel({"method": "emos", "field": "geopotential_500"}).item()
    assert ratio == pytest.approx(sigma / (2.5 * 24), rel=2 * 5.1e4 * EPS32 / 60)


def test_ensemble_crps_fair_and_ecdf_on_outer_members(linear_store: Path, tmp_path: Path) -> None:
    """Why both estimators are reported: two members on the truth and two at ±D around it. The fair CRPS
    is exactly 0 for EVERY D (its pairwise term cancels the members' error: (2D/4) − 12D/(2·4·3)), so an
    ensemble trained on it can spread two members arbitrarily far at no cost; the CRPS of the members'
    empirical distribution is D/8 (properscoring's crps_ensemble), growing with D."""
    import properscoring

    truth = make_forecast(linear_store, method="persistence", init=("2000-01-03", "2000-01-06"), leads_h=(24,),
                          fields=["geopotential_500"], progress=False)
    # the truth at valid time = persistence + slope·24 h (the store's linear trend): members around it
    exact = truth["geopotential"] + 2.5 * 24
    for d in (100.0, 1000.0):
        members = xr.concat([exact, exact, exact + d, exact - d], dim="member").transpose("time", ..., "member",
                                                                                           "latitude", "longitude")
        fc = truth.copy()
        fc["geopotential"] = members.assign_coords(member=np.arange(4))
        fc.attrs["forecast_kind"] = "ensemble"
        fc.to_zarr(tmp_path / f"e{d:.0f}.zarr", zarr_format=2)
        s = evaluate({"e3": tmp_path / f"e{d:.0f}.zarr"}, linear_store, references=False)
        cell = {"method": "e3", "field": "geopotential_500"}
        tol = 4 * 5.1e4 * EPS32  # the ~5e4-sized fields carry float32 rounding
        assert s["crps"].sel(cell).item() == pytest.approx(0.0, abs=tol)
        expected = properscoring.crps_ensemble(0.0, np.array([0.0, 0.0, d, -d]))
        assert expected == pytest.approx(d / 8)
        assert s["crps_ecdf"].sel(cell).item() == pytest.approx(expected, abs=tol)


def test_field_read_once_scores_equal_the_lazy_blocked_scores(linear_store: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A field small enough is read into memory once before it is scored (the completeness check, calibration,
    our scores and the WB2 terms each read the store otherwise); a larger one stays lazy. Every score of the two
    paths is the same, up to float64 re-association of the same sums."""
    import smoeweather.evaluate.run as E

    base = make_forecast(linear_store, method="persistence", init=("2000-01-03", "2000-01-12"), every="12h",
                         leads_h=(24, 48), fields=["geopotential_500"], progress=False)
    rng = np.random.default_rng(3)
    z = base["geopotential"]
    members = xr.concat([z + rng.normal(0.0, 30.0, size=z.shape) for _ in range(4)], "member")
    fc = base.copy()
    fc["geopotential"] = members.transpose("time", ..., "member", "latitude", "longitude").astype(np.float32)
    fc.attrs["forecast_kind"] = "ensemble"
    fc.chunk({"time": 4}).to_zarr(tmp_path / "ens.zarr", zarr_format=2)
    lazy_field = xr.open_zarr(tmp_path / "ens.zarr")["geopotential"]
    assert E._read_once(lazy_field).chunks is None  # 4 × 19 × 2 × 32 × 64 float64: far below BLOCK_BYTES

    def run() -> xr.Dataset:
        return evaluate({"ens": tmp_path / "ens.zarr"}, linear_store, climatology=linear_store,
                        climatology_years=(2000, 2000), references=False,
                        thresholds={"geopotential_500": [50500.0]})

    once = run()
    monkeypatch.setattr(E, "BLOCK_BYTES", 1.0)
    assert E._read_once(lazy_field).chunks is not None  # now too large: lazy
    lazy = run()
    assert set(once.data_vars) == set(lazy.data_vars) and "wb2_crps" in once and "brier_score" in once
    for k in once.data_vars:
        np.testing.assert_allclose(lazy[k].values, once[k].values, rtol=1e3 * EPS64, atol=0.0, err_msg=str(k))


def test_vectorised_nanquantile_equals_numpy() -> None:
    """The climatological thresholds' quantiles are numpy's nanquantile exactly (the same np.quantile on the same
    sorted valid samples), for NaN-free data, scattered gaps, a single valid sample and an all-NaN point."""
    import warnings

    from smoeweather.forecast.climatology import nanquantile_samples

    rng = np.random.default_rng(5)
    q = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    x = rng.normal(size=(31, 4, 6))
    np.testing.assert_array_equal(nanquantile_samples(x, q), np.nanquantile(x, q, axis=0))
    x[rng.random(x.shape) < 0.3] = np.nan
    x[:, 0, 0] = np.nan
    x[1:, 0, 1] = np.nan
    x[0, 0, 1] = 2.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns of the all-NaN point
        expected = np.nanquantile(x, q, axis=0)
    got = nanquantile_samples(x, q)
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[:, 0, 0]).all() and (got[:, 0, 1] == 2.5).all()
