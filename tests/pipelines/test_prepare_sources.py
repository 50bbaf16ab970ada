"""`smoe data prepare` end to end: every source format (published layouts and the real files in
../shared/data) → zarr store → values, grid, statistics, provenance; ENS-10 with ERA5 truth; atomicity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import xarray_regrid  # noqa: F401 - registers the .regrid accessor
from fake_layouts import (
    EPS32,
    era5_truth_10deg,
    f32_atol,
    sum_rtol,
    wb2_dataset,
    write_cmip6,
    write_ens10,
    write_wb2_zarr,
    write_weatherbench,
)

from pipelines import prepare as prepare_mod
from pipelines.canonical import G
from pipelines.errors import DataError
from pipelines.grids import weatherbench_grid
from pipelines.prepare import open_store, prepare
from smoeweather.cli import main
from smoeweather.data.ensemble_dataset import open_ensemble_dataset
from smoeweather.data.weather import WeatherBenchDataset, field_name
from smoeweather.metrics.weights import cell_area_weights

GRIB = "era5-levels-members.grib"
TA_CMIP6 = "ta_day_MPI-ESM1-2-HR_historical_r1i1p1f1_gn_20000101-20041231.nc"
FAST = dict(scheduler="threads", progress=False)
FIELDS = [("geopotential", 500), ("temperature", 850)]


def _cfgrib(path: Path) -> xr.Dataset:
    """The GRIB file as cfgrib reads it (no index file written), latitude ascending."""
    ds = xr.load_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": ""})
    return ds.sortby("latitude").load()


def _area_mean(da: xr.DataArray) -> xr.DataArray:
    w = cell_area_weights(da["latitude"].values)
    return (da * w.values[:, None]).mean(("latitude", "longitude"))


# ------------------------------------------------------------------------------ real ERA5 GRIB


@pytest.mark.parametrize("grid", [None, 5.625])
def test_real_era5_grib_to_sample_and_back(shared_data: Path, tmp_path: Path, grid: float | None) -> None:
    before = sorted(p.name for p in shared_data.iterdir())
    out = prepare("era5", shared_data / GRIB, tmp_path / "era5.zarr", grid=grid, **FAST)
    assert sorted(p.name for p in shared_data.iterdir()) == before  # no cfgrib index in the shared folder
    ds, _ = open_store(out)
    assert ds["geopotential"].dims == ("time", "member", "level", "latitude", "longitude")
    assert ds.sizes["member"] == 10 and ds.sizes["time"] == 4
    assert ds.sizes["latitude"] == (61 if grid is None else 32)

    raw = _cfgrib(shared_data / GRIB)
    if grid is not None:  # what xarray-regrid gives when applied directly to the cfgrib fields
        raw = raw.regrid.conservative(weatherbench_grid(grid), latitude_coord="latitude")
    member = 3
    ops = 4 if grid is None else 12  # + conservative regridding: a weighted sum of a few source cells
    data = WeatherBenchDataset(out, FIELDS, input_offsets_h=(0,), lead_h=12, constants=(), member=member)
    assert len(data) == 3  # 4 times 12-hourly: inits 0, 12, 24 h
    for i in range(len(data)):
        x, y = data[i]
        valid = data.valid_time(i)
        assert valid == data.init_time(i) + np.timedelta64(12, "h")
        back = data.denormalize_target(y.numpy())
        for c, (name, level) in enumerate(FIELDS):
            short = {"geopotential": "z", "temperature": "t"}[name]
            want = raw[short].isel(number=member).sel(time=valid, isobaricInhPa=level).values
            np.testing.assert_allclose(back[c], want, rtol=0, atol=f32_atol(want, data.target_mean[c], ops=ops))
            first = raw[short].isel(number=member).sel(time=data.init_time(i), isobaricInhPa=level).values
            x_phys = x[c].numpy() * data.input_std[c] + data.input_mean[c]
            np.testing.assert_allclose(x_phys, first, rtol=0, atol=f32_atol(first, data.input_mean[c], ops=ops))
    with pytest.raises(ValueError, match="member"):
        WeatherBenchDataset(out, FIELDS, input_offsets_h=(0,), lead_h=12, constants=())


# --------------------------------------------------------------------------- WeatherBench v1 + stats


def test_weatherbench_folder_values_statistics_provenance(tmp_path: Path) -> None:
    root = tmp_path / "5.625deg"
    written = write_weatherbench(root, years=(1979, 1980), steps=3)
    out = prepare("era5", root, tmp_path / "wb.zarr", train_years=(1979, 1979), **FAST)
    ds, stats = open_store(out)
    t = xr.concat([w["t"] for w in written["temperature"]], "time")
    np.testing.assert_array_equal(ds["temperature"].values, t.values)  # copied (no regrid): exact
    z = xr.concat([w["z"] for w in written["geopotential_500"]], "time")
    np.testing.assert_array_equal(ds["geopotential_500"].values, z.values)
    # only real fields: geopotential exists at 500 hPa only, so no all-NaN geopotential@850/1000
    assert "geopotential" not in ds and ds["geopotential_500"].attrs["canonical_name"] == "geopotential"
    assert ds["geopotential_500"].attrs["level"] == 500 and "level" not in ds["geopotential_500"].dims
    assert bool(np.isfinite(stats.to_array()).all())  # no NaN statistics anywhere
    t2m = xr.concat([w["t2m"] for w in written["2m_temperature"]], "time")
    np.testing.assert_array_equal(ds["2m_temperature"].values, t2m.values)
    const = written["constants"][0]
    np.testing.assert_array_equal(ds["land_sea_mask"].values, const["lsm"].values)
    np.testing.assert_array_equal(ds["geopotential_at_surface"].values, const["orography"].values)
    assert ds["time"].size == 6 and ds["latitude"].values[0] == -87.1875  # exact in binary

    # statistics over the training year 1979 only
    t1979 = written["temperature"][0]["t"].values.astype(np.float64)
    n = t1979[:, 0].size  # float64 reductions over n values on both sides
    np.testing.assert_allclose(
        stats["temperature"].sel(statistic="mean").values, t1979.mean(axis=(0, 2, 3)), rtol=sum_rtol(n)
    )
    np.testing.assert_allclose(
        stats["temperature"].sel(statistic="std").values, t1979.std(axis=(0, 2, 3)), rtol=sum_rtol(n)
    )
    assert stats.attrs["train_years"] == [1979, 1979]
    # consolidated metadata and provenance
    assert (out / ".zmetadata").is_file()
    ds2 = xr.open_zarr(out, consolidated=True)
    assert {"source", "prepare_args", "code_version", "written_utc"} <= set(ds2.attrs)
    assert json.loads(ds2.attrs["prepare_args"])["train_years"] == [1979, 1979]
    assert ds2["temperature"].encoding["chunks"][0] == 4


# ---------------------------------------------------------------- WB2 zarr, idempotency, atomicity


def test_wb2_memory_url_idempotent_and_atomic(tmp_path: Path, capsys, monkeypatch) -> None:
    url = "memory://prepare-test/wb2.zarr"
    write_wb2_zarr(url, times=8)
    expected = wb2_dataset(times=8)
    out = tmp_path / "wb2.zarr"
    prepare("era5", url, out, **FAST)
    ds, _ = open_store(out)
    for name in ("geopotential", "temperature", "2m_temperature", "land_sea_mask"):
        np.testing.assert_array_equal(ds[name].values, expected[name].values)
    stamp = (out / ".zattrs").stat().st_mtime_ns
    capsys.readouterr()
    prepare("era5", url, out, **FAST)  # identical arguments: a no-op
    assert "up to date" in capsys.readouterr().out
    assert (out / ".zattrs").stat().st_mtime_ns == stamp

    def boom(*args, **kwargs):
        raise RuntimeError("interrupted while writing")

    monkeypatch.setattr(prepare_mod.zarr, "consolidate_metadata", boom)
    target = tmp_path / "interrupted.zarr"
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare("era5", url, target, **FAST)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wb2.zarr"]  # no temporary sibling either


# ----------------------------------------------------------------------------------------- CMIP6


def test_cmip6_two_files_regridded_conservatively(tmp_path: Path) -> None:
    paths, full = write_cmip6(tmp_path / "cmip6", "zg", days=6, files=2)
    out = prepare("cmip6", tmp_path / "cmip6", tmp_path / "zg.zarr", grid=5.625, **FAST)
    ds, _ = open_store(out)
    grid = weatherbench_grid(5.625)
    np.testing.assert_array_equal(ds["latitude"].values, grid["latitude"].values)  # the target's coords
    np.testing.assert_array_equal(ds["longitude"].values, grid["longitude"].values)
    assert ds["latitude"].values[0] == -87.1875 and ds["latitude"].values[-1] == 87.1875
    assert ds["geopotential"].dims == ("time", "level", "latitude", "longitude")
    assert list(ds["level"].values) == [500, 850] and ds.sizes["time"] == 6
    assert ds["geopotential"].attrs["units"] == "m**2 s**-2"
    src = (full["zg"].rename(lat="latitude", lon="longitude", plev="level") * G).astype(np.float64)
    src = src.assign_coords(level=(src["level"].values / 100).astype(int)).sortby("level")
    got = ds["geopotential"].astype(np.float64)
    # area-weighted global mean preserved to 1 % of the field's spatial spread (xarray-regrid pads the poles)
    spread = float(src.std(("latitude", "longitude")).min())
    np.testing.assert_allclose(_area_mean(got).values, _area_mean(src).values, rtol=0, atol=0.01 * spread)
    direct = src.regrid.conservative(grid, latitude_coord="latitude")  # what xarray-regrid gives directly
    np.testing.assert_allclose(got.values, direct.transpose(*got.dims).values, rtol=EPS32)  # stored as float32
    assert np.isfinite(got.values).all()
    # the same glob as a pattern gives the same store content
    again = prepare("cmip6", str(tmp_path / "cmip6" / "zg_*.nc"), tmp_path / "zg2.zarr", grid=5.625, **FAST)
    # the same regrid code twice on one machine: the same bits
    np.testing.assert_array_equal(xr.open_zarr(again)["geopotential"].values, got.values.astype(np.float32))


def test_real_cmip6_ta_native_grid_or_clear_error(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not cover.*--native-grid"):
        prepare("cmip6", shared_data / TA_CMIP6, tmp_path / "ta.zarr", grid=5.625, **FAST)
    assert not (tmp_path / "ta.zarr").exists()
    out = prepare("cmip6", shared_data / TA_CMIP6, tmp_path / "ta.zarr", grid=None, time_chunk=64, **FAST)
    ds, stats = open_store(out)
    raw = xr.load_dataset(shared_data / TA_CMIP6)
    assert ds["temperature"].shape == (1827, 2, 2, 3) and list(ds["level"].values) == [850, 1000]
    want = raw["ta"].sortby("lat").sel(plev=[85000.0, 100000.0]).values
    np.testing.assert_allclose(ds["temperature"].values, want, rtol=EPS32)  # at most one float32 rounding
    mean850 = want[:, 0].astype(np.float64).mean()  # statistics are float64 reductions
    assert float(stats["temperature"].sel(statistic="mean", level=850)) == pytest.approx(
        mean850, rel=sum_rtol(want[:, 0].size)
    )


# ---------------------------------------------------------------------------------------- ENS-10


@pytest.fixture(scope="module")
def ens10(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path, xr.Dataset]:
    folder = tmp_path_factory.mktemp("ens10")
    paths = write_ens10(folder / "grib", years=(2016, 2017))
    times = pd.DatetimeIndex(
        [*pd.date_range("2016-01-03", periods=4, freq="12h"), *pd.date_range("2017-01-03", periods=4, freq="12h")]
    )
    truth = era5_truth_10deg(times)
    truth_nc = folder / "era5_truth.nc"
    truth.to_netcdf(truth_nc)
    return paths, truth_nc, truth


def test_ens10_with_truth_to_dataset(ens10, tmp_path: Path) -> None:
    paths, truth_nc, truth = ens10
    out = prepare("ens10", paths["pl"].parent, tmp_path / "e.zarr", grid=None, truth=truth_nc, **FAST)
    ds, _ = open_store(out)
    assert ds.sizes["member"] == 10 and ds.sizes["time"] == 2
    assert {"geopotential_truth", "temperature_truth", "2m_temperature_truth"} <= set(ds.data_vars)
    fields = [("geopotential", 500), ("temperature", 850), ("2m_temperature", None)]
    data = open_ensemble_dataset(out, {"variables": fields})
    pl, sfc = _cfgrib(paths["pl"]), _cfgrib(paths["sfc"])
    for i in range(len(data)):
        init = data.init_time(i)
        valid = init + np.timedelta64(48, "h")
        x, y, _, _ = (a.numpy().astype(np.float64) for a in data[i])
        for c, (name, level) in enumerate(fields):
            if name == "2m_temperature":
                ens = sfc["t2m"].sel(time=init, step=np.timedelta64(48, "h")).values
            else:
                short = {"geopotential": "z", "temperature": "t"}[name]
                ens = pl[short].sel(time=init, step=np.timedelta64(48, "h"), isobaricInhPa=level).values
            mean, std = data.stats[field_name((name, level))]
            np.testing.assert_allclose(x[2 * c] * std + mean, ens.mean(0), rtol=0, atol=f32_atol(ens, mean))
            spread = ens.astype(np.float64).std(0, ddof=1)  # the dataset computes it in float64 too
            np.testing.assert_allclose(x[2 * c + 1] * std, spread, rtol=4 * EPS32)  # /std, float32, ·std
            want = truth[name].sel(time=valid)
            want = want.sel(level=level) if level is not None else want
            np.testing.assert_allclose(y[c] * std + mean, want.values, rtol=0, atol=f32_atol(want, mean))


def test_ens10_regridded_members_cli_and_mismatch(ens10, tmp_path: Path, capsys) -> None:
    paths, truth_nc, truth = ens10
    truth_store = prepare("era5", truth_nc, tmp_path / "truth.zarr", grid=5.625, **FAST)
    out = tmp_path / "e5.zarr"
    args = ["data", "prepare", "ens10", "--source", str(paths["pl"]), str(paths["sfc"]), "--out", str(out)]
    args += ["--truth", str(truth_store), "--members", "5", "--scheduler", "threads", "--quiet"]
    assert main(args) == 0
    ds, _ = open_store(out)
    assert ds.sizes["member"] == 5 and list(ds["member"].values) == [1, 2, 3, 4, 5]
    assert ds.sizes["latitude"] == 32 and ds.sizes["longitude"] == 64
    era5 = xr.open_zarr(truth_store)
    valid = ds["time"].values + np.timedelta64(48, "h")
    np.testing.assert_allclose(
        ds["temperature_truth"].values, era5["temperature"].sel(time=valid).values, rtol=EPS32
    )
    assert json.loads(ds.attrs["prepare_args"])["members"] == 5
    assert main(args) == 0 and "up to date" in capsys.readouterr().out

    part = truth.isel(latitude=slice(0, 10))  # southern half only: cannot verify the global forecast
    part.to_netcdf(tmp_path / "half.nc")
    with pytest.raises(DataError, match="truth.*does not cover"):
        prepare("ens10", paths["pl"].parent, tmp_path / "x.zarr", grid=None, truth=tmp_path / "half.nc", **FAST)
    early = truth.isel(time=slice(0, 2))  # 2016-01-03 only: no 2016-01-04 / 2017-01-04 valid times
    early.to_netcdf(tmp_path / "early.nc")
    with pytest.raises(DataError, match="valid time"):
        prepare("ens10", paths["pl"].parent, tmp_path / "x.zarr", grid=None, truth=tmp_path / "early.nc", **FAST)
    with pytest.raises(DataError, match="ens10 only"):
        prepare("era5", truth_nc, tmp_path / "y.zarr", members=5, **FAST)
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()



def test_netcdf_files_split_in_time_keep_constants_2d(tmp_path: Path) -> None:
    """Two canonical netCDF years (as the GCM world ships) → constants stay (lat, lon), fields concatenate."""
    lat = np.linspace(-87.1875, 87.1875, 4)
    lon = np.arange(8) * 45.0
    lsm = np.arange(32, dtype=np.float32).reshape(4, 8) / 31.0
    paths = []
    for year in (2001, 2002):
        time = pd.date_range(f"{year}-01-01", periods=4, freq="6h")
        ds = xr.Dataset(
            {"temperature": (("time", "level", "latitude", "longitude"),
                             np.full((4, 1, 4, 8), float(year - 1730), np.float32), {"units": "K"}),  # 271/272 K
             "land_sea_mask": (("latitude", "longitude"), lsm, {"units": "1"})},
            coords={"time": time, "level": [850], "latitude": lat, "longitude": lon},
        )
        paths.append(tmp_path / f"y{year}.nc")
        ds.to_netcdf(paths[-1])
    out = tmp_path / "two_years.zarr"
    prepare("era5", [str(p) for p in paths], out, grid=None, fmt="cds", progress=False)
    store, _ = open_store(out)
    assert store["land_sea_mask"].dims == ("latitude", "longitude")
    np.testing.assert_array_equal(store["land_sea_mask"].values, lsm)
    assert store.sizes["time"] == 8
    np.testing.assert_array_equal(store["temperature"].isel(level=0, latitude=0, longitude=0).values,
                                  [271.0] * 4 + [272.0] * 4)
