"""The canonical Dataset: one vocabulary (WeatherBench 2 / ERA5 long names) for every source.

Canonical form (what every reader returns):
- dims, in this order where present: ``time`` (valid time, or initialisation time for forecasts),
  ``prediction_timedelta`` (lead time), ``member`` (ensemble; 0 = control), ``level`` (hPa: int, or float for
  levels below 1 hPa such as 0.1 from GRIB ``isobaricInPa``), ``latitude``
  (degrees north, ASCENDING, as WeatherBench 2), ``longitude`` (degrees east, [0, 360), sorted);
- variable names and units of WeatherBench 2 / ERA5 (``geopotential`` in m² s⁻², not height);
- CF attributes (``units``, ``long_name``, ``standard_name`` where one exists) on variables and
  coordinates; provenance (``source_format``, ``source_files``, ``history``) in the Dataset attrs.

``canonicalize`` does the renaming and normalisation; ``validate`` checks a canonical Dataset against
what the caller needs (variables, levels, clean time axis, NaNs) and raises ``DataError`` otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.errors import DataError

G = 9.80665  # standard gravity, m s⁻² (WMO), converts geopotential height (m) to geopotential (m² s⁻²)

CANONICAL_DIMS = ("time", "prediction_timedelta", "member", "level", "latitude", "longitude")
SOURCES = ("auto", "weatherbench", "wb2", "cds", "cmip6", "ens10")
FILL_POLICIES = ("error", "zero", "mean", "nearest")
FillPolicy = Literal["error", "zero", "mean", "nearest"]

# name -> (units, long_name, standard_name or None)
VARIABLES: dict[str, tuple[str, str, str | None]] = {
    "geopotential": ("m**2 s**-2", "Geopotential", "geopotential"),
    "temperature": ("K", "Temperature", "air_temperature"),
    "u_component_of_wind": ("m s**-1", "U component of wind", "eastward_wind"),
    "v_component_of_wind": ("m s**-1", "V component of wind", "northward_wind"),
    "specific_humidity": ("kg kg**-1", "Specific humidity", "specific_humidity"),
    "relative_humidity": ("%", "Relative humidity", "relative_humidity"),
    "vertical_velocity": ("Pa s**-1", "Vertical velocity", "lagrangian_tendency_of_air_pressure"),
    "vorticity": ("s**-1", "Vorticity (relative)", "atmosphere_relative_vorticity"),
    "potential_vorticity": ("K m**2 kg**-1 s**-1", "Potential vorticity", None),
    "2m_temperature": ("K", "2 metre temperature", "air_temperature"),
    "10m_u_component_of_wind": ("m s**-1", "10 metre U wind component", "eastward_wind"),
    "10m_v_component_of_wind": ("m s**-1", "10 metre V wind component", "northward_wind"),
    "mean_sea_level_pressure": ("Pa", "Mean sea level pressure", "air_pressure_at_mean_sea_level"),
    "surface_pressure": ("Pa", "Surface pressure", "surface_air_pressure"),
    "toa_incident_solar_radiation": ("J m**-2", "TOA incident solar radiation", None),
    "total_precipitation": (
        "m",
        "Total precipitation (accumulated over the source's step)",
        "lwe_thickness_of_precipitation_amount",
    ),
    "total_precipitation_6hr": (
        "m",
        "Total precipitation over 6 hours",
        "lwe_thickness_of_precipitation_amount",
    ),
    "convective_precipitation": ("m", "Convective precipitation", None),
    "total_cloud_cover": ("1", "Total cloud cover", "cloud_area_fraction"),
    "total_column_water": ("kg m**-2", "Total column water", None),
    "total_column_water_vapour": (
        "kg m**-2",
        "Total column water vapour",
        "lwe_thickness_of_atmosphere_mass_content_of_water_vapor",
    ),
    "sea_surface_temperature": ("K", "Sea surface temperature", "sea_surface_temperature"),
    "skin_temperature": ("K", "Skin temperature", None),
    "land_sea_mask": ("1", "Land-sea mask (land fraction)", "land_binary_mask"),
    "geopotential_at_surface": ("m**2 s**-2", "Geopotential at surface", "surface_geopotential"),
    "soil_type": ("1", "Soil type", None),
}

# ERA5 / CDS / cfgrib short names (also ENS-10, whose GRIB files carry the same parameter ids).
CDS_NAMES = {
    "z": "geopotential",
    "gh": "geopotential",
    "t": "temperature",
    "u": "u_component_of_wind",
    "v": "v_component_of_wind",
    "q": "specific_humidity",
    "r": "relative_humidity",
    "w": "vertical_velocity",
    "vo": "vorticity",
    "pv": "potential_vorticity",
    "t2m": "2m_temperature",
    "2t": "2m_temperature",
    "u10": "10m_u_component_of_wind",
    "v10": "10m_v_component_of_wind",
    "10u": "10m_u_component_of_wind",
    "10v": "10m_v_component_of_wind",
    "msl": "mean_sea_level_pressure",
    "sp": "surface_pressure",
    "tisr": "toa_incident_solar_radiation",
    "tp": "total_precipitation",
    "cp": "convective_precipitation",
    "tcc": "total_cloud_cover",
    "tcw": "total_column_water",
    "tcwv": "total_column_water_vapour",
    "sst": "sea_surface_temperature",
    "skt": "skin_temperature",
    "lsm": "land_sea_mask",
    "slt": "soil_type",
}
# WeatherBench v1 netCDF: ERA5 short names plus the constants file's own names.
WEATHERBENCH_NAMES = {**CDS_NAMES, "orography": "geopotential_at_surface"}
# CMIP6 CMOR variable ids. zg is geopotential HEIGHT (m): converted to geopotential with ×G.
CMIP6_NAMES = {
    "zg": "geopotential",
    "ta": "temperature",
    "ua": "u_component_of_wind",
    "va": "v_component_of_wind",
    "hus": "specific_humidity",
    "hur": "relative_humidity",
    "wap": "vertical_velocity",
    "tas": "2m_temperature",
    "uas": "10m_u_component_of_wind",
    "vas": "10m_v_component_of_wind",
    "psl": "mean_sea_level_pressure",
    "ps": "surface_pressure",
    "tos": "sea_surface_temperature",
    "ts": "skin_temperature",
    "clt": "total_cloud_cover",
    "sftlf": "land_sea_mask",
    "orog": "geopotential_at_surface",
}
VARIABLE_RENAMES: dict[str, dict[str, str]] = {
    "weatherbench": WEATHERBENCH_NAMES,
    "wb2": {},
    "cds": CDS_NAMES,
    "ens10": CDS_NAMES,
    "cmip6": CMIP6_NAMES,
}
ALL_KNOWN_NAMES = {**CMIP6_NAMES, **WEATHERBENCH_NAMES}  # no short name appears in two tables
COORD_RENAMES = {
    "lat": "latitude",
    "lon": "longitude",
    "nav_lat": "latitude",
    "nav_lon": "longitude",
    "isobaricInhPa": "level",
    "isobaricInPa": "level",
    "pressure_level": "level",
    "plev": "level",
    "number": "member",
    "realization": "member",
    "member_id": "member",
    "step": "prediction_timedelta",
    "lead_time": "prediction_timedelta",
}
# Coordinates and helper variables with no place in the canonical Dataset.
DROP_NAMES = (
    "time_bnds",
    "time_bounds",
    "lat_bnds",
    "lon_bnds",
    "plev_bnds",
    "lat_bounds",
    "lon_bounds",
    "height",
    "surface",
    "heightAboveGround",
    "meanSea",
    "expver",
    "lat2d",
    "lon2d",
)

# units spellings, normalised (lower case, no spaces, no '**' or '^') -> canonical spelling
_UNIT_ALIASES = {
    "m2s-2": "m**2 s**-2",
    "m2/s2": "m**2 s**-2",
    "k": "K",
    "kelvin": "K",
    "degk": "K",
    "ms-1": "m s**-1",
    "m/s": "m s**-1",
    "kgkg-1": "kg kg**-1",
    "kg/kg": "kg kg**-1",
    "pa": "Pa",
    "pas-1": "Pa s**-1",
    "pa/s": "Pa s**-1",
    "s-1": "s**-1",
    "jm-2": "J m**-2",
    "j/m2": "J m**-2",
    "kgm-2": "kg m**-2",
    "kg/m2": "kg m**-2",
    "m": "m",
    "metres": "m",
    "meters": "m",
    "gpm": "gpm",
    "1": "1",
    "(0-1)": "1",
    "0-1": "1",
    "~": "1",
    "fraction": "1",
    "dimensionless": "1",
    "%": "%",
    "percent": "%",
    "degc": "degC",
    "celsius": "degC",
    "km2kg-1s-1": "K m**2 kg**-1 s**-1",
}
# (canonical variable, canonical source unit) -> (scale, offset): value_out = value_in * scale + offset
_CONVERSIONS: dict[tuple[str, str], tuple[float, float]] = {
    ("geopotential", "m"): (G, 0.0),
    ("geopotential", "gpm"): (G, 0.0),
    ("geopotential_at_surface", "m"): (G, 0.0),
    ("land_sea_mask", "%"): (0.01, 0.0),
    ("total_cloud_cover", "%"): (0.01, 0.0),
    ("relative_humidity", "1"): (100.0, 0.0),
    ("specific_humidity", "1"): (1.0, 0.0),  # CMIP6 hus is "1" (kg/kg)
    ("temperature", "degC"): (1.0, 273.15),
    ("2m_temperature", "degC"): (1.0, 273.15),
    ("sea_surface_temperature", "degC"): (1.0, 273.15),
}
_LEVEL_PA_UNITS = {"pa", "pascal", "pascals"}
_LEVEL_HPA_UNITS = {"hpa", "millibars", "millibar", "mbar", "mb", "hectopascal", "hectopascals"}

LATITUDE_ATTRS = {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude", "axis": "Y"}
LONGITUDE_ATTRS = {
    "units": "degrees_east",
    "standard_name": "longitude",
    "long_name": "longitude",
    "axis": "X",
}
LEVEL_ATTRS = {
    "units": "hPa",
    "standard_name": "air_pressure",
    "long_name": "pressure level",
    "positive": "down",
    "axis": "Z",
}
MEMBER_ATTRS = {"standard_name": "realization", "long_name": "ensemble member"}
TIME_ATTRS = {"standard_name": "time", "long_name": "time", "axis": "T"}
LEAD_ATTRS = {"standard_name": "forecast_period", "long_name": "lead time"}


def _where(path: object) -> str:
    return str(path) if path is not None else "dataset"


def _normalise_unit(units: str) -> str | None:
    key = units.strip().lower().replace(" ", "").replace("**", "").replace("^", "")
    return _UNIT_ALIASES.get(key)


def _drop_bookkeeping(ds: xr.Dataset) -> xr.Dataset:
    """Drop bounds, scalar GRIB level coords and cfgrib's derived ``valid_time`` (not a dim)."""
    drop = [n for n in DROP_NAMES if n in ds.variables and n not in ds.dims]
    if "valid_time" in ds.coords and "valid_time" not in ds.dims:
        drop.append("valid_time")
    if "step" in ds.coords and "step" not in ds.dims:
        drop.append("step")  # analyses: a scalar step of 0
    return ds.drop_vars(drop)


