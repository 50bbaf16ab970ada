"""Regions for area-mean scores (pure xarray): WeatherBench 2's predefined boxes, land and sea, own boxes and
mask files, turned into one ``(region, latitude, longitude)`` array of area weights.

A region is a set of latitude bands, an optional set of longitude bands and a surface (``all``, ``land`` or
``sea``). Its weights are the latitude weights cos φ / mean cos φ times the box indicator (bands inclusive at
both ends, as WeatherBench 2 slices them) times the land fraction (land), 1 − land fraction (sea) or 1 (all).
Like WB2's ``LandRegion``, land weights each point by the ``land_sea_mask`` FRACTION unless a threshold is
given, then by ``land_sea_mask > threshold``; sea is the complement, so land and sea weights add up to the
global ones. A weighted area mean with these weights equals WB2's ``SliceRegion``/``LandRegion`` means (a slice
keeps the latitude weights of its rows, which is the indicator times the global weights up to a constant).

Region specifications (``smoe evaluate --regions``): a predefined name (:data:`WB2_REGIONS`, plus ``land`` and
``sea`` for the whole globe), ``NAME_land`` / ``NAME_sea`` for the land or sea part of a predefined region,
``wb2`` (WB2's whole list), ``default`` (global, land, sea), a box ``NAME=LAT0:LAT1,LON0:LON1`` (degrees; a
longitude band may cross the date line or 0°, e.g. ``-12.5:42.5``), or a mask file ``NAME=PATH`` (a netCDF
with one ``(latitude, longitude)`` variable of weights in [0, 1] on the evaluation grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xarray as xr

from smoeweather.metrics.weights import cell_area_weights

Band = tuple[float, float]
SURFACES = ("all", "land", "sea")
_TOL = 1e-9  # degrees: grid coordinates stored as float32 still fall inside a band they sit on


@dataclass(frozen=True)
class Region:
    """One region: latitude bands (inclusive), longitude bands (None: all longitudes; a band ``(lo, hi)``
    with lo > hi, or given in −180…180, wraps through 0°) and the surface it keeps; or a mask (weights in
    [0, 1] on the evaluation grid, from a file) instead of bands."""

    name: str
    lat: tuple[Band, ...] = ((-90.0, 90.0),)
    lon: tuple[Band, ...] | None = None
    surface: str = "all"
    mask_file: str | None = None

    def __post_init__(self) -> None:
        if self.surface not in SURFACES:
            raise ValueError(f"region {self.name!r}: surface must be one of {SURFACES}, got {self.surface!r}")


# WeatherBench 2's predefined regions (scripts/evaluate.py): SliceRegions with inclusive slices
_ET = ((-90.0, -20.0), (20.0, 90.0))
WB2_REGIONS: dict[str, Region] = {
    "global": Region("global"),
    "tropics": Region("tropics", ((-20.0, 20.0),)),
    "extra-tropics": Region("extra-tropics", _ET),
    "northern-hemisphere": Region("northern-hemisphere", ((20.0, 90.0),)),
    "southern-hemisphere": Region("southern-hemisphere", ((-90.0, -20.0),)),
    "europe": Region("europe", ((35.0, 75.0),), ((-12.5, 42.5),)),
    "north-america": Region("north-america", ((25.0, 60.0),), ((240.0, 285.0),)),
    "north-atlantic": Region("north-atlantic", ((25.0, 65.0),), ((290.0, 350.0),)),
    "north-pacific": Region("north-pacific", ((25.0, 60.0),), ((145.0, 230.0),)),
    "east-asia": Region("east-asia", ((25.0, 60.0),), ((102.5, 150.0),)),
    "ausnz": Region("ausnz", ((-45.0, -12.5),), ((120.0, 175.0),)),
    "arctic": Region("arctic", ((60.0, 90.0),)),
    "antarctic": Region("antarctic", ((-90.0, -60.0),)),
    "global_land": Region("global_land", surface="land"),
    "extra-tropics_land": Region("extra-tropics_land", _ET, surface="land"),
    "tropics_land": Region("tropics_land", ((-20.0, 20.0),), surface="land"),
}
"""WB2's list, names as WB2 writes them (the northern and southern extra-tropics are its
``northern-hemisphere`` and ``southern-hemisphere``, |φ| ≥ 20°)."""
ALIASES: dict[str, Region] = {"land": Region("land", surface="land"), "sea": Region("sea", surface="sea")}
DEFAULT_REGIONS: tuple[str, ...] = ("global", "land", "sea")
GROUPS: dict[str, tuple[str, ...]] = {"default": DEFAULT_REGIONS, "wb2": tuple(WB2_REGIONS)}


def _choices() -> str:
    return (f"{', '.join([*GROUPS, *WB2_REGIONS, *ALIASES])}, NAME_land / NAME_sea of a predefined region, "
            "NAME=LAT0:LAT1,LON0:LON1 (a box) or NAME=PATH (a mask file)")


def _band(text: str, what: str, spec: str) -> Band:
    try:
        lo, hi = (float(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"--regions {spec!r}: {what} band must be LO:HI in degrees, got {text!r}") from None
    return lo, hi


def parse_region(spec: str) -> Region:
    """One region from its specification (see the module docstring); ValueError naming ``--regions`` and the
    valid choices for anything else."""
    spec = spec.strip()
    if "=" in spec:
        name, value = (s.strip() for s in spec.split("=", 1))
        if not name or not value:
            raise ValueError(f"--regions {spec!r}: expected NAME=LAT0:LAT1,LON0:LON1 or NAME=PATH")
        if Path(value).suffix in (".nc", ".nc4", ".netcdf") or Path(value).is_file():
            if not Path(value).is_file():
                raise ValueError(f"--regions {spec!r}: mask file {value} does not exist")
            return Region(name, mask_file=str(value))
        parts = value.split(",")
        if len(parts) not in (1, 2):
            raise ValueError(f"--regions {spec!r}: a box is NAME=LAT0:LAT1,LON0:LON1 (longitudes optional)")
        lat = _band(parts[0], "latitude", spec)
        if not (-90.0 <= min(lat) and max(lat) <= 90.0 and lat[0] <= lat[1]):
            raise ValueError(f"--regions {spec!r}: latitudes must satisfy -90 <= LAT0 <= LAT1 <= 90")
        lon = (_band(parts[1], "longitude", spec),) if len(parts) == 2 else None
        if lon and not all(-180.0 <= v <= 360.0 for v in lon[0]):
            raise ValueError(f"--regions {spec!r}: longitudes must lie in -180 … 360")
        return Region(name, (lat,), lon)
    if spec in WB2_REGIONS:
        return WB2_REGIONS[spec]
    if spec in ALIASES:
        return ALIASES[spec]
    for surface in ("land", "sea"):
        base = spec.removesuffix(f"_{surface}")
        if base != spec and base in WB2_REGIONS and WB2_REGIONS[base].surface == "all":
            return replace(WB2_REGIONS[base], name=spec, surface=surface)
    raise ValueError(f"--regions: unknown region {spec!r}; valid: {_choices()}")


def parse_regions(specs: Sequence[str] | str | None) -> list[Region]:
    """Regions of a list of specifications (groups ``default`` and ``wb2`` expanded, duplicates dropped in
    order); None or empty: :data:`DEFAULT_REGIONS`."""
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        specs = ["default"]
    out: dict[str, Region] = {}
    for spec in specs:
        for s in GROUPS.get(spec.strip(), (spec,)):
            r = parse_region(s)
            if r.name in out and out[r.name] != r:
                raise ValueError(f"--regions: two different regions are named {r.name!r}")
            out[r.name] = r
    return list(out.values())


def _in_lon_band(lon: np.ndarray, band: Band) -> np.ndarray:
    lo, hi = band
    if hi - lo >= 360.0:
        return np.ones(lon.shape, bool)
    width = (hi - lo) % 360.0  # a band with lo > hi (e.g. 350:10) wraps through 0°
    return (lon - lo + _TOL) % 360.0 <= width + 2 * _TOL


def _mask_from_file(region: Region, latitude: np.ndarray, longitude: np.ndarray) -> np.ndarray:
    path = region.mask_file
    try:
        ds = xr.open_dataset(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"--regions {region.name}={path}: not a readable netCDF mask file "
                         f"({type(err).__name__}); give a netCDF with one (latitude, longitude) variable") from None
    with ds:
        cands = [v for v in ds.data_vars if {"latitude", "longitude"} <= set(ds[v].dims)]
        if len(cands) != 1:
            raise ValueError(f"--regions {region.name}={path}: the mask file needs exactly one (latitude, longitude) "
                             f"variable, found {cands or list(ds.data_vars)}")
        da = ds[cands[0]].squeeze(drop=True).load()
    if set(da.dims) != {"latitude", "longitude"}:
        raise ValueError(f"--regions {region.name}={path}: mask dims {da.dims}, expected (latitude, longitude)")
    # longitudes normalised to [0, 360) as every other input of the command (-180..180 masks are common)
    da = da.assign_coords(longitude=np.mod(da["longitude"].values, 360.0)).sortby("longitude")
    try:
        da = da.sel(latitude=latitude, longitude=np.mod(longitude, 360.0), method="nearest", tolerance=1e-3)
    except KeyError:
        raise ValueError(f"--regions {region.name}={path}: the mask's grid is not the evaluation grid") from None
    values = da.transpose("latitude", "longitude").values.astype(np.float64)
    if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1:
        raise ValueError(f"--regions {region.name}={path}: mask values must be finite and in [0, 1]")
    return values


def land_fraction(land_sea_mask: xr.DataArray, threshold: float | None = None) -> xr.DataArray:
    """Land weight per point: the mask's fraction (WB2 ``LandRegion`` default), or 1/0 above/not above
    ``threshold``; float64 on (latitude, longitude)."""
    lsm = land_sea_mask.squeeze(drop=True).astype(np.float64)
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"--land-threshold must lie in [0, 1], got {threshold}")
        lsm = (lsm > threshold).astype(np.float64)
    return lsm.clip(0.0, 1.0)


def region_weights(regions: Sequence[Region], latitude: xr.DataArray, longitude: xr.DataArray,
                   land_sea_mask: xr.DataArray | None = None, threshold: float | None = None) -> xr.DataArray:
    """Area weights ``(region, latitude, longitude)``, float64: WB2 cell-area weights × box × surface weight.

    ``land_sea_mask`` (latitude, longitude) is needed for land and sea regions (ValueError naming them
    otherwise). A region with no grid point inside gets a ValueError naming it.
    """
    lat = np.asarray(latitude, np.float64)
    lon = np.asarray(longitude, np.float64) % 360.0
    wlat = cell_area_weights(xr.DataArray(lat, dims="latitude")).values
    needs = [r.name for r in regions if r.surface != "all"]
    land = None
    if needs:
        if land_sea_mask is None:
            raise ValueError(f"regions {needs} need a land_sea_mask (in the truth store, or --land-sea-mask)")
        land = land_fraction(land_sea_mask, threshold).transpose("latitude", "longitude").values
        if land.shape != (lat.size, lon.size):
            raise ValueError(f"land_sea_mask shape {land.shape} is not the grid's {(lat.size, lon.size)}")
    out = np.zeros((len(regions), lat.size, lon.size))
    for i, r in enumerate(regions):
        if r.mask_file is not None:
            box = _mask_from_file(r, lat, np.asarray(longitude, np.float64))
        else:
            rows = np.zeros(lat.size, bool)
            for lo, hi in r.lat:
                rows |= (lat >= lo - _TOL) & (lat <= hi + _TOL)
            cols = np.ones(lon.size, bool) if r.lon is None else np.zeros(lon.size, bool)
            for band in r.lon or ():
                cols |= _in_lon_band(lon, band)
            box = rows[:, None] & cols[None, :]
        surface = 1.0 if r.surface == "all" else (land if r.surface == "land" else 1.0 - land)
        out[i] = wlat[:, None] * box * surface
        if not out[i].any():
            raise ValueError(f"region {r.name!r} holds no grid point of weight > 0 on this grid")
    return xr.DataArray(out, dims=("region", "latitude", "longitude"),
                        coords={"region": [r.name for r in regions], "latitude": np.asarray(latitude),
                                "longitude": np.asarray(longitude)},
                        attrs={"long_name": "area weight of each region (WB2 cell-area weight x box x surface)",
                               "units": "1"})


def describe_regions(regions: Sequence[Region], threshold: float | None = None) -> dict[str, str]:
    """{name: one-line definition}, for the score file's attributes."""
    out = {}
    for r in regions:
        if r.mask_file is not None:
            out[r.name] = f"mask file {Path(r.mask_file).name}"
            continue
        lat = " or ".join(f"{lo:g}..{hi:g}N" for lo, hi in r.lat)
        lon = "all longitudes" if r.lon is None else " or ".join(f"{lo:g}..{hi:g}E" for lo, hi in r.lon)
        land = {"all": "", "land": ", land (land_sea_mask " + ("fraction)" if threshold is None else
                                                                f"> {threshold:g})"),
                "sea": ", sea (1 - land)"}[r.surface]
        out[r.name] = f"lat {lat}, {lon}{land}"
    return out


__all__ = ["ALIASES", "DEFAULT_REGIONS", "Region", "WB2_REGIONS", "describe_regions", "land_fraction",
           "parse_region", "parse_regions", "region_weights"]
