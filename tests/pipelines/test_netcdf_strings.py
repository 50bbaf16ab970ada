"""netCDF files the project writes keep strings as char arrays: they read back as the same strings, and a file
held open can be opened again (netCDF-C crashes on that with variable-length strings)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import netCDF4
import numpy as np
import xarray as xr

from pipelines.atomic import write_netcdf

REOPEN = textwrap.dedent("""
    import sys, xarray as xr
    path = sys.argv[1]
    held = [xr.open_dataset(path) for _ in range(2)]  # two handles left open, as in a notebook
    for _ in range(60):
        ds = xr.load_dataset(path)
    print(",".join(map(str, ds["method"].values)))
""")


def _scores() -> xr.Dataset:
    return xr.Dataset({"rmse": (("method", "field"), np.arange(6.0).reshape(3, 2)),
                       "label": (("method",), np.array(["dense", "SMoE ü", "x"], dtype=object))},
                      coords={"method": ["dense", "smoe_all", "persistence"], "field": ["z500", "t850"]})


def test_strings_are_char_arrays_and_read_back(tmp_path: Path) -> None:
    path = write_netcdf(_scores(), tmp_path / "scores.nc")
    with netCDF4.Dataset(path) as nc:
        for name in ("method", "field", "label"):
            assert nc[name].dtype == np.dtype("S1"), f"{name} is {nc[name].dtype}, expected a char array"
    back = xr.load_dataset(path)
    assert list(back["method"].values) == ["dense", "smoe_all", "persistence"]
    assert list(back["label"].values) == ["dense", "SMoE ü", "x"]
    np.testing.assert_array_equal(back["rmse"].values, np.arange(6.0).reshape(3, 2))


def test_a_held_open_file_opens_again(tmp_path: Path) -> None:
    """In a child process: a segmentation fault there would be exit code -11, not a crash of the test run."""
    path = write_netcdf(_scores(), tmp_path / "scores.nc")
    done = subprocess.run([sys.executable, "-c", REOPEN, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "dense,smoe_all,persistence"


def test_encoding_is_added_to_not_replaced(tmp_path: Path) -> None:
    path = write_netcdf(_scores(), tmp_path / "z.nc", encoding={"rmse": {"zlib": True, "complevel": 4}})
    with netCDF4.Dataset(path) as nc:
        assert nc["rmse"].filters()["zlib"] and nc["method"].dtype == np.dtype("S1")
