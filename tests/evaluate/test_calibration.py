"""Calibration a forecaster can see: Brier score (against `scores`), Brier skill score, reliability table and PIT
histograms (closed forms), scored by `smoe evaluate` for probability, Gaussian and ensemble forecasts, and drawn
by `smoe plot reliability` / `smoe plot pit`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scores.probability
import xarray as xr
from scipy import stats

from pipelines.prepare import write_store
from smoeweather.cli import main
from smoeweather.evaluate.run import evaluate
from smoeweather.metrics import calibration as cal
from smoeweather.metrics.weights import cell_area_weights

LAT = np.linspace(-78.75, 78.75, 8)
LON = np.arange(16) * 22.5
TIMES = np.arange(np.datetime64("2001-01-01", "ns"), np.datetime64("2001-02-10", "ns"), np.timedelta64(12, "h"))
LEADS = np.array([24], "timedelta64[h]").astype("timedelta64[ns]")
INITS = TIMES[40:76:2]
THRESHOLDS = [278.0, 282.0]


def test_brier_matches_scores_and_reliability_closed_form() -> None:
    rng = np.random.default_rng(0)
    p = xr.DataArray(rng.uniform(size=(50, 8, 16)), dims=("time", "latitude", "longitude"))
    o = xr.DataArray((rng.uniform(size=(50, 8, 16)) < p.values) * 1.0, dims=p.dims)
    w = xr.DataArray(np.ones((8, 16)), dims=("latitude", "longitude"))
    ours = cal.brier_terms(p, o, w).mean("time")
    theirs = scores.probability.brier_score(p, o, reduce_dims=["time", "latitude", "longitude"])
    assert float(ours) == pytest.approx(float(theirs), rel=1e-12)
    # reliability: 4 cases at p = 0.05 (1 event), 2 at p = 0.95 (2 events)
    pp = xr.DataArray([0.05, 0.05, 0.05, 0.05, 0.95, 0.95], dims="case")
    oo = xr.DataArray([1.0, 0, 0, 0, 1, 1], dims="case")
    table = cal.reliability_table(pp, oo, ["case"])
    assert table["count"].values.tolist() == [4, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    np.testing.assert_allclose(table["observed_frequency"].values[[0, 9]], [0.25, 1.0])
    np.testing.assert_allclose(table["forecast_probability"].values[[0, 9]], [0.05, 0.95])
    assert float(cal.brier_skill(xr.DataArray(0.1), xr.DataArray(0.2))) == pytest.approx(0.5)


def test_pit_and_exceedance_closed_forms() -> None:
    mu = xr.DataArray(np.zeros((100,)), dims="case")
    sigma = xr.ones_like(mu)
    truth = xr.DataArray(stats.norm.ppf((np.arange(100) + 0.5) / 100), dims="case")  # PIT exactly uniform
    hist = cal.pit_histogram(cal.pit_values(mu, "gaussian", truth, sigma), ["case"])
    np.testing.assert_allclose(hist.values, 0.1, rtol=1e-12)
    thr = xr.DataArray([-1.0, 0.0, 1.0], dims="threshold")
    p = cal.exceedance_probability(mu, "gaussian", thr, sigma)
    np.testing.assert_allclose(p.isel(case=0).values, 1 - stats.norm.cdf([-1, 0, 1]), rtol=1e-12)
    ens = xr.DataArray([[-2.0, 0.5, 3.0]], dims=("case", "member"))
    np.testing.assert_allclose(cal.exceedance_probability(ens, "ensemble", thr).values, [[2 / 3, 2 / 3, 1 / 3]])
    below = cal.exceedance_probability(xr.DataArray([0.2]), "probability", thr, relative_to="less_than")
    assert float(below[0]) == pytest.approx(0.8)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A truth store, a 6-member ensemble, its Gaussian fit (mean, sd) and that Gaussian's probabilities of
    exceeding 278 and 282 K as an IMPROVER-style probability store."""
    tmp = tmp_path_factory.mktemp("calibration")
    rng = np.random.default_rng(4)
    t = 280.0 + 3.0 * rng.normal(size=(len(TIMES), 1, 8, 16))
    truth = xr.Dataset({"temperature": (("time", "level", "latitude", "longitude"), t.astype(np.float32),
                                        {"units": "K"})},
                       coords={"time": TIMES, "level": [850], "latitude": LAT, "longitude": LON})
    write_store(lambda: truth, tmp / "truth.zarr", args={"test": "cal"}, train_years=None, source="test",
                time_chunk=8, scheduler="synchronous", progress=False)
    valid = INITS[:, None] + LEADS[None, :]
    y = truth["temperature"].sel(time=valid.ravel()).values.astype(np.float64).reshape(len(INITS), 1, 1, 8, 16)
    members = y[:, :, None] + rng.normal(0.5, 2.0, size=(len(INITS), 1, 6, 1, 8, 16))
    coords = {"time": INITS, "prediction_timedelta": LEADS, "level": [850], "latitude": LAT, "longitude": LON}
    ens = xr.Dataset({"temperature": (("time", "prediction_timedelta", "member", "level", "latitude", "longitude"),
                                      members, {"units": "K"})}, coords=coords)
    ens.chunk({"member": 2, "time": 5}).to_zarr(tmp / "ens.zarr", zarr_format=2)  # chunks along every dim
    mu, sd = members.mean(2), members.std(2, ddof=1)
    dims = ("time", "prediction_timedelta", "level", "latitude", "longitude")
    xr.Dataset({"temperature": (dims, mu, {"units": "K"}), "temperature_std": (dims, sd, {"units": "K"})},
               coords=coords, attrs={"forecast_kind": "gaussian"}).to_zarr(tmp / "gauss.zarr", zarr_format=2)
    thr = np.array(THRESHOLDS)
    prob = 1 - stats.norm.cdf((thr[None, None, :, None, None, None] - mu[:, :, None]) / sd[:, :, None])
    xr.Dataset({"temperature": (("time", "prediction_timedelta", "threshold", "level", "latitude", "longitude"), prob,
                                {"units": "1", "spp__relative_to_threshold": "greater_than"})},
               coords={**coords, "threshold": ("threshold", thr, {"units": "K"})}).to_zarr(tmp / "prob.zarr",
                                                                                          zarr_format=2)
    return {"truth": tmp / "truth.zarr", "ens": tmp / "ens.zarr", "gauss": tmp / "gauss.zarr",
            "prob": tmp / "prob.zarr", "y": y, "members": members}  # type: ignore[dict-item]


