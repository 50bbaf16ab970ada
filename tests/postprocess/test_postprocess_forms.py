"""Operational output forms of ``smoe postprocess apply``, in IMPROVER's names: probabilities of
(non-)exceedance (``probability_of_<standard name>_above_threshold`` on a ``threshold`` coordinate whose
standard_name is the field's) equal the predictive distribution's CDF (scipy.stats.norm / truncnorm) at the
thresholds, percentiles its ppf, ECC realizations on a ``realization`` dim; every variable that is the field has
its standard_name, σ a cell method instead; every store has its validity time and units, sites keep their
station ids and coordinates; ``--out X.nc`` writes CF netCDF, ``--out X.zarr`` zarr, anything else is refused;
every netCDF form passes compliance-checker's CF-1.8 test with no error (no high-priority failure) and only the
warnings the postprocessing guide lists; smoe's readers give the store names back."""

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
from smoeweather.postprocess.distributions import Normal, TruncatedNormal, family
from smoeweather.postprocess.forms import parse_thresholds, thresholds_for

QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]
EPS32 = float(np.finfo(np.float32).eps)
STANDARD = {"temperature": "air_temperature", "geopotential": "geopotential", "2m_temperature": "air_temperature"}
FORMS = ["--members", "6", "--thresholds", "temperature=265,275", "geopotential=54000", "--percentiles", "10", "50",
         "90"]
WARNINGS = ("§2.3 Naming Conventions: variable 2m_temperature", "§2.4 Dimensions", "§7.3 Cell Methods")
"""The medium-priority compliance-checker messages left (docs/guide/postprocessing.md lists them): a WeatherBench 2
name that begins with a digit (``2m_temperature``), dims not in T, Z, Y, X order (the lead and the
realization/threshold/percentile dims lie between the init time and the level), and ``realization: mean``
naming a standard name rather than a dim (IMPROVER's own cell method)."""


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


