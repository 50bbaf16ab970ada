"""WeatherBench 2's evaluation files, metric for metric: closed forms and the independent `scores` /
`properscoring` packages, on forecasts whose error varies between initialisations (so that WB2's
rmse_sqrt_before_time_avg and the square root of the time-mean mse differ); the ensemble dim by name; fsspec URLs;
WB2 climatology zarrs; missing forecast data and existing outputs refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import properscoring
import pytest
import scores.probability
import xarray as xr

from pipelines.prepare import write_store
from smoeweather.cli import main
from smoeweather.evaluate.run import evaluate
from smoeweather.metrics.weights import cell_area_weights

EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)
LAT = np.linspace(-78.75, 78.75, 8)
LON = np.arange(16) * 22.5
TIMES = np.arange(np.datetime64("2001-01-01", "ns"), np.datetime64("2001-01-21", "ns"), np.timedelta64(12, "h"))
LEADS = np.array([24, 48], "timedelta64[h]").astype("timedelta64[ns]")
INITS = TIMES[2:20:2]  # 9 initialisations, every valid time inside the truth


def _truth(rng: np.random.Generator) -> xr.Dataset:
    t = 280.0 + 5.0 * rng.normal(size=(len(TIMES), 1, 8, 16))
    return xr.Dataset({"temperature": (("time", "level", "latitude", "longitude"), t, {"units": "K"}),
                       "land_sea_mask": (("latitude", "longitude"), (rng.uniform(size=(8, 16)) > 0.5) * 1.0)},
                      coords={"time": TIMES, "level": [850], "latitude": LAT, "longitude": LON})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, xr.Dataset]:
    rng = np.random.default_rng(11)
    ds = _truth(rng)
    path = tmp_path_factory.mktemp("wb2") / "truth.zarr"
    write_store(lambda: ds.astype(np.float32), path, args={"test": "wb2"}, train_years=None, source="test",
                time_chunk=8, scheduler="synchronous", progress=False)
    return path, xr.open_zarr(path).load()


def _at_valid(truth: xr.Dataset) -> xr.DataArray:
    valid = INITS[:, None] + LEADS[None, :]
    t = truth["temperature"].sel(level=850, drop=True).sel(time=valid.ravel()).values.astype(np.float64)
    return xr.DataArray(t.reshape(len(INITS), len(LEADS), 8, 16), dims=("time", "prediction_timedelta", "latitude",
                                                                          "longitude"),
                        coords={"time": INITS, "prediction_timedelta": LEADS, "latitude": LAT, "longitude": LON})


def _store(da: xr.DataArray, path: Path, kind: str | None = None, **extra: xr.DataArray) -> Path:
    ds = xr.Dataset({"temperature": da.expand_dims(level=[850], axis=da.dims.index("latitude")), **{
        k: v.expand_dims(level=[850], axis=v.dims.index("latitude")) for k, v in extra.items()}})
    ds["temperature"].attrs["units"] = "K"
    if kind:
        ds.attrs["forecast_kind"] = kind
    ds.to_zarr(path, zarr_format=2)
    return path


def test_cell_area_weights_closed_forms() -> None:
    lat = xr.DataArray(LAT, dims="latitude")
    cosw = np.cos(np.deg2rad(LAT)) / np.cos(np.deg2rad(LAT)).mean()
    np.testing.assert_allclose(cell_area_weights(lat).values, cosw, rtol=16 * EPS64)  # no pole rows: cos φ
    poles = np.arange(-90, 90.1, 1.5)  # WB2's 1.5° grid: pole cells have area 1 − sin(89.25°), not cos 90° = 0
    w = cell_area_weights(xr.DataArray(poles, dims="latitude")).values
    raw = np.r_[1 - np.sin(np.deg2rad(89.25)), 2 * np.cos(np.deg2rad(poles[1:-1])) * np.sin(np.deg2rad(0.75)),
                1 - np.sin(np.deg2rad(89.25))]
    # sin φ₊ − sin φ₋ cancels near the poles: relative rounding up to ~2ε / (smallest cell area)
    np.testing.assert_allclose(w, raw / raw.mean(), rtol=4 * EPS64 / raw.min())
    assert w[0] > 0


def test_deterministic_rmse_before_and_after_time_mean(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    """An error c_i constant over the globe at init i: per-init RMSE |c_i|, mse mean c_i², RMSE √(mean c_i²)."""
    path, truth = world
    c = np.linspace(-2.0, 6.0, len(INITS))
    t = _at_valid(truth)
    fc = _store(t + xr.DataArray(c, dims="time", coords={"time": INITS}), tmp_path / "fc.zarr")
    s = evaluate({"model": fc}, path, out_dir=tmp_path / "out", references=False, regions=["global"])
    temporal = xr.load_dataset(tmp_path / "out" / "wb2" / "model" / "deterministic_temporal.nc")
    det = xr.load_dataset(tmp_path / "out" / "wb2" / "model" / "deterministic.nc")
    per_init = temporal["temperature"].sel(metric="rmse_sqrt_before_time_avg", level=850, region="global")
    tol = 64 * 300 * EPS32  # float32 storage of ~280 K values
    np.testing.assert_allclose(per_init.transpose("time", "lead_time").values, np.abs(c)[:, None] * [1, 1],
                               atol=tol)
    mse = det["temperature"].sel(metric="mse", level=850, region="global").values
    np.testing.assert_allclose(mse, np.mean(c**2) * np.ones(2), rtol=1e-5)
    rmse = s["rmse"].sel({"method": "model", "field": "temperature_850", "region": "global"}).values
    np.testing.assert_allclose(rmse**2, mse, rtol=1e-12)  # our headline RMSE is √ of WB2's time-mean mse
    assert np.all(per_init.mean("time").values < rmse - 0.5)  # Jensen: the two really differ here
    np.testing.assert_allclose(det["temperature"].sel(metric="bias", level=850, region="global").values,
                               c.mean(), atol=tol)
    np.testing.assert_allclose(det["temperature"].sel(metric="mae", level=850, region="global").values,
                               np.abs(c).mean(), atol=tol)
    assert set(det["metric"].values) == {"mse", "bias", "mae"}  # no climatology: no acc


def _ensemble(world: tuple[Path, xr.Dataset], m: int = 5, seed: int = 3) -> tuple[xr.DataArray, xr.DataArray]:
    t = _at_valid(world[1])
    rng = np.random.default_rng(seed)
    scale = xr.DataArray(np.linspace(0.5, 3.0, len(INITS)), dims="time", coords={"time": INITS})
    noise = xr.DataArray(rng.normal(size=(m, *t.shape)), dims=("realization", *t.dims))
    return (t + scale * noise + 0.3).transpose("time", "prediction_timedelta", "realization", ...), t


def test_probabilistic_and_binary_against_scores(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    """A 5-member ensemble in WB2's own layout (dim ``realization``, after the lead): crps, its spread and
    skill, ensemble-mean MSEs, variance, Brier, debiased Brier and ignorance at climatological quantiles."""
    path, truth = world
    ens, t = _ensemble(world)
    fc = _store(ens, tmp_path / "ens.zarr")
    evaluate({"ens": fc}, path, climatology=path, out_dir=tmp_path / "out", references=False, regions=["global"],
             binary_quantiles=(0.25, 0.75))
    prob = xr.load_dataset(tmp_path / "out" / "wb2" / "ens" / "probabilistic.nc")["temperature"].sel(
        level=850, region="global")
    w = cell_area_weights(xr.DataArray(LAT, dims="latitude", coords={"latitude": LAT}))

    def amean_tmean(x: xr.DataArray) -> np.ndarray:
        m = x.weighted(w).mean(["latitude", "longitude"]).mean("time")
        return m.transpose(*[d for d in ("quantile", "prediction_timedelta") if d in m.dims]).values

    fair = scores.probability.crps_for_ensemble(ens, t, "realization", method="fair", preserve_dims=list(t.dims))
    np.testing.assert_allclose(prob.sel(metric="crps").values, amean_tmean(fair), rtol=1e-10)
    skill = abs(ens - t).mean("realization")
    np.testing.assert_allclose(prob.sel(metric="crps_skill").values, amean_tmean(skill), rtol=1e-10)
    pair = abs(ens - ens.rename(realization="r2")).sum(["realization", "r2"]) / (5 * 4)
    np.testing.assert_allclose(prob.sel(metric="crps_spread").values, amean_tmean(pair), rtol=1e-10)
    mean, var = ens.mean("realization"), ens.var("realization", ddof=1)
    np.testing.assert_allclose(prob.sel(metric="ensemble_mean_mse").values, amean_tmean((mean - t) ** 2),
                               rtol=1e-10)
    np.testing.assert_allclose(prob.sel(metric="debiased_ensemble_mean_mse").values,
                               amean_tmean((mean - t) ** 2 - var / 5), rtol=1e-10)
    np.testing.assert_allclose(prob.sel(metric="ensemble_variance").values, amean_tmean(var), rtol=1e-10)
    binary = xr.load_dataset(tmp_path / "out" / "wb2" / "ens" / "ensemble_binary.nc")["temperature"].sel(
        level=850, region="global")
    assert binary["quantile"].values.tolist() == [0.25, 0.75]
    from smoeweather.forecast.climatology import doy_quantiles
    from smoeweather.forecast.reference import training_fields

    train = next(iter(training_fields(str(path), [("temperature", 850)]).values()))
    vt = xr.DataArray(INITS[:, None] + LEADS[None, :], dims=("time", "prediction_timedelta"),
                      coords={"time": INITS, "prediction_timedelta": LEADS})
    thr = doy_quantiles(train, np.array([0.25, 0.75]), vt)
    event = (t > thr).astype(float)
    p = (ens > thr).mean("realization")
    bs = scores.probability.brier_score(p, event, preserve_dims=list(event.dims))
    np.testing.assert_allclose(binary.sel(metric="brier_score").transpose("quantile", "lead_time").values,
                               amean_tmean(bs),
                               rtol=1e-10)
    np.testing.assert_allclose(binary.sel(metric="debiased_brier_score").transpose("quantile", "lead_time").values,
                               amean_tmean(bs - p * (1 - p) / 4), rtol=1e-10)
    with np.errstate(divide="ignore"):
        ign = -np.log(xr.where(event > 0.5, p, 1 - p))
    np.testing.assert_allclose(binary.sel(metric="ignorance_score").transpose("quantile", "lead_time").values,
                               amean_tmean(ign), rtol=1e-10)


def test_wb2_files_and_our_table_from_one_computation(world: tuple[Path, xr.Dataset], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One engine: each per-initialisation term is computed once (the members sorted once per field, no
    per-point CRPS estimator called) and WB2's files and our table come from the very same arrays: the WB2
    file's per-init mse IS our per_init_mse, its crps per init our per_init_crps, bit for bit."""
    import smoeweather.metrics.probabilistic as P
    from smoeweather.metrics import wb2
    from smoeweather.metrics.scores import field_terms, table_scores

    path, _ = world
    ens, t = _ensemble(world)
    fc = _store(ens, tmp_path / "ens.zarr")
    sorts = []
    spread = P.pairwise_spread
    monkeypatch.setattr(P, "pairwise_spread", lambda *a, **k: sorts.append(1) or spread(*a, **k))
    monkeypatch.setattr(P, "crps_ensemble", lambda *a, **k: pytest.fail("a second CRPS computation"))
    s = evaluate({"ens": fc}, path, climatology=path, out_dir=tmp_path / "out", references=False,
                 regions=["global", "tropics"], binary_quantiles=(0.5,))
    assert len(sorts) == 1  # one field, one block: the members sorted once
    one = {"method": "ens", "field": "temperature_850"}
    for ours, theirs in (("per_init_mse", "wb2_mse"), ("per_init_crps", "wb2_crps"), ("per_init_acc", "wb2_acc"),
                         ("per_init_debiased_ensemble_mean_mse", "wb2_debiased_ensemble_mean_mse")):
        np.testing.assert_array_equal(s[theirs].sel(one).values, s[ours].sel(one).values, err_msg=ours)
    np.testing.assert_array_equal(s["wb2_ensemble_mean_mse"].sel(one).values, s["per_init_mse"].sel(one).values)
    out = tmp_path / "out" / "wb2" / "ens"
    temporal = xr.load_dataset(out / "deterministic_temporal.nc")["temperature"].sel(level=850, metric="mse")
    mine = s["per_init_mse"].sel(one)
    np.testing.assert_array_equal(temporal.transpose("region", "lead_time", "time").values,
                                  mine.transpose("region", "prediction_timedelta", "time").values)
    prob = xr.load_dataset(out / "probabilistic.nc")["temperature"].sel(level=850)
    for metric, table in (("crps", "crps"), ("debiased_ensemble_mean_mse", "debiased_ensemble_mean_mse")):
        np.testing.assert_array_equal(prob.sel(metric=metric).transpose("region", "lead_time").values,
                                      s[table].sel(one).transpose("region", "prediction_timedelta").values)
    # the engine's own arrays: WB2's metric IS the table's per-init term (the same object, not a copy)
    w = cell_area_weights(xr.DataArray(LAT, dims="latitude", coords={"latitude": LAT}))
    terms = field_terms(ens.rename(realization="member"), "ensemble", t, w)
    table = table_scores(terms, per_init=True, regions=False)
    named = wb2.metric_terms(terms.per_init, "ensemble")
    assert named["mse"] is named["ensemble_mean_mse"] is terms.per_init["mse"]
    assert named["crps"] is terms.per_init["crps"]
    np.testing.assert_array_equal(table["per_init_crps"].values, named["crps"].squeeze("region").values)