def _rename_coords(ds: xr.Dataset) -> xr.Dataset:
    renames = {k: v for k, v in COORD_RENAMES.items() if k in ds.variables and v not in ds.variables}
    ds = ds.rename(renames)
    # CDS netCDF (2024 on) and cfgrib analyses read with time_dims=("valid_time",): valid_time is the dim
    if "valid_time" in ds.dims and "time" not in ds.variables:
        ds = ds.rename({"valid_time": "time"})
    return ds


def _rename_variables(ds: xr.Dataset, source: str) -> xr.Dataset:
    if source == "auto":
        table = {**CMIP6_NAMES, **WEATHERBENCH_NAMES}
    else:  # the source's own names first, then every other known name (a CMIP `tas` read as CDS …)
        table = {**ALL_KNOWN_NAMES, **VARIABLE_RENAMES[source]} if VARIABLE_RENAMES[source] else {}
    renames: dict[str, str] = {}
    for name in ds.data_vars:
        if name in VARIABLES:
            continue
        new = table.get(str(name))
        if new is None:
            new = _split_level_suffix(str(name), table, ds)
        if new is not None:
            if new in renames.values() or (new in ds.data_vars and new != name):
                raise DataError(
                    f"variables {[k for k, v in renames.items() if v == new] + [name]} both map to "
                    f"'{new}'; expected one source variable per canonical variable"
                )
            renames[str(name)] = new
    ds = ds.rename(renames)
    # a single-level ERA5 `z` (GRIB typeOfLevel surface) is the surface geopotential, not Z at a level
    if "geopotential" in ds.data_vars and "level" not in ds["geopotential"].coords:
        if ds["geopotential"].attrs.get("GRIB_typeOfLevel") == "surface":
            ds = ds.rename({"geopotential": "geopotential_at_surface"})
    return ds


