"""Units compared everywhere: every case of the campaign as a test, each failing before the units layer
(:mod:`smoeweather.units`): a K model on a degC forecast and the reverse, a degC forecast fitted or scored against
K truth, a K site model on a table given ``--units degC``, ``--thresholds temperature=-5degC`` on a K field, and
the refusals (no units, incompatible units); plus a property: whatever K/degC labels a model and a forecast carry,
apply gives the same physical μ."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from smoeweather.cli import main
from smoeweather.data import forecast_stores

# the notes of the conversions asked for here (smoeweather.units.UnitsConverted, a UserWarning); imported in each
# test, so that every test runs (and fails by itself) on code without the units layer
pytestmark = pytest.mark.filterwarnings("ignore:.* converted from .*:UserWarning",
                                        "ignore:.*truth held inside a forecast file:UserWarning")


def _converted() -> type[Warning]:
    from smoeweather.units import UnitsConverted

    return UnitsConverted

ZERO_C = 273.15
LAT, LON = np.array([-30.0, -10.0, 10.0, 30.0]), np.arange(8) * 45.0
F32 = 300.0 * float(np.finfo(np.float32).eps)  # stores hold float32: one rounding of a value near 300 K


def tiny_ens(path: Path, units: str = "K", truth_units: str | None = None, seed: int = 0, n_init: int = 8,
             members: int = 4) -> Path:
    """A float gcm_ens-like file: ``temperature`` (time, lead 24 h, member, level 850, 4×8 grid) in ``units``
    and its truth ``truth_temperature`` on daily valid times in ``truth_units`` (default the same); the same
    physical values whatever the units (degC = K − 273.15). ``units=""``: no units attribute."""
    rng = np.random.default_rng(seed)
    init = pd.date_range("2005-01-01", periods=n_init, freq="D")
    valid = pd.date_range(init[0], init[-1] + pd.Timedelta(hours=24), freq="D")
    truth_k = 270.0 + 5.0 * rng.standard_normal((len(valid), 1, len(LAT), len(LON)))
    yv = truth_k[1:]
    ens_k = (yv + 1.5 + 2.0 * rng.standard_normal(yv.shape))[:, None, None] + rng.standard_normal(
        (n_init, 1, members, 1, len(LAT), len(LON)))

    def label(x: np.ndarray, u: str) -> tuple[np.ndarray, dict[str, str]]:
        return (x - ZERO_C if u == "degC" else x), ({"units": u} if u else {})

    ens, ea = label(ens_k, units)
    tr, ta = label(truth_k, units if truth_units is None else truth_units)
    ds = xr.Dataset({"temperature": (("time", "prediction_timedelta", "member", "level", "latitude", "longitude"),
                                     ens, ea),
                     "truth_temperature": (("valid_time", "level", "latitude", "longitude"), tr, ta)},
                    coords={"time": init, "prediction_timedelta": pd.to_timedelta([24], "h"),
                            "member": np.arange(members), "level": np.array([850], np.int32), "latitude": LAT,
                            "longitude": LON, "valid_time": valid})
    ds.to_netcdf(path)
    return path


def site_table(path: Path, units: str = "K", seed: int = 3) -> Path:
    """A CSV site table (valid date, station, lat, lon, observation, members m0..m3), values in ``units``."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in pd.date_range("2005-01-01", periods=12, freq="D"):
        for s in range(3):
            obs = 270.0 + 4.0 * rng.standard_normal()
            mem = obs + 1.0 + rng.standard_normal(4)
            off = ZERO_C if units == "degC" else 0.0
            rows.append({"date": d.strftime("%Y%m%d00"), "station": f"S{s}", "latitude": 40.0 + s,
                         "longitude": 10.0 + s, "observation": obs - off,
                         **{f"m{i}": v - off for i, v in enumerate(mem)}})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _mu(store: Path, name: str = "temperature") -> xr.DataArray:
    return forecast_stores.store_names(xr.open_zarr(store))[name].load()  # a probability file in IMPROVER's names


def _fit(tmp: Path, fc: Path, out: str, *extra: str) -> Path:
    assert main(["postprocess", "fit", "--forecast", str(fc), "--out", str(tmp / out), "--quiet", *extra]) == 0
    return tmp / out


def _apply(tmp: Path, model: Path, fc: Path, out: str, *extra: str) -> Path:
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(fc), "--out", str(tmp / out),
                 "--quiet", *extra]) == 0
    return tmp / out


def test_cf_spellings_parse_and_compare() -> None:
    from smoeweather.units import conversion, parse, parse_quantity

    assert parse("degree_Celsius", "x") == parse("degC", "x")
    assert parse("m2 s-2", "x") == parse("m**2 s**-2", "x")
    assert parse("(0 - 1)", "x") == parse("1", "x")
    assert conversion("temperature", "K", "a", "degC", "b").offset == -ZERO_C
    assert conversion("pressure", "hPa", "a", "Pa", "b").scale == 100.0
    assert conversion("geopotential", "m", "a", "m**2 s**-2", "b").scale == pytest.approx(9.80665, rel=1e-15)
    assert conversion("temperature", "m2 s-2", "a", "m**2 s**-2", "b") is None
    assert parse_quantity("-5degC", "--thresholds").units == "degC"
    with pytest.raises(ValueError, match="'height'.*'m' of a.*'m\\*\\*2 s\\*\\*-2' of b.*not convertible"):
        conversion("height", "m", "a", "m**2 s**-2", "b")  # a height is no geopotential
    with pytest.raises(ValueError, match="unknown units 'furlongs_per_gpm'"):
        conversion("t", "furlongs_per_gpm", "file x.nc", "K", "truth")


