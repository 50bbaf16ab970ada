"""Out-of-core EMOS: the chunked CLI path (default scheduler: a local dask.distributed cluster) gives
the in-memory fit_emos/apply_emos results to float tolerance, on the gcm_ens streams and on a file in their exact
layout; ``--scheduler tcp://…`` on a LocalCluster started here gives the same stores as the default; the pooled
fit reduces over blocks; ECC-Q on dask equals ECC-Q in memory; no staging or partial output is left behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import properscoring
import pytest
import xarray as xr
from conftest import SHARED_DATA, skip_without_shared
from test_postprocess_cli import gcm_ens_like

from smoeweather.cli import main
from smoeweather.data import forecast_stores
from smoeweather.postprocess import chunked
from smoeweather.postprocess.ecc import ecc_members
from smoeweather.postprocess.emos import apply_emos, fit_emos
from smoeweather.postprocess.model_file import read_model

EPS32 = float(np.finfo(np.float32).eps)
GCM_ENS = SHARED_DATA / "gcm_ens"


def _fit_apply(train: Path, new: Path, out: Path, *extra: str, local: bool, train_period: tuple[str, str] | None = None,
               apply_period: tuple[str, str] | None = None, members: int | None = None) -> None:
    fit = ["postprocess", "fit", "--method", "emos", "--forecast", str(train), "--out", str(out / "emos.nc"),
           "--quiet", *extra]
    if local:
        fit.append("--per-gridpoint")
    if train_period:
        fit += ["--train-period", *train_period]
    assert main(fit) == 0
    app = ["postprocess", "apply", "--emos", str(out / "emos.nc"), "--forecast", str(new), "--out",
           str(out / "pp.zarr"), "--quiet", *extra]
    if apply_period:
        app += ["--apply-period", *apply_period]
    if members:
        app += ["--members", str(members)]
    assert main(app) == 0


def _in_memory(train: Path, new: Path, local: bool, train_period: tuple[str, str] | None = None,
               apply_period: tuple[str, str] | None = None) -> tuple[xr.Dataset, xr.Dataset, xr.Dataset, xr.Dataset]:
    """Today's in-memory path: load, fit_emos, apply_emos; (params, μ, σ, truth of the new forecast)."""
    fc = forecast_stores.select_period(forecast_stores.open_ensemble(train), train_period).load()
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, train)).load()
    params = fit_emos(fc, truth, per_gridpoint=local)
    nf = forecast_stores.select_period(forecast_stores.open_ensemble(new), apply_period).load()
    mu, sigma = apply_emos(params, nf)
    return params, mu, sigma, forecast_stores.truth_at_valid_times(nf, forecast_stores.open_truth(None, new)).load()


def _crps(mu: xr.DataArray, sigma: xr.DataArray, y: xr.DataArray) -> float:
    w = np.cos(np.deg2rad(y["latitude"]))
    c = xr.DataArray(properscoring.crps_gaussian(y.values, mu.transpose(*y.dims).values,
                                                 sigma.transpose(*y.dims).values), dims=y.dims, coords=y.coords)
    return float(c.weighted(w).mean())


@pytest.mark.parametrize("local", [False, True], ids=["global", "gridpoint"])
def test_chunked_cli_equals_in_memory_on_gcm_ens_layout(tmp_path: Path, local: bool) -> None:
    """Default scheduler (local cluster). Per grid point the same Newton solver runs on the same points: the
    coefficients agree to round-off; the global fit sums the CRPS derivatives over blocks instead of in one
    array: the same minimum to the solver's tolerance. Stores are float32: μ, σ, CRPS agree to its epsilon."""
    train, new = gcm_ens_like(tmp_path / "a.nc", 2005, 0), gcm_ens_like(tmp_path / "b.nc", 2006, 1)
    _fit_apply(train, new, tmp_path, local=local, members=6)
    params, mu, sigma, y = _in_memory(train, new, local)
    got, attrs = read_model(tmp_path / "emos.nc")
    pp = xr.open_zarr(tmp_path / "pp.zarr")
    for n in params.data_vars:
        np.testing.assert_allclose(got[n].transpose(*params[n].dims).values, params[n].values, rtol=1e-6,
                                   atol=1e-9 * float(abs(params[n]).max()))
        np.testing.assert_allclose(pp[n].values, mu[n].values, rtol=2 * EPS32)
        np.testing.assert_allclose(pp[f"{n}_std"].values, sigma[n].values, rtol=4 * EPS32)
        assert _crps(pp[n], pp[f"{n}_std"], y[n]) == pytest.approx(_crps(mu[n], sigma[n], y[n]), rel=4 * EPS32)
    ens = xr.open_zarr(tmp_path / "pp_members.zarr")
    assert ens.sizes["realization"] == 6 and ens.attrs["forecast_kind"] == "ensemble"
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob("*.tmp*"))


@pytest.mark.slow
@pytest.mark.shared_data
@skip_without_shared("gcm_ens", "gcm_ens_2006.nc")
def test_gcm_ens_scores_unchanged_against_the_in_memory_path(tmp_path: Path) -> None:
    """Fit on the 2005 stream (Jan–Feb), apply to the 2006 stream (January): per-grid-point and global EMOS
    CRPS of the chunked CLI path equal today's in-memory path to float32 tolerance."""
    train, new = GCM_ENS / "gcm_ens_2005.nc", GCM_ENS / "gcm_ens_2006.nc"
    tp, ap = ("2005-01-01", "2005-02-28"), ("2006-01-01", "2006-01-31")
    for local in (True, False):
        out = tmp_path / ("gridpoint" if local else "global")
        _fit_apply(train, new, out, local=local, train_period=tp, apply_period=ap)
        _, mu, sigma, y = _in_memory(train, new, local, tp, ap)
        pp = xr.open_zarr(out / "pp.zarr")
        for n in mu.data_vars:
            assert _crps(pp[n], pp[f"{n}_std"], y[n]) == pytest.approx(_crps(mu[n], sigma[n], y[n]),
                                                                       rel=4 * EPS32)


