"""What a user runs is what the tests run: ``smoe data prepare`` through the CLI with NO
``--scheduler`` (the local ``distributed`` cluster every user gets) and no ``--quiet``, once per source kind
(WeatherBench folders, WB2 zarr, CDS GRIB, CMIP6, ENS-10), with one-time-step and ensemble cases; each
store must equal the one written with ``--scheduler threads`` (values, coords, statistics).

GRIB files are written here with eccodes in the layouts ECMWF delivers (a single 1° analysis; an ENS
forecast with control + 50 perturbed members); the real ERA5 ensemble file in ../shared/data is cut to one
time step by copying its own messages.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import xarray_regrid  # noqa: F401 - registers the .regrid accessor
from fake_layouts import (
    EPS32,
    GRIB_10DEG,
    era5_truth_10deg,
    f32_atol,
    wb2_dataset,
    write_cmip6,
    write_ens10,
    write_grib,
    write_wb2_zarr,
    write_weatherbench,
    z_mean,
)

from pipelines.grids import weatherbench_grid
from pipelines.prepare import open_store
from smoeweather.cli import main

REPO = Path(__file__).resolve().parents[2]
GRIB_1DEG = {
    "Ni": 360,
    "Nj": 181,
    "latitudeOfFirstGridPointInDegrees": 90.0,
    "latitudeOfLastGridPointInDegrees": -90.0,
    "longitudeOfFirstGridPointInDegrees": 0.0,
    "longitudeOfLastGridPointInDegrees": 359.0,
    "iDirectionIncrementInDegrees": 1.0,
    "jDirectionIncrementInDegrees": 1.0,
}
CHATTER = (  # library chatter a user must not see, and failures
    "Hosting the HTTP server",  # distributed: its HTTP server's default port 8787 was taken
    "FutureWarning",  # cfgrib's xr.merge, torch's LeafSpec deprecation in Lightning
    "💡 Tip",  # Lightning's litlogger / litmodels advertisements
    "weights_only",  # Lightning's INFO at every checkpoint save
    "LeafSpec",  # torch deprecation raised inside Lightning
    "Traceback",
    "CancelledError",  # distributed's progress bar cut off by a cluster shutdown
)


def _cfgrib(path: Path) -> xr.Dataset:
    """All messages of a GRIB file as cfgrib reads them (no index file), latitude ascending."""
    import cfgrib

    parts = cfgrib.open_datasets(str(path), backend_kwargs={"indexpath": ""})
    return [p.sortby("latitude").load() for p in parts]


@contextlib.contextmanager
def _port_8787_taken() -> Iterator[None]:
    """Hold distributed's default HTTP port, as a second prepare or a notebook's cluster does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", 8787))
        sock.listen(1)
    except OSError:  # already taken by someone else: the same situation
        pass
    try:
        yield
    finally:
        sock.close()


def _prepare_default_and_threads(
    kind: str, source: list[str], tmp_path: Path, capfd: pytest.CaptureFixture, *extra: str
) -> tuple[xr.Dataset, xr.Dataset]:
    """Run ``smoe data prepare`` as a user does (no scheduler option, progress shown), and again with
    ``--scheduler threads --quiet``; assert both stores are equal and the default run printed no library
    chatter. Returns (data, statistics) of the default store."""
    default, threads = tmp_path / f"{kind}_default.zarr", tmp_path / f"{kind}_threads.zarr"
    capfd.readouterr()
    with _port_8787_taken():
        assert main(["data", "prepare", kind, "--source", *source, "--out", str(default), *extra]) == 0
    out = capfd.readouterr()
    assert f"wrote {default}" in out.out
    for noise in CHATTER:
        assert noise not in out.out + out.err, f"library chatter in a default prepare: {noise!r}\n{out.err}"
    args = ["data", "prepare", kind, "--source", *source, "--out", str(threads), *extra]
    assert main([*args, "--scheduler", "threads", "--quiet"]) == 0
    ds, stats = open_store(default)
    ds_t, stats_t = open_store(threads)
    # one dask graph under both schedulers: the same reductions in the same order, so the same bits
    xr.testing.assert_identical(ds.load().drop_attrs(), ds_t.load().drop_attrs())
    drop = ("written_utc", "code_version")  # the clock, and HEAD when a commit lands between the runs
    assert {k: v for k, v in ds.attrs.items() if k not in drop} == {
        k: v for k, v in ds_t.attrs.items() if k not in drop
    }
    xr.testing.assert_identical(stats.load(), stats_t.load())  # NaN statistics compare equal too
    return ds, stats


