"""Regressions for `smoe data prepare`: each silent data error must now be right or refuse.

GRIB messages are written here with eccodes and netCDF files with xarray, so nothing needs ../shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import pipelines
from pipelines import atomic
from pipelines.errors import DataError

REPO = Path(__file__).resolve().parents[2]
FAST = dict(scheduler="threads", progress=False)


# ------------------------------------------------------------------------------ §4 one-way layering


def _pipelines_modules() -> list[str]:
    root = Path(pipelines.__file__).parent
    return sorted(
        ".".join(("pipelines", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for p in root.rglob("*.py")
    )


def test_pipelines_never_import_smoeweather() -> None:
    modules = _pipelines_modules()
    assert "pipelines.prepare" in modules and "pipelines.readers.cds" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'smoeweather' or m.startswith('smoeweather.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"pipelines imported smoeweather modules: {out.stdout.strip()}"


def test_smoeweather_io_is_the_pipelines_helper() -> None:
    from smoeweather import io

    assert io.atomic_path is atomic.atomic_path and io.write_json is atomic.write_json


def test_one_regrid_and_one_path_helper() -> None:
    from pipelines import grids, prepare
    from pipelines.readers import _files, cds, cmip6, ens10

    assert not hasattr(prepare, "_regrid_to") and cmip6.regrid is grids.regrid and prepare.regrid is grids.regrid
    assert not hasattr(prepare, "_files") and not hasattr(_files, "as_paths")
    assert cds.resolve_sources is ens10.resolve_sources is prepare.resolve_sources


# ------------------------------------------------------------------------------ §2 atomic --overwrite


def _store(path: Path, value: float) -> Path:
    xr.Dataset({"x": ("t", np.full(3, value))}).to_zarr(path, mode="w", zarr_format=2)
    return path


@pytest.mark.parametrize("fail_at", ["swap", "delete_old"])
def test_overwrite_keeps_a_complete_store_when_a_step_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str
) -> None:
    target = _store(tmp_path / "s.zarr", 1.0)
    real_replace, real_remove = os.replace, atomic._remove
    calls = []

    def replace(src, dst):  # noqa: ANN001
        if Path(dst).parent != tmp_path:  # zarr's own writes inside the store
            return real_replace(src, dst)
        calls.append((Path(src).name, Path(dst).name))
        if fail_at == "swap" and len(calls) == 2:  # old already aside, new not yet in place
            raise OSError("injected crash between the renames")
        return real_replace(src, dst)

    def remove(path: Path) -> None:
        if fail_at == "delete_old" and path.name.endswith(".old"):
            raise OSError("injected crash before the old store is deleted")
        real_remove(path)

    monkeypatch.setattr(atomic.os, "replace", replace)
    monkeypatch.setattr(atomic, "_remove", remove)
    with pytest.raises(OSError, match="injected"):
        with atomic.atomic_path(target, overwrite=True) as tmp:
            _store(tmp, 2.0)
    assert calls[0][1].endswith(".old")  # the old store was renamed aside first, never deleted first
    expected = 1.0 if fail_at == "swap" else 2.0  # always one complete store at the target
    np.testing.assert_array_equal(xr.open_zarr(target)["x"].values, np.full(3, expected))


def test_overwrite_success_leaves_no_sibling(tmp_path: Path) -> None:
    target = _store(tmp_path / "s.zarr", 1.0)
    with atomic.atomic_path(target, overwrite=True) as tmp:
        _store(tmp, 2.0)
    np.testing.assert_array_equal(xr.open_zarr(target)["x"].values, np.full(3, 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


# ------------------------------------------------------------------------------ helpers: tiny sources

LAT10, LON10 = np.arange(-90.0, 91.0, 10.0), np.arange(0.0, 360.0, 10.0)  # the 10° GRIB grid of fake_layouts


def _field(value: float, seed: int = 0) -> np.ndarray:
    """A (19, 36) north-first field: ``value`` plus a reproducible pattern (exact in 24-bit GRIB packing
    to ~1e-3 of its range, see ``_grib_tol``)."""
    rng = np.random.default_rng(seed)
    return value + rng.standard_normal((19, 36))


def _grib_tol(values: np.ndarray) -> float:
    """GRIB1 simple packing with 24 bits: quantisation step = range / 2**24 (half of it per value),
    plus float32 rounding of the decoded value (eps32 * |max|)."""
    span = float(np.ptp(values))
    return span / 2**24 + np.finfo(np.float32).eps * float(np.abs(values).max())


def _msg(short: str = "t", level: int | None = 850, **keys: object) -> dict:
    base = {"shortName": short, "dataDate": 20200101, "dataTime": 0}
    if level is not None:
        base.update(typeOfLevel=keys.pop("typeOfLevel", "isobaricInhPa"), level=level)
    return {**base, **keys}


def _prepare(source, out: Path, **kwargs):  # noqa: ANN001, ANN202
    from pipelines.prepare import prepare

    return prepare("era5", source, out, **{"grid": None, **FAST, **kwargs})


# ------------------------------------------------------------------------------ §2 forecast steps


def test_era5_grib_with_only_step_96h_is_labelled_with_its_valid_time(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    values = _field(250.0)
    write_grib(tmp_path / "fc.grib", [_msg(stepRange="96", values=values)])
    ds = xr.open_zarr(_prepare(tmp_path / "fc.grib", tmp_path / "s.zarr", fmt="cds"))
    # init 2020-01-01 00Z + 96 h: the valid time, never the start date (a silent 96 h shift before)
    np.testing.assert_array_equal(ds["time"].values, np.array(["2020-01-05T00:00"], "datetime64[ns]"))
    assert "prediction_timedelta" not in ds.dims
    got = ds["temperature"].sel(level=850).isel(time=0).values
    np.testing.assert_allclose(got, values[::-1], rtol=0, atol=_grib_tol(values))  # north-first → ascending


def test_era5_grib_steps_0_and_3h_become_two_valid_times(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    fields = {s: _field(250.0 + s, seed=s) for s in (0, 3)}
    write_grib(tmp_path / "fc.grib", [_msg(stepRange=str(s), values=v) for s, v in fields.items()])
    ds = xr.open_zarr(_prepare(tmp_path / "fc.grib", tmp_path / "s.zarr", fmt="cds"))
    expected = np.array(["2020-01-01T00:00", "2020-01-01T03:00"], "datetime64[ns]")
    np.testing.assert_array_equal(ds["time"].values, expected)
    assert ds["temperature"].dims == ("time", "level", "latitude", "longitude")
    for i, s in enumerate((0, 3)):
        got = ds["temperature"].isel(time=i, level=0).values
        np.testing.assert_allclose(got, fields[s][::-1], rtol=0, atol=_grib_tol(fields[s]))


def test_era5_grib_ambiguous_inits_times_steps_refused(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    msgs = [_msg(dataTime=h * 100, stepRange=str(s), values=_field(250.0)) for h in (0, 12) for s in (0, 12)]
    write_grib(tmp_path / "fc.grib", msgs)
    with pytest.raises(DataError, match=r"fc\.grib.*duplicated valid times"):
        _prepare(tmp_path / "fc.grib", tmp_path / "s.zarr", fmt="cds")
    assert not (tmp_path / "s.zarr").exists()


def test_era5_grib_inits_times_steps_mapping_uniquely_are_valid_times(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    # temperatures 270 K + the valid hour: each valid time's field is told apart (and plausible, in K)
    msgs = [_msg(dataTime=h * 100, stepRange=str(s), values=_field(270 + h + s)) for h in (0, 6) for s in (0, 3)]
    write_grib(tmp_path / "fc.grib", msgs)
    ds = xr.open_zarr(_prepare(tmp_path / "fc.grib", tmp_path / "s.zarr", fmt="cds"))
    hours = (ds["time"].values - np.datetime64("2020-01-01")) / np.timedelta64(1, "h")
    np.testing.assert_array_equal(hours, [0, 3, 6, 9])
    for h in (0, 3, 6, 9):  # the field written for init + step is found at that valid time
        want = _field(270 + h)[::-1]
        np.testing.assert_allclose(
            ds["temperature"].sel(time=f"2020-01-01T{h:02d}", level=850).values, want, rtol=0, atol=_grib_tol(want)
        )


def test_ens10_grib_keeps_init_time_and_lead(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    from pipelines.readers.cds import open_cds_file

    write_grib(tmp_path / "fc.grib", [_msg(stepRange="96", values=_field(250.0))])
    ds = open_cds_file(tmp_path / "fc.grib", source="ens10")
    np.testing.assert_array_equal(ds["time"].values, np.array(["2020-01-01"], "datetime64[ns]"))
    np.testing.assert_array_equal(ds["prediction_timedelta"].values, [np.timedelta64(96, "h")])


# ------------------------------------------------------------------------------ §2 levels in Pa


def test_levels_in_pa_become_hpa_floats_next_to_hpa_levels_cli(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    from smoeweather.cli import main

    fields = {("isobaricInPa", 1): _field(200.0, 1), ("isobaricInPa", 50): _field(210.0, 2)}
    fields[("isobaricInhPa", 850)] = _field(280.0, 3)
    write_grib(tmp_path / "pl.grib", [_msg(level=lv, typeOfLevel=t, values=v) for (t, lv), v in fields.items()])
    out = tmp_path / "s.zarr"
    args = ["data", "prepare", "era5", "--source", str(tmp_path / "pl.grib"), "--out", str(out), "--format", "cds"]
    assert main([*args, "--native-grid", "--levels", "0.01", "850", "--scheduler", "threads", "--quiet"]) == 0
    ds = xr.open_zarr(out)
    np.testing.assert_array_equal(ds["level"].values, [0.01, 850.0])  # 1 Pa = 0.01 hPa, float levels
    assert ds["level"].attrs["units"] == "hPa"
    for level, key in ((0.01, ("isobaricInPa", 1)), (850.0, ("isobaricInhPa", 850))):
        want = fields[key][::-1]
        np.testing.assert_allclose(
            ds["temperature"].sel(level=level).isel(time=0).values, want, rtol=0, atol=_grib_tol(want)
        )


# ------------------------------------------------------------------------------ §2 control + perturbed


def test_control_and_perturbed_members_in_one_grib(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    msgs = [
        _msg(type="cf" if n == 0 else "pf", number=n, stepRange="24", values=_field(250.0 + n, n)) for n in range(3)
    ]
    write_grib(tmp_path / "ens.grib", msgs)
    ds = xr.open_zarr(_prepare(tmp_path / "ens.grib", tmp_path / "s.zarr", fmt="cds"))
    np.testing.assert_array_equal(ds["member"].values, [0, 1, 2])
    for n in range(3):  # member 0 is the control forecast
        want = _field(250.0 + n, n)[::-1]
        got = ds["temperature"].sel(member=n, level=850).isel(time=0).values
        np.testing.assert_allclose(got, want, rtol=0, atol=_grib_tol(want))

    from pipelines.readers import open_ens10

    msgs = [
        _msg(type="cf" if n == 0 else "pf", number=n, stepRange=str(s), values=_field(250.0 + n, n))
        for n in range(10)
        for s in (0, 24, 48)
    ]
    write_grib(tmp_path / "output.pl.20200101", msgs)
    ens = open_ens10(tmp_path / "output.pl.20200101", members=5)
    np.testing.assert_array_equal(ens["member"].values, [0, 1, 2, 3, 4])
    want = _field(250.0, 0)[::-1]
    np.testing.assert_allclose(
        ens["temperature"].sel(member=0, level=850).isel(time=0).values, want, rtol=0, atol=_grib_tol(want)
    )


# ------------------------------------------------------------------------------ §2 NaNs, every source


def _nc(path: Path, times: pd.DatetimeIndex, names: dict[str, float], seed: int = 0) -> xr.Dataset:
    """A netCDF on the 10° grid (latitude ascending) with ERA5 short names, e.g. {"z500": 5e4, "t850": 280}."""
    rng = np.random.default_rng(seed)
    shape = (len(times), LAT10.size, LON10.size)
    units = {"z": "m**2 s**-2", "t": "K"}
    data = {
        n: (("time", "latitude", "longitude"), v + rng.standard_normal(shape), {"units": units[n[0]]})
        for n, v in names.items()
    }
    ds = xr.Dataset(data, coords={"time": times, "latitude": LAT10, "longitude": LON10})
    ds.to_netcdf(path)
    return ds


def _with_nans(ds: xr.Dataset, name: str, n: int = 12) -> xr.Dataset:
    """``ds`` with ``n`` NaNs in the first time step of ``name`` (first row of its last two dims)."""
    ds = ds.copy(deep=True)
    values = ds[name].values
    index = (0,) * (values.ndim - 2)
    values[index][0, :n] = np.nan
    ds[name].values = values
    return ds


def test_nan_refused_with_counts_and_nothing_written_weatherbench(tmp_path: Path) -> None:
    from fake_layouts import write_weatherbench

    root = tmp_path / "5.625deg"
    write_weatherbench(root, years=(1979,), steps=3)
    path = root / "2m_temperature" / "2m_temperature_1979_5.625deg.nc"
    ds = _with_nans(xr.load_dataset(path), "t2m")
    path.unlink()
    ds.to_netcdf(path)
    out = tmp_path / "wb.zarr"
    with pytest.raises(DataError, match=r"'2m_temperature': 12 of 6144 values.*nothing was written"):
        _prepare(root, out, grid=5.625)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["5.625deg"]  # no temporary left
    filled = xr.open_zarr(_prepare(root, out, grid=5.625, fill_policy="zero"))
    assert int(filled["2m_temperature"].isnull().sum()) == 0
    assert int((filled["2m_temperature"] == 0).sum()) == 12 and "2m_temperature': 12" in filled.attrs["nan_filled"]


def test_nan_refused_wb2_store_per_level(tmp_path: Path) -> None:
    from fake_layouts import wb2_dataset

    src = tmp_path / "src.zarr"
    _with_nans(wb2_dataset(times=8), "geopotential").to_zarr(src, consolidated=True, zarr_format=2)
    with pytest.raises(DataError, match=r"'geopotential' @500 hPa: 12 of 16384 values"):
        _prepare(src, tmp_path / "s.zarr", fmt="wb2")
    assert not (tmp_path / "s.zarr").exists()


def test_nan_refused_cmip6(tmp_path: Path) -> None:
    from fake_layouts import write_cmip6

    paths, _ = write_cmip6(tmp_path / "raw", variable="tas", files=1)
    ds = xr.load_dataset(paths[0], decode_times=False)
    paths[0].unlink()
    _with_nans(ds, "tas").to_netcdf(paths[0])
    from pipelines.prepare import prepare

    with pytest.raises(DataError, match=r"'2m_temperature': 12 of"):
        prepare("cmip6", tmp_path / "raw", tmp_path / "s.zarr", grid=None, **FAST)
    assert not (tmp_path / "s.zarr").exists()


def test_nan_refused_training_config_sources(tmp_path: Path) -> None:
    from smoeweather.training.stores import ensure_store

    times = pd.date_range("2000-01-01", periods=4, freq="6h")
    src = _nc(tmp_path / "in.nc", times, {"t850": 280.0})
    canonical = src.rename(t850="temperature")
    _with_nans(canonical, "temperature").to_netcdf(tmp_path / "canonical.nc")
    store = tmp_path / "s.zarr"
    with pytest.raises(DataError, match=r"'temperature': 12 of"):
        ensure_store({"store": str(store), "sources": [str(tmp_path / "canonical.nc")]})
    assert not store.exists()


# ------------------------------------------------------------------------------ §2 variables on different levels


def test_variables_on_different_levels_keep_only_real_fields(tmp_path: Path) -> None:
    from smoeweather.data.weather import WeatherBenchDataset

    times = pd.date_range("2000-01-01", periods=4, freq="6h")
    src = _nc(tmp_path / "zt.nc", times, {"z500": 5.4e4, "t850": 280.0})
    ds = xr.open_zarr(_prepare(tmp_path / "zt.nc", tmp_path / "s.zarr", fmt="cds"))
    stats = xr.open_zarr(tmp_path / "s.zarr", group="statistics").load()
    assert sorted(ds.data_vars) == ["geopotential_500", "temperature_850"] and "level" not in ds.dims
    assert int(ds.to_array().isnull().sum()) == 0 and bool(np.isfinite(stats.to_array()).all())
    # the store keeps float32: one correctly rounded cast, exact
    np.testing.assert_array_equal(ds["temperature_850"].values, src["t850"].values.astype(np.float32))
    data = WeatherBenchDataset(
        tmp_path / "s.zarr", [("geopotential", 500), "temperature_850"], input_offsets_h=(0,), lead_h=6, constants=()
    )
    x, _ = data[0]
    t = src["t850"].values[0]
    # float32 normalisation of ~280 K values: a few ulps of 280 relative to std ≈ 1
    tol = 4 * np.finfo(np.float32).eps * 300 / float(stats["temperature_850"].sel(statistic="std"))
    want = (t - float(stats["temperature_850"].sel(statistic="mean"))) / float(
        stats["temperature_850"].sel(statistic="std")
    )
    np.testing.assert_allclose(x[1].numpy(), want, rtol=0, atol=tol)


# ------------------------------------------------------------------------------ §2 statistics


@pytest.mark.parametrize(("freq", "label"), [("12h", "12h"), ("1D", "1D"), ("MS", "1 month")])
def test_diff_std_at_the_data_own_step(freq: str, label: str) -> None:
    from pipelines.statistics import compute_statistics

    times = pd.date_range("2000-01-01", periods=14, freq=freq)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((14, 3, 4)).cumsum(axis=0)
    ds = xr.Dataset({"x": (("time", "latitude", "longitude"), x)}, coords={"time": times})
    stats = compute_statistics(ds).compute()
    want = np.diff(x, axis=0).std()
    # float64 reductions over n = 156 values: error ≲ n * eps64 relative
    np.testing.assert_allclose(float(stats["x"].sel(statistic="diff_std")), want, rtol=156 * np.finfo(float).eps)
    assert stats.attrs["diff_step"] == label and stats.attrs["available"] == 1


def test_irregular_steps_say_why_diff_std_is_missing() -> None:
    from pipelines.statistics import compute_statistics

    times = pd.DatetimeIndex(["2000-01-03", "2000-01-06", "2000-01-10", "2000-01-13"])  # twice weekly
    ds = xr.Dataset({"x": (("time", "latitude"), np.arange(8.0).reshape(4, 2))}, coords={"time": times})
    stats = compute_statistics(ds).compute()
    assert np.isnan(float(stats["x"].sel(statistic="diff_std"))) and "irregular" in stats.attrs["diff_std_note"]


def test_one_time_step_prepares_and_statistics_are_marked_unavailable(tmp_path: Path) -> None:
    from smoeweather.data.weather import _stat

    _nc(tmp_path / "one.nc", pd.date_range("2000-01-01", periods=1), {"t850": 280.0})
    out = _prepare(tmp_path / "one.nc", tmp_path / "s.zarr", fmt="cds")
    ds, stats = xr.open_zarr(out), xr.open_zarr(out, group="statistics")
    assert ds.sizes["time"] == 1 and stats.attrs["available"] == 0
    assert "1 time step" in stats.attrs["unavailable_reason"]
    with pytest.raises(ValueError, match="statistics of .* are unavailable"):  # readers refuse NaN statistics
        _stat(stats.load(), ("temperature", 850), "mean", str(out))


# ------------------------------------------------------------------------------ §2 stale stores


def test_changed_source_is_not_up_to_date(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    times = pd.date_range("2000-01-01", periods=4, freq="6h")
    _nc(tmp_path / "a.nc", times, {"t850": 280.0})
    out = _prepare(tmp_path / "a.nc", tmp_path / "s.zarr", fmt="cds")
    capsys.readouterr()
    _prepare(tmp_path / "a.nc", out, fmt="cds")
    assert "up to date" in capsys.readouterr().out
    new = _nc(tmp_path / "a.nc", times, {"t850": 290.0}, seed=1)  # same size, new values
    with pytest.raises(FileExistsError, match="changed since this store was written"):
        _prepare(tmp_path / "a.nc", out, fmt="cds")
    _prepare(tmp_path / "a.nc", out, fmt="cds", overwrite=True)
    got = xr.open_zarr(out)["temperature"].sel(level=850).values
    np.testing.assert_array_equal(got, new["t850"].values.astype(np.float32))


# ------------------------------------------------------------------------------ §2 wrong kind


def test_cmip_names_through_era5_cds_are_canonical(tmp_path: Path) -> None:
    times = pd.date_range("2000-01-01", periods=3, freq="6h")
    src = _nc(tmp_path / "t.nc", times, {"t850": 280.0}).rename(t850="tas").drop_vars([])
    src["tas"].attrs["units"] = "K"
    src.to_netcdf(tmp_path / "tas.nc")
    ds = xr.open_zarr(_prepare(tmp_path / "tas.nc", tmp_path / "s.zarr", fmt="cds"))
    assert list(ds.data_vars) == ["2m_temperature"]
    np.testing.assert_array_equal(ds["2m_temperature"].values, src["tas"].values.astype(np.float32))


def test_unknown_field_name_refused_naming_file_and_variable(tmp_path: Path) -> None:
    times = pd.date_range("2000-01-01", periods=3, freq="6h")
    _nc(tmp_path / "t.nc", times, {"t850": 280.0}).rename(t850="foo").to_netcdf(tmp_path / "foo.nc")
    with pytest.raises(DataError, match=r"foo\.nc.*\['foo'\] have no canonical"):
        _prepare(tmp_path / "foo.nc", tmp_path / "s.zarr", fmt="cds")


def test_grib_through_cmip6_refused_and_nothing_written_beside_it(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    from pipelines.prepare import prepare

    src = tmp_path / "src"
    src.mkdir()
    write_grib(src / "t.grib", [_msg(values=_field(250.0))])
    with pytest.raises(DataError, match=r"t\.grib: a GRIB file where netCDF was expected"):
        prepare("cmip6", src / "t.grib", tmp_path / "s.zarr", grid=None, **FAST)
    _prepare(src / "t.grib", tmp_path / "e.zarr", fmt="cds")  # and the era5 path never writes an index
    assert [p.name for p in src.iterdir()] == ["t.grib"]


# ------------------------------------------------------------------------------ §2 paths


def test_literal_bracket_path_idx_skipped_and_cds_hint(tmp_path: Path) -> None:
    from fake_layouts import write_grib

    from pipelines.readers._files import resolve_sources

    folder = tmp_path / "run[1]"
    folder.mkdir()
    write_grib(folder / "a[0].grib", [_msg(values=_field(250.0))])
    (folder / "a[0].grib.5b7b6.idx").write_bytes(b"not a grib index we wrote")
    assert resolve_sources(folder / "a[0].grib") == [folder / "a[0].grib"]  # exists: not a glob
    assert resolve_sources(folder) == [folder / "a[0].grib"]  # the .idx is skipped
    ds = xr.open_zarr(_prepare(folder / "a[0].grib", tmp_path / "s.zarr", fmt="cds"))
    assert list(ds.data_vars) == ["temperature"]
    assert (
        xr.open_zarr(_prepare(folder, tmp_path / "f.zarr", fmt="cds"))["temperature"].shape == ds["temperature"].shape
    )
    with pytest.raises(DataError, match=r"holds 1 GRIB/netCDF file\(s\) directly.*--format cds"):
        _prepare(folder, tmp_path / "g.zarr")  # a folder is guessed to be WeatherBench v1


# ------------------------------------------------------------------------------ §2 clean dask shutdown


def test_local_cluster_run_prints_no_traceback(tmp_path: Path) -> None:
    times = pd.date_range("2000-01-01", periods=8, freq="6h")
    _nc(tmp_path / "a.nc", times, {"t850": 280.0})
    for i in range(2):  # the cancelled feed appeared in about one run out of three before the fix
        out = tmp_path / f"s{i}.zarr"
        cmd = [sys.executable, "-m", "smoeweather.cli", "data", "prepare", "era5", "--source", str(tmp_path / "a.nc")]
        run = subprocess.run(
            [*cmd, "--out", str(out), "--format", "cds", "--native-grid"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr and "CancelledError" not in run.stderr, run.stderr
        assert out.is_dir()


def test_cds_netcdf_forecast_fields_become_valid_times(tmp_path: Path) -> None:
    """CDS (2024+) netCDF of forecast fields: forecast_reference_time × forecast_period (hours)."""
    init = pd.to_datetime(["2020-01-01T06", "2020-01-01T18"])
    period = np.array([1, 2, 3])
    x = 280 + np.random.default_rng(0).standard_normal((2, 3, LAT10.size, LON10.size))
    valid = init.values[:, None] + period[None, :] * np.timedelta64(1, "h")
    dims = ("forecast_reference_time", "forecast_period", "latitude", "longitude")
    xr.Dataset(
        {"t2m": (dims, x, {"units": "K"})},
        coords={
            "forecast_reference_time": init,
            "forecast_period": ("forecast_period", period, {"units": "hours"}),
            "latitude": LAT10,
            "longitude": LON10,
            "valid_time": (dims[:2], valid),
        },
    ).to_netcdf(tmp_path / "fc.nc")
    ds = xr.open_zarr(_prepare(tmp_path / "fc.nc", tmp_path / "s.zarr", fmt="cds"))
    np.testing.assert_array_equal(ds["time"].values, np.sort(valid.ravel()))
    assert ds["2m_temperature"].dims == ("time", "latitude", "longitude")
    np.testing.assert_array_equal(ds["2m_temperature"].values, x.reshape(6, LAT10.size, LON10.size).astype(np.float32))