def _probability(ds: xr.Dataset, name: str, below: bool = False, units: bool = True) -> xr.DataArray:
    """The probabilities of field ``name`` in a probability file, checked against IMPROVER's names (``units``:
    the field has units, hence its standard name; without: its name, on the threshold as its long_name)."""
    what = STANDARD[name] if units else name
    var = f"probability_of_{what}_{'below' if below else 'above'}_threshold"
    assert list(ds.data_vars) == [var]
    da = ds[var]
    assert da.attrs["long_name"] == var and da.attrs["units"] == "1" and da.attrs["smoe__variable"] == name
    assert "standard_name" not in da.attrs and "spp__relative_to_threshold" not in da.attrs
    thr = ds["threshold"].attrs
    assert thr.get("standard_name" if units else "long_name") == what
    assert thr["spp__relative_to_threshold"] == ("less_than" if below else "greater_than")
    return da


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-grid-point EMOS applied with every form: zarr stores with their CF netCDF twins, and netCDF files
    (``--out nc/pp.nc``) with probabilities of not exceeding the thresholds and quantiles."""
    root = tmp_path_factory.mktemp("forms")
    old = gcm_ens_like(root / "a.nc", 2005, 1, n_init=12)
    new = gcm_ens_like(root / "b.nc", 2006, 2, n_init=6)
    _pp("fit", "--per-gridpoint", "--forecast", old, "--out", root / "m.nc")
    _pp("apply", "--emos", root / "m.nc", "--forecast", new, "--out", root / "pp.zarr", *FORMS, "--netcdf")
    _pp("apply", "--emos", root / "m.nc", "--forecast", new, "--out", root / "nc" / "pp.nc", *FORMS, "--below",
        "--quantiles", "0.1", "0.9")
    return root


def test_grid_probabilities_are_the_normal_cdf(grid: Path) -> None:
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(grid / "pp.zarr").load())
    for name, thresholds in (("temperature", [265.0, 275.0]), ("geopotential", [54000.0])):
        p = xr.open_zarr(grid / f"pp_probabilities_{name}.zarr")
        assert p.attrs["forecast_kind"] == "probability"
        da = _probability(p, name)
        assert da.dims[:3] == ("time", "prediction_timedelta", "threshold")
        assert p["threshold"].attrs["units"] == mu[name].attrs["units"]
        assert list(p["threshold"].values) == thresholds
        _check_time_coords(p)
        m, s = mu[name].values.astype(np.float64), sigma[name].values.astype(np.float64)
        for t in thresholds:
            expect = stats.norm.sf(t, loc=m, scale=s)
            got = da.sel(threshold=t).transpose(*mu[name].dims).values
            np.testing.assert_allclose(got, expect, rtol=0, atol=_prob_tol(m, s, t))
        # smoe's reader gives the store's name back, the sense on the threshold coordinate
        back = forecast_stores.open_forecast(grid / f"pp_probabilities_{name}.zarr")
        assert list(back.data_vars) == [name] and forecast_stores.forecast_kind(back) == "probability"


def test_grid_percentiles_ppf_members_and_std_names(grid: Path) -> None:
    gauss = xr.open_zarr(grid / "pp.zarr").load()
    mu, sigma = forecast_stores.split_gaussian(gauss)
    pct = xr.open_zarr(grid / "pp_percentiles.zarr")
    assert list(pct["percentile"].values) == [10.0, 50.0, 90.0] and pct["percentile"].attrs["units"] == "%"
    for p in (10.0, 50.0, 90.0):
        expect = stats.norm.ppf(p / 100, loc=mu["temperature"].values.astype(np.float64),
                                scale=sigma["temperature"].values.astype(np.float64))
        got = pct["temperature"].sel(percentile=p).transpose(*mu["temperature"].dims).values
        np.testing.assert_allclose(got, expect, rtol=4 * EPS32)
    # read back by smoe's own reader as quantiles on 0-1
    q = forecast_stores.open_forecast(grid / "pp_percentiles.zarr")
    assert forecast_stores.forecast_kind(q) == "quantiles" and list(q["quantile"].values) == [0.1, 0.5, 0.9]
    ens = xr.open_zarr(grid / "pp_members.zarr")
    assert ens["temperature"].dims[2] == "realization" and "member" not in ens.dims
    assert ens["realization"].attrs == {"units": "1", "standard_name": "realization"}
    assert ens["realization"].dtype == np.int32 and list(ens["realization"].values) == list(range(6))
    assert forecast_stores.open_forecast(grid / "pp_members.zarr").sizes["member"] == 6  # read as before
    _check_time_coords(ens)
    for name, standard in STANDARD.items():
        if name in gauss:
            for ds in (gauss, pct, ens):
                assert ds[name].attrs["standard_name"] == standard
            assert gauss[name].attrs["cell_methods"] == "realization: mean"
            std = gauss[f"{name}_std"].attrs
            assert "standard_name" not in std and std["cell_methods"] == "realization: standard_deviation"
            assert "standard deviation" in std["long_name"]
    nc = xr.open_dataset(grid / "pp_members.nc")
    assert "realization" in nc.dims and nc["time"].dims == ("forecast_reference_time", "forecast_period")
    assert nc["time"].attrs["standard_name"] == "time"


def _netcdf(path: Path) -> bool:
    """Whether ``path`` is a netCDF-4 (HDF5) file."""
    return path.is_file() and path.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"


def test_out_nc_writes_netcdf_in_improver_layout(grid: Path) -> None:
    """``--out nc/pp.nc``: every output a netCDF file (the defaults take --out's suffix), in IMPROVER's layout;
    P(Y ≤ t) is 1 − P(Y > t) of the zarr run; smoe's reader gives every file back in the store's names."""
    names = ["pp", "pp_members", "pp_quantiles", "pp_percentiles", "pp_probabilities_temperature",
             "pp_probabilities_geopotential"]
    assert sorted(p.name for p in (grid / "nc").iterdir()) == sorted(f"{n}.nc" for n in names)
    assert all(_netcdf(grid / "nc" / f"{n}.nc") for n in names)
    with xr.open_dataset(grid / "nc" / "pp_probabilities_temperature.nc") as below:
        da = _probability(below, "temperature", below=True)
        assert da.dims[:3] == ("forecast_reference_time", "forecast_period", "threshold")
        assert below["time"].attrs["standard_name"] == "time" and "history" in below.attrs
        above = xr.open_zarr(grid / "pp_probabilities_temperature.zarr")
        np.testing.assert_allclose(da.values, 1.0 - above["probability_of_air_temperature_above_threshold"].values,
                                   rtol=0, atol=4 * EPS32)
    for n, kind in zip(names, ("gaussian", "ensemble", "quantiles", "quantiles", "probability", "probability")):
        back = forecast_stores.open_forecast(grid / "nc" / f"{n}.nc")
        assert forecast_stores.forecast_kind(back) == kind
        assert {"time", "prediction_timedelta"} <= set(back.dims)
        assert set(back.data_vars) <= {"temperature", "temperature_std", "geopotential", "geopotential_std"}


# expected: the stream holds its truth inside the forecast file and has no land-sea mask (evaluate says so)
@pytest.mark.filterwarnings("ignore:.*truth held inside a forecast file:UserWarning",
                            "ignore:.*has no land_sea_mask:UserWarning")
def test_evaluate_scores_the_netcdf_outputs_as_their_stores(grid: Path, tmp_path: Path) -> None:
    """``smoe evaluate`` on the netCDF files (IMPROVER's names) gives the scores of the zarr stores: CRPS of
    the μ/σ, the members and the percentiles, and P(Y ≤ t) the Brier score of P(Y > t) (1 − p against 1 − o)."""
    new, out = grid / "b.nc", tmp_path / "scores"
    thr = ["--thresholds", "temperature_850=265"]
    assert main(["evaluate", f"g={grid / 'pp.zarr'}", f"gnc={grid / 'nc' / 'pp.nc'}",
                 f"ens={grid / 'pp_members.zarr'}", f"ensnc={grid / 'nc' / 'pp_members.nc'}",
                 f"p={grid / 'pp_probabilities_temperature.zarr'}",
                 f"pnc={grid / 'nc' / 'pp_probabilities_temperature.nc'}", f"pct={grid / 'nc' / 'pp_percentiles.nc'}",
                 "--truth", str(new), *thr, "--no-references", "--quiet", "--out", str(out)]) == 0
    sc = xr.load_dataset(out / "scores.nc").sel(field="temperature_850")

    def score(name: str, method: str) -> np.ndarray:  # {"method": ...}: sel's own `method` is its fill method
        return sc[name].sel({"method": method}).values

    for zarr, nc in (("g", "gnc"), ("ens", "ensnc")):
        assert np.isfinite(score("crps", zarr)).all()
        np.testing.assert_allclose(score("crps", nc), score("crps", zarr), rtol=1e-6)
    assert np.isfinite(score("brier_score", "p")).all()
    np.testing.assert_allclose(score("brier_score", "pnc"), score("brier_score", "p"), rtol=0, atol=1e-6)
    assert np.isfinite(score("quantile_loss", "pct")).all()


def _cf_messages(path: Path) -> tuple[list[str], list[str]]:
    """compliance-checker's CF-1.8 test of ``path``, offline (its bundled standard-name table): the messages
    of its failed high-priority checks (errors) and of its failed medium-priority ones (warnings)."""
    why = "needs compliance-checker (the [dev] extra): pip install -e '.[dev]'"
    runner = pytest.importorskip("compliance_checker.runner", reason=why)
    suite = runner.CheckSuite()
    suite.load_all_available_checkers()
    results, errors = suite.run_all(suite.load_dataset(str(path)), ["cf:1.8"], skip_checks=[])["cf:1.8"]
    assert not errors, errors
    failed = [r for r in results if r.value is False or (isinstance(r.value, tuple) and r.value[0] < r.value[1])]
    return ([f"{r.name}: {m}" for r in failed if r.weight == 3 for m in r.msgs],
            [f"{r.name}: {m}" for r in failed if r.weight == 2 for m in r.msgs])


def _cf_errors(path: Path) -> list[str]:
    """The errors of :func:`_cf_messages`, after checking that every warning is one the guide lists."""
    errors, warnings = _cf_messages(path)
    assert all(w.startswith(WARNINGS) for w in warnings), warnings
    return errors


@pytest.mark.parametrize("name", ["pp", "pp_members", "pp_percentiles", "pp_probabilities_temperature",
                                  "nc/pp", "nc/pp_members", "nc/pp_quantiles", "nc/pp_percentiles",
                                  "nc/pp_probabilities_temperature", "nc/pp_probabilities_geopotential"])
def test_grid_cf_netcdf_passes_compliance_checker(grid: Path, name: str) -> None:
    assert _cf_errors(grid / f"{name}.nc") == []


def test_sites_truncnormal_below_keep_station_ids_and_pass_cf(tmp_path: Path) -> None:
    table = tmp_path / "uwme.csv"
    _table(table, n_sites=5, n_days=30)
    _pp("fit", "--per-site", "--distribution", "truncnormal", "--forecast", table, "--units", "K",
        "--out", tmp_path / "m.nc")
    _pp("apply", "--emos", tmp_path / "m.nc", "--forecast", table, "--units", "K", "--out", tmp_path / "pp.zarr",
        "--members", "5", "--thresholds", "274", "--below", "--percentiles", "25", "75", "--netcdf")
    _pp("apply", "--emos", tmp_path / "m.nc", "--forecast", table, "--units", "K", "--out", tmp_path / "pp.nc",
        "--members", "5", "--thresholds", "274", "--quantiles", "0.5")
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    m, s = mu["2m_temperature"].values.astype(np.float64), sigma["2m_temperature"].values.astype(np.float64)
    dist = stats.truncnorm(-m / s, np.inf, loc=m, scale=s)
    prob = _probability(xr.open_zarr(tmp_path / "pp_probabilities.zarr"), "2m_temperature", below=True)
    got = prob.sel(threshold=274.0).transpose(*mu["2m_temperature"].dims).values
    np.testing.assert_allclose(got, dist.cdf(274.0), rtol=0, atol=_prob_tol(m, s, 274.0))
    pct = xr.open_zarr(tmp_path / "pp_percentiles.zarr")
    got = pct["2m_temperature"].sel(percentile=75.0).transpose(*mu["2m_temperature"].dims).values
    np.testing.assert_allclose(got, dist.ppf(0.75), rtol=4 * EPS32)
    assert pct["2m_temperature"].attrs["standard_name"] == "air_temperature"  # the truncated distribution's
    ids = xr.open_zarr(tmp_path / "pp.zarr")["station_id"].values
    for name in ("pp", "pp_members", "pp_percentiles", "pp_probabilities"):
        ds = xr.open_zarr(tmp_path / f"{name}.zarr")
        assert list(ds["station_id"].values) == list(ids)
        assert {"latitude", "longitude"} <= set(ds.coords)
        _check_time_coords(ds)
        assert _cf_errors(tmp_path / f"{name}.nc") == []
    for name in ("pp", "pp_members", "pp_quantiles", "pp_probabilities"):  # --out pp.nc: netCDF on sites
        assert _netcdf(tmp_path / f"{name}.nc") and _cf_errors(tmp_path / f"{name}.nc") == []
    mu_attrs = xr.open_zarr(tmp_path / "pp.zarr")["2m_temperature"].attrs
    assert "location parameter" in mu_attrs["long_name"] and "standard_name" not in mu_attrs


def test_drn_sites_probabilities(tmp_path: Path) -> None:
    table = tmp_path / "uwme.csv"
    _table(table, n_sites=4, n_days=30)
    _pp("fit", "--method", "drn", "--forecast", table, "--drn-epochs", "2", "--drn-seeds", "1", "--drn-hidden", "4",
        "--out", tmp_path / "drn.nc")
    _pp("apply", "--drn", tmp_path / "drn.nc", "--forecast", table, "--out", tmp_path / "pp.zarr",
        "--thresholds", "272", "278")
    mu, sigma = forecast_stores.split_gaussian(xr.open_zarr(tmp_path / "pp.zarr").load())
    prob = xr.open_zarr(tmp_path / "pp_probabilities.zarr")
    assert "station_id" in prob.coords
    da = _probability(prob, "2m_temperature", units=False)  # a table without --units: no standard name
    m, s = mu["2m_temperature"].values.astype(np.float64), sigma["2m_temperature"].values.astype(np.float64)
    for t in (272.0, 278.0):
        got = da.sel(threshold=t).transpose(*mu["2m_temperature"].dims).values
        np.testing.assert_allclose(got, stats.norm.sf(t, m, s), rtol=0, atol=_prob_tol(m, s, t))


def test_store_names_reads_improver_names_back() -> None:
    """One home for the renaming: IMPROVER's names to the store's, a store's names unchanged, a clash refused."""
    t = np.array(["2006-01-01"], "datetime64[ns]")
    lead = np.array([24], "timedelta64[h]").astype("timedelta64[ns]")
    coords = {"forecast_reference_time": t, "forecast_period": lead, "threshold": [270.0],
              "time": (("forecast_reference_time", "forecast_period"), t[:, None] + lead[None, :])}
    dims = ("forecast_reference_time", "forecast_period", "threshold")
    ours = xr.Dataset({"probability_of_air_temperature_below_threshold": (dims, np.zeros((1, 1, 1)),
                                                                           {"smoe__variable": "2m_temperature"})},
                      coords)
    back = forecast_stores.store_names(ours)
    assert list(back.data_vars) == ["2m_temperature"] and set(back.dims) == {"time", "prediction_timedelta",
                                                                             "threshold"}
    assert back["time"].values[0] == t[0]  # the init, the validity time dropped
    above = "probability_of_air_temperature_above_threshold"
    theirs = ours.rename(probability_of_air_temperature_below_threshold=above)
    del theirs[above].attrs["smoe__variable"]
    assert list(forecast_stores.store_names(theirs).data_vars) == ["air_temperature"]  # IMPROVER's own file: X
    members = xr.Dataset({"t": (("time", "realization"), np.zeros((1, 3)))}, {"realization": [0, 1, 2]})
    assert forecast_stores.store_names(members).sizes["member"] == 3
    assert "realization" in forecast_stores.store_names(members, ensemble_dim="realization").dims
    store = xr.Dataset({"t": (("time", "member"), np.zeros((1, 3)))})
    assert forecast_stores.store_names(store).identical(store)
    clash = ours.assign(**{"2m_temperature": ours["probability_of_air_temperature_below_threshold"]})
    with pytest.raises(ValueError, match="forecast x.nc: the probabilities .* expected one per field"):
        forecast_stores.store_names(clash, where="forecast x.nc")


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
    # an output that is neither .nc nor .zarr: one line naming the option, the forms and a fix
    for argv, word in ((["--out", str(tmp_path / "o.zar")], "--out"),
                       (["--out", str(tmp_path / "o.zarr"), "--members", "6", "--members-out", str(tmp_path / "o_ens")],
                        "--members-out")):
        assert main([*base[:-2], *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{word} " in err and ".nc (a CF netCDF file) or .zarr" in err
        assert "e.g." in err and not any(tmp_path.glob("o*"))
