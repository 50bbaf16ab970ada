"""``smoe evaluate`` of site (station) forecasts: the raw ensemble of a site table (ensembleBMA ``srft`` layout)
or CF timeSeries file, and the stores ``smoe postprocess apply`` writes on sites, scored against the stations'
observations over the (initialisation, station) cases: CRPS against ``properscoring`` case by case, the Brier
score in closed form, the Gaussian CRPS and PIT, the CLI end to end, station matching and the refusals; the UWME
figure of ``benchmarks/results/postprocess_calibration.json`` on the real table (skipped without ../shared/data)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import properscoring
import pytest
import xarray as xr
from conftest import REPO

from smoeweather.cli import main
from smoeweather.data.forecast_stores import gaussian_dataset, write_store
from smoeweather.data.sites import read_site_table, write_sites
from smoeweather.evaluate.run import evaluate

MEMBERS = ["CMCG", "ETA", "GFS", "UKMO"]
VAR = "2m_temperature"
EPS64, EPS32 = float(np.finfo(np.float64).eps), float(np.finfo(np.float32).eps)
TOL = 1e3 * EPS64  # means over a few hundred float64 cases, in another order


def srft_table(path: Path, n_sites: int = 5, n_days: int = 30, seed: int = 0, first: int = 0, drop: int = 4
               ) -> pd.DataFrame:
    """A site table in ensembleBMA's exact ``srft`` layout (member columns, observation, integer YYYYMMDDHH
    valid date, station id with a trailing blank, latitude, longitude, elevation, type); ``drop`` rows missing.
    Members are biased and under-dispersed, so post-processing has something to fix."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(first, first + n_sites):
        for d in pd.date_range("2004-01-01", periods=n_days, freq="D"):
            obs = 271.0 + 2.0 * s + 4.0 * np.sin(d.day_of_year / 4.0 + s) + rng.normal(0.0, 1.5)
            x = obs + 1.0 + rng.normal(0.0, 0.6, len(MEMBERS))
            rows.append([*x, obs, int(d.strftime("%Y%m%d00")), f"K{s:03d} ", 45.0 + s, -120.0 - s, 10.0 * s, "SA"])
    df = pd.DataFrame(rows, columns=[*MEMBERS, "observation", "date", "station", "latitude", "longitude",
                                     "elevation", "type"])
    df = df.drop(index=rng.choice(len(df), size=drop, replace=False)).reset_index(drop=True)
    df.to_csv(path, index=False)
    return df


@pytest.fixture
def table(tmp_path: Path) -> Path:
    srft_table(tmp_path / "t.csv")
    return tmp_path / "t.csv"


