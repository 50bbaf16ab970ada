"""The device call's packs (``benchmarks/gpu_pack.py``): a GCM-world year packs and unpacks bit for bit, as data
(no pickle), and the packed packages' libraries still work once stripped of their debug data."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import SHARED_DATA, skip_without_shared

from benchmarks.gpu_pack import pack_gcm, strip_debug, unpack_gcm

YEAR1 = ("gcm_world", "gcm_5.625deg_year1.nc")


def _refuse_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pack was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


def _same_file(a: Path, b: Path) -> None:
    """Decoded values, stored int16 values, attributes and coordinates all equal."""
    for mask_and_scale in (True, False):
        x, y = xr.open_dataset(a, mask_and_scale=mask_and_scale), xr.open_dataset(b, mask_and_scale=mask_and_scale)
        assert x.attrs == y.attrs
        for name in ("geopotential", "temperature", "land_sea_mask", "geopotential_at_surface", *x.coords):
            assert x[name].dtype == y[name].dtype, name
            np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)
            assert x[name].attrs.keys() == y[name].attrs.keys(), name
            for k, v in y[name].attrs.items():
                got = np.asarray(x[name].attrs[k])
                assert got.dtype == np.asarray(v).dtype, (name, k)
                np.testing.assert_array_equal(got, v, err_msg=f"{name}.{k}")  # a NaN _FillValue equals itself


@skip_without_shared(*YEAR1)
def test_gcm_pack_of_the_real_year_round_trips_bit_for_bit_as_data(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The first three days of the real year-1 file (CF-packed int16, five levels) through pack and unpack."""
    src = tmp_path / "first_days.nc"
    xr.open_dataset(SHARED_DATA.joinpath(*YEAR1), mask_and_scale=False).sel(time=slice(None, "2001-01-03T18")) \
        .to_netcdf(src)
    pack_gcm(tmp_path / "year.pack", SHARED_DATA.joinpath(*YEAR1), until="2001-01-03T18")
    _refuse_pickle(monkeypatch)
    sizes = unpack_gcm(tmp_path / "year.pack", tmp_path / "back.nc")
    assert sizes == {"time": 12, "level": 5, "latitude": 32, "longitude": 64}
    _same_file(tmp_path / "back.nc", src)


def test_gcm_pack_keeps_the_attribute_dtypes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 scale factors and int16 fill values come back as such (CF decoding computes in their dtype)."""
    rng = np.random.default_rng(0)
    shape = (6, 2, 3, 4)
    coords = {"time": np.arange(6) * np.timedelta64(6, "h") + np.datetime64("2001-01-01", "ns"),
              "level": np.array([500, 850], np.int32), "latitude": [-30.0, 0.0, 30.0], "longitude": [0.0, 90, 180, 270]}
    packed = {"scale_factor": np.float32(0.5), "add_offset": np.float32(250.0), "_FillValue": np.int16(-32768)}
    ds = xr.Dataset({v: (tuple(coords), rng.integers(-3000, 3000, shape).astype(np.int16), {"units": "K", **packed})
                     for v in ("geopotential", "temperature")}
                    | {v: (("latitude", "longitude"), rng.random((3, 4), np.float32)) for v in
                       ("land_sea_mask", "geopotential_at_surface")}, coords=coords, attrs={"title": "synthetic"})
    ds.to_netcdf(tmp_path / "src.nc")
    pack_gcm(tmp_path / "x.pack", tmp_path / "src.nc", None)
    _refuse_pickle(monkeypatch)
    unpack_gcm(tmp_path / "x.pack", tmp_path / "back.nc")
    _same_file(tmp_path / "back.nc", tmp_path / "src.nc")


def test_gcm_pack_refuses_a_file_of_another_layout(tmp_path: Path) -> None:
    ds = xr.Dataset({"geopotential": (("time", "latitude", "longitude"), np.zeros((2, 3, 4), np.int16))})
    ds.to_netcdf(tmp_path / "other.nc")
    with pytest.raises(ValueError, match="other.nc: no variables"):
        pack_gcm(tmp_path / "x.pack", tmp_path / "other.nc", None)
    np.savez(tmp_path / "not_a_pack.npz", layout=np.array('{"format": "x"}'))
    with pytest.raises(ValueError, match="not_a_pack.npz: not a smoeweather-gcm-pack"):
        unpack_gcm(tmp_path / "not_a_pack.npz", tmp_path / "y.nc")


def _gnu_strip() -> bool:
    tool = shutil.which("strip")
    return tool is not None and "GNU" in subprocess.run([tool, "--version"], capture_output=True, text=True).stdout


@pytest.mark.skipif(not _gnu_strip(), reason="needs binutils' strip (apt install binutils), as the GPU packs do")
def test_a_stripped_library_loses_its_debug_data_and_still_works(tmp_path: Path) -> None:
    """numcodecs' zstd extension stripped by strip_debug: no debug sections left (smaller where the wheel had them,
    as numcodecs 0.16's x86-64 wheels do), and it still compresses and decompresses an array bit for bit in a
    fresh interpreter."""
    numcodecs = pytest.importorskip("numcodecs")
    package = tmp_path / "numcodecs"
    shutil.copytree(Path(numcodecs.__file__).parent, package)
    library = next(package.glob("zstd*.so"))
    before = library.read_bytes()
    if not before.startswith(b"\x7fELF"):
        pytest.skip(f"{library.name} is not an ELF library (strip_debug leaves those as they are)")
    library.write_bytes(strip_debug(before))
    after = library.read_bytes()
    assert b".debug_info" not in after
    assert len(after) < len(before) if b".debug_info" in before else len(after) <= len(before)
    code = (f"import numpy as np, numcodecs.zstd as z; assert z.__file__.startswith({str(tmp_path)!r}); "
            "a = np.random.default_rng(0).normal(size=4096); c = z.Zstd(level=3); "
            "assert np.array_equal(np.frombuffer(c.decode(c.encode(a))), a)")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(tmp_path)}, timeout=60)
