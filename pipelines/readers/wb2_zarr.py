"""WeatherBench 2 / ARCO-ERA5 analysis-ready zarr stores, through any fsspec URL.

``gs://weatherbench2/datasets/era5/…zarr``, ``memory://…``, ``file://…`` or a local path; extra
arguments for the filesystem go in ``storage_options`` (e.g. ``{"token": "anon"}``; ignored for
plain local paths). Data stay lazy
(dask): only the selection is read later. Returns the canonical Dataset
(time, level, latitude, longitude); ARCO's descending latitude is flipped to ascending.
"""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from pipelines.canonical import canonicalize, select_time, validate
from pipelines.errors import DataError


def open_wb2_zarr(
    url: str,
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
    time: slice | tuple[object, object] | None = None,
    storage_options: dict | None = None,
) -> xr.Dataset:
    """Open a WB2/ARCO zarr store lazily and select ``variables``, ``levels`` (hPa) and ``time``.

    ``time`` is ``slice(start, stop)`` or ``(start, stop)`` (inclusive, anything pandas parses); a
    range outside the store raises ``DataError``, as do missing variables or levels. NaN checks are
    left to the caller (``validate``) because they would read the whole selection.
    """
    if "://" not in str(url):
        storage_options = None  # a plain local path: zarr refuses storage_options there
    try:
        ds = xr.open_zarr(url, storage_options=storage_options, chunks={})
    except Exception as err:  # FileNotFoundError, KeyError, zarr/fsspec errors
        raise DataError(f"{url}: cannot open as a zarr store ({type(err).__name__}: {err})") from err
    if variables is not None:  # select first: ARCO stores hold hundreds of variables
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise DataError(
                f"{url}: missing variable(s) {missing}; available: {sorted(map(str, ds.data_vars))}"
            )
        ds = ds[list(variables)]
    ds = canonicalize(ds, source="wb2", provenance={"source_files": url})
    ds = validate(ds, path=url, variables=variables, levels=levels, check_nans=False)
    if time is not None:
        start, stop = (time.start, time.stop) if isinstance(time, slice) else time
        ds = select_time(ds, start, stop, path=url)
    return ds