def test_k_model_on_degc_forecast_gives_the_same_mu_in_degc(tmp_path: Path) -> None:
    model = _fit(tmp_path, tiny_ens(tmp_path / "train.nc", "K"), "emos.nc")
    assert json.loads(xr.open_dataset(model).attrs["field_units"]) == {"temperature": "K"}
    mu_k = _mu(_apply(tmp_path, model, tiny_ens(tmp_path / "new_k.nc", "K", seed=1), "pp_k.zarr"))
    with pytest.warns(_converted(), match="from degC to K"):
        pp_c = _apply(tmp_path, model, tiny_ens(tmp_path / "new_c.nc", "degC", seed=1), "pp_c.zarr")
    mu_c = _mu(pp_c)
    assert mu_c.attrs["units"] == "degC"
    np.testing.assert_allclose(mu_c.values, mu_k.values - ZERO_C, rtol=0, atol=F32)  # was off by up to 261
    np.testing.assert_allclose(_mu(pp_c, "temperature_std").values, _mu(tmp_path / "pp_k.zarr",
                                                                         "temperature_std").values, rtol=1e-6)


def test_degc_model_on_k_forecast(tmp_path: Path) -> None:
    model = _fit(tmp_path, tiny_ens(tmp_path / "train.nc", "degC"), "emos_c.nc")
    mu_c = _mu(_apply(tmp_path, model, tiny_ens(tmp_path / "new_c.nc", "degC", seed=1), "pp_c.zarr"))
    mu_k = _mu(_apply(tmp_path, model, tiny_ens(tmp_path / "new_k.nc", "K", seed=1), "pp_k.zarr"))
    assert mu_k.attrs["units"] == "K"
    np.testing.assert_allclose(mu_k.values, mu_c.values + ZERO_C, rtol=0, atol=F32)  # was 254.0 for 260.7


def test_fit_degc_forecast_against_k_truth(tmp_path: Path) -> None:
    same = _fit(tmp_path, tiny_ens(tmp_path / "c.nc", "degC"), "same.nc")
    with pytest.warns(_converted(), match="from K to degC"):
        mixed = _fit(tmp_path, tiny_ens(tmp_path / "mixed.nc", "degC", truth_units="K"), "mixed_model.nc")
    a_same, a_mixed = xr.open_dataset(same)["temperature_a"], xr.open_dataset(mixed)["temperature_a"]
    assert a_mixed.attrs["units"] == "degC"
    np.testing.assert_allclose(a_mixed.values, a_same.values, atol=1e-6)  # was a = +273.6
    assert abs(float(a_mixed.max())) < 5


def test_crossval_degc_forecast_against_k_truth(tmp_path: Path) -> None:
    """crossval scores in the forecast's units: a degC ensemble with its truth in K gives the CRPS of the all-degC
    file (the truth converted, noted), not one off by 273 K."""
    def crps(fc: Path, out: str) -> dict:
        argv = ["postprocess", "crossval", "--fold", "month", "--forecast", str(fc), "--out", str(tmp_path / out)]
        assert main(argv) == 0
        return json.loads((tmp_path / out / "crossval.json").read_text())["scores"]

    same = crps(tiny_ens(tmp_path / "c.nc", "degC", n_init=40), "same")
    with pytest.warns(_converted(), match="from K to degC"):
        mixed = crps(tiny_ens(tmp_path / "m.nc", "degC", truth_units="K", n_init=40), "mixed")
    for field, leads in same.items():
        for lead, methods in leads.items():
            for method, value in methods.items():  # float64 fits of the same values (to 1e-9 after K → degC)
                assert mixed[field][lead][method] == pytest.approx(value, rel=1e-6), (field, lead, method)


def test_evaluate_degc_forecast_against_k_truth(tmp_path: Path) -> None:
    from smoeweather.evaluate.run import evaluate

    truth = tiny_ens(tmp_path / "truth_k.nc", "K")
    rmse_k = evaluate({"ens": str(truth)}, str(truth), references=False)["rmse"]
    with pytest.warns(_converted(), match="from degC to K"):
        scores = evaluate({"ens": str(tiny_ens(tmp_path / "fc_c.nc", "degC"))}, str(truth), references=False)
    assert str(scores["units"].values[0]) == "K"
    np.testing.assert_allclose(scores["rmse"].values, rmse_k.values, rtol=1e-9)  # was 288.8 K
    assert float(scores["rmse"].max()) < 10


