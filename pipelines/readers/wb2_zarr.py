"""WeatherBench 2 / ARCO-ERA5 analysis-ready zarr stores, through any fsspec URL.

``gs://weatherbench2/datasets/era5/…zarr``, ``memory://…``, ``file://…`` or a local path; extra
arguments for the filesystem go in ``storage_options`` (e.g. ``{"token": "anon"}``; ignored for
plain local paths). Data stay lazy
(dask): only the selection is read later. Returns the canonical Dataset
(time, level, latitude, longitude); ARCO's descending latitude is flipped to ascending.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from pipelines.canonical import canonicalize, select_time, validate
from pipelines.errors import DataError


def open_wb2_zarr(
    url: str,
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
    time: slice | tuple[object, object] | None = None,
    storage_options: dict | None = None,
    allow_missing: bool = False,
) -> xr.Dataset:
    """Open a WB2/ARCO zarr store lazily and select ``variables``, ``levels`` (hPa) and ``time``.

    ``time`` is ``slice(start, stop)`` or ``(start, stop)`` (inclusive, anything pandas parses); a range
    outside the store raises ``DataError``, as do missing variables or levels and missing chunks
    (:func:`check_chunks`; ``allow_missing``: chunks that read as NaN are missing values, not an error). NaN
    checks are left to the caller (``validate``) because they would read the whole selection.
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
    check_chunks(ds, url, variables, storage_options, allow_missing)
    ds = canonicalize(ds, source="wb2", provenance={"source_files": url})
    ds = validate(ds, path=url, variables=variables, levels=levels, check_nans=False)
    if time is not None:
        start, stop = (time.start, time.stop) if isinstance(time, slice) else time
        ds = select_time(ds, start, stop, path=url)
    return ds


def _missing_key(store: str, name: str, array: zarr.Array) -> str | None:
    """The first chunk file of ``array`` absent from a LOCAL zarr v2 ``store`` (None elsewhere or when none)."""
    root = Path(store) / name
    if "://" in store or not root.is_dir() or array.metadata.zarr_format != 2:
        return None
    sep = getattr(array.metadata, "dimension_separator", ".") or "."
    grid = [range(-(-s // c)) for s, c in zip(array.shape, array.chunks)]
    for index in itertools.product(*grid):
        key = sep.join(map(str, index)) if index else "0"
        if not (root / key).exists():
            return f"{name}/{key}"
    return None


def check_chunks(ds: xr.Dataset, store: str, variables: Sequence[str] | None = None,
                 storage_options: dict | None = None, allow_missing: bool = False) -> xr.Dataset:
    """``ds`` (opened from the zarr ``store``) unchanged, or DataError naming the store, the variable and the
    number of chunks missing: zarr reads a missing chunk as its fill value (NaN, or 0), so a damaged or
    partly copied store would otherwise pass as data (zarr also leaves out chunks holding only the fill value:
    an all-NaN chunk is missing data either way). ``allow_missing``: chunks of a NaN fill value are missing
    values (the NaN count records them), not an error. Checks ``variables`` (default every data variable);
    lists the chunk keys of each array (cheap, no chunk is read)."""
    try:
        group = zarr.open_group(store, mode="r", storage_options=storage_options if "://" in store else None)
    except Exception:  # noqa: BLE001 - not openable as a plain group (e.g. a consolidated-only view): nothing to list
        return ds
    for name in [str(v) for v in (variables or ds.data_vars) if v in ds.data_vars]:
        try:
            array = group[name]
        except KeyError:
            continue
        if not isinstance(array, zarr.Array):
            continue
        have, want = array.nchunks_initialized, array.nchunks
        nan_fill = array.fill_value is not None and np.isnan(array.fill_value)
        if have < want and not (allow_missing and nan_fill):
            key = _missing_key(store, name, array)
            raise DataError(
                f"{store}: variable {name!r} lacks {want - have} of its {want} chunks"
                + (f" (first missing: {key})" if key else "")
                + f"; zarr reads them as its fill value {array.fill_value} (a chunk file lost, or never written "
                "because all its values were missing). Expected a complete store: copy or download it again"
                + (", or pass --allow-missing to keep them as NaN" if nan_fill else "")
            )
    return ds
