"""WeatherBench (v1) netCDF folders, as published (Rasp et al. 2020).

Layout under ``root`` (one resolution per root, e.g. ``.../5.625deg``)::

    geopotential_500/geopotential_500hPa_1979_5.625deg.nc   z  (time, lat, lon), scalar `level` 500
    temperature/temperature_1979_5.625deg.nc                t  (time, level, lat, lon), 13 levels
    2m_temperature/2m_temperature_1979_5.625deg.nc          t2m (time, lat, lon)
    toa_incident_solar_radiation/…, total_precipitation/…   tisr, tp (hourly, J m⁻², m)
    constants/constants_5.625deg.nc                         lsm, orography, slt, lat2d, lon2d (lat, lon)

Hourly times, latitude ascending. ``tp`` stays ``total_precipitation`` (1-hour accumulation);
summing to ``total_precipitation_6hr`` is a resampling decision left to the caller.
Returns the canonical Dataset (time, level, latitude, longitude); constants have no time dim.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import xarray as xr

from pipelines.canonical import canonicalize, validate
from pipelines.errors import DataError
from pipelines.readers._files import PathLike, open_netcdf

CONSTANTS = "constants"


def _year_file(folder: Path, year: int, grid: str) -> Path:
    matches = sorted(folder.glob(f"*_{year}_{grid}.nc"))
    if not matches:
        available = sorted({p.name.rsplit("_", 2)[-2] for p in folder.glob(f"*_{grid}.nc")})
        raise DataError(
            f"{folder}: no file for year {year} at {grid} (expected '<name>_{year}_{grid}.nc'"
            f"); available years: {', '.join(available) or 'none'}"
        )
    if len(matches) > 1:
        raise DataError(f"{folder}: several files for year {year}: {[m.name for m in matches]}")
    return matches[0]


def _open_folder(root: Path, folder_name: str, years: Sequence[int], grid: str) -> xr.Dataset:
    folder = root / folder_name
    if not folder.is_dir():
        present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise DataError(
            f"{folder}: variable folder '{folder_name}' not found under {root}; available: {present}"
        )
    if folder_name == CONSTANTS:
        path = folder / f"constants_{grid}.nc"
        if not path.is_file():
            raise DataError(f"{path}: constants file not found (expected constants_{grid}.nc)")
        return canonicalize(open_netcdf(path), source="weatherbench", provenance={"source_files": str(path)})
    parts = []
    for year in years:
        path = _year_file(folder, year, grid)
        part = canonicalize(open_netcdf(path, chunks={}), source="weatherbench")
        parts.append(validate(part, path=path, check_nans=False))  # time axis of each file
    try:
        ds = xr.concat(parts, dim="time", join="exact", combine_attrs="drop_conflicts")
    except ValueError as err:
        raise DataError(f"{folder}: yearly files do not share one grid/levels ({err})") from err
    ds.attrs["source_files"] = f"{folder}/*_{{{','.join(map(str, years))}}}_{grid}.nc"
    return validate(ds, path=ds.attrs["source_files"], check_nans=False)  # and across years


def open_weatherbench(
    root: PathLike,
    variables: Iterable[str],
    years: Iterable[int],
    grid: str = "5.625deg",
    levels: Sequence[int] | None = None,
    fill_policy: str = "error",
    check_nans: bool = True,
) -> xr.Dataset:
    """Read WeatherBench v1 folders for ``years`` and merge them into one canonical Dataset.

    ``variables`` are folder names as published ("geopotential_500", "temperature_850",
    "temperature", "2m_temperature", "toa_incident_solar_radiation", "constants", …); ``levels``
    (hPa) selects from multi-level folders. Missing folders, years or levels raise ``DataError``.
    Data stay lazy (dask) except for the NaN check, which reads everything once: pass
    ``check_nans=False`` to defer it (e.g. to a chunked ``validate`` while writing the store).
    """
    root = Path(root)
    folders, years = list(variables), sorted(int(y) for y in years)
    if not years and any(f != CONSTANTS for f in folders):
        raise DataError(f"{root}: no years requested; expected e.g. years=range(1979, 2016)")
    parts = [_open_folder(root, name, years, grid) for name in folders]
    try:
        ds = xr.merge(parts, compat="no_conflicts", join="outer", combine_attrs="drop_conflicts")
    except (ValueError, xr.MergeError) as err:
        raise DataError(f"{root}: folders {folders} disagree on grid or values ({err})") from err
    ds.attrs.update(
        source_format="weatherbench",
        grid=grid,
        source_files="; ".join(str(p.attrs.get("source_files", "")) for p in parts),
    )
    return validate(ds, path=root, levels=levels, fill_policy=fill_policy, check_nans=check_nans)
