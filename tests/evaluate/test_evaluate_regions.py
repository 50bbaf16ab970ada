"""Regions, WeatherBench 2's probabilistic set and zonal spectra in `smoe evaluate`: region scores against
hand-computed masked latitude-weighted means, the debiased ensemble-mean MSE and the energy score against
closed forms and the `scores` package, a single zonal wave's spectrum, the WB2 result files, clear errors."""

from __future__ import annotations

from pathlib import Path

import dask.array
import numpy as np
import pytest
import scores.continuous
import scores.probability
import xarray as xr

from pipelines.prepare import write_store
from smoeweather.cli import main
from smoeweather.evaluate.run import evaluate, scores_json
from smoeweather.forecast import run_forecast
from smoeweather.metrics import probabilistic as P
from smoeweather.metrics.regions import WB2_REGIONS, parse_region, parse_regions, region_weights
from smoeweather.metrics.scores import forecast_scores
from smoeweather.metrics.spectra import EARTH_RADIUS_M, zonal_energy_spectrum

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
LAT = np.linspace(-87.1875, 87.1875, 32)
LON = np.arange(64) * 5.625
DIMS = ("time", "prediction_timedelta", "latitude", "longitude")


def _coords(t: int, lead: int = 1) -> dict[str, np.ndarray]:
    return {"time": np.arange(t), "prediction_timedelta": np.arange(lead), "latitude": LAT, "longitude": LON}


def _lsm(rng: np.random.Generator) -> xr.DataArray:
    """A land fraction in [0, 1] with exact 0s and 1s (as real masks have) and fractional coasts."""
    v = np.clip(rng.uniform(-0.5, 1.5, size=(32, 64)), 0.0, 1.0)
    return xr.DataArray(v, dims=("latitude", "longitude"), coords={"latitude": LAT, "longitude": LON})


