"""File helpers shared by the readers: format sniffing, integrity checks, guarded opening."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import xarray as xr

from pipelines.errors import DataError

PathLike = str | os.PathLike


SKIPPED_SUFFIXES = (".idx", ".tmp")  # cfgrib index files, interrupted downloads/writes


def resolve_sources(paths: PathLike | Sequence[PathLike], pattern: str = "*") -> list[Path]:
    """The one path helper: source(s) → list of existing files; ``DataError`` naming what is missing.

    ``paths``: one path, a sequence of paths, a glob (``*``, ``?``, ``[...]``) or a folder (its files
    matching ``pattern``, sorted). A path that exists is taken literally even when it holds glob
    characters (``run[1].grib``). cfgrib index files (``*.idx``) and hidden files are skipped in folders
    and globs. URLs are not files: pass them to the zarr reader.
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise DataError("no input files given; expected at least one path")
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(
                p
                for p in path.glob(pattern)
                if p.is_file() and not p.name.startswith(".") and not p.name.endswith(SKIPPED_SUFFIXES)
            )
            if not found:
                raise DataError(f"--source {path}: folder holds no file matching {pattern!r}")
            out.extend(found)
        elif path.exists():  # literal path first: '[' in a file name is not a glob
            out.append(path)
        elif any(c in str(item) for c in "*?["):
            found = sorted(
                Path(p) for p in glob.glob(str(item)) if not Path(p).name.endswith(SKIPPED_SUFFIXES)
            )
            found = [p for p in found if p.is_file()]
            if not found:
                raise DataError(f"--source {item}: no file matches this pattern (and no file has this name)")
            out.extend(found)
        else:
            raise DataError(f"{path}: file not found")
    return out


def sniff_format(path: Path) -> str:
    """'grib' or 'netcdf' from the file's magic bytes; anything else raises ``DataError``."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"GRIB":
        return "grib"
    if head[:3] == b"CDF" or head[:8] == b"\x89HDF\r\n\x1a\n":
        return "netcdf"
    raise DataError(
        f"{path}: neither GRIB nor netCDF (first bytes {head!r}); expected a GRIB "
        "message ('GRIB') or a netCDF-3/4 header"
    )


def check_grib(path: Path) -> int:
    """Read every GRIB message with eccodes; return their number.

    cfgrib skips a truncated or corrupt message with a log line and fills its place with NaN, so a
    damaged download would otherwise pass unnoticed: here it raises ``DataError``.
    """
    import eccodes

    count = 0
    with open(path, "rb") as f:
        while True:
            try:
                handle = eccodes.codes_grib_new_from_file(f)
            except Exception as err:  # eccodes raises its own error classes (PrematureEndOfFile, …)
                raise DataError(
                    f"{path}: truncated or corrupt GRIB file (message {count + 1} "
                    f"unreadable: {err}); expected complete GRIB messages"
                ) from err
            if handle is None:
                break
            eccodes.codes_release(handle)
            count += 1
    if count == 0:
        raise DataError(f"{path}: no GRIB message found; expected a GRIB file")
    return count


def open_netcdf(path: Path, **kwargs: object) -> xr.Dataset:
    """``xr.open_dataset`` with a ``DataError`` naming the file when it is truncated or corrupt."""
    if sniff_format(Path(path)) == "grib":  # xarray would pick cfgrib and write an index beside the file
        raise DataError(
            f"{path}: a GRIB file where netCDF was expected; GRIB from the CDS or ENS-10 is read by "
            "`smoe data prepare era5 --format cds` or `smoe data prepare ens10`"
        )
    try:
        ds = xr.open_dataset(path, **kwargs)
    except (OSError, ValueError, RuntimeError) as err:
        raise DataError(
            f"{path}: cannot read netCDF (truncated or corrupt? {err}); expected a readable netCDF-3/4 file"
        ) from err
    return ds


def load_checked(ds: xr.Dataset, path: Path) -> xr.Dataset:
    """Load values now so that a file truncated after its header fails here, naming the file."""
    try:
        return ds.load()
    except (OSError, ValueError, RuntimeError, IndexError) as err:
        raise DataError(f"{path}: data unreadable (truncated or corrupt? {err})") from err