_LEVEL_SUFFIX = re.compile(r"^([a-z]+)_?(\d{2,4})$")


def _split_level_suffix(name: str, table: dict[str, str], ds: xr.Dataset) -> str | None:
    """``z500`` → ``geopotential`` with a scalar ``level`` 500 coord added (to the variable only)."""
    m = _LEVEL_SUFFIX.match(name)
    if m is None or m.group(1) not in table:
        return None
    return f"{table[m.group(1)]}@{int(m.group(2))}"


def _expand_level_suffixes(ds: xr.Dataset) -> xr.Dataset:
    """Turn variables renamed to ``name@level`` into ``name`` with a ``level`` dimension."""
    marked = [n for n in ds.data_vars if "@" in str(n)]
    if not marked:
        return ds
    pieces = []
    for n in marked:
        name, level = str(n).split("@")
        pieces.append(ds[n].expand_dims(level=[int(level)]).rename(name).to_dataset())
    return xr.merge(
        [ds.drop_vars(marked), *pieces], compat="no_conflicts", join="outer", combine_attrs="override"
    )


def _normalise_level(ds: xr.Dataset) -> xr.Dataset:
    if "level" not in ds.coords:
        return ds
    if ds["level"].ndim == 0:
        ds = ds.expand_dims("level")
        for name in list(ds.data_vars):  # constants have no level: keep them 2-D
            if name in ("land_sea_mask", "geopotential_at_surface", "soil_type"):
                ds[name] = ds[name].isel(level=0, drop=True)
    level = ds["level"]
    units = str(level.attrs.get("units", "")).strip().lower()
    values = np.asarray(level.values, dtype=float)
    if units in _LEVEL_PA_UNITS or (units not in _LEVEL_HPA_UNITS and values.size and values.max() > 1100):
        values = values / 100.0
    elif units and units not in _LEVEL_HPA_UNITS:
        raise DataError(f"coordinate 'level' has units '{units}'; expected Pa or hPa (pressure levels)")
    if np.allclose(values, np.round(values)):
        values = np.round(values).astype("int64")
    ds = ds.assign_coords(level=("level", values, dict(LEVEL_ATTRS)))
    return ds.sortby("level")