# ------------------------------------------------------------------------------------------ CDS GRIB


def test_one_time_step_analysis_grib_default_cluster(tmp_path: Path, capfd) -> None:
    """The first real case: one global 1° analysis, z and t at 500/850 hPa, ``--grid 5.625``."""
    rng = np.random.default_rng(0)
    messages = []
    for short, mean, std in (("z", 54000.0, 3000.0), ("t", 260.0, 15.0)):
        for level in (500, 850):
            messages.append({
                "class": "ea", "stream": "oper", "type": "an", "shortName": short, "typeOfLevel": "isobaricInhPa",
                "level": level, "dataDate": 20240115, "dataTime": 1200,
                "values": (z_mean([level])[0] if short == "z" else mean) + std * rng.standard_normal((181, 360)),
            })
    grib = tmp_path / "analysis.grib"
    write_grib(grib, messages, GRIB_1DEG)
    ds, stats = _prepare_default_and_threads("era5", [str(grib)], tmp_path, capfd, "--grid", "5.625")
    assert list(ds["time"].values) == [np.datetime64("2024-01-15T12:00", "ns")]
    assert list(ds["level"].values) == [500, 850] and "member" not in ds.dims
    assert ds["geopotential"].dims == ("time", "level", "latitude", "longitude")
    assert ds.sizes["latitude"] == 32 and ds.sizes["longitude"] == 64
    (raw,) = _cfgrib(grib)
    raw = raw.sel(isobaricInhPa=[500, 850])  # cfgrib lists levels top down
    direct = raw.regrid.conservative(weatherbench_grid(5.625), latitude_coord="latitude")
    for name, short in (("geopotential", "z"), ("temperature", "t")):
        want = direct[short].transpose("isobaricInhPa", "latitude", "longitude").values
        np.testing.assert_allclose(ds[name].isel(time=0).values, want, rtol=0, atol=f32_atol(want, ops=12))
    assert stats.attrs["available"] == 0 and "1 time step" in stats.attrs["unavailable_reason"]


def test_ens_control_and_perturbed_members_default_cluster(tmp_path: Path, capfd) -> None:
    """The second real case: an ECMWF ENS GRIB, control (cf, number 0) + 50 perturbed (pf) members
    at one time, ``--format cds --native-grid``."""
    rng = np.random.default_rng(1)
    messages = []
    for number in range(51):
        for short, mean, std in (("z", 54000.0, 3000.0), ("t", 260.0, 15.0)):
            for level in (500, 850):
                messages.append({
                    "stream": "enfo", "type": "cf" if number == 0 else "pf", "number": number,
                    "numberOfForecastsInEnsemble": 51, "shortName": short, "typeOfLevel": "isobaricInhPa",
                    "level": level, "dataDate": 20240115, "dataTime": 0, "stepRange": "24",
                    "values": (z_mean([level])[0] if short == "z" else mean) + std * rng.standard_normal((19, 36)),
                })
    grib = tmp_path / "ens.grib"
    write_grib(grib, messages, GRIB_10DEG)
    ds, stats = _prepare_default_and_threads(
        "era5", [str(grib)], tmp_path, capfd, "--format", "cds", "--native-grid"
    )
    assert list(ds["time"].values) == [np.datetime64("2024-01-16T00:00", "ns")]  # valid time: init + 24 h
    assert list(ds["member"].values) == list(range(51))  # control first, then the perturbed members
    assert list(ds["level"].values) == [500, 850]
    assert ds["temperature"].dims == ("time", "member", "level", "latitude", "longitude")
    parts = {str(p["z"].attrs["GRIB_dataType"]): p.sel(isobaricInhPa=[500, 850]) for p in _cfgrib(grib)}
    for name, short in (("geopotential", "z"), ("temperature", "t")):
        control = parts["cf"][short].transpose("isobaricInhPa", "latitude", "longitude").values
        perturbed = parts["pf"][short].transpose("number", "isobaricInhPa", "latitude", "longitude").values
        # the GRIB's values as cfgrib decodes them, copied (no arithmetic): exact
        np.testing.assert_array_equal(ds[name].sel(member=0).isel(time=0).values, control)
        np.testing.assert_array_equal(ds[name].sel(member=slice(1, 50)).isel(time=0).values, perturbed)
    assert stats.attrs["available"] == 0