def test_k_site_model_on_a_degc_table(tmp_path: Path) -> None:
    table = ["--table-variable", "temperature", "--table-lead", "24h"]
    model = _fit(tmp_path, site_table(tmp_path / "train.csv", "K"), "site.nc", *table, "--units", "K")
    mu_k = _mu(_apply(tmp_path, model, site_table(tmp_path / "k.csv", "K", 4), "k.zarr", *table, "--units", "K"))
    mu_c = _mu(_apply(tmp_path, model, site_table(tmp_path / "c.csv", "degC", 4), "c.zarr", *table,
                      "--units", "degC"))
    np.testing.assert_allclose(mu_c.values, mu_k.values - ZERO_C, rtol=0, atol=F32)


def test_thresholds_with_units_on_a_k_field(tmp_path: Path) -> None:
    model = _fit(tmp_path, tiny_ens(tmp_path / "train.nc", "K"), "emos.nc")
    fc = tiny_ens(tmp_path / "new.nc", "K", seed=1)
    _apply(tmp_path, model, fc, "a.zarr", "--thresholds", "temperature=-5degC")
    _apply(tmp_path, model, fc, "b.zarr", "--thresholds", "temperature=268.15")
    p_c, p_k = _mu(tmp_path / "a_probabilities.zarr"), _mu(tmp_path / "b_probabilities.zarr")
    np.testing.assert_allclose(p_c["threshold"].values, [268.15], rtol=1e-15)
    np.testing.assert_allclose(p_c.values, p_k.values, rtol=1e-12)
    assert 0.0 < float(p_c.mean()) < 1.0  # a plain -5 would be -5 K: probability 1 everywhere
    assert main(["postprocess", "apply", "--emos", str(model), "--forecast", str(fc), "--out",
                 str(tmp_path / "c.zarr"), "--quiet", "--thresholds", "temperature=5m"]) == 2  # a length: refused


def test_evaluate_thresholds_with_units(tmp_path: Path) -> None:
    from smoeweather.commands.evaluate import parse_thresholds
    from smoeweather.evaluate.run import evaluate

    truth = tiny_ens(tmp_path / "truth.nc", "K")
    s = evaluate({"ens": str(truth)}, str(truth), references=False,
                 thresholds=parse_thresholds(["temperature_850=-3degC,271"]))
    np.testing.assert_allclose(np.sort(s["threshold"].values), [270.15, 271.0], rtol=1e-15)


def test_units_missing_on_one_side_refused_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fc = tiny_ens(tmp_path / "bare.nc", "", truth_units="K")
    assert main(["postprocess", "fit", "--forecast", str(fc), "--out", str(tmp_path / "m.nc"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "'temperature'" in err and "bare.nc" in err and "has no units" in err and "--units" in err
    assert not (tmp_path / "m.nc").exists()
    model = _fit(tmp_path, tiny_ens(tmp_path / "train.nc", "K"), "emos.nc")
    code = main(["postprocess", "apply", "--emos", str(model), "--forecast", str(tiny_ens(tmp_path / "m.nc", "m")),
                 "--out", str(tmp_path / "pp.zarr"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'m'" in err and "'K'" in err and "m.nc" in err and "emos.nc" in err
    assert not (tmp_path / "pp.zarr").exists()


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.floats(200.0, 320.0), min_size=8, max_size=8),
       model_c=st.booleans(), forecast_c=st.booleans(), a=st.floats(-3.0, 3.0), b=st.floats(0.5, 1.5))
def test_property_apply_gives_the_same_physical_mu(values: list[float], model_c: bool, forecast_c: bool, a: float,
                                                   b: float) -> None:
    """For K values labelled K or degC on the model and on the forecast, μ is the same physical temperature."""
    from smoeweather.postprocess.emos import apply_emos
    from smoeweather.postprocess.pipeline import from_model_units, to_model_units

    k = np.asarray(values, np.float64).reshape(1, 1, 4, 2)  # (time, lead, member, site)
    mu_units, fc_units = ("degC" if model_c else "K"), ("degC" if forecast_c else "K")
    fc = xr.Dataset({"t": (("time", "prediction_timedelta", "member", "site"),
                           k - ZERO_C if forecast_c else k, {"units": fc_units})})
    # the model μ = a + b·mean in its own units: a K model's a is a K offset (the same in degC); its b acts on
    # the value, so a degC model with the same physical map has a_c = a + (b − 1)·273.15
    a_model = a + (b - 1.0) * ZERO_C if model_c else a
    params = xr.Dataset({"t": xr.DataArray([a_model, b, 0.5, 0.0], dims="coefficient",
                                           coords={"coefficient": ["a", "b", "c", "d"]}, attrs={"units": mu_units})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _converted())
        conv = to_model_units({"field_units": {"t": mu_units}}, fc, "model.nc", "fc.nc")
        mu, sigma = from_model_units(*apply_emos(params, conv), conv)
    mu_k = mu["t"].values + (ZERO_C if forecast_c else 0.0)
    assert mu["t"].attrs["units"] == fc_units
    np.testing.assert_allclose(mu_k, a + b * k.mean(axis=2), rtol=0, atol=1e-9)
    np.testing.assert_allclose(sigma["t"].values, np.sqrt(0.5), rtol=1e-12)