def test_tcp_scheduler_gives_the_default_output(tmp_path: Path) -> None:
    """``--scheduler tcp://…`` of a LocalCluster started here: the same model file and stores as the default."""
    from distributed import LocalCluster

    train, new = gcm_ens_like(tmp_path / "a.nc", 2005, 0), gcm_ens_like(tmp_path / "b.nc", 2006, 1)
    _fit_apply(train, new, tmp_path / "default", local=True, members=6)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=None,
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as cluster:
        assert cluster.scheduler_address.startswith("tcp://")
        _fit_apply(train, new, tmp_path / "tcp", "--scheduler", cluster.scheduler_address, local=True, members=6)
    a, _ = read_model(tmp_path / "default" / "emos.nc")
    b, _ = read_model(tmp_path / "tcp" / "emos.nc")
    xr.testing.assert_identical(a, b)  # one dask graph under both schedulers: the same reductions in the same order
    for store in ("pp.zarr", "pp_members.zarr"):
        xr.testing.assert_equal(xr.open_zarr(tmp_path / "default" / store), xr.open_zarr(tmp_path / "tcp" / store))


def test_pooled_fit_reduces_over_blocks_and_ecc_streams(tmp_path: Path) -> None:
    """The global fit over 4 spatial blocks of the staged store equals fit_emos; ECC-Q members of dask arrays
    (computed chunk by chunk) equal those of the loaded arrays exactly."""
    path = gcm_ens_like(tmp_path / "a.nc", 2005, 0)
    fc = forecast_stores.open_ensemble(path).load()
    truth = forecast_stores.truth_at_valid_times(fc, forecast_stores.open_truth(None, path)).load()
    ref = fit_emos(fc, truth)
    arrays = chunked.training_arrays(fc.chunk({"time": 5}), truth.chunk({"time": 5}))
    old = chunked.BLOCK_BYTES
    chunked.BLOCK_BYTES = 2 * 8 * 3 * 24 * 4 * 12  # two latitude rows per block: 4 blocks of the 8 rows
    try:
        with chunked.scheduler("threads") as client:
            staged = chunked.stage(arrays, tmp_path / "staged.zarr", client, False)
            assert staged["geopotential__mean"].chunks[-2] == (2, 2, 2, 2)
            got = chunked.fit_staged(staged, list(fc.data_vars), False, client, False)
    finally:
        chunked.BLOCK_BYTES = old
    for n in ref.data_vars:
        np.testing.assert_allclose(got[n].transpose(*ref[n].dims).values, ref[n].values, rtol=1e-7,
                                   atol=1e-9 * float(abs(ref[n]).max()))
    mu, sigma = apply_emos(ref, fc)
    eager = ecc_members(mu, sigma, fc, 6)
    lazy_mu, lazy_sigma = apply_emos(ref, fc.chunk({"time": 3, "latitude": 4}))
    lazy = ecc_members(lazy_mu, lazy_sigma, fc.chunk({"time": 3, "latitude": 4}), 6)
    assert lazy["geopotential"].chunks is not None
    # dask runs the same numpy functions per chunk, the members of a point never split for its statistics: exact
    xr.testing.assert_identical(lazy.compute(), eager)
    # a store chunked ALONG the members (e.g. zarr's default chunks of a member store) gives the same members
    split = ecc_members(lazy_mu, lazy_sigma, fc.chunk({"time": 3, "member": 2}), 6)
    # the member chunks only feed the ranks (integers); mu/sigma as above: exact
    xr.testing.assert_identical(split.compute(), eager)


def test_stores_written_after_a_period_selection_of_a_chunked_store(tmp_path: Path) -> None:
    """A period cut of a time-chunked store (``select_period``: ``isel`` with an index array) can leave dask chunks
    such as (7, 8) or (7, …, 7, 9) (the demo's), which zarr refuses; ``write_stores`` makes them regular, and the
    values are kept."""
    from smoeweather.postprocess.pipeline import write_stores

    times = pd.date_range("2001-01-01", periods=137, freq="3D")  # 2002 is cut out as chunks (7, 8)
    rng = np.random.default_rng(0)
    ds = xr.Dataset({"t": (("time", "prediction_timedelta", "latitude", "longitude"),
                           rng.standard_normal((137, 1, 3, 4)).astype(np.float32))},
                    coords={"time": times, "prediction_timedelta": [np.timedelta64(24, "h")],
                            "latitude": [-10.0, 0.0, 10.0], "longitude": [0.0, 90.0, 180.0, 270.0]})
    cut = forecast_stores.select_period(ds.chunk({"time": 8}), ["2002", "2002"])
    assert len(set(cut["t"].chunks[0][:-1])) > 1 or cut["t"].chunks[0][-1] > cut["t"].chunks[0][0]  # irregular
    out = tmp_path / "cut.zarr"
    write_stores([(cut, out, "deterministic", {})], None, False, False)
    np.testing.assert_array_equal(xr.open_zarr(out)["t"].values, cut["t"].values)
    assert chunked.zarr_chunks(ds.chunk({"time": 8}))["t"].chunks == ds.chunk({"time": 8})["t"].chunks