def test_real_era5_ensemble_one_time_step_default_cluster(shared_data: Path, tmp_path: Path, capfd) -> None:
    """The real ERA5 EDA file cut to its first time (its own messages, copied): 10 members, one time."""
    import eccodes

    grib = tmp_path / "era5_one_time.grib"
    with open(shared_data / "era5-levels-members.grib", "rb") as src, open(grib, "wb") as dst:
        while (h := eccodes.codes_grib_new_from_file(src)) is not None:
            if eccodes.codes_get(h, "dataDate") == 20170101 and eccodes.codes_get(h, "dataTime") == 0:
                eccodes.codes_write(h, dst)
            eccodes.codes_release(h)
    ds, stats = _prepare_default_and_threads("era5", [str(grib)], tmp_path, capfd, "--native-grid")
    assert ds.sizes["time"] == 1 and list(ds["member"].values) == list(range(10))
    assert list(ds["level"].values) == [500, 850] and ds.sizes["latitude"] == 61
    (raw,) = _cfgrib(grib)
    want = raw["t"].sel(isobaricInhPa=[500, 850]).transpose("number", "isobaricInhPa", "latitude", "longitude").values
    np.testing.assert_array_equal(ds["temperature"].isel(time=0).values, want)  # copied from the GRIB, no arithmetic
    assert stats.attrs["available"] == 0


# ------------------------------------------------------------------------- other source kinds


def test_weatherbench_folders_default_cluster(tmp_path: Path, capfd) -> None:
    root = tmp_path / "5.625deg"
    written = write_weatherbench(root, years=(1979,), steps=3)
    ds, stats = _prepare_default_and_threads("era5", [str(root)], tmp_path, capfd)
    np.testing.assert_array_equal(ds["temperature"].values, written["temperature"][0]["t"].values)  # copied
    assert list(ds["level"].values) == [500, 850, 1000]
    np.testing.assert_array_equal(ds["geopotential_500"].values, written["geopotential_500"][0]["z"].values)
    assert stats.attrs["available"] == 1 and bool(np.isfinite(stats.to_array()).all())


def test_wb2_zarr_default_cluster(tmp_path: Path, capfd) -> None:
    url = str(tmp_path / "wb2.zarr")
    write_wb2_zarr(url, times=8)
    expected = wb2_dataset(times=8)
    ds, stats = _prepare_default_and_threads("era5", [url], tmp_path, capfd)
    for name in ("geopotential", "temperature", "2m_temperature", "land_sea_mask"):
        np.testing.assert_array_equal(ds[name].values, expected[name].values)  # copied from the zarr, no regrid
    assert stats.attrs["diff_step"] == "6h"


def test_cmip6_default_cluster(tmp_path: Path, capfd) -> None:
    write_cmip6(tmp_path / "cmip6", "zg", days=6, files=2)
    ds, stats = _prepare_default_and_threads("cmip6", [str(tmp_path / "cmip6")], tmp_path, capfd)
    assert list(ds["level"].values) == [500, 850] and ds.sizes["time"] == 6
    assert ds.sizes["latitude"] == 32 and bool(np.isfinite(ds["geopotential"].values).all())
    assert stats.attrs["diff_step"] == "1D"


def test_ens10_one_init_with_truth_default_cluster(tmp_path: Path, capfd) -> None:
    """ENS-10 with a single initialisation (one time step) and its ERA5 truth, default grid."""
    paths = write_ens10(tmp_path / "grib", years=(2016,))
    truth = era5_truth_10deg(pd.date_range("2016-01-02", periods=6, freq="12h"))
    truth_nc = tmp_path / "truth.nc"
    truth.to_netcdf(truth_nc)
    ds, stats = _prepare_default_and_threads(
        "ens10", [str(paths["pl"]), str(paths["sfc"])], tmp_path, capfd, "--truth", str(truth_nc)
    )
    assert ds.sizes["time"] == 1 and list(ds["member"].values) == list(range(1, 11))
    assert list(ds["level"].values) == [500, 850] and ds.sizes["latitude"] == 32
    assert {"geopotential_truth", "temperature_truth", "2m_temperature_truth"} <= set(ds.data_vars)
    assert stats.attrs["available"] == 0
    direct = truth["temperature"].sel(time="2016-01-04T00").regrid.conservative(
        weatherbench_grid(5.625), latitude_coord="latitude"
    )
    np.testing.assert_allclose(ds["temperature_truth"].isel(time=0).values,
                               direct.transpose("level", "latitude", "longitude").values, rtol=4 * EPS32)