def _masked_mean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ w x / Σ w over the last two axes: the hand-computed area mean."""
    return (x * w).sum((-2, -1)) / w.sum()


# ---- region definitions -----------------------------------------------------------------------------
def test_wb2_boxes_inclusive_and_wrapping() -> None:
    lat = xr.DataArray(np.arange(-90.0, 90.1, 2.5), dims="latitude")
    lon = xr.DataArray(np.arange(0.0, 360.0, 2.5), dims="longitude")
    rw = region_weights(parse_regions(["wb2"])[:13], lat, lon)
    assert rw["region"].values.tolist()[:5] == ["global", "tropics", "extra-tropics", "northern-hemisphere",
                                                "southern-hemisphere"]
    inside = rw > 0
    # europe: 35..75 N, 347.5..360 and 0..42.5 E, both ends included (WB2 slices are inclusive)
    eu = inside.sel(region="europe")
    assert bool(eu.sel(latitude=35.0, longitude=347.5)) and bool(eu.sel(latitude=75.0, longitude=42.5))
    assert bool(eu.sel(latitude=50.0, longitude=0.0)) and not bool(eu.sel(latitude=50.0, longitude=45.0))
    assert not bool(eu.sel(latitude=50.0, longitude=345.0)) and not bool(eu.sel(latitude=32.5, longitude=10.0))
    # tropics and extra-tropics share the ±20° rows, as WB2's slices do; the poles have weight 0 (cos 90°)
    assert bool(inside.sel(region="tropics", latitude=20.0).all()) and bool(
        inside.sel(region="extra-tropics", latitude=20.0).all())
    na = inside.sel(region="north-america")
    assert bool(na.sel(latitude=40.0, longitude=240.0)) and not bool(na.sel(latitude=40.0, longitude=290.0))
    # the weights are the latitude weights inside the box
    g = rw.sel(region="global")
    np.testing.assert_allclose(rw.sel(region="arctic").values, g.where(lat >= 60, 0.0).values, rtol=0, atol=0)
    assert set(WB2_REGIONS) >= {"global_land", "tropics_land", "extra-tropics_land", "ausnz", "east-asia"}


def test_land_sea_are_fraction_weights_and_complements() -> None:
    lsm = _lsm(np.random.default_rng(3))
    regs = parse_regions(["default", "europe_land"])
    rw = region_weights(regs, lsm["latitude"], lsm["longitude"], lsm)
    g, land, sea = (rw.sel(region=r).values for r in ("global", "land", "sea"))
    np.testing.assert_allclose(land + sea, g, rtol=4 * EPS64)
    np.testing.assert_allclose(land, g * lsm.values, rtol=4 * EPS64)
    thr = region_weights(regs, lsm["latitude"], lsm["longitude"], lsm, threshold=0.5)
    np.testing.assert_array_equal(thr.sel(region="land").values > 0, lsm.values > 0.5)
    eu = rw.sel(region="europe_land").values
    assert eu.sum() > 0 and np.all(eu <= land + 4 * EPS64)


def test_bad_region_specifications_name_the_option_and_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--regions.*unknown region 'europa'.*wb2.*europe"):
        parse_region("europa")
    with pytest.raises(ValueError, match=r"--regions 'box=10:x'.*LO:HI"):
        parse_region("box=10:x")
    with pytest.raises(ValueError, match="LAT0 <= LAT1"):
        parse_region("box=60:30,0:10")
    with pytest.raises(ValueError, match="does not exist"):
        parse_region(f"m={tmp_path / 'nope.nc'}")
    with pytest.raises(ValueError, match="land_sea_mask"):
        region_weights(parse_regions(["land"]), xr.DataArray(LAT, dims="latitude"),
                       xr.DataArray(LON, dims="longitude"))
    with pytest.raises(ValueError, match="no grid point"):
        region_weights([parse_region("tiny=10.1:10.2,0:1")], xr.DataArray(LAT, dims="latitude"),
                       xr.DataArray(LON, dims="longitude"))
    box = parse_region("med=30:46,-6:36")
    assert box.lat == ((30.0, 46.0),) and box.lon == ((-6.0, 36.0),)


# ---- region scores = hand-computed masked means -----------------------------------------------------------
def test_region_scores_equal_hand_computed_masked_latitude_weighted_means() -> None:
    rng = np.random.default_rng(0)
    t, lead = 9, 2
    truth = xr.DataArray(rng.normal(size=(t, lead, 32, 64)), dims=DIMS, coords=_coords(t, lead))
    fc = truth + rng.normal(0.2, 1.0, size=truth.shape)
    clim = xr.DataArray(rng.normal(size=(32, 64)) * 0.5, dims=DIMS[2:], coords={"latitude": LAT, "longitude": LON})
    lsm = _lsm(rng)
    regs = parse_regions(["default", "tropics", "box=30:60,-20:40"])
    rw = region_weights(regs, truth["latitude"], truth["longitude"], lsm)
    lat_w = np.cos(np.deg2rad(LAT))[:, None] * np.ones(64)
    out = forecast_scores(fc, "deterministic", truth, None, climatology=clim, regions=rw, per_init=True)
    e = (fc - truth).values
    for r in rw["region"].values.tolist():
        if r == "global":
            w = lat_w
        elif r in ("land", "sea"):
            w = lat_w * (lsm.values if r == "land" else 1.0 - lsm.values)
        elif r == "tropics":
            w = lat_w * (np.abs(LAT) <= 20)[:, None]
        else:
            w = lat_w * ((LAT >= 30) & (LAT <= 60))[:, None] * ((LON <= 40) | (LON >= 340))[None, :]
        mse_t = _masked_mean(e**2, w)  # (time, lead)
        np.testing.assert_allclose(out["per_init_mse"].sel(region=r).values, mse_t, rtol=1e3 * EPS64)
        np.testing.assert_allclose(out["rmse"].sel(region=r).values, np.sqrt(mse_t.mean(0)), rtol=1e3 * EPS64)
        np.testing.assert_allclose(out["bias"].sel(region=r).values, _masked_mean(e, w).mean(0), rtol=1e3 * EPS64)
        np.testing.assert_allclose(out["crps"].sel(region=r).values, _masked_mean(abs(e), w).mean(0),
                                   rtol=1e3 * EPS64)
        fa, oa = (fc - clim).values, (truth - clim).values
        acc = _masked_mean(fa * oa, w) / np.sqrt(_masked_mean(fa**2, w) * _masked_mean(oa**2, w))
        np.testing.assert_allclose(out["acc"].sel(region=r).values, acc.mean(0), rtol=1e3 * EPS64)
    # the global region equals the scores package's latitude-weighted RMSE
    ref = scores.continuous.rmse(fc, truth, reduce_dims=("latitude", "longitude"),
                                 weights=xr.DataArray(np.cos(np.deg2rad(LAT)), dims="latitude",
                                                      coords={"latitude": LAT}))
    np.testing.assert_allclose(np.sqrt(out["per_init_mse"].sel(region="global")).values,
                               ref.transpose("time", "prediction_timedelta").values, rtol=1e3 * EPS64)


def _trend_store(path: Path, lsm: xr.DataArray, slope: float = 2.5, days: int = 12) -> Path:
    """6-hourly store: Z500 = 5e4 + slope·h·g with g = 1 + 2·land fraction (land errs faster), T850 constant."""
    times = np.arange(np.datetime64("2000-01-01", "ns"), np.datetime64("2000-01-01", "ns") + np.timedelta64(days, "D"),
                      np.timedelta64(6, "h"))
    hours = ((times - times[0]) / np.timedelta64(1, "h")).astype(np.float64)
    g = 1.0 + 2.0 * lsm.values
    z = 50000.0 + slope * hours[:, None, None, None] * g[None, None]
    ds = xr.Dataset(
        {"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32), {"units": "m**2 s**-2"}),
         "land_sea_mask": (("latitude", "longitude"), lsm.values.astype(np.float32), {"units": "1"})},
        coords={"time": times, "level": [500], "latitude": LAT, "longitude": LON},
    )
    write_store(lambda: ds, path, args={"test": "trend"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return path


def test_cli_default_regions_land_and_sea_closed_form(tmp_path: Path) -> None:
    """Persistence of Z = 5e4 + s·h·(1 + 2·land): the error at lead τ is −s·τ·g, so each region's RMSE is
    s·τ·√(Σ w g² / Σ w) with its own weights w (latitude × land fraction, or × sea fraction)."""
    lsm = _lsm(np.random.default_rng(5))
    store = _trend_store(tmp_path / "trend.zarr", lsm)
    fc = run_forecast(store, method="persistence", init=("2000-01-02", "2000-01-08"), every="24h",
                      fields=["geopotential_500"], leads_h=("24h", "48h"), out=tmp_path / "p.zarr")
    out = tmp_path / "scores"
    assert main(["evaluate", str(fc), "--truth", str(store), "--no-references", "--out", str(out)]) == 0
    s = xr.load_dataset(out / "scores.nc")
    assert s["rmse"].dims == ("method", "field", "prediction_timedelta", "region")
    assert s["region"].values.tolist() == ["global", "land", "sea"]
    lat_w = np.cos(np.deg2rad(LAT))[:, None] * np.ones(64)
    g = 1.0 + 2.0 * lsm.values.astype(np.float32).astype(np.float64)
    land = lsm.values.astype(np.float32).astype(np.float64)
    for r, w in (("global", lat_w), ("land", lat_w * land), ("sea", lat_w * (1 - land))):
        for lead in (24, 48):
            want = 2.5 * lead * np.sqrt((w * g**2).sum() / w.sum())
            got = s["rmse"].sel({"method": "persistence", "field": "geopotential_500", "region": r,
                                 "prediction_timedelta": np.timedelta64(lead, "h")}).item()
            assert got == pytest.approx(want, rel=8 * 5.1e4 * EPS32 / (2.5 * 24))
    assert s["rmse"].sel(region="land").max() > s["rmse"].sel(region="sea").max()
    js = scores_json(s)
    assert js["scores"]["persistence"]["rmse"] == js["regions"]["global"]["persistence"]["rmse"]
    md = (out / "scores.md").read_text()
    assert md.index("### region: global") < md.index("### region: land") < md.index("### region: sea")
    assert len(s["time"]) == 7 and s["per_init_mse"].sizes["time"] == 7
    # WeatherBench 2's evaluation files, one folder per method: mse (time mean) and its square root per init
    wb2 = xr.load_dataset(out / "wb2" / "persistence" / "deterministic.nc")
    assert wb2["geopotential"].dims == ("metric", "region", "lead_time", "level")
    assert "rmse_sqrt_before_time_avg" not in wb2["metric"].values and wb2.attrs["ensemble_size"] == 1
    np.testing.assert_allclose(np.sqrt(wb2["geopotential"].sel(metric="mse", level=500).values),
                               s["rmse"].sel({"method": "persistence", "field": "geopotential_500"}).transpose(
                                   "region", "prediction_timedelta").values, rtol=1e-12)
    temporal = xr.load_dataset(out / "wb2" / "persistence" / "deterministic_temporal.nc")
    assert "time" in temporal["geopotential"].dims and "rmse_sqrt_before_time_avg" in temporal["metric"].values
    # a threshold instead of fractions, and WB2's list: a region dim of 16
    s2 = evaluate(fc, store, references=False, regions="wb2", land_threshold=0.5)
    assert s2.sizes["region"] == len(WB2_REGIONS)
    # unknown region names: a clear error naming the option and the choices
    with pytest.raises(ValueError, match=r"--regions.*wb2"):
        evaluate(fc, store, references=False, regions=["mars"])


def test_named_land_region_without_mask_refuses_default_falls_back(tmp_path: Path) -> None:
    lsm = _lsm(np.random.default_rng(6))
    store = _trend_store(tmp_path / "trend.zarr", lsm)
    ds = xr.open_zarr(store).drop_vars("land_sea_mask")
    ds.to_zarr(tmp_path / "nolsm.zarr", zarr_format=2)
    fc = run_forecast(store, method="persistence", init=("2000-01-02", "2000-01-04"), every="24h",
                      fields=["geopotential_500"], leads_h=("24h",), out=tmp_path / "p.zarr")
    with pytest.raises(ValueError, match="--land-sea-mask"):
        evaluate(fc, tmp_path / "nolsm.zarr", references=False, regions=["land"])
    with pytest.warns(UserWarning, match="global region only"):
        s = evaluate(fc, tmp_path / "nolsm.zarr", references=False, regions="default")
    assert s["region"].values.tolist() == ["global"]
    s = evaluate(fc, tmp_path / "nolsm.zarr", references=False, regions=["sea"], land_sea_mask=store)
    assert s["region"].values.tolist() == ["sea"]


# ---- debiased ensemble-mean MSE and energy score ---------------------------------------------------------
def test_debiased_ensemble_mean_mse_closed_form_and_unbiased() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3, 5))  # (member, a, b)
    y = rng.normal(size=(3, 5))
    fx = xr.DataArray(x, dims=("member", "a", "b"))
    fy = xr.DataArray(y, dims=("a", "b"))
    got = P.debiased_ensemble_mean_mse_per_point(fx, fy)
    want = (x.mean(0) - y) ** 2 - x.var(0, ddof=1) / 4
    np.testing.assert_allclose(got.values, want, rtol=16 * EPS64, atol=16 * EPS64)
    # = the scores package's MSE of the ensemble mean minus the mean unbiased variance / M
    mse = scores.continuous.mse(fx.mean("member"), fy, reduce_dims=("a", "b"))
    np.testing.assert_allclose(float(P.debiased_ensemble_mean_mse(fx, fy, dims=("a", "b"))),
                               float(mse) - x.var(0, ddof=1).mean() / 4, rtol=64 * EPS64)
    # unbiased for (μ − y)² with M = 2: members N(μ, 1) at 200 000 points; the plain MSE is 1/2 too large
    n, mu = 200_000, 0.7
    two = xr.DataArray(rng.normal(mu, 1.0, size=(2, n)), dims=("member", "p"))
    zero = xr.DataArray(np.zeros(n), dims="p")
    deb = P.debiased_ensemble_mean_mse_per_point(two, zero)
    se = float(deb.std()) / np.sqrt(n)
    assert float(deb.mean()) == pytest.approx(mu**2, abs=5 * se)
    assert float(((two.mean("member")) ** 2).mean()) == pytest.approx(mu**2 + 0.5, abs=5 * se)


def _energy_brute(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """The energy score straight from its definition: ‖v‖ = √(Σ w v² / Σ w), all ordered pairs."""
    def norm(v: np.ndarray) -> float:
        return float(np.sqrt((w * v**2).sum() / w.sum()))
    m = len(x)
    skill = np.mean([norm(x[j] - y) for j in range(m)])
    spread = sum(norm(x[j] - x[k]) for j in range(m) for k in range(m) if j != k) / (m * (m - 1))
    return skill - 0.5 * spread


def test_energy_score_against_definition_crps_and_point_mass() -> None:
    rng = np.random.default_rng(2)
    lat, lon = LAT[::4], LON[::8]
    x = rng.normal(size=(3, 5, len(lat), len(lon)))  # (time, member, lat, lon)
    y = rng.normal(size=(3, len(lat), len(lon)))
    fx = xr.DataArray(x, dims=("time", "member", "latitude", "longitude"), coords={"latitude": lat, "longitude": lon})
    fy = xr.DataArray(y, dims=("time", "latitude", "longitude"), coords={"latitude": lat, "longitude": lon})
    w = xr.DataArray(np.cos(np.deg2rad(lat)), dims="latitude", coords={"latitude": lat})
    es = P.energy_score_terms(fx, fy, w)["energy_score"]
    ww = np.cos(np.deg2rad(lat))[:, None] * np.ones(len(lon))
    want = [_energy_brute(x[i], y[i], ww) for i in range(3)]
    np.testing.assert_allclose(es.values, want, rtol=1e3 * EPS64)
    # lazily on dask chunks: the same numbers
    lazy = P.energy_score_terms(fx.chunk({"time": 1}), fy.chunk({"time": 1}), w)["energy_score"]
    assert isinstance(lazy.data, dask.array.Array)
    np.testing.assert_allclose(lazy.values, want, rtol=1e3 * EPS64)
    # one spatial point: the energy score is the fair CRPS (scores package)
    one_w = xr.zeros_like(w.broadcast_like(fy.isel(time=0))).copy()
    one_w[2, 3] = 1.0
    es1 = P.energy_score_terms(fx, fy, one_w)["energy_score"]
    crps = scores.probability.crps_for_ensemble(fx.isel(latitude=2, longitude=3), fy.isel(latitude=2, longitude=3),
                                                ensemble_member_dim="member", method="fair",
                                                preserve_dims=["time"])
    np.testing.assert_allclose(es1.values, crps.values, rtol=1e3 * EPS64)
    # a point mass (all members equal): the energy score is the norm of the error
    same = fx.isel(member=[0] * 4).assign_coords(member=np.arange(4))
    es_same = P.energy_score_terms(same, fy, w)["energy_score"]
    np.testing.assert_allclose(es_same.values, np.sqrt(_masked_mean((x[:, 0] - y) ** 2, ww)), rtol=1e3 * EPS64)


def test_forecast_scores_ensemble_regions_new_metrics() -> None:
    rng = np.random.default_rng(4)
    t = 4
    truth = xr.DataArray(rng.normal(size=(t, 1, 32, 64)), dims=DIMS, coords=_coords(t))
    fc = xr.concat([truth + rng.normal(0.0, 1.0, size=truth.shape) for _ in range(6)], "member")
    fc = fc.transpose("time", "prediction_timedelta", "member", "latitude", "longitude")
    lsm = _lsm(rng)
    rw = region_weights(parse_regions(["default"]), truth["latitude"], truth["longitude"], lsm)
    out = forecast_scores(fc.chunk({"time": 2}), "ensemble", truth, None, regions=rw, per_init=True)
    x = fc.transpose("time", "prediction_timedelta", "member", "latitude", "longitude").values
    y = truth.values
    lat_w = np.cos(np.deg2rad(LAT))[:, None] * np.ones(64)
    for r, w in (("global", lat_w), ("land", lat_w * lsm.values), ("sea", lat_w * (1 - lsm.values))):
        deb = (x.mean(2) - y) ** 2 - x.var(2, ddof=1) / 6
        np.testing.assert_allclose(out["debiased_ensemble_mean_mse"].sel(region=r).values,
                                   _masked_mean(deb, w).mean(0), rtol=1e3 * EPS64)
        es = np.array([_energy_brute(x[i, 0], y[i, 0], w) for i in range(t)])
        np.testing.assert_allclose(out["per_init_energy_score"].sel(region=r).values[:, 0], es, rtol=1e3 * EPS64)
        np.testing.assert_allclose(out["energy_score"].sel(region=r).values, [es.mean()], rtol=1e3 * EPS64)
        # spread–skill with the finite-ensemble correction √((M + 1)/M), per region
        ss = np.sqrt(7 / 6) * np.sqrt(_masked_mean(x.var(2, ddof=1), w).mean(0) / _masked_mean(
            (x.mean(2) - y) ** 2, w).mean(0))
        np.testing.assert_allclose(out["spread_skill"].sel(region=r).values, ss, rtol=1e3 * EPS64)
    assert "rank_histogram" in out and out["rank_histogram"].sizes["rank"] == 7


# ---- zonal energy spectra --------------------------------------------------------------------------------
def test_single_zonal_wave_spectrum_one_peak_with_its_energy() -> None:
    """A cos(2π k₀ λ/360) on every circle: S[k₀] = C A²/2 (C = 2πR cos φ), zero elsewhere; the band mean is
    the cos φ-weighted mean of C A²/2 over the band's latitudes; Parseval Σ S = C·mean(f²)."""
    amp, k0 = 3.0, 5
    f = amp * np.cos(2 * np.pi * k0 * LON / 360.0)[None, :] * np.ones((32, 1))
    da = xr.DataArray(np.stack([f, 2 * f]), dims=("time", "latitude", "longitude"),
                      coords={"latitude": LAT, "longitude": LON})
    per_lat = zonal_energy_spectrum(da, band=None, mean_dims=())
    circ = 2 * np.pi * EARTH_RADIUS_M * np.cos(np.deg2rad(LAT))
    s0 = per_lat.isel(time=0).transpose("latitude", "wavenumber").values
    assert per_lat.sizes["wavenumber"] == 33 and int(np.argmax(s0[16])) == k0
    np.testing.assert_allclose(s0[:, k0], circ * amp**2 / 2, rtol=64 * EPS64)
    others = np.delete(s0, k0, axis=1)
    assert np.abs(others).max() <= 64 * EPS64 * s0[:, k0].max()
    np.testing.assert_allclose(s0.sum(1), circ * (f**2).mean(1), rtol=64 * EPS64)
    # band 30–60°, mean over time (amplitudes 1 and 2: mean energy factor (1 + 4)/2)
    band = zonal_energy_spectrum(da, band=(30.0, 60.0), mean_dims=("time",))
    sel = (LAT >= 30) & (LAT <= 60)
    cw = np.cos(np.deg2rad(LAT[sel]))
    want = (cw * circ[sel] * amp**2 / 2).sum() / cw.sum() * 2.5
    assert band.dims == ("wavenumber",) and float(band.sel(wavenumber=k0)) == pytest.approx(want, rel=64 * EPS64)
    assert float(band["wavelength"].sel(wavenumber=k0)) == pytest.approx(
        (cw * circ[sel]).sum() / cw.sum() / k0, rel=64 * EPS64)
    lazy = zonal_energy_spectrum(da.chunk({"time": 1}), band=(30.0, 60.0), mean_dims=("time",))
    np.testing.assert_allclose(lazy.values, band.values, rtol=64 * EPS64)
    with pytest.raises(ValueError, match="band"):
        zonal_energy_spectrum(da, band=(88.0, 89.0))