def _normalise_lat_lon(ds: xr.Dataset) -> xr.Dataset:
    if "latitude" in ds.dims:
        lat = ds["latitude"].values
        if np.nanmin(lat) < -90 - 1e-6 or np.nanmax(lat) > 90 + 1e-6:
            raise DataError(f"latitude values span {lat.min()}..{lat.max()}; expected within [-90, 90]")
        ds = ds.sortby("latitude")
        ds["latitude"].attrs = dict(LATITUDE_ATTRS)
    if "longitude" in ds.dims:
        lon = np.mod(ds["longitude"].values.astype("float64"), 360.0)
        lon[np.isclose(lon, 360.0)] = 0.0
        if len(np.unique(lon)) != lon.size:
            raise DataError(
                "longitude has duplicated points after wrapping to [0, 360) "
                "(e.g. both -180 and 180); expected each meridian once"
            )
        ds = ds.assign_coords(longitude=("longitude", lon, dict(LONGITUDE_ATTRS))).sortby("longitude")
    return ds


def _convert_units(ds: xr.Dataset) -> xr.Dataset:
    for name in list(ds.data_vars):
        if name not in VARIABLES:
            continue
        canonical_units = VARIABLES[str(name)][0]
        raw = ds[name].attrs.get("units")
        if raw is None:
            continue  # trusted to be canonical (e.g. WeatherBench constants without units)
        src = _normalise_unit(str(raw))
        if src == canonical_units:
            continue
        factor = _CONVERSIONS.get((str(name), src or ""))
        if factor is None:
            raise DataError(
                f"variable '{name}' has units '{raw}'; expected '{canonical_units}'"
                + (" (or a unit convertible to it)")
            )
        scale, offset = factor
        attrs = dict(ds[name].attrs)
        converted = ds[name] * scale + offset if offset else ds[name] * scale
        attrs["units_original"] = str(raw)
        ds[name] = converted.assign_attrs(attrs)
    return ds


