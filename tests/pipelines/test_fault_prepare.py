"""Fault cases of ``smoe data prepare``: every time step is judged, named fields are never dropped,
non-finite values and missing zarr chunks are refused by name, and implausible values (a unit mistake) are refused
naming the variable, the range and the likely mistake — here and at ``smoe forecast --data``. Each case in the
exact published layout (tests/fake_layouts.py); each gave a wrong store with exit 0 before."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from fake_layouts import wb2_dataset, write_cds_netcdf, write_grib, write_weatherbench
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import DataError
from pipelines.plausibility import RANGES, G, check_plausible, geopotential_range
from smoeweather.cli import main

FAST = ["--native-grid", "--scheduler", "threads", "--quiet"]


def _prepare(source: Path | str, out: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, str]:
    """(exit code, stderr) of ``smoe data prepare era5 --source SOURCE --out OUT``."""
    capsys.readouterr()
    code = main(["data", "prepare", "era5", "--source", str(source), "--out", str(out), *FAST, *extra])
    return code, capsys.readouterr().err


def _weatherbench_t850_nan_at_t0(root: Path) -> None:
    """WeatherBench v1 folders geopotential_500 + temperature (500/850/1000 hPa, 8 hourly steps) + constants;
    temperature at 850 hPa NaN at the first step only (7 valid steps)."""
    write_weatherbench(root, years=(1979,), steps=8)
    for folder in ("temperature_850", "2m_temperature", "toa_incident_solar_radiation", "total_precipitation"):
        for p in (root / folder).iterdir():
            p.unlink()
        (root / folder).rmdir()
    path = root / "temperature" / "temperature_1979_5.625deg.nc"
    ds = xr.load_dataset(path)
    ds["t"].loc[{"level": 850}] = ds["t"].sel(level=850).where(ds["time"] != ds["time"][0])
    path.unlink()
    ds.to_netcdf(path, encoding={"time": {"units": "hours since 1900-01-01", "dtype": "int32"}})


def test_nan_at_first_step_refuses_the_level_instead_of_dropping_it(tmp_path: Path, capsys) -> None:
    root = tmp_path / "5.625deg"
    _weatherbench_t850_nan_at_t0(root)
    out = tmp_path / "s.zarr"
    code, err = _prepare(root, out, capsys, "--levels", "500", "850")
    assert code == 2 and "'temperature' @850 hPa: 2048 of 16384 values" in err and not out.exists()
    code, err = _prepare(root, out, capsys, "--levels", "500", "850", "--allow-missing")
    assert code == 0, err
    ds = xr.open_zarr(out)
    assert list(ds["temperature"]["level"].values) == [500, 850] and ds.sizes["time"] == 8  # every step kept
    assert int(ds["temperature"].sel(level=850).isnull().sum()) == 2048
    assert "'temperature' @850 hPa: 2048 of 16384 values" in ds.attrs["missing_values"]
    assert sorted(ds.data_vars) == ["geopotential_500", "geopotential_at_surface", "land_sea_mask", "soil_type",
                                    "temperature"]  # geopotential truly absent at 850 hPa: split as before


def test_all_nan_variable_named_in_variables_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "era5.nc"
    ds = write_cds_netcdf(path)
    ds["t"] = ds["t"] * np.nan
    path.unlink()
    ds.to_netcdf(path)
    code, err = _prepare(path, tmp_path / "s.zarr", capsys, "--variables", "geopotential", "temperature")
    assert code == 2 and "variable 'temperature' named in --variables holds no data" in err
    code, err = _prepare(path, tmp_path / "s.zarr", capsys)  # unnamed: it never vanishes either
    assert code == 2 and "variable 'temperature' holds no data" in err and not (tmp_path / "s.zarr").exists()
    src = wb2_dataset(times=8)  # a WB2 zarr: zarr leaves the all-NaN chunks out, said as such
    src["temperature"] = src["temperature"] * np.nan
    src.to_zarr(tmp_path / "src.zarr", consolidated=True, zarr_format=2)
    code, err = _prepare(tmp_path / "src.zarr", tmp_path / "s.zarr", capsys, "--variables", "temperature")
    assert code == 2 and "variable 'temperature' lacks 1 of its 1 chunks" in err and "never written" in err


def test_missing_zarr_chunk_is_an_error_naming_the_store(tmp_path: Path, capsys) -> None:
    src = tmp_path / "src.zarr"
    wb2_dataset(times=8).chunk({"time": 4, "level": 1}).to_zarr(src, consolidated=True, zarr_format=2)
    (src / "geopotential" / "0.0.0.0").unlink()  # time 0-3 at 500 hPa
    code, err = _prepare(src, tmp_path / "s.zarr", capsys)
    assert code == 2 and str(src) in err and "'geopotential' lacks 1 of its 4 chunks" in err
    assert "geopotential/0.0.0.0" in err and not (tmp_path / "s.zarr").exists()


def test_inf_values_are_counted_and_refused_or_stored_as_missing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "era5.nc"
    ds = write_cds_netcdf(path)
    ds["t"][1, 0, 0, :3] = np.inf
    ds["t"][2, 1, 5, 5] = -np.inf
    path.unlink()
    ds.to_netcdf(path)
    out = tmp_path / "s.zarr"
    code, err = _prepare(path, out, capsys)
    assert code == 2 and "±inf" in err and "'temperature' @850 hPa: 3 of 2052 values (3 ±inf)" in err
    assert "'temperature' @500 hPa: 1 of 2052 values (1 ±inf)" in err and not out.exists()
    assert _prepare(path, out, capsys, "--allow-missing")[0] == 0
    store, stats = xr.open_zarr(out), xr.open_zarr(out, group="statistics").load()
    assert int(np.isinf(store["temperature"]).sum()) == 0 and int(store["temperature"].isnull().sum()) == 4
    assert bool(np.isfinite(stats["temperature"].sel(statistic=["mean", "std"])).all())


def _height_in_metres(path: Path) -> None:
    """A WB2 zarr whose geopotential holds geopotential HEIGHT (m) and no units attribute."""
    src = wb2_dataset(times=8)
    src["geopotential"] = (src["geopotential"] / G).assign_attrs(long_name="Geopotential")
    src.to_zarr(path, consolidated=True, zarr_format=2)


def test_geopotential_height_without_units_is_refused_at_prepare_and_forecast(tmp_path: Path, capsys) -> None:
    _height_in_metres(tmp_path / "src.zarr")
    store = tmp_path / "s.zarr"
    code, err = _prepare(tmp_path / "src.zarr", store, capsys)
    lo, hi = geopotential_range(500).median
    assert code == 2 and re.search(r"geopotential at 500 hPa: median 5,[45]\d\d, ", err) and not store.exists()
    assert f"expected {lo:,.0f}–{hi:,.0f} m² s⁻²: this looks like geopotential height in m; multiply by 9.80665" in err
    assert _prepare(tmp_path / "src.zarr", store, capsys, "--no-plausibility-check")[0] == 0
    forecast = ["forecast", "--method", "persistence", "--data", str(store), "--init", "2020-01-01T00",
                "2020-01-01T06", "--every", "6h", "--lead", "6h", "--no-progress"]
    capsys.readouterr()
    assert main([*forecast, "--out", str(tmp_path / "fc.zarr")]) == 2
    assert re.search(r"geopotential at 500 hPa: median 5,[45]\d\d, ", capsys.readouterr().err)
    assert not (tmp_path / "fc.zarr").exists()
    assert main([*forecast, "--out", str(tmp_path / "fc.zarr"), "--no-plausibility-check"]) == 0


def test_celsius_labelled_kelvin_grib_is_refused(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    grib = tmp_path / "an.grib"
    write_grib(grib, [{"stream": "oper", "type": "an", "shortName": "t", "typeOfLevel": "isobaricInhPa",
                       "level": level, "dataDate": 20240115, "dataTime": 1200,
                       "values": mean + 5 * rng.standard_normal((19, 36))} for level, mean in ((500, -21.0),
                                                                                              (850, 2.0))])
    code, err = _prepare(grib, tmp_path / "s.zarr", capsys)
    assert code == 2 and "temperature at 500 hPa: median -2" in err
    assert "expected 150–350 K: values look like °C labelled K" in err and "temperature at 850 hPa: median" in err


def test_level_axis_in_pa_labelled_hpa_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "era5.nc"
    ds = write_cds_netcdf(path)
    ds = ds.assign_coords(pressure_level=("pressure_level", [85000.0, 50000.0], {"units": "hPa"}))
    path.unlink()
    ds.to_netcdf(path)
    code, err = _prepare(path, tmp_path / "s.zarr", capsys)
    assert code == 2 and "level axis 50000, 85000 labelled hPa: looks like Pa" in err


# ------------------------------------------------------------------------------ the plausibility layer


def _field(values: np.ndarray, units: str, level: float | None = None) -> xr.Dataset:
    dims = ("time", "latitude", "longitude")
    da = xr.DataArray(values.reshape(2, 4, 8), dims=dims, attrs={"units": units})
    name = "temperature" if level is None else "geopotential"
    return da.expand_dims(level=[level]).to_dataset(name=name) if level is not None else da.to_dataset(name=name)


@settings(max_examples=40, deadline=None)
@given(
    unit=st.lists(st.floats(0.0, 1.0), min_size=64, max_size=64),
    position=st.floats(0.0, 1.0),
    spread=st.floats(0.0, 1.0),
)
def test_fields_in_range_pass_and_celsius_as_kelvin_is_refused(unit: list[float], position: float,
                                                               spread: float) -> None:
    """Any temperature field whose values lie in the plausible bounds with its median in the median range
    passes; the same field in °C labelled K is refused naming the mistake. Same for geopotential at 500 hPa
    and height in metres."""
    u = np.asarray(unit)
    rng = RANGES["temperature"]
    (m0, m1), (b0, b1) = rng.median, rng.bounds
    centre = m0 + position * (m1 - m0)
    width = spread * min(centre - b0, b1 - centre)
    values = centre + width * (u - np.median(u)) / max(float(np.ptp(u)), 1e-12)
    check_plausible({"t": _field(values, "K")})
    with pytest.raises(DataError, match="values look like °C labelled K"):
        check_plausible({"t": _field(values - 273.15, "K")})
    (z0, z1) = geopotential_range(500).median
    z = z0 + position * (z1 - z0) + spread * 2000 * (u - np.median(u))
    check_plausible({"z": _field(z, "m**2 s**-2", 500.0)})
    with pytest.raises(DataError, match="geopotential at 500 hPa: .*looks like geopotential height in m"):
        check_plausible({"z": _field(z / G, "m**2 s**-2", 500.0)})
    check_plausible({"t": _field(values - 273.15, "K")}, enabled=False)  # --no-plausibility-check


def test_default_worlds_pass(tmp_path: Path) -> None:
    """The synthetic default world and the published GCM world layout are plausible as generated."""
    from pipelines.plausibility import problems
    from pipelines.world import simulate_world

    assert problems(simulate_world((2000, 2000), seed=0, n_steps=8)) == []
    times = pd.date_range("2000-01-01", periods=3, freq="6h")
    from fake_layouts import era5_truth_10deg

    assert problems(era5_truth_10deg(times, levels=(250, 500, 700, 850, 925, 1000))) == []


def test_shared_gcm_worlds_pass() -> None:
    from conftest import SHARED_DATA

    from pipelines.plausibility import problems

    paths = sorted((SHARED_DATA / "gcm_world").glob("*.nc")) + sorted((SHARED_DATA / "gcm_ens").glob("*.nc"))
    if not paths:
        pytest.skip(f"needs the GCM world files under {SHARED_DATA}")
    for path in paths:
        with xr.open_dataset(path) as ds:
            assert problems(ds) == [], path