def test_cli_spectra_in_the_score_file(tmp_path: Path) -> None:
    lsm = _lsm(np.random.default_rng(7))
    store = _trend_store(tmp_path / "trend.zarr", lsm)
    fc = run_forecast(store, method="persistence", init=("2000-01-02", "2000-01-05"), every="24h",
                      fields=["geopotential_500"], leads_h=("24h", "48h"), out=tmp_path / "p.zarr")
    out = tmp_path / "scores"
    assert main(["evaluate", str(fc), "--truth", str(store), "--no-references", "--spectra", "--regions", "global",
                 "--out", str(out)]) == 0
    s = xr.load_dataset(out / "scores.nc")
    assert s["spectrum"].dims == ("method", "field", "prediction_timedelta", "wavenumber")
    assert s["truth_spectrum"].dims == ("field", "prediction_timedelta", "wavenumber")
    # persistence's spectrum is the truth's at the init: the truth's spectrum at valid times shifted by the lead
    truth = xr.open_zarr(store)["geopotential"].sel(level=500)
    inits = s["time"].values
    want = zonal_energy_spectrum(truth.sel(time=inits).astype(np.float64), band=(30.0, 60.0), mean_dims=("time",))
    np.testing.assert_allclose(s["spectrum"].sel({"method": "persistence", "field": "geopotential_500"}).isel(
        prediction_timedelta=0).values, want.values, rtol=1e3 * EPS64)
    assert main(["evaluate", str(fc), "--truth", str(store), "--regions", "europa", "--out", str(out)]) == 2


