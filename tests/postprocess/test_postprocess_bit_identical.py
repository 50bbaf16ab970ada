"""Refactors of post-processing keep its outputs identical: a gcm_ens-like per-grid-point EMOS fit → apply with
ECC-Q members and quantiles, a global member-weights EMOS, a truncated-normal EMOS, and a UWME-like station DRN
fit → apply give the same values as the recording (``postprocess_digests.json``).

The recording covers the values of every data variable of the model files and of every output store (not
attributes or coordinates: new CF metadata is allowed). On the machine that recorded it (the full
:func:`reference_values.fingerprint`, 2 intra-op threads) the bytes must be equal; on every other machine the
values must agree within the rounding :data:`REL` allows. Record with this file's ``__main__``. History: the first
digests were recorded on commit bc7a7be, before post-processing was refactored into one driver, and renewed with
fingerprints and reference values on an AVX-512 machine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import float_tol
from reference_values import assert_close_to_reference, digest, fingerprint, is_recording_machine, summarize
from test_postprocess_cli import gcm_ens_like
from test_postprocess_drn import _table

from smoeweather.cli import main

DIGESTS = Path(__file__).parents[1] / "postprocess_digests.json"
QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]
DRN_FAST = ["--drn-epochs", "3", "--drn-seeds", "2", "--drn-hidden", "8", "--drn-batch-size", "64"]


# EMOS fits are float64 Newton solves that stop where the decrement falls below 1e-12 (newton.minimise), so another
# iteration count can move a coefficient by about sqrt(1e-12) = 1e-6 of its scale; the DRN is a float32 network, a
# chain of float32 roundings through its layers and epochs. One allowance covers both: float_tol's 2 n u for n = 64
# dependent float32 roundings (u = 2^-24), 7.6e-6. Measured on one AVX-512 CPU at the torch capabilities default /
# AVX2 / AVX-512: ||dx|| / ||x|| at most 4.5e-10 (the DRN quantiles).
REL = float_tol(torch.float32, n_ops=64)["rtol"]


def values_of(path: Path) -> list[np.ndarray]:
    """The values of every data variable of a zarr store or netCDF file, by name."""
    ds = xr.open_zarr(path) if path.suffix == ".zarr" else xr.open_dataset(path)
    with ds:
        return [ds[n].values for n in sorted(map(str, ds.data_vars))]


def _pp(*args: object) -> None:
    assert main(["postprocess", *map(str, args), *QUIET]) == 0


def run_cases(root: Path) -> dict[str, list[np.ndarray]]:
    """Every case's outputs under ``root``; {output name: its variables' values}."""
    old, new = gcm_ens_like(root / "ens_2005.nc", 2005, 1), gcm_ens_like(root / "ens_2006.nc", 2006, 2)
    out: dict[str, Path] = {}
    _pp("fit", "--per-gridpoint", "--forecast", old, "--out", root / "emos.nc")
    _pp("apply", "--emos", root / "emos.nc", "--forecast", new, "--out", root / "pp.zarr", "--members", "6",
        "--quantiles", "0.1", "0.5", "0.9")
    out.update(emos_model=root / "emos.nc", emos_mu_sigma=root / "pp.zarr", emos_ecc=root / "pp_members.zarr",
               emos_quantiles=root / "pp_quantiles.zarr")
    _pp("fit", "--predictors", "members", "--forecast", old, "--variables", "temperature", "--out", root / "w.nc")
    _pp("apply", "--emos", root / "w.nc", "--forecast", new, "--out", root / "w.zarr")
    out.update(weights_model=root / "w.nc", weights_mu_sigma=root / "w.zarr")
    table = root / "uwme.csv"
    _table(table, n_sites=6, n_days=40)
    _pp("fit", "--method", "drn", "--forecast", table, *DRN_FAST, "--out", root / "drn.nc")
    _pp("apply", "--drn", root / "drn.nc", "--forecast", table, "--out", root / "drn.zarr", "--members", "5",
        "--quantiles", "0.25", "0.75")
    out.update(drn_model=root / "drn.nc", drn_mu_sigma=root / "drn.zarr", drn_ecc=root / "drn_members.zarr",
               drn_quantiles=root / "drn_quantiles.zarr")
    _pp("fit", "--per-site", "--forecast", table, "--out", root / "site.nc")
    _pp("apply", "--emos", root / "site.nc", "--forecast", table, "--out", root / "site.zarr", "--members", "5")
    out.update(site_model=root / "site.nc", site_mu_sigma=root / "site.zarr", site_ecc=root / "site_members.zarr")
    out.update(rolling_cases(root, table))
    return {k: values_of(p) for k, p in sorted(out.items())}


def rolling_cases(root: Path, table: Path) -> dict[str, Path]:
    """Rolling training windows (per-site EMOS, DRN) on the station table."""
    roll = ["--window", "10D", "--lag", "2D", "--dates", "2004-01-20", "2004-02-05"]
    _pp("fit", "--per-site", "--forecast", table, *roll, "--out", root / "roll.nc")
    _pp("apply", "--emos", root / "roll.nc", "--forecast", table, "--apply-period", "2004-01-20", "2004-02-05",
        "--out", root / "roll.zarr")
    _pp("fit", "--method", "drn", "--forecast", table, *DRN_FAST, *roll, "--out", root / "drn_roll.nc")
    _pp("apply", "--drn", root / "drn_roll.nc", "--forecast", table, "--apply-period", "2004-01-20", "2004-02-05",
        "--out", root / "drn_roll.zarr")
    return {"rolling_site_model": root / "roll.nc", "rolling_site_mu_sigma": root / "roll.zarr",
            "rolling_drn_model": root / "drn_roll.nc", "rolling_drn_mu_sigma": root / "drn_roll.zarr"}


@pytest.mark.usefixtures("recorded_threads")
def test_postprocess_outputs_are_bit_identical(tmp_path: Path) -> None:
    recorded = json.loads(DIGESTS.read_text())
    torch.manual_seed(0)
    got = run_cases(tmp_path)
    assert sorted(got) == sorted(recorded["reference"])
    for name, arrays in got.items():
        assert_close_to_reference(summarize(arrays), recorded["reference"][name], REL, name)
    if is_recording_machine(recorded["machine"]):  # the bytes, only where they were recorded
        assert {name: digest(arrays) for name, arrays in got.items()} == recorded["digests"]


if __name__ == "__main__":  # record: PYTHONPATH=tests python tests/postprocess/test_postprocess_bit_identical.py [OUT]
    import sys
    import tempfile

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cases = run_cases(Path(tempfile.mkdtemp(prefix="ppbit")))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DIGESTS
    out.write_text(json.dumps({"machine": fingerprint(), "digests": {k: digest(v) for k, v in cases.items()},
                               "reference": {k: summarize(v) for k, v in cases.items()}}, indent=1) + "\n")