# ------------------------------------------------------------------------------- quiet output (§5)

QUIET_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import numpy as np
from fake_layouts import write_grib
from pipelines.prepare import write_store
from pipelines.world import simulate_world
from smoeweather.cli import main

out = Path(sys.argv[1])
rng = np.random.default_rng(0)
write_grib(out / "an.grib", [
    {{"stream": "oper", "type": "an", "shortName": s, "typeOfLevel": "isobaricInhPa", "level": lev,
      "dataDate": 20240115, "dataTime": 1200, "values": m.get(lev, m.get(0)) + rng.standard_normal((19, 36))}}
    for s, m in (("z", {{500: 54000.0, 850: 14300.0}}), ("t", {{0: 260.0}})) for lev in (500, 850)])
assert main(["data", "prepare", "era5", "--source", str(out / "an.grib"), "--out", str(out / "an.zarr")]) == 0
world = simulate_world((2000, 2000), seed=0, n_steps=240)
write_store(lambda: world, out / "world.zarr", args={{"test": 1}}, train_years=None, source="test", time_chunk=8)
assert main(["data", "stats", str(out / "world.zarr")]) == 0
periods = {{"train": ["2000-01-01", "2000-01-31"], "valid": ["2000-02-01", "2000-02-20"],
           "test": ["2000-02-21", "2000-02-29"]}}
assert main(["train", "--config", {config!r}, f"output_dir={{out / 'run'}}", f"data.store={{out / 'world.zarr'}}",
             "data.world=null", "data.train_years=null", "data.valid_years=null", "data.test_years=null",
             *[f"data.{{k}}_period=[{{a}}, {{b}}]" for k, (a, b) in periods.items()],
             "data.variables=[geopotential_500, temperature_850]", "data.lead_choices_h=[24]",
             "data.batch_size=4", "data.num_workers=2", "model.width=4", "model.blocks=1", "trainer.max_epochs=1",
             "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.log_every_n_steps=1",
             "trainer.enable_progress_bar=false"]) == 0
"""


def test_prepare_stats_train_print_no_library_chatter(tmp_path: Path) -> None:
    """A fresh interpreter (default warning filters, as a user's shell) runs a GRIB prepare on the default
    cluster with port 8787 taken, ``smoe data stats`` and a small ``smoe train`` (with loader worker
    processes, as the ENS-10 and paper configs use): progress and results, no library chatter."""
    script = QUIET_SCRIPT.format(tests=str(REPO / "tests"),
                                 config=str(REPO / "configs" / "weatherbench" / "world_dense.yaml"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
    with _port_8787_taken():
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                             cwd=REPO, env=env, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert f"wrote {tmp_path / 'an.zarr'}" in run.stdout  # progress and results are still shown
    assert "temperature [K]" in run.stdout and "smoe train: best checkpoint" in run.stdout
    for noise in CHATTER:
        assert noise not in output, f"library chatter {noise!r} in:\n{output}"


def test_world_store_kind_default_cluster(tmp_path: Path, capfd) -> None:
    """Kind ``world`` (a canonical netCDF, e.g. the GCM world's files), years and levels selected."""
    from pipelines.world import simulate_world

    world = simulate_world((2000, 2000), seed=0, n_steps=24)
    world.to_netcdf(tmp_path / "world.nc")
    ds, stats = _prepare_default_and_threads(
        "world", [str(tmp_path / "world.nc")], tmp_path, capfd, "--levels", "500", "850"
    )
    assert list(ds["level"].values) == [500, 850] and ds.sizes["time"] == 24
    np.testing.assert_allclose(ds["temperature"].values, world["temperature"].sel(level=[500, 850]).values,
                               rtol=EPS32)
    assert stats.attrs["available"] == 1