def test_mask_file_region_equals_the_same_box(tmp_path: Path) -> None:
    lat = xr.DataArray(LAT, dims="latitude", coords={"latitude": LAT})
    lon = xr.DataArray(LON, dims="longitude", coords={"longitude": LON})
    box = region_weights([parse_region("europe")], lat, lon).isel(region=0, drop=True)
    inside = (box > 0).astype(np.float64).rename("my_mask")
    inside.to_netcdf(tmp_path / "eu.nc")
    from_file = region_weights([parse_region(f"eu={tmp_path / 'eu.nc'}")], lat, lon)
    # a 0/1 mask gives the box's own weights (weights × 1.0): exact
    np.testing.assert_array_equal(from_file.isel(region=0).values, box.values)
    (inside * 2).to_netcdf(tmp_path / "bad.nc")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        region_weights([parse_region(f"bad={tmp_path / 'bad.nc'}")], lat, lon)


def test_forecast_scores_in_blocks_of_inits_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dask-backed forecast is scored block by block of initialisations (bounded memory); every score, the
    per-init means and the rank histogram (blocks weighted by their share of the weight, a truth gap included)
    equal those of the in-memory forecast in one pass."""
    import smoeweather.metrics.scores as S

    rng = np.random.default_rng(11)
    t = 6
    truth = xr.DataArray(rng.normal(size=(t, 1, 32, 64)), dims=DIMS, coords=_coords(t))
    fc = xr.concat([truth + rng.normal(0.3, 1.0, size=truth.shape) for _ in range(5)], "member")
    fc = fc.transpose("time", "prediction_timedelta", "member", "latitude", "longitude")
    truth[1, 0, :5] = np.nan  # a gap: that block carries less weight in the rank histogram
    clim = truth.mean("time") + 0.1
    rw = region_weights(parse_regions(["default"]), truth["latitude"], truth["longitude"], _lsm(rng))
    whole = forecast_scores(fc, "ensemble", truth, None, climatology=clim, regions=rw, per_init=True)
    chunked = fc.chunk({"time": 2})
    monkeypatch.setattr(S, "BLOCK_BYTES", 1.0)  # one time chunk per block
    assert S._init_blocks(chunked, "time") == [slice(0, 2), slice(2, 4), slice(4, 6)]
    blocked = forecast_scores(chunked, "ensemble", truth, None, climatology=clim, regions=rw, per_init=True)
    assert set(blocked) == set(whole)
    for k, v in whole.items():  # per-init sums are the same; only the means over blocks are re-associated
        np.testing.assert_allclose(blocked[k].transpose(*v.dims).values, v.values, rtol=1e3 * EPS64, atol=0.0,
                                   err_msg=k)
