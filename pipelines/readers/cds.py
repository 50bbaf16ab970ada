"""Raw Copernicus Climate Data Store downloads (ERA5): GRIB through cfgrib, and netCDF.

Handles both GRIB layouts cfgrib produces (``time`` [+ ``step``] with ``valid_time`` derived; or
``number`` for ensembles, ``isobaricInhPa`` for pressure levels) and both CDS netCDF layouts (legacy
``time``/``level``/``number``; 2024+ ``valid_time``/``pressure_level``/``number``). The GRIB index
file is never written (``indexpath=""``), so read-only folders work.
Returns the canonical Dataset: dims (time, [prediction_timedelta], [member], [level], latitude,
longitude), WB2 names and units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import xarray as xr

from pipelines.canonical import canonicalize, validate
from pipelines.errors import DataError
from pipelines.readers._files import PathLike, check_grib, load_checked, open_netcdf, resolve_sources, sniff_format

GRIB_KWARGS = {"indexpath": ""}


def _open_grib(path) -> list[xr.Dataset]:
    import cfgrib

    check_grib(path)
    try:
        parts = cfgrib.open_datasets(str(path), backend_kwargs=dict(GRIB_KWARGS))
    except Exception as err:  # cfgrib raises EOFError, DatasetBuildError, …
        raise DataError(f"{path}: cfgrib cannot read this GRIB file ({err})") from err
    return parts


def open_cds_file(path: PathLike, source: str = "cds") -> xr.Dataset:
    """Open one CDS GRIB or netCDF file as a canonical Dataset (values loaded and checked)."""
    (p,) = resolve_sources(path)
    fmt = sniff_format(p)
    if fmt == "grib":
        parts = [canonicalize(part, source=source) for part in _open_grib(p)]
        ds = xr.merge(parts, compat="no_conflicts", join="outer", combine_attrs="drop_conflicts")
    else:
        ds = canonicalize(open_netcdf(p), source=source)
    ds = load_checked(ds, p)
    ds.attrs.update(source_files=str(p), source_format=source, file_format=fmt)
    return ds


def open_cds(
    paths: PathLike | Sequence[PathLike],
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    fill_policy: str = "error",
) -> xr.Dataset:
    """Open CDS GRIB/netCDF file(s) and combine them along ``time``.

    ``variables`` are canonical names (e.g. "geopotential"), ``levels`` in hPa (one list, or a dict
    per variable as for ``z500``/``t850`` files); both are checked and
    selected by ``validate``, which also rejects duplicated/non-monotonic times and NaNs
    (``fill_policy``). Files are loaded into memory: CDS downloads are meant to be modest; big
    archives belong in the WB2/ARCO zarr reader.
    """
    files = resolve_sources(paths)
    parts = [open_cds_file(p) for p in files]
    if len(parts) == 1:
        ds = parts[0]
    else:
        try:
            ds = xr.concat(parts, dim="time", join="exact", combine_attrs="drop_conflicts")
        except ValueError as err:
            raise DataError(
                f"files {[str(p) for p in files]} do not share one grid, level set or "
                f"variable set ({err}); expected the same layout in every file"
            ) from err
        ds = ds.sortby("time") if ds.indexes["time"].is_unique else ds
    ds.attrs["source_files"] = ", ".join(str(p) for p in files)
    where = files[0] if len(files) == 1 else f"{files[0].parent}/{{{', '.join(p.name for p in files)}}}"
    return validate(ds, path=where, variables=variables, levels=levels, fill_policy=fill_policy)