def test_evaluate_brier_bss_reliability_pit(stores: dict, tmp_path: Path) -> None:
    out = tmp_path / "scores"
    s = evaluate({"raw": stores["ens"], "emos": stores["gauss"], "prob": stores["prob"]}, stores["truth"],
                 climatology=stores["truth"], out_dir=out, references=False, regions=["global"])
    one = {"region": "global", "field": "temperature_850"}
    bs = s["brier_score"].sel(one).isel(prediction_timedelta=0)
    # the probability store holds the Gaussian's own probabilities: identical Brier scores
    np.testing.assert_allclose(bs.sel({"method": "prob"}).values, bs.sel({"method": "emos"}).values, rtol=1e-12)
    # the raw ensemble's Brier score by hand (area weights, then the mean over initialisations)
    y, members = stores["y"][:, 0, 0], stores["members"][:, 0, :, 0]
    w = cell_area_weights(xr.DataArray(LAT, dims="latitude")).values[:, None] * np.ones(16)
    for i, t in enumerate(THRESHOLDS):
        p = (members > t).mean(1)
        want = (((p - (y > t)) ** 2 * w).sum((-2, -1)) / w.sum()).mean()
        assert float(bs.sel({"method": "raw"}).isel(threshold=i)) == pytest.approx(want, rel=1e-12)
    bss = s["brier_skill_score"].sel(one).isel(prediction_timedelta=0)
    np.testing.assert_allclose(bss.sel({"reference": "raw"}).values, 1 - bs.values / bs.sel({"method": "raw"}).values,
                               rtol=1e-12)
    clim = s["brier_score_climatology"].sel(one).isel(prediction_timedelta=0)
    np.testing.assert_allclose(bss.sel({"reference": "climatology"}).values, 1 - bs.values / clim.values, rtol=1e-12)
    counts = s["reliability_count"].sel({"method": "raw", "field": "temperature_850"}).isel(prediction_timedelta=0)
    assert (counts.sum("probability_bin") == len(INITS) * 8 * 16).all()
    pit = s["pit_histogram"].sel({"method": "emos", "field": "temperature_850"}).isel(prediction_timedelta=0)
    assert float(pit.sum()) == pytest.approx(1.0) and np.isnan(s["pit_histogram"].sel({"method": "raw"})).all()
    assert "brier_score" in (out / "scores.md").read_text()