def _set_attrs(ds: xr.Dataset) -> xr.Dataset:
    for name in ds.data_vars:
        if name in VARIABLES:
            units, long_name, standard_name = VARIABLES[str(name)]
            attrs = {k: v for k, v in ds[name].attrs.items() if not k.startswith("GRIB_")}
            attrs.update(units=units, long_name=long_name)
            if standard_name:
                attrs["standard_name"] = standard_name
            else:
                attrs.pop("standard_name", None)
            ds[name].attrs = attrs
    for coord, attrs in (
        ("member", MEMBER_ATTRS),
        ("time", TIME_ATTRS),
        ("prediction_timedelta", LEAD_ATTRS),
    ):
        if coord in ds.coords:
            ds[coord].attrs = dict(attrs)
    return ds


def _refuse_unknown(ds: xr.Dataset, source: str, where: str) -> xr.Dataset:
    """Sources with a name table: a field whose name maps to no canonical variable is refused (never
    stored under its raw name); unknown helper variables without a latitude/longitude grid are dropped."""
    if source in ("auto", "wb2"):
        return ds
    unknown, helpers = [], []
    for name, da in ds.data_vars.items():
        if str(name) in VARIABLES or "@" in str(name):
            continue
        (unknown if {"latitude", "longitude"} <= set(da.dims) else helpers).append(str(name))
    if unknown:
        raise DataError(
            f"{where}: variable(s) {unknown} have no canonical (WeatherBench 2) name for source '{source}'; "
            f"known source names: {sorted(ALL_KNOWN_NAMES)}; expected one of these (or the canonical names "
            f"{sorted(VARIABLES)})"
        )
    return ds.drop_vars(helpers)


def canonicalize(
    ds: xr.Dataset,
    source: str = "auto",
    provenance: dict[str, str] | None = None,
) -> xr.Dataset:
    """Rename and normalise ``ds`` from ``source`` to the canonical form (see module docstring).

    ``source`` picks the rename table: "weatherbench" (v1 short names, ``lat``/``lon``, constants),
    "wb2" (already long names), "cds"/"ens10" (cfgrib/ERA5 short names, ``isobaricInhPa``, ``number``,
    ``step``, ``valid_time``), "cmip6" (CMOR ids, ``plev`` in Pa, ``zg`` height ×G) or "auto" (all).
    Names such as ``z500``/``t850`` become ``geopotential``/``temperature`` at that level.
    Values are only rescaled for documented unit conversions; unknown units raise ``DataError``.
    """
    if source not in SOURCES:
        raise DataError(f"canonicalize: unknown source '{source}'; expected one of {SOURCES}")
    ds = _drop_bookkeeping(ds)
    ds = _rename_coords(ds)
    ds = _rename_variables(ds, source)
    where = _where(ds.encoding.get("source") or (provenance or {}).get("source_files"))
    ds = _refuse_unknown(ds, source, where)
    ds = _expand_level_suffixes(ds)
    ds = _normalise_level(ds)
    ds = _normalise_lat_lon(ds)
    ds = _convert_units(ds)
    ds = _set_attrs(ds)
    extra = [d for d in ds.dims if d not in CANONICAL_DIMS]  # e.g. `month`: kept, in front
    ds = ds.transpose(*extra, *[d for d in CANONICAL_DIMS if d in ds.dims])
    attrs = {k: v for k, v in ds.attrs.items() if not k.startswith("GRIB_")}
    attrs["source_format"] = source
    attrs["latitude_order"] = "ascending"
    attrs.update(provenance or {})
    history = str(attrs.get("history", "")).strip()
    step = f"canonicalized by smoeweather pipelines.canonical (source={source})"
    attrs["history"] = f"{history}\n{step}".strip()
    ds.attrs = attrs
    return ds


# --------------------------------------------------------------------------------------- validation


