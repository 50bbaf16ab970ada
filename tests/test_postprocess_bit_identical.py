"""Refactors of post-processing keep its outputs bit-identical: a gcm_ens-like per-grid-point EMOS
fit → apply with ECC-Q members and quantiles, a global member-weights EMOS, a truncated-normal EMOS, and a
UWME-like station DRN fit → apply give the same values, byte for byte, as on the code before the refactor.

Digests cover the values of every data variable of the model files and of every output store (not attributes or
coordinates: new CF metadata is allowed). They were recorded by running this file's ``__main__`` on commit
bc7a7be, torch 2.x on x86-64 CPU, 2 intra-op threads; another torch build or CPU may round differently, so they
are only compared where they were recorded."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from test_postprocess_cli import gcm_ens_like
from test_postprocess_drn import _table

from smoeweather.cli import main

DIGESTS = Path(__file__).with_name("postprocess_digests.json")
QUIET = ["--scheduler", "threads", "--quiet", "--overwrite"]
DRN_FAST = ["--drn-epochs", "3", "--drn-seeds", "2", "--drn-hidden", "8", "--drn-batch-size", "64"]


def _machine() -> str:
    return f"torch {torch.__version__.split('+')[0]} {platform.machine()} threads {torch.get_num_threads()}"


def digest_of(path: Path) -> str:
    """sha256 (16 hex) of the values of every data variable of a zarr store or netCDF file, by name."""
    ds = xr.open_zarr(path) if path.suffix == ".zarr" else xr.open_dataset(path)
    with ds:
        h = hashlib.sha256()
        for n in sorted(map(str, ds.data_vars)):
            h.update(n.encode())
            h.update(np.ascontiguousarray(ds[n].values).tobytes())
        return h.hexdigest()[:16]


def _pp(*args: object) -> None:
    assert main(["postprocess", *map(str, args), *QUIET]) == 0


def run_cases(root: Path) -> dict[str, str]:
    """Every case's outputs under ``root``; {output name: digest}."""
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
    return {k: digest_of(p) for k, p in sorted(out.items())}


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
    if recorded.get("machine") != _machine():
        pytest.skip(f"digests recorded on {recorded.get('machine')!r}, this is {_machine()!r}: got {got}")
    assert got == recorded["cases"]


if __name__ == "__main__":  # record the digests: python tests/test_postprocess_bit_identical.py
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cases = run_cases(Path(tempfile.mkdtemp(prefix="ppbit")))
    DIGESTS.write_text(json.dumps({"machine": _machine(), "commit": "bc7a7be", "cases": cases}, indent=1) + "\n")
    print(DIGESTS.read_text())