def test_probability_store_below_with_float32_thresholds_and_the_sense_on_the_coordinate(stores: dict,
                                                                                          tmp_path: Path) -> None:
    """An IMPROVER-style store of P(Y <= t), spp__relative_to_threshold only on its float32 threshold coordinate
    (278.3 stored as 278.29998779): scored as the event --thresholds 278.3 names (not as a second threshold, not
    as P(Y > t)), with the Brier score of the Gaussian it was computed from."""
    g = xr.open_zarr(stores["gauss"]).load()
    t = np.array([278.3, 282.0])
    below = stats.norm.cdf((t[None, None, :, None, None, None] - g["temperature"].values[:, :, None])
                           / g["temperature_std"].values[:, :, None])
    coords = {d: g[d] for d in ("time", "prediction_timedelta", "level", "latitude", "longitude")}
    sense = {"units": "K", "spp__relative_to_threshold": "less_than"}
    xr.Dataset({"temperature": (("time", "prediction_timedelta", "threshold", "level", "latitude", "longitude"), below,
                                {"units": "1"})},
               coords={**coords, "threshold": ("threshold", t.astype(np.float32), sense)}
               ).to_zarr(tmp_path / "below.zarr", zarr_format=2)
    s = evaluate({"emos": stores["gauss"], "below": tmp_path / "below.zarr"}, stores["truth"], references=False,
                 thresholds={"temperature_850": t.tolist()})
    bs = s["brier_score"].sel(field="temperature_850").isel(prediction_timedelta=0)
    assert bs.sizes["threshold"] == 2 and np.isfinite(bs.values).all()
    np.testing.assert_allclose(bs.sel({"method": "below"}).values, bs.sel({"method": "emos"}).values, rtol=1e-12)


@pytest.mark.filterwarnings("ignore:.*has no land_sea_mask:UserWarning")  # expected: the test's truth has none
def test_cli_thresholds_and_calibration_plots(stores: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "scores"
    assert main(["evaluate", f"raw={stores['ens']}", f"emos={stores['gauss']}", "--truth", str(stores["truth"]),
                 "--climatology", str(stores["truth"]), "--thresholds", "temperature_850=279", "--no-references",
                 "--quiet", "--out", str(out)]) == 0
    s = xr.load_dataset(out / "scores.nc")
    assert s["threshold"].values.tolist() == [279.0] and "climatology" in s["reference"].values
    figs = tmp_path / "figs"
    assert main(["plot", "reliability", str(out / "scores.nc"), "--out", str(figs)]) == 0
    assert main(["plot", "pit", str(out / "scores.nc"), "--out", str(figs)]) == 0
    assert sorted(p.name for p in figs.iterdir()) == ["pit_temperature_850.png",
                                                      "reliability_temperature_850_gt_279.png"]
    capsys.readouterr()
    assert main(["evaluate", f"raw={stores['ens']}", "--truth", str(stores["truth"]), "--thresholds", "t850=x",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "--thresholds 't850=x'" in capsys.readouterr().err


def test_reliability_plot_with_a_method_missing_at_one_lead(tmp_path: Path) -> None:
    """A network of one lead beside an ensemble of two: its empty panel is skipped, the figure is drawn; a field
    without events gets no figure."""
    from smoeweather.plotting.calibration import plot_pit, plot_reliability

    leads = np.array([24, 48], dtype="timedelta64[h]").astype("timedelta64[ns]")
    bins = (np.arange(10) + 0.5) / 10
    count = np.ones((2, 1, 1, 2, 10))
    count[1, ..., 0, :] = np.nan  # method "net" has no forecast at 24 h
    count = np.concatenate([count, np.full_like(count, np.nan)], axis=1)  # field "t": no event scored
    coords = {"method": ["raw", "net"], "field": ["z", "t"], "threshold": [1.0], "prediction_timedelta": leads,
              "probability_bin": bins}
    dims = tuple(coords)
    ds = xr.Dataset({"reliability_forecast_probability": (dims, np.broadcast_to(bins, count.shape) * count),
                     "reliability_observed_frequency": (dims, np.broadcast_to(bins, count.shape) * count),
                     "reliability_count": (dims, count), "units": ("field", ["m", "K"])}, coords=coords)
    ds.to_netcdf(tmp_path / "scores.nc")
    paths = plot_reliability(tmp_path / "scores.nc", tmp_path / "figs")
    assert [p.name for p in paths] == ["reliability_z_gt_1.png"] and paths[0].stat().st_size > 0
    pit = np.full((2, 2, 2, 10), 0.1)
    pit[1, :, 0] = 0.0  # "net": an empty histogram at 24 h
    xr.Dataset({"pit_histogram": (("method", "field", "prediction_timedelta", "pit_bin"), pit)},
               coords={**{k: coords[k] for k in ("method", "field", "prediction_timedelta")},
                       "pit_bin": bins}).to_netcdf(tmp_path / "pit.nc")
    assert [p.name for p in plot_pit(tmp_path / "pit.nc", tmp_path / "figs")] == ["pit_z.png", "pit_t.png"]
