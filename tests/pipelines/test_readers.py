"""Readers → canonical Dataset: every format from files in the published layout and from the real
files in ../shared/data; values survive; every bad input gets a DataError that says what and where."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from fake_layouts import (
    EPS32,
    EPS64,
    era5_truth_10deg,
    sum_rtol,
    wb2_dataset,
    write_cds_netcdf,
    write_cmip6,
    write_ens10,
    write_wb2_zarr,
    write_weatherbench,
)

from pipelines.canonical import G, canonicalize, fill_nans, select_years, validate
from pipelines.errors import DataError
from pipelines.grids import weatherbench_grid
from pipelines.readers import open_source
from smoeweather.metrics.weights import cell_area_weights

GRIB = "era5-levels-members.grib"
TAS_CMIP5 = "tas_Amon_CanESM2_rcp85_r1i1p1_200701-200712.nc"
TA_CMIP6 = "ta_day_MPI-ESM1-2-HR_historical_r1i1p1f1_gn_20000101-20041231.nc"
CANONICAL_ORDER = ["time", "prediction_timedelta", "member", "level", "latitude", "longitude"]


def assert_canonical(ds: xr.Dataset) -> None:
    lat, lon = ds["latitude"].values, ds["longitude"].values
    assert np.all(np.diff(lat) > 0) and lon.min() >= 0 and lon.max() < 360 and np.all(np.diff(lon) > 0)
    assert ds["latitude"].attrs["units"] == "degrees_north"
    assert ds["longitude"].attrs["units"] == "degrees_east"
    if "level" in ds.dims:
        assert ds["level"].dtype == np.int64 and ds["level"].attrs["units"] == "hPa"
    for da in ds.data_vars.values():
        assert "units" in da.attrs and "long_name" in da.attrs
        dims = [d for d in CANONICAL_ORDER if d in da.dims]
        assert [d for d in da.dims if d in CANONICAL_ORDER] == dims


# ------------------------------------------------------------------------------------------- grids


def test_weatherbench_grid_and_area_weights():
    grid = weatherbench_grid()
    assert grid.sizes == {"latitude": 32, "longitude": 64}
    assert grid["latitude"].values[0] == -87.1875 and grid["latitude"].values[-1] == 87.1875
    assert grid["longitude"].values[-1] == 354.375
    w = cell_area_weights(grid["latitude"])
    assert abs(float(w.mean()) - 1.0) <= sum_rtol(32)  # mean of 32 float64 weights normalised to 1
    lat = np.deg2rad(grid["latitude"].values)
    d = np.deg2rad(5.625) / 2
    exact = np.sin(lat + d) - np.sin(lat - d)
    # both sides difference sines: a few ulps of |sin| ≤ 1, amplified by 1 / (smallest difference)
    np.testing.assert_allclose(w.values, exact / exact.mean(), rtol=8 * EPS64 / exact.min())
    assert weatherbench_grid(2.8125).sizes == {"latitude": 64, "longitude": 128}


# ----------------------------------------------------------------------------------- WeatherBench v1


@pytest.fixture(scope="module")
def wb_root(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("wb") / "5.625deg"
    return root, write_weatherbench(root)


def test_weatherbench_folders_values_survive(wb_root):
    root, written = wb_root
    folders = [
        "geopotential_500",
        "temperature",
        "temperature_850",
        "2m_temperature",
        "toa_incident_solar_radiation",
        "total_precipitation",
        "constants",
    ]
    ds = open_source("weatherbench", root, variables=folders, years=[1979, 1980])
    assert_canonical(ds)
    raw_z = xr.concat([w["z"] for w in written["geopotential_500"]], "time")
    # the readers copy values (no arithmetic): exact, here and below
    np.testing.assert_array_equal(ds["geopotential"].sel(level=500).values, raw_z.values)
    raw_t = xr.concat([w["t"] for w in written["temperature"]], "time")
    np.testing.assert_array_equal(ds["temperature"].values, raw_t.values)
    np.testing.assert_array_equal(
        ds["2m_temperature"].values, xr.concat([w["t2m"] for w in written["2m_temperature"]], "time").values
    )
    const = written["constants"][0]
    np.testing.assert_array_equal(ds["land_sea_mask"].values, const["lsm"].values)
    np.testing.assert_array_equal(ds["geopotential_at_surface"].values, const["orography"].values)
    assert "lat2d" not in ds and ds["land_sea_mask"].dims == ("latitude", "longitude")
    assert ds["geopotential"].attrs["units"] == "m**2 s**-2"
    assert ds["temperature"].attrs["standard_name"] == "air_temperature"
    assert ds.sizes["time"] == 6 and ds.attrs["source_format"] == "weatherbench"
    np.testing.assert_array_equal(ds["latitude"].values, weatherbench_grid()["latitude"].values)


def test_weatherbench_bad_requests(wb_root):
    root, _ = wb_root
    with pytest.raises(
        DataError, match=r"geopotential_500: no file for year 1990 .*available years: 1979, 1980"
    ):
        open_source("weatherbench", root, variables=["geopotential_500"], years=[1990])
    with pytest.raises(DataError, match=r"variable folder 'vorticity' not found"):
        open_source("weatherbench", root, variables=["vorticity"], years=[1979])
    with pytest.raises(DataError, match=r"variable 'temperature' lacks level\(s\) \[700\] hPa"):
        open_source("weatherbench", root, variables=["temperature"], years=[1979], levels=[700])


def test_weatherbench_non_monotonic_and_duplicated_time(tmp_path):
    written = write_weatherbench(tmp_path, years=[1979])
    ds = written["2m_temperature"][0]
    path = tmp_path / "2m_temperature" / "2m_temperature_1979_5.625deg.nc"
    ds.isel(time=[0, 2, 1]).to_netcdf(path)
    with pytest.raises(
        DataError,
        match=r"2m_temperature_1979_5.625deg.nc: 'time' is not monotonically increasing \(at position 2",
    ):
        open_source("weatherbench", tmp_path, variables=["2m_temperature"], years=[1979])
    ds.isel(time=[0, 1, 1]).to_netcdf(path)
    with pytest.raises(
        DataError,
        match=r"1979_5.625deg.nc: 1 duplicated timestamp\(s\) in 'time', first \['1979-01-01 01:00:00'\]",
    ):
        open_source("weatherbench", tmp_path, variables=["2m_temperature"], years=[1979])


# ------------------------------------------------------------------------------------- WB2 zarr


@pytest.mark.parametrize("scheme", ["memory", "path", "file"])
def test_wb2_zarr_via_fsspec_urls(tmp_path, scheme):
    url = {
        "memory": f"memory://wb2-{tmp_path.name}.zarr",
        "path": str(tmp_path / "wb2.zarr"),
        "file": f"file://{tmp_path / 'wb2f.zarr'}",
    }[scheme]
    written = write_wb2_zarr(url, latitude_descending=(scheme == "path"))
    ds = open_source(
        "wb2",
        url,
        variables=["geopotential", "temperature", "land_sea_mask"],
        levels=[850],
        time=("2020-01-01T06", "2020-01-02T00"),
        storage_options={},
    )
    assert_canonical(ds)
    assert ds.sizes == {"time": 4, "level": 1, "latitude": 32, "longitude": 64}
    expected = written["geopotential"].sel(level=850).isel(time=slice(1, 5)).sortby("latitude")
    np.testing.assert_array_equal(ds["geopotential"].sel(level=850).values, expected.values)
    assert ds.attrs["source_files"] == url


def test_wb2_zarr_bad_requests(tmp_path):
    url = str(tmp_path / "wb2.zarr")
    write_wb2_zarr(url)
    with pytest.raises(DataError, match=r"wb2.zarr: missing variable\(s\) \['specific_humidity'\]"):
        open_source("wb2", url, variables=["specific_humidity"])
    with pytest.raises(DataError, match=r"lacks level\(s\) \[700\] hPa; available levels: \[500, 850\]"):
        open_source("wb2", url, variables=["geopotential"], levels=[700])
    with pytest.raises(DataError, match=r"requested time 2019-01-01..2019-12-31 is outside the data"):
        open_source("wb2", url, time=slice("2019-01-01", "2019-12-31"))
    with pytest.raises(DataError, match=r"nowhere.zarr: cannot open as a zarr store"):
        open_source("wb2", str(tmp_path / "nowhere.zarr"))


# ------------------------------------------------------------------------------------------ CDS


@pytest.mark.shared_data
def test_cds_real_grib_members_and_levels(shared_data, tmp_path):
    import cfgrib

    path = shutil.copy(shared_data / GRIB, tmp_path / GRIB)
    ds = open_source("cds", path)
    assert_canonical(ds)
    assert ds.sizes == {"time": 4, "member": 10, "level": 2, "latitude": 61, "longitude": 120}
    assert list(ds["level"].values) == [500, 850] and set(ds.data_vars) == {"geopotential", "temperature"}
    raw = cfgrib.open_datasets(str(shared_data / GRIB), backend_kwargs={"indexpath": ""})[0]
    pick = dict(time="2017-01-01T12:00", latitude=45.0, longitude=90.0)
    assert float(ds["geopotential"].sel(member=3, level=500, **pick)) == float(
        raw["z"].sel(number=3, isobaricInhPa=500, **pick)
    )
    assert float(ds["temperature"].sel(member=9, level=850, **pick)) == float(
        raw["t"].sel(number=9, isobaricInhPa=850, **pick)
    )
    assert list(tmp_path.iterdir()) == [tmp_path / GRIB]  # no cfgrib index written
    with pytest.raises(DataError, match=r"missing variable\(s\) \['specific_humidity'\]"):
        open_source("cds", path, variables=["specific_humidity"])
    with pytest.raises(
        DataError,
        match=r"era5.grib: variable 'geopotential' lacks level\(s\) \[700\] hPa; available levels: \[500, 8",
    ):
        validate(ds, path="era5.grib", variables=["geopotential"], levels=[700])


@pytest.mark.shared_data
def test_truncated_grib_and_netcdf(shared_data, tmp_path):
    cut = tmp_path / "cut.grib"
    cut.write_bytes((shared_data / GRIB).read_bytes()[:1000])
    with pytest.raises(DataError, match=r"cut.grib: truncated or corrupt GRIB file \(message 1"):
        open_source("cds", cut)
    half = tmp_path / "half.grib"
    half.write_bytes((shared_data / GRIB).read_bytes()[:1_200_000])  # cfgrib alone would fill NaNs
    with pytest.raises(DataError, match=r"half.grib: truncated or corrupt GRIB file \(message 82"):
        open_source("cds", half)
    for n in (2000, 300_000):
        nc = tmp_path / f"cut{n}.nc"
        nc.write_bytes((shared_data / TAS_CMIP5).read_bytes()[:n])
        with pytest.raises(DataError, match=rf"cut{n}.nc: (cannot read netCDF|data unreadable)"):
            open_source("cds", nc)
        with pytest.raises(DataError, match=rf"cut{n}.nc: (cannot read netCDF|data unreadable)"):
            open_source("cmip6", nc).load()
    text = tmp_path / "notes.grib"
    text.write_text("not a grib")
    with pytest.raises(DataError, match=r"notes.grib: neither GRIB nor netCDF"):
        open_source("cds", text)


def test_truncated_grib_and_netcdf_written_here(tmp_path):
    """The same refusals without ../shared: the broken files are written by the test."""
    from fake_layouts import write_grib

    rng = np.random.default_rng(0)
    msgs = [
        {"shortName": "t", "typeOfLevel": "isobaricInhPa", "level": lv, "dataDate": 20200101, "dataTime": 0,
         "values": 250 + rng.standard_normal((19, 36))}
        for lv in (250, 500, 700, 850)
    ]
    whole = tmp_path / "whole.grib"
    write_grib(whole, msgs)
    data = whole.read_bytes()
    size = len(data) // 4  # four messages of equal length
    for name, n, message in (("cut.grib", 100, 1), ("half.grib", 2 * size + size // 2, 3)):
        (tmp_path / name).write_bytes(data[:n])
        with pytest.raises(DataError, match=rf"{name}: truncated or corrupt GRIB file \(message {message}"):
            open_source("cds", tmp_path / name)
    times = pd.date_range("2000-01-01", periods=40, freq="6h")
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), 280 + rng.standard_normal((40, 19, 36)), {"units": "K"})},
        coords={"time": times, "lat": np.arange(-90.0, 91.0, 10.0), "lon": np.arange(0.0, 360.0, 10.0)},
    )
    ds.to_netcdf(tmp_path / "whole.nc")
    data = (tmp_path / "whole.nc").read_bytes()
    for n in (2000, len(data) // 2):
        nc = tmp_path / f"cut{n}.nc"
        nc.write_bytes(data[:n])
        with pytest.raises(DataError, match=rf"cut{n}.nc: (cannot read netCDF|data unreadable)"):
            open_source("cds", nc)
        with pytest.raises(DataError, match=rf"cut{n}.nc: (cannot read netCDF|data unreadable)"):
            open_source("cmip6", nc).load()


def test_cds_netcdf_new_layout(tmp_path):
    raw = write_cds_netcdf(tmp_path / "era5_pl.nc")
    ds = open_source("cds", tmp_path / "era5_pl.nc")
    assert_canonical(ds)
    assert list(ds["level"].values) == [500, 850] and ds.sizes["time"] == 3
    expected = raw["z"].sel(pressure_level=500.0).sortby("latitude")
    np.testing.assert_array_equal(ds["geopotential"].sel(level=500).values, expected.values)
    with pytest.raises(
        DataError, match=r"3 duplicated timestamp\(s\) in 'time', first \['2021-06-01 00:00:00'"
    ):
        open_source("cds", [tmp_path / "era5_pl.nc", tmp_path / "era5_pl.nc"])


@pytest.mark.shared_data
def test_real_members_5625_netcdf(shared_data):
    ds = open_source(
        "cds",
        shared_data / "era5_members_z500_t850_5.625deg.nc",
        levels={"geopotential": [500], "temperature": [850]},
    )
    raw = xr.load_dataset(shared_data / "era5_members_z500_t850_5.625deg.nc")
    np.testing.assert_array_equal(
        ds["geopotential"].sel(level=500).values, raw["z500"].transpose("time", "number", "lat", "lon").values
    )
    np.testing.assert_array_equal(
        ds["temperature"].sel(level=850).values, raw["t850"].transpose("time", "number", "lat", "lon").values
    )
    np.testing.assert_array_equal(ds["latitude"].values, weatherbench_grid()["latitude"].values)
    with pytest.raises(
        DataError, match=r"'temperature' lacks level\(s\) \[500\] hPa; available levels: \[850\]"
    ):
        open_source("cds", shared_data / "era5_members_z500_t850_5.625deg.nc", levels=[500])


@pytest.mark.shared_data
# the tutorial file's packed u, v, z declare a NaN _FillValue, which xarray drops (harmless: none is missing)
@pytest.mark.filterwarnings("ignore:variable '[uvz]' has non-conforming '_FillValue'")
def test_eraint_descending_latitude_and_180_longitude(shared_data):
    raw = xr.load_dataset(shared_data / "eraint_uvz.nc")
    assert raw["latitude"].values[0] == 90 and raw["longitude"].values.min() == -180
    ds = canonicalize(raw, source="cds")
    assert_canonical(ds)
    assert list(ds["level"].values) == [200, 500, 850]
    for lat, lon in [(60.0, -30.0), (-45.75, 179.25), (0.0, -180.0)]:
        a = ds["u_component_of_wind"].sel(month=7, level=200, latitude=lat, longitude=lon % 360)
        b = raw["u"].sel(month=7, level=200, latitude=lat, longitude=lon)
        assert float(a) == float(b)
    assert ds["geopotential"].attrs["units"] == "m**2 s**-2"


# ---------------------------------------------------------------------------------------- CMIP6


@pytest.mark.shared_data
def test_cmip5_tas_365_day_conservative_mean(shared_data):
    path = shared_data / TAS_CMIP5
    ds = open_source("cmip6", path, target_grid=weatherbench_grid(), method="conservative")
    assert_canonical(ds)
    assert ds.sizes == {"time": 12, "latitude": 32, "longitude": 64}
    assert ds.attrs["calendar_original"] == "365_day" and ds["time"].dtype.kind == "M"
    raw = xr.load_dataset(path, decode_times=False)["tas"]
    src_mean = float((raw * cell_area_weights(raw["lat"].values).values[:, None]).mean())
    out_mean = float((ds["2m_temperature"] * cell_area_weights(ds["latitude"])).mean())
    assert abs(out_mean - src_mean) < 0.5
    bilinear = open_source("cmip6", path, target_grid=weatherbench_grid(), method="bilinear")
    assert int(bilinear["2m_temperature"].isnull().sum()) == 0  # periodic in longitude, poles padded


@pytest.mark.shared_data
def test_cmip6_ta_plev_pa_to_hpa(shared_data):
    ds = open_source("cmip6", shared_data / TA_CMIP6)
    assert list(ds["level"].values) == [850, 1000] and ds.sizes["time"] == 1827
    raw = xr.load_dataset(shared_data / TA_CMIP6)
    np.testing.assert_array_equal(ds["temperature"].sel(level=850).values, raw["ta"].sel(plev=85000.0).values)
    assert ds.attrs["source_id"] == "MPI-ESM1-2-HR"


def test_cmip6_zg_two_files_noleap(tmp_path):
    paths, full = write_cmip6(tmp_path, "zg", calendar="noleap")
    ds = open_source("cmip6", paths[::-1])  # file order must not matter
    assert_canonical(ds)
    assert ds.sizes == {"time": 6, "level": 2, "latitude": 12, "longitude": 24}
    assert ds["time"].dtype.kind == "M" and ds.attrs["calendar_original"] == "noleap"
    np.testing.assert_allclose(
        ds["geopotential"].sel(level=500).values, full["zg"].sel(plev=50000.0).values * G, rtol=2 * EPS32
    )
    assert ds["geopotential"].attrs["units"] == "m**2 s**-2"
    assert ds["geopotential"].attrs["units_original"] == "m"
    out = open_source("cmip6", paths, target_grid=weatherbench_grid(), method="conservative")
    assert out.sizes == {"time": 6, "level": 2, "latitude": 32, "longitude": 64}
    assert int(out["geopotential"].isnull().sum()) == 0  # lon 7.5…352.5 wrapped onto 0 and 354.375
    w_in, w_out = cell_area_weights(ds["latitude"]), cell_area_weights(out["latitude"])
    mean_in = float((ds["geopotential"] * w_in).mean())
    assert abs(float((out["geopotential"] * w_out).mean()) - mean_in) < 1e-3 * mean_in


def test_cmip6_360_day_keeps_cftime_and_mismatching_grids(tmp_path):
    paths, _ = write_cmip6(tmp_path / "a", "tas", calendar="360_day")
    ds = open_source("cmip6", paths, target_grid=weatherbench_grid(), method="bilinear")
    assert ds["time"].dtype == object and ds.attrs["calendar_original"] == "360_day"
    assert list(select_years(ds, [1850])["time"].dt.year.values) == [1850] * 6
    with pytest.raises(DataError, match=r"year\(s\) \[1851\] not in the data; available years: 1850..1850"):
        select_years(ds, [1851])
    other = tmp_path / "b" / paths[1].name
    other.parent.mkdir()
    xr.load_dataset(paths[1]).isel(lat=slice(0, 6)).to_netcdf(other)
    with pytest.raises(DataError, match=r"latitude differs from .* \(6 vs 12 values\); expected one grid"):
        open_source("cmip6", [paths[0], other])


# --------------------------------------------------------------------------------------- ENS-10


@pytest.fixture(scope="module")
def ens10_files(tmp_path_factory) -> dict[str, Path]:
    return write_ens10(tmp_path_factory.mktemp("ens10"))


def test_ens10_members_lead_and_truth(ens10_files):
    import cfgrib

    truth = era5_truth_10deg(pd.date_range("2016-01-01", "2017-01-10", freq="12h"))
    ds = open_source("ens10", [ens10_files["pl"], ens10_files["sfc"]], members=10, truth=truth)
    assert ds.sizes == {"time": 2, "member": 10, "level": 2, "latitude": 19, "longitude": 36}
    assert pd.Timedelta(ds["prediction_timedelta"].values) == pd.Timedelta(hours=48)
    np.testing.assert_array_equal(ds["valid_time"].values, ds["time"].values + np.timedelta64(48, "h"))
    raw = cfgrib.open_datasets(str(ens10_files["pl"]), backend_kwargs={"indexpath": ""})[0]
    a = ds["geopotential"].sel(member=4, level=850).isel(time=1)
    b = (
        raw["z"]
        .sel(number=4, isobaricInhPa=850, step=np.timedelta64(48, "h"))
        .isel(time=1)
        .sortby("latitude")
    )
    np.testing.assert_array_equal(a.values, b.values)
    t2m = ds["2m_temperature_truth"].isel(time=0)
    np.testing.assert_array_equal(t2m.values, truth["2m_temperature"].sel(time="2016-01-04T00").values)
    five = open_source("ens10", ens10_files["sfc"], members=5)
    assert list(five["member"].values) == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(
        five["2m_temperature"].values, ds["2m_temperature"].isel(member=slice(0, 5)).values
    )


def test_ens10_bad_requests(ens10_files):
    with pytest.raises(DataError, match=r"members=7 is not supported; expected 5 or 10"):
        open_source("ens10", ens10_files["pl"], members=7)
    with pytest.raises(DataError, match=r"lead time 3 days 00:00:00 not in file"):
        open_source("ens10", ens10_files["sfc"], lead_hours=72)
    short = era5_truth_10deg(pd.date_range("2016-01-01", "2016-12-31", freq="12h"))
    with pytest.raises(DataError, match=r"truth lacks 1 valid time\(s\) .*\['2017-01-04"):
        open_source("ens10", ens10_files["sfc"], truth=short)
    coarse = era5_truth_10deg(pd.date_range("2016-01-01", "2017-01-10", freq="12h")).isel(
        latitude=slice(1, -1)
    )
    with pytest.raises(DataError, match=r"truth grid does not match the ENS-10 forecast grid in latitude"):
        open_source("ens10", ens10_files["sfc"], truth=coarse)


# ------------------------------------------------------------------------- canonical form, validation


def test_unknown_kind_source_and_units():
    with pytest.raises(DataError, match=r"unknown source kind 'grib2'; expected one of"):
        open_source("grib2", "x")
    with pytest.raises(DataError, match=r"unknown source 'era6'"):
        canonicalize(wb2_dataset(), source="era6")
    bad = wb2_dataset().assign(temperature=lambda d: d["temperature"].assign_attrs(units="furlongs"))
    with pytest.raises(DataError, match=r"variable 'temperature' has units 'furlongs'; expected 'K'"):
        canonicalize(bad, source="wb2")


def test_nan_report_and_fill_policies():
    ds = canonicalize(wb2_dataset(times=2), source="wb2")
    sst = ds["2m_temperature"].load().copy()
    sst[:, 10:12, 20:23] = np.nan  # a 'land' patch, same at every time, as in SST fields
    ds = ds.assign({"2m_temperature": sst})
    with pytest.raises(
        DataError, match=r"store.zarr: NaN values found \('2m_temperature': 12 of 4096 values\)"
    ):
        validate(ds, path="store.zarr")
    zero = validate(ds, fill_policy="zero")["2m_temperature"]
    assert float(zero[0, 10, 20]) == 0.0 and "zero" in validate(ds, fill_policy="zero").attrs["nan_filled"]
    nearest = validate(ds, fill_policy="nearest")["2m_temperature"]
    assert float(nearest[0, 10, 20]) in (float(sst[0, 9, 20]), float(sst[0, 10, 19]))
    assert int(nearest.isnull().sum()) == 0
    np.testing.assert_array_equal(nearest.values[~np.isnan(sst.values)], sst.values[~np.isnan(sst.values)])
    mean = fill_nans(ds, "mean")["2m_temperature"]
    field = sst[1].values
    assert float(mean[1, 11, 22]) == pytest.approx(float(sst[1].mean()), rel=sum_rtol(field.size, EPS32))
    with pytest.raises(DataError, match=r"fill_policy 'median' is not known"):
        validate(ds, fill_policy="median")


def test_validate_needs_grid():
    with pytest.raises(DataError, match=r"f.nc: no 'latitude' dimension"):
        validate(xr.Dataset({"x": ("time", [1.0])}), path="f.nc")
