"""Readers: every source format → the canonical Dataset (see ``pipelines.canonical``).

``open_source(kind, source, **kwargs)`` dispatches on ``kind``:

=============== ===================================================== =========================
kind            ``source``                                            reader
=============== ===================================================== =========================
"weatherbench"  root folder of one resolution (WeatherBench v1)        ``open_weatherbench``
"wb2"           zarr URL or path (WeatherBench 2 / ARCO-ERA5)          ``open_wb2_zarr``
"cds"           GRIB/netCDF path(s) from the Climate Data Store        ``open_cds``
"cmip6"         CMOR netCDF path(s)                                    ``open_cmip6``
"ens10"         ENS-10 GRIB path(s)                                    ``open_ens10``
=============== ===================================================== =========================
"""

from __future__ import annotations

from collections.abc import Callable

import xarray as xr

from pipelines.errors import DataError
from pipelines.readers.cds import open_cds
from pipelines.readers.cmip6 import open_cmip6
from pipelines.readers.ens10 import open_ens10
from pipelines.readers.wb2_zarr import open_wb2_zarr
from pipelines.readers.weatherbench import open_weatherbench

READERS: dict[str, Callable[..., xr.Dataset]] = {
    "weatherbench": open_weatherbench,
    "wb2": open_wb2_zarr,
    "cds": open_cds,
    "cmip6": open_cmip6,
    "ens10": open_ens10,
}


def open_source(kind: str, source: object, **kwargs: object) -> xr.Dataset:
    """Open ``source`` with the reader for ``kind``; ``kwargs`` go to that reader."""
    reader = READERS.get(kind)
    if reader is None:
        raise DataError(f"unknown source kind '{kind}'; expected one of {sorted(READERS)}")
    return reader(source, **kwargs)


__all__ = [
    "READERS",
    "open_cds",
    "open_cmip6",
    "open_ens10",
    "open_source",
    "open_wb2_zarr",
    "open_weatherbench",
]