def test_gaussian_files_against_properscoring(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    path, truth = world
    t = _at_valid(truth)
    rng = np.random.default_rng(5)
    mu = t + rng.normal(0.5, 1.0, size=t.shape)
    sigma = xr.full_like(t, 1.0) * xr.DataArray(np.linspace(0.7, 2.0, len(INITS)), dims="time",
                                                coords={"time": INITS})
    fc = _store(mu, tmp_path / "g.zarr", "gaussian", temperature_std=sigma)
    evaluate({"emos": fc}, path, climatology=path, out_dir=tmp_path / "out", references=False, regions=["global"],
             binary_quantiles=(0.5,))
    w = cell_area_weights(xr.DataArray(LAT, dims="latitude", coords={"latitude": LAT}))
    gp = xr.load_dataset(tmp_path / "out" / "wb2" / "emos" / "gaussian_probabilistic.nc")["temperature"].sel(
        level=850, region="global")
    crps = xr.DataArray(properscoring.crps_gaussian(t.values, mu.values, sigma.values), dims=t.dims)
    want = crps.weighted(w.drop_vars("latitude")).mean(["latitude", "longitude"]).mean("time").values
    np.testing.assert_allclose(gp.sel(metric="crps").values, want, rtol=1e-10)
    assert (tmp_path / "out" / "wb2" / "emos" / "gaussian_binary.nc").is_file()
    assert not (tmp_path / "out" / "wb2" / "emos" / "probabilistic.nc").exists()


def test_realization_dim_cli_memory_url_and_storage_options(world: tuple[Path, xr.Dataset], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """WB2's ensemble layout at an fsspec URL (memory://), scored through the CLI with --storage-options."""
    path, _ = world
    ens, _ = _ensemble(world, m=3)
    ds = xr.Dataset({"temperature": ens.expand_dims(level=[850], axis=3)})
    ds["temperature"].attrs["units"] = "K"
    url = f"memory://wb2-eval-{tmp_path.name}/ens.zarr"
    ds.chunk({"realization": 1, "time": 4}).to_zarr(url, zarr_format=2)  # chunked along the members too
    out = tmp_path / "scores"
    assert main(["evaluate", f"ifs={url}", "--truth", str(path), "--no-references", "--regions", "global",
                 "--storage-options", "{}", "--quiet", "--out", str(out)]) == 0
    prob = xr.load_dataset(out / "wb2" / "ifs" / "probabilistic.nc")
    assert prob.attrs["ensemble_size"] == 3 and np.isfinite(prob["temperature"]).all()
    assert json.loads((out / "scores.json").read_text())["provenance"]["forecasts"]["ifs"] == url
    assert "evaluate: scoring" not in capsys.readouterr().err  # --quiet
    assert main(["evaluate", f"ifs={url}", "--truth", str(path), "--storage-options", "[1]", "--out",
                 str(tmp_path / "x")]) == 2
    assert "--storage-options must be a JSON object" in capsys.readouterr().err


def test_attribute_contradicting_the_data_is_refused(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    ens, _ = _ensemble(world, m=3)
    fc = _store(ens.rename(realization="member"), tmp_path / "bad.zarr", kind="deterministic")
    with pytest.raises(ValueError, match=r"bad.zarr.*forecast_kind='deterministic' contradicts the data.*ensemble"):
        evaluate({"bad": fc}, world[0], references=False)
    two = _store(ens.rename(realization="number").expand_dims(member=[0], axis=3), tmp_path / "two.zarr")
    with pytest.raises(ValueError, match=r"several dims could be its ensemble.*--ensemble-dim"):
        evaluate({"two": two}, world[0], references=False)


def test_missing_forecast_refused_unless_allowed(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    path, truth = world
    t = _at_valid(truth)
    fc = t + 1.0
    fc[:3] = np.nan  # a lost chunk: the first three initialisations
    store = _store(fc, tmp_path / "holes.zarr")
    with pytest.raises(ValueError, match=r"holes.zarr: temperature_850 misses values .* 3 initialisations.*"
                                         r"--allow-missing"):
        evaluate({"m": store}, path, references=False)
    s = evaluate({"m": store}, path, references=False, allow_missing=True)
    assert s["n_scored"].sel({"method": "m"}).values.tolist() == [[len(INITS) - 3] * 2]
    assert s["n_time"].values.tolist() == [[len(INITS)] * 2]
    np.testing.assert_allclose(s["rmse"].values, 1.0, rtol=1e-5)
    assert "incomplete_not_scored" in json.loads(s.attrs["provenance"])


def test_existing_output_refused_then_replaced_whole(world: tuple[Path, xr.Dataset], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, truth = world
    fc = _store(_at_valid(truth) + 2.0, tmp_path / "fc.zarr")
    out = tmp_path / "scores"
    out.mkdir()
    (out / "stale.nc").write_text("an earlier run's file")
    argv = ["evaluate", f"a={fc}", "--truth", str(path), "--no-references", "--quiet", "--out", str(out)]
    assert main(argv) == 2
    assert "already exists (pass --overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["scores.json", "scores.md", "scores.nc", "wb2"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_wb2_climatology_zarr_for_acc_and_thresholds(world: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    """A climatology in WB2's layout (dayofyear 1..366, hour; ``<var>`` and ``<var>_quantile``): ACC against it
    and Brier thresholds from it, selected by the calendar day of year and hour of the valid time."""
    path, truth = world
    t = _at_valid(truth)
    rng = np.random.default_rng(9)
    mean = 280.0 + rng.normal(size=(366, 2, 1, 8, 16))
    q = np.stack([mean - 1.0, mean + 1.0], axis=2)
    k = {"units": "K"}  # compared with the truth's units (WB2's climatologies carry ERA5's)
    clim = xr.Dataset({"temperature": (("dayofyear", "hour", "level", "latitude", "longitude"), mean, k),
                       "temperature_quantile": (("dayofyear", "hour", "quantile", "level", "latitude", "longitude"),
                                                q, k)},
                      coords={"dayofyear": np.arange(1, 367), "hour": [0, 12], "quantile": [0.2, 0.8],
                              "level": [850], "latitude": LAT, "longitude": LON})
    clim.to_zarr(tmp_path / "clim.zarr", zarr_format=2)
    fc = _store(t + rng.normal(size=t.shape), tmp_path / "fc.zarr")
    s = evaluate({"m": fc}, path, climatology=tmp_path / "clim.zarr", out_dir=tmp_path / "out", references=True,
                 regions=["global"], binary_quantiles=(0.2,))
    vt = INITS[:, None] + LEADS[None, :]
    doy = xr.DataArray(vt).dt.dayofyear.values
    hour = xr.DataArray(vt).dt.hour.values // 12
    c = mean[doy - 1, hour, 0]  # (init, lead, lat, lon)
    w = cell_area_weights(xr.DataArray(LAT, dims="latitude")).values[:, None]
    f = fc_values = xr.open_zarr(fc)["temperature"].sel(level=850).values
    fa, oa = f - c, t.values - c
    acc = (w * fa * oa).mean((-2, -1)) / np.sqrt((w * fa**2).mean((-2, -1)) * (w * oa**2).mean((-2, -1)))
    det = xr.load_dataset(tmp_path / "out" / "wb2" / "m" / "deterministic.nc")["temperature"]
    np.testing.assert_allclose(det.sel(metric="acc", level=850, region="global").values, acc.mean(0), rtol=1e-10)
    assert "climatology" in s["method"].values.tolist()
    del fc_values


def test_data_prepare_storage_options_on_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`smoe data prepare era5 URL --storage-options JSON`: the options reach fsspec (memory:// takes none, so
    an empty object works and a non-object is refused by name)."""
    from fake_layouts import wb2_dataset, write_wb2_zarr

    url = f"memory://prepare-so-{tmp_path.name}/wb2.zarr"
    write_wb2_zarr(url, times=8)
    out = tmp_path / "era5.zarr"
    argv = ["data", "prepare", "era5", "--source", url, "--out", str(out), "--native-grid", "--quiet", "--variables",
            "temperature", "--storage-options"]
    assert main([*argv, "[]"]) == 2
    assert "--storage-options must be a JSON object" in capsys.readouterr().err
    assert main([*argv, "{}"]) == 0
    np.testing.assert_array_equal(xr.open_zarr(out)["temperature"].values,  # copied from the zarr: exact
                                  wb2_dataset(times=8)["temperature"].values)


def test_wb2_spectrum_recipe_closed_forms() -> None:
    """At one latitude WB2's recipe (interpolation to common frequencies) equals the equal-wavenumber one, and a
    single wave A cos(6λ) keeps its closed-form peak C A²/2; bad recipes and one-longitude fields are refused."""
    from smoeweather.metrics.spectra import EARTH_RADIUS_M, zonal_energy_spectrum

    lon = np.arange(128) * 360 / 128
    lat = np.array([40.0])
    field = xr.DataArray(np.cos(np.deg2rad(lon) * 6)[None, :] * np.ones((1, 1)), dims=("latitude", "longitude"),
                         coords={"latitude": lat, "longitude": lon})
    a = zonal_energy_spectrum(field, band=(30, 60))
    b = zonal_energy_spectrum(field, band=(30, 60), recipe="wb2")
    # float64 FFT and a linear interpolation at the grid's own frequencies: rounding of ~nk terms
    tol = 64 * a.sizes["wavenumber"] * float(np.finfo(np.float64).eps)
    np.testing.assert_allclose(b.values, a.values, rtol=tol, atol=tol * float(a.max()))
    circ = 2 * np.pi * EARTH_RADIUS_M * np.cos(np.deg2rad(40.0))
    assert float(b.max()) == pytest.approx(circ / 2, rel=1e-12)  # C A²/2 at the wave's frequency
    with pytest.raises(ValueError, match="--spectra-recipe"):
        zonal_energy_spectrum(field, recipe="other")
    with pytest.raises(ValueError, match="--spectra: .*1 longitude"):
        zonal_energy_spectrum(field.isel(longitude=[0]))
