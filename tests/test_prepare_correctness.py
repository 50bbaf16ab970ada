"""Issue 7 §2/§4 regressions for `smoe data prepare`: each silent data error must now be right or refuse.

GRIB messages are written here with eccodes and netCDF files with xarray, so nothing needs ../shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import pipelines
from pipelines import atomic

REPO = Path(__file__).resolve().parents[1]
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