def _level(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def present_levels(da: xr.DataArray) -> xr.DataArray:
    """Boolean per ``level``: True where the variable holds any data (all-NaN levels are absent,
    as after merging sources with different level sets). All True for variables without levels."""
    if "level" not in da.dims:
        return xr.DataArray(True)
    return da.notnull().any([d for d in da.dims if d != "level"])


def nan_counts(ds: xr.Dataset) -> dict[str, int]:
    """NaNs per floating data variable, not counting absent (all-NaN) levels. Computes the data."""
    out = {}
    for name, da in ds.data_vars.items():
        if np.issubdtype(da.dtype, np.floating):
            out[str(name)] = int(da.isnull().where(present_levels(da), False).sum())
    return out


def _fill_nearest_2d(field: np.ndarray) -> np.ndarray:
    from scipy.ndimage import distance_transform_edt

    mask = np.isnan(field)
    if not mask.any() or mask.all():
        return field
    _, (i, j) = distance_transform_edt(mask, return_indices=True)
    return field[i, j]


def fill_nans(ds: xr.Dataset, policy: FillPolicy) -> xr.Dataset:
    """Fill NaNs of every floating variable by ``policy``.

    - "zero": 0 (e.g. precipitation where a source leaves dry points missing);
    - "mean": the mean over latitude/longitude of the same field (per time, member, level);
    - "nearest": the value of the nearest valid grid point in index space of the same 2-D field — the
      sensible choice for SST-style fields that are NaN over land.
    """
    out = ds.copy()
    for name, da in ds.data_vars.items():
        if not np.issubdtype(da.dtype, np.floating):
            continue
        present = present_levels(da)
        if policy == "zero":
            out[name] = da.fillna(0.0)
        elif policy == "mean":
            out[name] = da.fillna(da.mean(("latitude", "longitude"), skipna=True))
        elif policy == "nearest":
            out[name] = xr.apply_ufunc(
                _fill_nearest_2d,
                da,
                input_core_dims=[["latitude", "longitude"]],
                output_core_dims=[["latitude", "longitude"]],
                vectorize=True,
                dask="parallelized",
                output_dtypes=[da.dtype],
                keep_attrs=True,
            ).transpose(*da.dims)
        else:
            raise DataError(f"fill_policy '{policy}' is not known; expected one of {FILL_POLICIES}")
        out[name] = out[name].where(present)  # absent levels stay absent
    return out


def _check_levels(
    ds: xr.Dataset, levels: Iterable[int] | Mapping[str, Iterable[int]], where: str, need_data: bool = True
) -> xr.Dataset:
    """Check each variable with a level dim has the wanted levels with data; keep only those."""
    out = {}
    for name, da in ds.data_vars.items():
        wanted = levels.get(str(name)) if isinstance(levels, Mapping) else levels
        if "level" not in da.dims or wanted is None:
            out[name] = da
            continue
        # a level "exists" for a variable when it holds data (merged sources leave all-NaN levels)
        if need_data:
            has_data = present_levels(da).values
        else:
            has_data = np.ones(da.sizes["level"], dtype=bool)
        values = da["level"].values.astype(float)
        index, lacking = [], []
        for x in wanted:  # float levels (0.1 hPa) compared with a tolerance far below any level spacing
            hit = [i for i in np.flatnonzero(np.isclose(values, float(x), rtol=1e-6, atol=1e-9)) if has_data[i]]
            (index if hit else lacking).append(hit[0] if hit else x)
        if lacking:
            have = [_level(lv) for lv, ok in zip(values, has_data) if ok]
            raise DataError(
                f"{where}: variable '{name}' lacks level(s) {lacking} hPa; available levels: {have}"
            )
        out[name] = da.isel(level=index)
    return xr.Dataset(out, attrs=ds.attrs)


def validate(
    ds: xr.Dataset,
    path: object = None,
    variables: Sequence[str] | None = None,
    levels: Iterable[int] | Mapping[str, Iterable[int]] | None = None,
    fill_policy: FillPolicy = "error",
    check_nans: bool = True,
) -> xr.Dataset:
    """Check a canonical Dataset; return it (NaNs filled if ``fill_policy`` allows) or raise.

    ``variables`` and ``levels`` (hPa; one list for all variables or a dict per variable) also select:
    the returned Dataset holds only those. A level counts as present for a variable only when it holds
    data (merging sources leaves all-NaN levels). Raises ``DataError`` naming ``path`` and what was
    expected when: latitude/longitude are missing or not canonical, a variable or level is missing,
    ``time`` has duplicated or non-increasing stamps, or NaNs are present and ``fill_policy`` is
    "error" (the default; the message reports NaN counts per variable). Other policies: "zero",
    "mean", "nearest" (see ``fill_nans``); the counts filled are recorded in
    ``attrs["nan_filled"]``. With ``check_nans=False`` nothing is read (lazy stores): only
    coordinates are checked.
    """
    where = _where(path)
    if fill_policy not in FILL_POLICIES:
        raise DataError(f"{where}: fill_policy '{fill_policy}' is not known; expected one of {FILL_POLICIES}")
    for dim in ("latitude", "longitude"):
        if dim not in ds.dims:
            raise DataError(
                f"{where}: no '{dim}' dimension (dims: {list(ds.dims)}); expected a "
                "canonical Dataset on a latitude/longitude grid (call canonicalize first)"
            )
    lat, lon = ds["latitude"].values, ds["longitude"].values
    if lat.size > 1 and not np.all(np.diff(lat) > 0):
        raise DataError(f"{where}: latitude is not strictly ascending; expected canonical order")
    if lon.min() < 0 or lon.max() >= 360 or (lon.size > 1 and not np.all(np.diff(lon) > 0)):
        raise DataError(f"{where}: longitude not sorted within [0, 360); expected canonical order")

    if variables is not None:
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise DataError(
                f"{where}: missing variable(s) {missing}; available: {sorted(map(str, ds.data_vars))}"
            )
        ds = ds[list(variables)]
    if levels is not None:
        ds = _check_levels(ds, levels, where, need_data=check_nans)

    if "time" in ds.dims:
        index = ds.indexes["time"]
        duplicated = index[index.duplicated()]
        if len(duplicated):
            raise DataError(
                f"{where}: {len(duplicated)} duplicated timestamp(s) in 'time', first "
                f"{[str(t) for t in duplicated[:3]]}; expected unique timestamps"
            )
        if not index.is_monotonic_increasing:
            bad = int(
                np.argmax(
                    np.diff(np.asarray(index.values)) <= np.timedelta64(0)
                    if isinstance(index, pd.DatetimeIndex)
                    else [b <= a for a, b in zip(index[:-1], index[1:])]
                )
            )
            raise DataError(
                f"{where}: 'time' is not monotonically increasing (at position {bad + 1}:"
                f" {index[bad]} then {index[bad + 1]}); expected increasing timestamps"
            )

    counts = {k: v for k, v in nan_counts(ds).items() if v} if check_nans else {}
    if counts:
        sizes = {k: int(ds[k].size) for k in counts}
        report = ", ".join(f"'{k}': {v} of {sizes[k]} values" for k, v in counts.items())
        if fill_policy == "error":
            raise DataError(
                f"{where}: NaN values found ({report}); expected none, or pass "
                "fill_policy='nearest' (SST-style land gaps), 'mean' or 'zero'"
            )
        ds = fill_nans(ds, fill_policy)
        ds.attrs["nan_filled"] = f"{fill_policy}: {report}"
    return ds


def select_time(ds: xr.Dataset, start: object, stop: object, path: object = None) -> xr.Dataset:
    """``ds.sel(time=slice(start, stop))``, raising ``DataError`` when the request leaves the data."""
    where = _where(path)
    index = ds.indexes["time"]
    first, last = index[0], index[-1]
    lo = pd.Timestamp(start) if start is not None else None
    hi = pd.Timestamp(stop) if stop is not None else None
    if (lo is not None and lo < pd.Timestamp(first).floor("D")) or (
        hi is not None and hi > pd.Timestamp(last)
    ):
        raise DataError(
            f"{where}: requested time {start}..{stop} is outside the data, which covers {first}..{last}"
        )
    out = ds.sel(time=slice(start, stop))
    if out.sizes["time"] == 0:
        raise DataError(f"{where}: no timestamps in {start}..{stop}; data covers {first}..{last}")
    return out


def select_years(ds: xr.Dataset, years: Iterable[int], path: object = None) -> xr.Dataset:
    """Keep the given calendar years (works for numpy and cftime times); error on absent years."""
    years = sorted(int(y) for y in years)
    have = sorted(set(int(y) for y in ds["time"].dt.year.values))
    absent = [y for y in years if y not in have]
    if absent:
        raise DataError(
            f"{_where(path)}: year(s) {absent} not in the data; available years: {have[0]}..{have[-1]}"
            if have
            else f"{_where(path)}: no timestamps"
        )
    return ds.sel(time=ds["time"].dt.year.isin(years))
