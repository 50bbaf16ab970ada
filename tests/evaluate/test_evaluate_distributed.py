"""``smoe evaluate --scheduler``: the scores computed on a ``dask.distributed`` cluster (two workers, each
(method, field) one task, the forecast read there by chunks of initialisations and scored block by block) are
the threaded run's bit for bit: scores.nc, every WB2 file and scores.json / scores.md; the workers do the work;
arrays travel between processes with their strides; sites refuse the option by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from pipelines.prepare import write_store
from smoeweather.cli import main
from smoeweather.forecast import make_forecast

LAT = np.linspace(-87.1875, 87.1875, 16)
LON = np.arange(32) * 11.25


def _store(path: Path) -> Path:
    """6-hourly Z500 and T850 for 30 days: a seasonal trend, a wave and seeded noise (sums that round)."""
    times = np.arange(np.datetime64("2001-01-01", "ns"), np.datetime64("2001-01-31", "ns"), np.timedelta64(6, "h"))
    rng = np.random.default_rng(7)
    hours = ((times - times[0]) / np.timedelta64(1, "h"))[:, None, None, None]
    wave = np.cos(np.deg2rad(LAT))[:, None] * np.sin(np.deg2rad(LON))[None, :]
    shape = (len(times), 1, len(LAT), len(LON))
    z = 54000.0 + 2.0 * hours + 900.0 * wave + 120.0 * rng.standard_normal(shape)
    t = 270.0 - 0.01 * hours + 8.0 * wave + 1.5 * rng.standard_normal(shape)
    ds = xr.Dataset({"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32),
                                      {"units": "m**2 s**-2"}),
                     "temperature": (("time", "level", "latitude", "longitude"), t.astype(np.float32),
                                     {"units": "K"})},
                    coords={"time": times, "level": [500], "latitude": LAT, "longitude": LON})
    lower = ds.assign(geopotential=ds["geopotential"] - 40000.0)  # Z850 near 14,000 m² s⁻², where it lies
    ds = xr.concat([ds, lower.assign_coords(level=[850])], "level", combine_attrs="override")
    write_store(lambda: ds, path, args={"test": "distributed"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return path


def _ensemble(store: Path, path: Path) -> Path:
    """A 5-member ensemble (persistence plus seeded member noise), stored two initialisations per chunk."""
    base = make_forecast(store, method="persistence", init=("2001-01-08", "2001-01-13"), every="24h",
                         leads_h=(24, 48), fields=["geopotential_500", "temperature_850"], progress=False)
    rng = np.random.default_rng(11)
    fc = base.copy()
    for name, sd in (("geopotential", 60.0), ("temperature", 0.8)):
        x = base[name]
        members = xr.concat([x + rng.normal(0.0, sd, size=x.shape) for _ in range(5)], "member")
        fc[name] = members.transpose("time", "prediction_timedelta", "member", ...).astype(np.float32)
    fc.attrs.update(forecast_kind="ensemble", method="ens")
    fc.chunk({"time": 2}).to_zarr(path, zarr_format=2)
    return path


def _assert_same_outputs(a: Path, b: Path) -> None:
    """Every file under ``a`` is under ``b`` with the same values (netCDF: every variable and coordinate, bit
    for bit, and the attributes; text: the same text)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert Path("scores.nc") in files and any(f.parts[0] == "wb2" for f in files)
    for f in files:
        if f.suffix == ".nc":
            x, y = xr.load_dataset(a / f), xr.load_dataset(b / f)
            assert set(x.variables) == set(y.variables) and x.attrs == y.attrs, f
            for k in x.variables:
                np.testing.assert_array_equal(x[k].values, y[k].values, err_msg=f"{f}: {k}")
        elif f.suffix == ".json":
            assert json.loads((a / f).read_text()) == json.loads((b / f).read_text()), f
            assert (a / f).read_text() == (b / f).read_text(), f
        elif f.suffix in (".md", ".txt"):
            assert (a / f).read_text() == (b / f).read_text(), f


def test_arrays_travel_with_their_strides() -> None:
    """A view with gaps and permuted axes comes back with the same strides (a contiguous copy sums in another
    order), its values equal; a contiguous array, a Fortran-ordered one and a broadcast one come back equal."""
    from smoeweather.evaluate.cluster import Packed

    base = np.random.default_rng(0).standard_normal((6, 8, 130))
    view = base.transpose(2, 0, 1)[:, ::2, 1:]
    assert not view.flags.c_contiguous and not view.flags.f_contiguous
    for x in (view, base, np.asfortranarray(base), np.broadcast_to(base[0, 0], (4, 130)), np.float64(2.5)):
        y = Packed({"x": x, "da": xr.DataArray(x)}).load()
        np.testing.assert_array_equal(y["x"], x)
        np.testing.assert_array_equal(y["da"].values, x)
        assert np.shape(x) == () or y["x"].strides == x.strides
    got = Packed(view).load()
    assert got.sum(axis=0).tobytes() == view.sum(axis=0).tobytes()  # the same order of the sums


def test_workers_with_another_blas_thread_count_are_warned_about() -> None:
    """Large matrix products round differently with another BLAS thread count: a worker whose BLAS runs on
    another number of threads than this process's is named in a warning, one with the same count is not."""
    import warnings

    from smoeweather.evaluate import cluster

    here = cluster.blas_threads()
    if here is None:
        pytest.skip("threadpoolctl finds no BLAS here")

    class Workers:
        def __init__(self, n: int) -> None:
            self.n = n

        def run(self, fn: object) -> dict[str, int]:
            return {"tcp://worker:1": self.n}

    with pytest.warns(UserWarning, match=f"OPENBLAS_NUM_THREADS={here}"):
        cluster._warn_blas_threads(Workers(here + 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cluster._warn_blas_threads(Workers(here))


def test_scores_on_a_cluster_equal_the_threaded_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers of one thread each score the (method, field) pairs, every field lazy and scored one chunk of
    2 initialisations at a time: the files hold the threaded run's values bit for bit, with persistence, the
    climatology reference, ACC, binary and Brier scores, the reliability table and the rank histogram."""
    from distributed import LocalCluster

    import smoeweather.evaluate.run as E
    import smoeweather.metrics.scores as S
    from smoeweather.data import forecast_stores

    store = _store(tmp_path / "truth.zarr")
    ens = _ensemble(store, tmp_path / "ens.zarr")
    monkeypatch.setattr(E, "BLOCK_BYTES", 1.0)  # every field lazy, not read into this process first
    monkeypatch.setattr(S, "BLOCK_BYTES", 1.0)  # and scored one chunk of initialisations at a time
    monkeypatch.setattr(forecast_stores, "code_version", lambda: "0+test")  # others may commit between the runs
    args = ["evaluate", f"ens={ens}", "--truth", str(store), "--climatology", str(store), "--climatology-years",
            "2001", "2001", "--regions", "global", "tropics", "--thresholds", "temperature_850=268",
            "--quiet", "--out"]
    assert main([*args, str(tmp_path / "threads")]) == 0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as cluster:
        assert main([*args, str(tmp_path / "cluster"), "--scheduler", cluster.scheduler_address]) == 0
        done = [w.state.transition_counter for w in cluster.workers.values()]
    assert len(done) == 2 and min(done) > 0, done  # both workers computed tasks
    _assert_same_outputs(tmp_path / "threads", tmp_path / "cluster")
