"""Target grids: the WeatherBench equiangular grid and its cell-area weights."""

from __future__ import annotations

import numpy as np
import xarray as xr

from pipelines.canonical import LATITUDE_ATTRS, LONGITUDE_ATTRS


def weatherbench_grid(resolution_deg: float = 5.625) -> xr.Dataset:
    """WeatherBench (v1/v2 equiangular, no poles) grid as a coords-only Dataset.

    Cell centres: latitude ``-90 + d/2 … 90 - d/2`` ascending (degrees north), longitude
    ``0 … 360 - d`` (degrees east). At 5.625° that is 32 latitudes (−87.1875…87.1875) × 64 longitudes
    (0…354.375). Usable directly as the target of ``ds.regrid.conservative(grid)``.
    """
    n_lat = round(180 / resolution_deg)
    n_lon = round(360 / resolution_deg)
    if not np.isclose(n_lat * resolution_deg, 180) or not np.isclose(n_lon * resolution_deg, 360):
        from pipelines.errors import DataError

        raise DataError(f"resolution_deg={resolution_deg} does not divide 180° and 360° evenly")
    lat = -90 + resolution_deg / 2 + resolution_deg * np.arange(n_lat)
    lon = resolution_deg * np.arange(n_lon)
    return xr.Dataset(
        coords={
            "latitude": ("latitude", lat, dict(LATITUDE_ATTRS)),
            "longitude": ("longitude", lon, dict(LONGITUDE_ATTRS)),
        },
        attrs={"grid": f"equiangular {resolution_deg}deg without poles ({n_lat}x{n_lon})"},
    )


def same_grid(ds: xr.Dataset, target: xr.Dataset) -> bool:
    """True when ``ds`` and ``target`` have the same latitude/longitude points."""
    return (
        ds.sizes.get("latitude") == target.sizes["latitude"]
        and ds.sizes.get("longitude") == target.sizes["longitude"]
        and np.allclose(ds["latitude"], target["latitude"])
        and np.allclose(ds["longitude"], target["longitude"])
    )


def regrid(
    ds: xr.Dataset, target: xr.Dataset, method: str = "conservative", what: str = "source"
) -> xr.Dataset:
    """The one regridding of the pipelines: ``ds`` onto ``target``'s latitude/longitude (xarray-regrid).

    ``method``: "conservative" (area-weighted, for fluxes and means) or "bilinear". Unchanged when the
    grids already agree. Conservative regridding raises DataError (naming ``what``) when the source
    does not cover every target cell (a regional field onto a global grid). Attributes, dims order and
    provenance (``attrs["regridding"]``) are kept.
    """
    from pipelines.errors import DataError

    target = target[["latitude", "longitude"]] if isinstance(target, xr.Dataset) else target
    if method not in ("conservative", "bilinear"):
        raise DataError(f"regrid method '{method}' is not known; expected 'conservative' or 'bilinear'")
    if same_grid(ds, target):
        return ds
    import xarray_regrid  # noqa: F401 - registers the .regrid accessor

    if method == "conservative":
        ones = xr.DataArray(
            np.ones((ds.sizes["latitude"], ds.sizes["longitude"])),
            coords={"latitude": ds["latitude"], "longitude": ds["longitude"]},
            dims=("latitude", "longitude"),
        )
        cover = ones.regrid.conservative(target, latitude_coord="latitude", skipna=False)
        uncovered = int(cover.isnull().sum())
        if uncovered:
            lat, lon = ds["latitude"].values, ds["longitude"].values
            raise DataError(
                f"{what}: grid ({lat.size}x{lon.size}, latitude {lat.min():g}..{lat.max():g}, longitude "
                f"{lon.min():g}..{lon.max():g}) does not cover {uncovered} of {cover.size} cells of the "
                f"{target.sizes['latitude']}x{target.sizes['longitude']} target grid; expected a global "
                "field, or pass --native-grid (grid=None) to keep the source grid"
            )
        out = ds.regrid.conservative(target, latitude_coord="latitude", skipna=False)
    else:
        out = ds.regrid.linear(target)
    for name in ds.data_vars:
        out[name] = out[name].transpose(*ds[name].dims).assign_attrs(ds[name].attrs)
    out["latitude"].attrs, out["longitude"].attrs = ds["latitude"].attrs, ds["longitude"].attrs
    out.attrs = {
        **ds.attrs,
        "regridding": f"xarray-regrid {method} to {target.sizes['latitude']}x{target.sizes['longitude']}",
    }
    return out
