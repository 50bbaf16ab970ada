"""Site forecasts: the CSV/Parquet table reader on files in the exact ensembleBMA ``srft`` layout, the CF
DSG ``timeSeries`` file, EMOS with one weight per non-exchangeable member, global and per-site rolling fits through
the CLI with their refusals, and the real-data check on the UWME ensemble (skipped without ../shared/data)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import properscoring
import pytest
import xarray as xr
from conftest import SHARED_DATA, skip_without_shared

from smoeweather.cli import main
from smoeweather.data.sites import open_sites, read_site_table, write_sites
from smoeweather.postprocess.emos import fit_blocks, fit_groups_newton
from smoeweather.postprocess.model_file import read_model

MEMBERS = ["CMCG", "ETA", "GASP", "GFS", "JMA", "NGPS", "TCWB", "UKMO"]
UWME = SHARED_DATA / "ensembleBMA_srft_uwme_t2m.csv"
EPS32 = float(np.finfo(np.float32).eps)


def srft_like(path: Path, n_days: int = 30, n_sites: int = 6, seed: int = 0, drop: int = 5) -> pd.DataFrame:
    """A table in the exact srft layout (member columns, observation, integer YYYYMMDDHH valid date, station id
    with trailing blank, latitude, longitude, elevation, type), rows missing at random. Members differ in
    quality: the first is good, the others add a growing bias and noise."""
    rng = np.random.default_rng(seed)
    dates = pd.date_range("2004-01-01", periods=n_days, freq="D")
    rows = []
    for s in range(n_sites):
        base = 270.0 + 3.0 * s
        for d in dates:
            obs = base + 4.0 * np.sin(d.day_of_year / 5.0 + s) + rng.normal(0.0, 1.0)
            x = [obs + k * 0.5 + rng.normal(0.0, 0.8 + 0.4 * k) for k in range(len(MEMBERS))]
            rows.append([*x, obs, int(d.strftime("%Y%m%d00")), f"K{s:03d} ", 45.0 + s, -120.0 - s, 100.0 * s,
                         "SA"])
    df = pd.DataFrame(rows, columns=[*MEMBERS, "observation", "date", "station", "latitude", "longitude",
                                     "elevation", "type"])
    df = df.drop(index=rng.choice(len(df), size=drop, replace=False)).reset_index(drop=True)
    if path.suffix == ".parquet":
        df.to_parquet(path)
    else:
        df.to_csv(path, index=False)
    return df


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_reader_exact_layout(tmp_path: Path, suffix: str) -> None:
    df = srft_like(tmp_path / f"t{suffix}")
    fc, obs = read_site_table(tmp_path / f"t{suffix}")
    assert list(fc["member"].values) == MEMBERS and fc.sizes["site"] == 6 and fc.sizes["time"] == 30
    assert list(fc["station_id"].values) == [f"K{s:03d}" for s in range(6)]  # blanks stripped
    assert fc["station_id"].attrs["cf_role"] == "timeseries_id" and fc.attrs["featureType"] == "timeSeries"
    # the date is the valid date: init = valid - 48 h; every row lands at its (init, site), missing rows NaN
    np.testing.assert_array_equal(obs["time"].values, pd.date_range("2004-01-01", periods=30).values)
    np.testing.assert_array_equal(fc["time"].values, (pd.date_range("2004-01-01", periods=30)
                                                      - pd.Timedelta("48h")).values)
    for _, r in df.sample(10, random_state=1).iterrows():
        t = pd.Timestamp(str(r["date"])[:8])
        s = int(r["station"].strip()[1:])
        assert obs["2m_temperature"].sel(time=t).values[s] == r["observation"]
        got = fc["2m_temperature"].sel(time=t - pd.Timedelta("48h")).values[0, :, s]
        np.testing.assert_array_equal(got, r[MEMBERS].to_numpy(float))  # parsed from the same CSV text: exact
    assert int(np.isnan(obs["2m_temperature"]).sum()) == 5
    np.testing.assert_array_equal(fc["altitude"].values, 100.0 * np.arange(6))


def test_table_refusals(tmp_path: Path) -> None:
    df = srft_like(tmp_path / "t.csv")
    pd.concat([df, df.iloc[:1]]).to_csv(tmp_path / "dup.csv", index=False)
    with pytest.raises(ValueError, match=r"K000.*more than one row"):
        read_site_table(tmp_path / "dup.csv")
    df.drop(columns="observation").to_csv(tmp_path / "noobs.csv", index=False)
    with pytest.raises(ValueError, match="no observation column"):
        read_site_table(tmp_path / "noobs.csv")
    with pytest.raises(ValueError, match=r"no member column\(s\) \['XX'\]"):
        read_site_table(tmp_path / "t.csv", members=["CMCG", "XX"])


def test_cf_dsg_file_round_trip(tmp_path: Path) -> None:
    srft_like(tmp_path / "t.csv")
    fc, obs = read_site_table(tmp_path / "t.csv")
    write_sites(fc, obs, tmp_path / "sites.nc")
    with xr.open_dataset(tmp_path / "sites.nc") as raw:
        assert raw.attrs["featureType"] == "timeSeries" and raw["station_id"].attrs["cf_role"] == "timeseries_id"
        assert raw["2m_temperature"].dims == ("site", "time", "prediction_timedelta", "member")
        assert "latitude" in raw["2m_temperature"].encoding["coordinates"]  # CF: moved to encoding on read
    fc2, obs2 = open_sites(tmp_path / "sites.nc")
    xr.testing.assert_equal(fc2["2m_temperature"].drop_vars(["member", "station_id"]),
                            fc["2m_temperature"].drop_vars(["member", "station_id"]))
    # the observations come back on the valid times the forecasts verify at
    np.testing.assert_array_equal(obs2["2m_temperature"].sel(time=obs["time"][2:]).values,
                                  obs["2m_temperature"].values[2:])


def test_member_weights_recovered_and_mean_form_matches_the_grid_solver() -> None:
    """μ = a + Σ bₖ xₖ with known weights, σ² = c + d·var: the pooled fit recovers them; split over blocks it
    gives the same answer; with X = [1, mean] it equals the per-group Newton solver of the gridded fit."""
    rng = np.random.default_rng(3)
    n, k = 40_000, 3
    x = rng.normal(0.0, 2.0, (n, k)) + rng.normal(0.0, 3.0, (n, 1))
    var = x.var(1, ddof=1)
    b_true, a_true, c_true, d_true = np.array([0.6, 0.3, 0.1]), 1.5, 0.4, 0.8
    y = a_true + x @ b_true + np.sqrt(c_true + d_true * var) * rng.standard_normal(n)
    blk = {"X": np.concatenate([np.ones((1, n, 1)), x[None]], -1), "v": var[None], "y": y[None],
           "w": np.ones((1, n))}
    coef, ok = fit_blocks(lambda fn: fn(blk))
    assert ok.all()
    np.testing.assert_allclose(coef[0, 1:4], b_true, atol=0.02)
    np.testing.assert_allclose(coef[0, [0, 4, 5]], [a_true, c_true, d_true], atol=0.1)

    def reduce(fn):  # the same samples in 7 blocks
        parts = [fn({kk: a[:, i::7] for kk, a in blk.items()}) for i in range(7)]
        return {kk: sum(p[kk] for p in parts) for kk in parts[0]}

    np.testing.assert_allclose(fit_blocks(reduce)[0], coef, rtol=1e-9, atol=1e-9)
    m = x.mean(1)
    mean_form = {"X": np.stack([np.ones(n), m], -1)[None], "v": var[None], "y": y[None], "w": np.ones((1, n))}
    ref, _ = fit_groups_newton(m[None], var[None], y[None], np.ones((1, n)))
    np.testing.assert_allclose(fit_blocks(lambda fn: fn(mean_form))[0], ref, rtol=1e-8, atol=1e-10)


def _cli(*args: object) -> None:
    assert main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet"]) == 0


def test_cli_rolling_member_weights_and_per_site(tmp_path: Path) -> None:
    """fit --predictors members --window 10D --lag 2D on a table, apply: μ equals a + Σ bₖ xₖ of each date's
    coefficients (read back from the model file), CRPS against properscoring, and EMOS beats the raw ensemble."""
    srft_like(tmp_path / "t.csv", n_days=40)
    fc, obs = read_site_table(tmp_path / "t.csv")
    _cli("fit", "--forecast", tmp_path / "t.csv", "--predictors", "members", "--window", "10D", "--lag", "2D",
         "--out", tmp_path / "mem.nc")
    params, attrs = read_model(tmp_path / "mem.nc")
    assert attrs["window"] == "10D" and attrs["predictors"] == "members"
    # dates with a full window: first init (Dec 30) + lag + window - 1 day .. last init (Feb 7) + lag
    assert [str(t)[:10] for t in params["time"].values[[0, -1]]] == ["2004-01-10", "2004-02-09"]
    with xr.open_dataset(tmp_path / "mem.nc") as raw:
        assert raw["2m_temperature_b"].dims == ("prediction_timedelta", "time", "member")
    period = [str(params["time"].values[0])[:10], str(fc["time"].values[-1])[:10]]
    _cli("apply", "--emos", tmp_path / "mem.nc", "--forecast", tmp_path / "t.csv", "--out", tmp_path / "pp.zarr",
         "--apply-period", *period)
    pp = xr.open_zarr(tmp_path / "pp.zarr")
    sel = fc.sel(time=pp["time"].values)["2m_temperature"].isel(prediction_timedelta=0)
    p = params["2m_temperature"].isel(prediction_timedelta=0).sel(time=pp["time"].values)
    b = p.sel(coefficient=[f"b_{m}" for m in MEMBERS]).values  # (time, member)
    mu = p.sel(coefficient="a").values[:, None] + np.einsum("tm,tms->ts", b, sel.values)
    np.testing.assert_allclose(pp["2m_temperature"].isel(prediction_timedelta=0).values, mu, rtol=4 * EPS32)
    y = obs["2m_temperature"].sel(time=(pp["time"] + pp["prediction_timedelta"]).values[:, 0]).values
    crps = properscoring.crps_gaussian(y, pp["2m_temperature"].values[:, 0], pp["2m_temperature_std"].values[:, 0])
    xs = np.moveaxis(sel.values, 1, -1)
    fin = np.isfinite(xs).all(-1) & np.isfinite(y)  # rows missing from the table have no raw forecast
    raw = np.full(y.shape, np.nan)
    raw[fin] = properscoring.crps_ensemble(y[fin], xs[fin])
    ok = np.isfinite(crps) & np.isfinite(raw)
    assert crps[ok].mean() < 0.8 * raw[ok].mean()  # members 2..8 are biased: weights fix what the mean cannot
    assert p.sel(coefficient="b_CMCG").mean() > p.sel(coefficient="b_UKMO").mean()

    _cli("fit", "--forecast", tmp_path / "t.csv", "--per-site", "--window", "10D", "--lag", "2D",
         "--out", tmp_path / "site.nc")
    sp, _ = read_model(tmp_path / "site.nc")
    assert sp["2m_temperature"].dims == ("prediction_timedelta", "time", "site", "coefficient")


def _refused(capsys: pytest.CaptureFixture[str], pattern: str, *args: object) -> None:
    """The CLI exits 2 with an error message matching ``pattern``."""
    assert main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err), err


def test_cli_site_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    srft_like(tmp_path / "t.csv", n_days=30, n_sites=4)
    _cli("fit", "--forecast", tmp_path / "t.csv", "--per-site", "--out", tmp_path / "site.nc")
    # a site in the forecast but not in the model file
    srft_like(tmp_path / "more.csv", n_days=30, n_sites=6, seed=1)
    _refused(capsys, r"2 site\(s\).*\['K004', 'K005'\]", "apply", "--emos", tmp_path / "site.nc", "--forecast",
             tmp_path / "more.csv", "--out", tmp_path / "pp.zarr")
    assert not (tmp_path / "pp.zarr").exists()
    # mismatched members: the member-weights model names its members
    _cli("fit", "--forecast", tmp_path / "t.csv", "--predictors", "members", "--out", tmp_path / "mem.nc")
    pd.read_csv(tmp_path / "t.csv").rename(columns={"UKMO": "ECMWF"}).to_csv(tmp_path / "renamed.csv", index=False)
    _refused(capsys, r"members .*ECMWF.* differ from the members .*UKMO", "apply", "--emos", tmp_path / "mem.nc",
             "--forecast", tmp_path / "renamed.csv", "--out", tmp_path / "pp.zarr")
    # a date without a full window, and a rolling model applied to a date it has no coefficients for
    _refused(capsys, r"2004-01-02.*no full training window", "fit", "--forecast", tmp_path / "t.csv", "--window",
             "10D", "--dates", "2004-01-02", "2004-01-20", "--out", tmp_path / "roll.nc")
    assert not (tmp_path / "roll.nc").exists()
    _cli("fit", "--forecast", tmp_path / "t.csv", "--window", "10D", "--out", tmp_path / "roll.nc")
    _refused(capsys, r"no coefficients for the forecast date\(s\) \['2003-12-30", "apply", "--emos",
             tmp_path / "roll.nc", "--forecast", tmp_path / "t.csv", "--out", tmp_path / "pp.zarr")
    assert not (tmp_path / "pp.zarr").exists()
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.shared_data
@skip_without_shared(UWME.name)  # the UWME site table (ensembleBMA, GPL: never copied into the project)
def test_uwme_rolling_emos_beats_the_raw_ensemble(tmp_path: Path) -> None:
    """Real 48 h 2 m temperature of the 8-member UWME at 969 stations: a 25-day rolling global EMOS (lag 2 days)
    over one week of forecast dates lowers the CRPS of the raw ensemble (fair) by more than 10 %."""
    _cli("fit", "--forecast", UWME, "--window", "25D", "--lag", "2D", "--dates", "2004-02-10", "2004-02-16",
         "--out", tmp_path / "emos.nc")
    _cli("apply", "--emos", tmp_path / "emos.nc", "--forecast", UWME, "--apply-period", "2004-02-10", "2004-02-16",
         "--out", tmp_path / "pp.zarr")
    fc, obs = read_site_table(UWME)
    pp = xr.open_zarr(tmp_path / "pp.zarr").isel(prediction_timedelta=0)
    x = fc["2m_temperature"].sel(time=pp["time"].values).isel(prediction_timedelta=0).values  # (t, m, site)
    y = obs["2m_temperature"].sel(time=pp["time"].values + np.timedelta64(48, "h")).values
    m = x.shape[1]
    xs = np.moveaxis(x, 1, -1)
    fair = np.abs(xs - y[..., None]).mean(-1) - np.abs(xs[..., :, None] - xs[..., None, :]).sum((-1, -2)) / (
        2 * m * (m - 1))
    emos = properscoring.crps_gaussian(y, pp["2m_temperature"].values, pp["2m_temperature_std"].values)
    ok = np.isfinite(fair) & np.isfinite(emos)
    assert ok.sum() > 3000
    assert emos[ok].mean() < 0.9 * fair[ok].mean()