def _cases(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(members (case, M), observation (case,)) of the table's complete rows."""
    fc, obs = read_site_table(path)
    x = fc[VAR].isel(prediction_timedelta=0).transpose("time", "site", "member").values
    y = obs[VAR].sel(time=fc["time"].values + fc["prediction_timedelta"].values[0]).values
    ok = np.isfinite(x).all(-1) & np.isfinite(y)
    return x[ok], y[ok]


def test_raw_ensemble_scores_agree_with_properscoring_case_by_case(table: Path, tmp_path: Path) -> None:
    """CRPS (ECDF: properscoring per case, averaged; fair: minus the members' pairwise term), RMSE and bias of
    the ensemble mean, and the Brier score of the fraction of members above t; the same from the CF file."""
    x, y = _cases(table)
    t = 273.15
    s = evaluate({"raw": table}, table, thresholds={VAR: [t]})
    one = {"method": "raw", "field": VAR}
    assert int(s["n_cases"].item()) == len(y) and int(s["n_sites"].item()) == 5
    ecdf = properscoring.crps_ensemble(y, x)
    assert s["crps_ecdf"].sel(one).item() == pytest.approx(ecdf.mean(), rel=TOL)
    m = x.shape[1]
    pair = np.abs(x[:, :, None] - x[:, None, :]).sum((1, 2))
    fair = ecdf + pair * (1.0 / (2 * m * m) - 1.0 / (2 * m * (m - 1)))
    assert s["crps"].sel(one).item() == pytest.approx(fair.mean(), rel=TOL)
    err = x.mean(1) - y
    assert s["rmse"].sel(one).item() == pytest.approx(np.sqrt((err**2).mean()), rel=TOL)
    assert s["bias"].sel(one).item() == pytest.approx(err.mean(), rel=TOL, abs=TOL)
    p, o = (x > t).mean(1), (y > t).astype(float)
    assert s["brier_score"].sel(one).item() == pytest.approx(((p - o) ** 2).mean(), rel=TOL)
    assert s["rank_histogram"].sel(one).sum().item() == pytest.approx(1.0, rel=TOL)
    assert int(s["reliability_count"].sel(one).sum()) == len(y)
    # the same ensemble as a CF timeSeries file (raw and truth in one file)
    fc, obs = read_site_table(table)
    write_sites(fc, obs, tmp_path / "t.nc")
    s2 = evaluate({"raw": tmp_path / "t.nc"}, tmp_path / "t.nc", thresholds={VAR: [t]})
    for k in ("crps", "crps_ecdf", "rmse", "brier_score"):
        np.testing.assert_allclose(s2[k].values, s[k].values, rtol=TOL, err_msg=k)


def _gaussian_store(path: Path, table: Path, mu_of: object, sigma: float) -> Path:
    """A μ/σ site store on the table's stations, inits and lead; μ = ``mu_of``(observation)."""
    fc, obs = read_site_table(table)
    y = obs[VAR].sel(time=fc["time"].values + fc["prediction_timedelta"].values[0])
    mu = xr.full_like(fc[VAR].isel(member=0, drop=True), np.nan)
    mu.values[:, 0] = mu_of(y.values)  # type: ignore[operator]
    mu_ds = xr.Dataset({VAR: mu})
    return write_store(gaussian_dataset(mu_ds, xr.Dataset({VAR: xr.full_like(mu, sigma)})), path, "gaussian")


def test_gaussian_crps_pit_and_brier_closed_form(table: Path, tmp_path: Path) -> None:
    """A Gaussian forecast N(y + 1, 2²): its CRPS is properscoring's closed form, averaged over the cases; at the
    threshold t = μ its exceedance probability is exactly 1/2, so the Brier score is 1/4 whatever happens."""
    x, y = _cases(table)
    store = _gaussian_store(tmp_path / "g.zarr", table, lambda v: v + 1.0, 2.0)
    s = evaluate({"raw": table, "g": store}, table, thresholds={VAR: [273.15]}, allow_missing=True)
    g = {"method": "g", "field": VAR}
    mu32 = (y + 1.0).astype(np.float32).astype(np.float64)  # the store holds float32
    assert s["crps"].sel(g).item() == pytest.approx(properscoring.crps_gaussian(y, mu32, 2.0).mean(), rel=TOL)
    assert s["spread_skill"].sel(g).item() == pytest.approx(2.0, rel=1e2 * EPS32)
    assert s["pit_histogram"].sel(g).sum().item() == pytest.approx(1.0, rel=TOL)
    assert str(s["kind"].sel({"method": "g"}).item()) == "gaussian"
    # μ = the threshold at every case: P(Y > t) = 1/2 and (1/2 − o)² = 1/4
    half = _gaussian_store(tmp_path / "h.zarr", table, lambda v: np.full_like(v, 273.5), 3.0)
    s = evaluate({"h": half}, table, thresholds={VAR: [273.5]})
    assert s["brier_score"].sel({"method": "h", "field": VAR}).item() == pytest.approx(0.25, abs=TOL)


def _run(*args: object) -> int:
    return main([*map(str, args)])


def test_cli_scores_postprocess_apply_outputs_end_to_end(table: Path, tmp_path: Path) -> None:
    """fit EMOS on the table, apply (μ/σ, ECC members, probabilities of frost, percentiles), then ``smoe
    evaluate`` scores them all with the raw ensemble: scores.{nc,json,md}, no wb2/; the probability store's
    Brier score is the μ/σ store's, EMOS beats the raw ensemble's CRPS and Brier score; the ``--netcdf`` twin
    scores as its store."""
    pp = ["--scheduler", "threads", "--quiet"]
    assert _run("postprocess", "fit", "--forecast", table, "--out", tmp_path / "emos.nc", *pp) == 0
    assert _run("postprocess", "apply", "--emos", tmp_path / "emos.nc", "--forecast", table, "--out",
                tmp_path / "pp.zarr", "--members", len(MEMBERS), "--thresholds", 273.15, "--below", "--percentiles",
                10, 50, 90, "--netcdf", *pp) == 0
    out = tmp_path / "scores"
    assert _run("evaluate", f"raw={table}", f"emos={tmp_path / 'pp.zarr'}", f"ecc={tmp_path / 'pp_members.zarr'}",
                f"prob={tmp_path / 'pp_probabilities.zarr'}", f"pct={tmp_path / 'pp_percentiles.zarr'}",
                f"emos_nc={tmp_path / 'pp.nc'}",
                "--truth", table, "--thresholds", f"{VAR}=273.15", "--out", out, "--quiet") == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank_histograms.png", "scores.json", "scores.md", "scores.nc"]
    s = xr.open_dataset(out / "scores.nc")
    assert dict(zip(s["method"].values.tolist(), s["kind"].values.tolist())) == {
        "raw": "ensemble", "emos": "gaussian", "ecc": "ensemble", "prob": "probability", "pct": "quantiles",
        "emos_nc": "gaussian"}  # the CF netCDF twin (IMPROVER's names) of the mu/sigma store: the same scores
    # the twin holds the same float32 mu/sigma: the same scoring code on the same numbers gives the same bits
    np.testing.assert_array_equal(s["crps"].sel({"method": "emos_nc"}).values, s["crps"].sel({"method": "emos"}).values)
    bs = s["brier_score"].sel(field=VAR, threshold=273.15).isel(prediction_timedelta=0)
    assert bs.sel({"method": "prob"}).item() == pytest.approx(bs.sel({"method": "emos"}).item(), rel=1e2 * EPS32)
    assert bs.sel({"method": "emos"}).item() < bs.sel({"method": "raw"}).item()
    crps = s["crps"].sel(field=VAR).isel(prediction_timedelta=0)
    assert crps.sel({"method": "emos"}).item() < 0.8 * crps.sel({"method": "raw"}).item()
    assert np.isfinite(s["quantile_loss"].sel({"method": "pct", "field": VAR})).all()
    assert s["brier_skill_score"].sel({"reference": "raw", "method": "raw"}).item() == 0.0
    js = json.loads((out / "scores.json").read_text())
    assert js["provenance"]["sites"]["scored"] == 5 and "gridded" in js["provenance"]["wb2_evaluation_files"]
    assert set(js["scores"]) == {"raw", "emos", "ecc", "prob", "pct", "emos_nc"}
    md = (out / "scores.md").read_text()
    assert "Stations scored: 5" in md and "brier_score" in md and "WeatherBench 2" in md


def test_stations_matched_by_id_and_refusals(table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    """A forecast of other stations: the common ones are scored and the others counted; none in common,
    grid-only options and a forecast missing values are refused by name, and nothing is written."""
    srft_table(tmp_path / "shifted.csv", first=2, seed=1, drop=0)  # stations K002..K006 against K000..K004
    with pytest.warns(UserWarning, match="not scored"):
        s = evaluate({"a": tmp_path / "shifted.csv"}, table)
    prov = json.loads(s.attrs["provenance"])
    assert int(s["n_sites"].item()) == 3 and prov["sites"]["scored"] == 3
    assert prov["sites"]["dropped_not_common"][str(tmp_path / "shifted.csv")] == 2
    srft_table(tmp_path / "far.csv", first=10)
    with pytest.raises(ValueError, match="no station .* common"):
        evaluate({"far": tmp_path / "far.csv"}, table, out_dir=tmp_path / "none")
    assert not (tmp_path / "none").exists()
    for option, values in (("--regions", ["europe"]), ("--climatology", [str(table)]), ("--spectra", []),
                           ("--scheduler", ["local"])):
        assert _run("evaluate", table, "--truth", table, option, *values, "--out", tmp_path / "o", "--quiet") == 2
        err = capsys.readouterr().err
        assert re.search(f"{option} is for gridded forecasts .* site", err), err
        assert not (tmp_path / "o").exists()
    # μ/σ only on the first 20 days: refused by default; --allow-missing scores the cases both forecast
    store = _gaussian_store(tmp_path / "g.zarr", table, lambda v: v, 1.0)
    cut = xr.open_zarr(store).isel(time=slice(0, 20)).load()
    write_store(cut.assign({VAR: cut[VAR].where(cut["site"] != 0)}), tmp_path / "cut.zarr", "gaussian")
    with pytest.raises(ValueError, match=r"cut.zarr: 2m_temperature misses values at \d+ .*--allow-missing"):
        evaluate({"raw": table, "cut": tmp_path / "cut.zarr"}, table)
    s = evaluate({"raw": table, "cut": tmp_path / "cut.zarr"}, table, allow_missing=True)
    x, y = _cases(table)
    assert 0 < int(s["n_cases"].item()) < len(y) and int(s["n_time"].item()) == 20


@pytest.mark.shared_data
def test_uwme_raw_brier_score_of_frost_is_the_benchmark_figure(shared_data: Path, tmp_path: Path) -> None:
    """The UWME table: per-site rolling EMOS (25-day window, 2-day lag) fitted and applied as in
    benchmarks/postprocess_calibration_results.py; ``smoe evaluate`` scores raw and EMOS on the cases both
    forecast, and the Brier scores of frost (T ≤ 273.15 K, the same as of T > 273.15 K) at 48 h are the
    published ones."""
    table = shared_data / "ensembleBMA_srft_uwme_t2m.csv"
    ref = json.loads((REPO / "benchmarks" / "results" / "postprocess_calibration.json").read_text())
    ref = ref.get("uwme", ref)
    pp = ["--units", "K", "--scheduler", "threads", "--quiet"]
    assert _run("postprocess", "fit", "--forecast", table, "--window", "25D", "--lag", "2D", "--per-site",
                "--out", tmp_path / "site.nc", *pp) == 0
    assert _run("postprocess", "apply", "--emos", tmp_path / "site.nc", "--forecast", table, "--apply-period",
                *ref["forecast_dates"], "--out", tmp_path / "site.zarr", *pp) == 0
    s = evaluate({"raw": table, "emos": tmp_path / "site.zarr"}, table, thresholds={VAR: [273.15]},
                 allow_missing=True, table={"units": "K"})  # a table carries no units: EMOS's K are compared
    assert int(s["n_cases"].item()) == ref["cases"]
    bs = s["brier_score"].isel(field=0, prediction_timedelta=0, threshold=0)
    assert bs.sel({"method": "raw"}).item() == pytest.approx(ref["bs"]["raw"], rel=1e6 * EPS64)
    assert bs.sel({"method": "emos"}).item() == pytest.approx(ref["bs"]["emos_site"], rel=1e2 * EPS32)


def test_station_ids_padded_or_with_leading_zeros_match_across_formats(table: Path, tmp_path: Path) -> None:
    """WMO-style ids with a leading zero in a CSV table (read as text, not the number 1000) and the same stations in
    a CF file with blank-padded fixed-width ids, in another order: every station matches, and either way round
    the scores are the table's own."""
    df = pd.read_csv(table)
    df["station"] = [f"0{1000 + int(s.strip()[1:])} " for s in df["station"]]  # "01000 ", ...
    df.to_csv(tmp_path / "wmo.csv", index=False)
    fc, obs = read_site_table(tmp_path / "wmo.csv")
    assert fc["station_id"].values.tolist() == ["01000", "01001", "01002", "01003", "01004"]
    padded = ("site", np.array([f"{s}  " for s in fc["station_id"].values.tolist()]))
    order = [3, 1, 4, 0, 2]
    write_sites(fc.assign_coords(station_id=padded).isel(site=order),
                obs.assign_coords(station_id=padded).isel(site=order), tmp_path / "padded.nc")
    own = evaluate({"raw": tmp_path / "wmo.csv"}, tmp_path / "wmo.csv")
    for f, t in ((tmp_path / "padded.nc", tmp_path / "wmo.csv"), (tmp_path / "wmo.csv", tmp_path / "padded.nc")):
        s = evaluate({"raw": f}, t)
        assert int(s["n_sites"].item()) == 5 and int(s["n_cases"].item()) == int(own["n_cases"].item())
        np.testing.assert_allclose(s["crps"].values, own["crps"].values, rtol=TOL)


def test_cf_file_of_two_leads_observations_per_valid_time_and_threshold_coordinate_sense(tmp_path: Path) -> None:
    """A CF file with leads 24 h and 48 h whose 24 h observations are left empty after the first initialisation
    (a tool that writes the observation only where it wrote a forecast): the 48 h rows still give every valid
    time its observation, so both leads are scored on every case, per lead as properscoring. A probability
    store of P(Y ≤ t) whose ``spp__relative_to_threshold`` is only on its threshold coordinate (IMPROVER's
    place) and whose threshold is float32 is scored as the complementary exceedance of the threshold given in
    float64 (one event, not two): the Brier score of the ensemble's own fractions."""
    from smoeweather.data.sites import site_coords

    rng = np.random.default_rng(3)
    n_init, n_site, t = 12, 3, 271.3
    inits = pd.date_range("2004-01-01", periods=n_init, freq="D").values.astype("datetime64[ns]")
    leads = np.array([24, 48], "timedelta64[h]").astype("timedelta64[ns]")
    valid = pd.date_range("2004-01-01", periods=n_init + 2, freq="D").values.astype("datetime64[ns]")
    coords = site_coords(["A", "B", "C"], np.full(n_site, 45.0), np.full(n_site, 7.0), np.zeros(n_site))
    y = 271.0 + rng.normal(0.0, 2.0, (len(valid), n_site))
    truth = xr.Dataset({VAR: (("time", "site"), y, {"units": "K"})}, coords={"time": valid, **coords})
    yv = np.stack([truth[VAR].sel(time=inits + lead).values for lead in leads], 1)  # (init, lead, site)
    x = yv[:, :, None, :] + rng.normal(0.5, 1.0, (n_init, 2, 4, n_site))
    fc = xr.Dataset({VAR: (("time", "prediction_timedelta", "member", "site"), x, {"units": "K"})},
                    coords={"time": inits, "prediction_timedelta": leads, "member": MEMBERS, **coords})
    write_sites(fc, truth, tmp_path / "full.nc")
    ds = xr.load_dataset(tmp_path / "full.nc")
    ds[f"{VAR}_observation"][:, 1:, 0] = np.nan  # 24 h observations only for the first initialisation
    ds.to_netcdf(tmp_path / "sparse.nc")
    below = (x <= t).mean(2)[:, :, None, :]  # P(Y <= t) of the members, (init, lead, threshold, site)
    prob = xr.Dataset({VAR: (("time", "prediction_timedelta", "threshold", "site"), below, {"units": "1"})},
                      coords={"time": inits, "prediction_timedelta": leads, **coords})
    prob = prob.assign_coords(threshold=("threshold", np.array([t], np.float32),
                                         {"spp__relative_to_threshold": "less_than", "units": "K"}))
    write_store(prob, tmp_path / "below.zarr", "probability")
    s = evaluate({"raw": tmp_path / "sparse.nc", "below": tmp_path / "below.zarr"}, tmp_path / "sparse.nc",
                 thresholds={VAR: [t]})
    assert s["n_cases"].values.ravel().tolist() == [n_init * n_site] * 2
    assert s["threshold"].values.tolist() == [t]
    for j, lead in enumerate(leads):
        xs, ys = x[:, j].transpose(0, 2, 1).reshape(-1, 4), yv[:, j].reshape(-1)  # (init·site, member)
        at = {"field": VAR, "prediction_timedelta": lead}
        assert s["crps_ecdf"].sel({**at, "method": "raw"}).item() == pytest.approx(
            properscoring.crps_ensemble(ys, xs).mean(), rel=TOL)
        bs = (((xs > t).mean(1) - (ys > t)) ** 2).mean()
        for m in ("raw", "below"):
            got = s["brier_score"].sel({**at, "method": m, "threshold": t}).item()
            assert got == pytest.approx(bs, rel=TOL, abs=TOL)
