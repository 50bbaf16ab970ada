"""ENS-10 (Ashkboos et al. 2022): ECMWF 10-member hindcasts, twice weekly 1998–2017, 0.5°.

Published files are GRIB, one per hindcast day-of-year and level type, e.g. ``output.pl.20180102``
(pressure levels: z, t, q, w, d, u, v at 11 levels) and ``output.sfc.20180102`` (surface: sst, tcw,
tcwv, cp, msl, tcc, u10, v10, t2m, tp, skt), each holding the 20 hindcast years × 10 members
(``number``) × steps 0, 24, 48 h. They are read with cfgrib like CDS GRIB (same parameter ids).

``open_ens10`` returns the forecast at one lead (48 h by default) with dims
(time = initialisation, member, [level], latitude, longitude), scalar ``prediction_timedelta`` and a
``valid_time`` coord (= time + lead). With ``truth`` (a canonical ERA5 Dataset on the same grid) the
verifying analysis is added as ``<name>_truth`` variables on the same ``time`` axis, i.e.
``truth[name].sel(time=valid_time)`` relabelled to the initialisation time, so forecast and truth at
one index always describe the same valid time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.canonical import validate
from pipelines.errors import DataError
from pipelines.readers._files import PathLike, resolve_sources
from pipelines.readers.cds import open_cds_file

TRUTH_SUFFIX = "_truth"
ENS10_MEMBERS = 10


def _open_forecast(files: list, lead: np.timedelta64) -> xr.Dataset:
    parts = []
    for path in files:
        ds = open_cds_file(path, source="ens10")
        if "prediction_timedelta" not in ds.dims:
            raise DataError(f"{path}: no forecast steps ('step'); expected ENS-10 steps 0/24/48 h")
        steps = ds.indexes["prediction_timedelta"]
        if lead not in steps:
            raise DataError(
                f"{path}: lead time {pd.Timedelta(lead)} not in file; available: "
                f"{[str(pd.Timedelta(s)) for s in steps]}"
            )
        parts.append(ds.sel(prediction_timedelta=lead))
    try:  # pressure-level and surface files of the same dates side by side; further dates along time
        ds = xr.combine_by_coords(
            parts, compat="no_conflicts", join="outer", combine_attrs="drop_conflicts", data_vars="all"
        )
    except ValueError as err:
        raise DataError(
            f"ENS-10 files {[str(f) for f in files]} cannot be combined ({err}); expected "
            "the same grid and members in all files"
        ) from err
    return ds


def _select_members(ds: xr.Dataset, members: int, where: str) -> xr.Dataset:
    if "member" not in ds.dims:
        raise DataError(f"{where}: no ensemble dimension ('number'); expected {ENS10_MEMBERS} members")
    if ds.sizes["member"] < members:
        raise DataError(f"{where}: {ds.sizes['member']} members in the files; expected at least {members}")
    return ds.isel(member=slice(0, members))


def add_truth(ds: xr.Dataset, truth: xr.Dataset, where: str) -> xr.Dataset:
    """Add ``truth[name]`` at each valid time as ``<name>_truth`` (truth must be on the forecast grid)."""
    for dim in ("latitude", "longitude"):
        a, b = ds[dim].values, truth[dim].values if dim in truth.dims else np.array([])
        if a.shape != b.shape or not np.allclose(a, b):
            raise DataError(
                f"truth grid does not match the ENS-10 forecast grid in {dim} "
                f"({b.size} vs {a.size} points); expected truth on the forecast grid"
            )
    valid = ds["valid_time"].values
    missing_times = pd.DatetimeIndex(valid).difference(truth.indexes["time"])
    if len(missing_times):
        raise DataError(
            f"truth lacks {len(missing_times)} valid time(s) of {where}, first "
            f"{[str(t) for t in missing_times[:3]]}; expected truth at init + lead"
        )
    for name in ds.data_vars:
        if name not in truth.data_vars:
            raise DataError(
                f"truth has no variable '{name}' to verify {where}; "
                f"available: {sorted(map(str, truth.data_vars))}"
            )
        verifying = truth[name].sel(time=valid)
        if "level" in ds[name].dims:
            verifying = verifying.sel(level=ds["level"].values)
        ds[f"{name}{TRUTH_SUFFIX}"] = verifying.assign_coords(time=ds["time"].values)
    return ds


def open_ens10(
    paths: PathLike | Sequence[PathLike],
    members: int = 10,
    truth: xr.Dataset | None = None,
    lead_hours: int = 48,
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
) -> xr.Dataset:
    """Read ENS-10 GRIB file(s) at ``lead_hours``; first ``members`` (5 or 10); optional truth.

    ``variables`` (canonical names) and ``levels`` (hPa) are checked and selected.
    """
    if members not in (5, 10):
        raise DataError(f"members={members} is not supported; expected 5 or 10 (ENS-10 setups)")
    files = resolve_sources(paths)
    where = str(files[0]) if len(files) == 1 else f"{files[0].parent}/{{{', '.join(f.name for f in files)}}}"
    lead = np.timedelta64(int(lead_hours), "h").astype("timedelta64[ns]")
    ds = _open_forecast(files, lead)
    ds = validate(ds, path=where, variables=variables, levels=levels)
    ds = _select_members(ds, members, where)
    ds = ds.assign_coords(valid_time=("time", ds["time"].values + lead))
    if truth is not None:
        ds = add_truth(ds, truth, where)
    ds.attrs.update(
        source_format="ens10",
        source_files=", ".join(map(str, files)),
        lead_time=f"{lead_hours} h",
        ensemble_size=str(members),
    )
    return ds
