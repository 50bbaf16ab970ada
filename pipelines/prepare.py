"""``smoe data prepare``: raw source → analysis-ready, time-chunked, consolidated zarr + statistics.

Store layout (zarr format 2, consolidated metadata at the root):

- root: the canonical Dataset (dims ``time, [member], [level], latitude, longitude``; latitude ascending,
  longitude [0, 360), level hPa; units in attrs), chunked along ``time`` only;
  ``xr.open_zarr(store)`` opens it.
- group ``statistics``: the Dataset of :func:`pipelines.statistics.compute_statistics` over the training
  years (dim ``statistic`` = mean/std/diff_std); ``xr.open_zarr(store, group="statistics")`` opens it.
- root attrs: provenance — ``source``, ``prepare_args`` (JSON; used for the idempotency check),
  ``source_fingerprint`` (JSON: size + content hash or mtime of every source file; a changed source is
  never "up to date"), ``code_version``, ``written_utc``; ``nan_filled`` when ``fill_policy`` filled NaNs.

Writes are atomic (a temporary sibling is renamed onto the target only after everything, statistics and
consolidated metadata included, has been written; ``--overwrite`` renames the old store aside first and
deletes it last) and stream chunk by chunk with dask. NaNs are counted per variable and level in the
same pass that writes (bounded memory); with ``fill_policy="error"`` any NaN aborts and nothing is left.
Variables holding data on only some levels are stored per level as ``<name>_<level>``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr
import zarr

from pipelines.atomic import atomic_path
from pipelines.compute import compute, dask_client
from pipelines.errors import DataError
from pipelines.grids import regrid, same_grid, weatherbench_grid
from pipelines.plausibility import check_plausible
from pipelines.provenance import code_version
from pipelines.readers._files import resolve_sources
from pipelines.statistics import compute_statistics, select_years

# cfgrib (0.9.15) combines the variables of a GRIB file with ``xr.merge`` without an explicit ``compat``;
# xarray (2025.08+) then warns on every GRIB read that the default ``compat`` will change. The warning is
# about cfgrib's own call, not the data (the readers merge with explicit arguments and the tests pin the
# values), so it is silenced for cfgrib's module only; every other FutureWarning still shows.
warnings.filterwarnings(
    "ignore",
    message="In a future version of xarray the default value for compat will change",
    category=FutureWarning,
    module="cfgrib",
)

KINDS = ("era5", "cmip6", "ens10", "world")
ERA5_FORMATS = ("weatherbench", "wb2", "cds")
ARGS_ATTR = "prepare_args"


def stored_args(store: str | Path) -> dict[str, Any] | None:
    """The ``prepare_args`` recorded in an existing store, or None."""
    try:
        attrs = zarr.open_group(str(store), mode="r").attrs
    except Exception:  # noqa: BLE001 - anything unreadable is "not ours"
        return None
    raw = attrs.get(ARGS_ATTR)
    return json.loads(raw) if isinstance(raw, str) else None


def dask_time_chunk(ds: xr.Dataset, time_chunk: int, target_bytes: float = 16e6) -> int:
    """Time steps per dask task: a multiple of the zarr ``time_chunk`` with ≈ ``target_bytes`` per task."""
    per_step = sum(
        v.dtype.itemsize * v.size / v.sizes["time"] for v in ds.data_vars.values() if "time" in v.dims
    )
    per_step = max(per_step / max(len(ds.data_vars), 1), 1.0)  # one variable's bytes per step
    return time_chunk * max(1, int(target_bytes // (per_step * time_chunk)))


FINGERPRINT_ATTR = "source_fingerprint"
HASH_BELOW_BYTES = 1 << 20  # files smaller than this are fingerprinted by content, larger by size + mtime


def _fingerprint_files(paths: Sequence[Path]) -> dict[str, Any]:
    entries = []
    for p in sorted(paths):
        st = p.stat()
        if st.st_size < HASH_BELOW_BYTES:
            entries.append([str(p), st.st_size, "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()])
        else:
            entries.append([str(p), st.st_size, f"mtime_ns:{st.st_mtime_ns}"])
    return {"files": len(entries), "sha256": hashlib.sha256(json.dumps(entries).encode()).hexdigest()}


def source_fingerprint(source: Source) -> dict[str, Any] | None:
    """Fingerprint of every local file under ``source`` (files, globs, folders, zarr stores): per file its
    size plus its content hash (files < 1 MiB) or its modification time. None for remote URLs, which
    cannot be fingerprinted cheaply (a changed remote source is not detected)."""
    items = [source] if isinstance(source, str | Path) else list(source)
    if any("://" in str(s) for s in items):
        return None
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            paths.extend(p for p in path.rglob("*") if p.is_file())
        else:
            paths.extend(resolve_sources(item))
    return _fingerprint_files(paths)


def store_mismatch(store: str | Path, args: dict[str, Any], fingerprint: dict[str, Any] | None,
                   compare_source: bool = True) -> str | None:
    """Why the existing ``store`` is not what ``args`` and the source ``fingerprint`` would make: "arguments"
    (other arguments, or not written by smoe), "source" (the source changed since it was written; checked only
    when ``compare_source``) or None (up to date)."""
    if stored_args(store) != json.loads(json.dumps(args)):
        return "arguments"
    if compare_source and stored_fingerprint(store) != json.loads(json.dumps(fingerprint)):
        return "source"
    return None


def stored_fingerprint(store: str | Path) -> Any:
    """The source fingerprint recorded in an existing store (None when it has none)."""
    try:
        raw = zarr.open_group(str(store), mode="r").attrs.get(FINGERPRINT_ATTR)
    except Exception:  # noqa: BLE001 - unreadable: no fingerprint
        return None
    return json.loads(raw) if isinstance(raw, str) else None


def _level_label(level: Any) -> str:
    f = float(level)
    return f"{int(f)}" if f.is_integer() else f"{f:g}"


def _named_pairs(ds: xr.Dataset, names: Sequence[str] | None, levels: Sequence[float] | None,
                 absent: dict[str, list[int]], where: str) -> None:
    """DataError when a variable holds no data at any level, a level named in ``--levels`` holds none in any
    variable, or a named variable holds none at a named level (``absent``: per variable the level indices that
    are all-NaN over every time step): named fields are never dropped, and no variable vanishes."""
    leveled = [n for n, v in ds.data_vars.items() if "level" in v.dims]
    values = ds["level"].values
    for name, lost in absent.items():
        if len(lost) == ds[name].sizes["level"]:
            named = " named in --variables" if name in (names or ()) else ""
            raise DataError(f"{where}: variable {name!r}{named} holds no data (NaN at every level and time step); "
                            "expected values, or name the other variables with --variables")
    for name in names or ():
        lost = absent.get(name, [])
        if levels and lost:
            shown = ", ".join(_level_label(values[i]) for i in lost)
            raise DataError(f"{where}: {name!r} at {shown} hPa (named in --variables and --levels) holds no data "
                            "(NaN at every time step); expected values, or leave that level out of --levels")
    for i, level in enumerate(values if levels else ()):
        if all(i in absent.get(n, []) for n in leveled):
            raise DataError(f"{where}: level {_level_label(level)} hPa named in --levels holds no data in any "
                            "variable (NaN at every time step); expected values, or leave it out of --levels")


def _absent_levels(ds: xr.Dataset, leveled: list[str]) -> dict[str, list[int]]:
    """Per leveled variable the level indices that hold no data at ANY time step: candidates from the first
    time step (cheap), each confirmed over the whole selection (reads only those fields)."""
    first = ds[leveled].isel(time=0) if "time" in ds.dims else ds[leveled]
    present = {n: first[n].notnull().any([d for d in first[n].dims if d != "level"]) for n in leveled}
    present = dict(zip(present, dask.compute(*present.values())))
    candidates = [(n, int(i)) for n in leveled for i in np.flatnonzero(~present[n].values)]
    if not candidates:
        return {}
    anywhere = dask.compute(*[ds[n].isel(level=i).notnull().any() for n, i in candidates])
    out: dict[str, list[int]] = {}
    for (name, i), has_data in zip(candidates, anywhere):
        if not bool(has_data):
            out.setdefault(name, []).append(i)
    return out


def split_partial_levels(ds: xr.Dataset, where: str, variables: Sequence[str] | None = None,
                         levels: Sequence[float] | None = None) -> xr.Dataset:
    """Keep only real fields: a variable that holds data on only some levels of the shared ``level`` axis
    (merged sources, e.g. ``z500`` + ``t850`` in one netCDF) is stored as one 2-D variable per present level,
    ``<name>_<level>`` (attrs ``canonical_name``, ``level``), instead of all-NaN ``<name>@<other level>``.

    A level is absent only when it holds no value at ANY time step (candidates found on the first time step,
    then confirmed over the whole selection); a field with data at some times is kept whole, and the NaN count
    while writing refuses or records it. A variable named in ``variables`` or a level named in ``levels``
    (the command line) that holds no data is refused (DataError), never dropped.
    """
    leveled = [n for n, v in ds.data_vars.items() if "level" in v.dims]
    if not leveled:
        return ds
    absent = _absent_levels(ds, leveled)
    _named_pairs(ds, variables, levels, absent, where)
    if len(leveled) < 2 or not absent:
        return ds
    partial = list(absent)
    out = ds.drop_vars(partial)
    for name in partial:
        da = ds[name]
        for i in range(da.sizes["level"]):
            if i in absent[name]:
                continue
            level = da["level"].values[i]
            flat = f"{name}_{_level_label(level)}"
            if flat in ds.variables:
                raise DataError(f"{where}: variable {flat!r} exists and also as {name!r} at {level} hPa")
            attrs = {**da.attrs, "canonical_name": str(name), "level": float(level), "level_units": "hPa"}
            out[flat] = da.isel(level=i, drop=True).assign_attrs(attrs)
    if not any("level" in v.dims for v in out.data_vars.values()):
        out = out.drop_vars("level")
    out.attrs["partial_levels"] = (
        f"variables {partial} hold data on only some levels; stored per level as <name>_<level>"
    )
    return out


def _nan_count_graph(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """Lazy counts of non-finite values (NaN and ±inf) per floating variable (per ``level`` where present),
    and of ±inf alone under ``<name>/inf``."""
    out = {}
    for name, da in ds.data_vars.items():
        if np.issubdtype(da.dtype, np.floating):
            dims = [d for d in da.dims if d != "level"]
            out[str(name)] = (~np.isfinite(da)).sum(dims)
            out[f"{name}/inf"] = np.isinf(da).sum(dims)
    return out


def _nan_report(counts: dict[str, xr.DataArray], ds: xr.Dataset) -> str:
    """'temperature' @850 hPa: 12 of 2048 values (2 ±inf), ... (only the fields with NaN or ±inf)."""
    parts = []
    for name, count in counts.items():
        if name.endswith("/inf"):
            continue
        inf = counts[f"{name}/inf"]
        per_field = ds[name].size // max(int(count.size), 1)
        if "level" in count.dims:
            for level, c, n_inf in zip(count["level"].values, count.values, inf.values):
                if int(c):
                    parts.append(f"'{name}' @{_level_label(level)} hPa: {int(c)} of {per_field} values"
                                 + (f" ({int(n_inf)} ±inf)" if int(n_inf) else ""))
        elif int(count):
            parts.append(f"'{name}': {int(count)} of {per_field} values" + (f" ({int(inf)} ±inf)" if int(inf) else ""))
    return ", ".join(parts)


def _refuse_empty(counts: dict[str, xr.DataArray], ds: xr.Dataset, where: str) -> None:
    """DataError naming every field (variable, level) without a single finite value."""
    empty = []
    for name, count in counts.items():
        if name.endswith("/inf"):
            continue
        per_field = ds[name].size // max(int(count.size), 1)
        if "level" in count.dims:
            empty += [f"{name!r} at {_level_label(lv)} hPa" for lv, c in zip(count["level"].values, count.values)
                      if per_field and int(c) == per_field]
        elif per_field and int(count) == per_field:
            empty.append(repr(name))
    if empty:
        raise DataError(f"{where}: {', '.join(empty)} hold(s) no finite value (NaN or ±inf at every time step); "
                        "expected data, or leave the field out with --variables/--levels")


def _record_counts(counts: dict[str, xr.DataArray], ds: xr.Dataset, source: str, out: Path, tmp: Path,
                   fill_policy: str, allow_missing: bool) -> None:
    """Judge the non-finite counts of the write pass: DataError for an empty field, or for any NaN/±inf with
    ``fill_policy`` "error" and not ``allow_missing``; else the counts recorded in the store ``tmp``'s attrs
    (``missing_values`` when kept as NaN, ``nan_filled`` when filled)."""
    _refuse_empty(counts, ds, source)
    report = _nan_report(counts, ds)
    if report and fill_policy == "error" and not allow_missing:
        raise DataError(
            f"{source}: NaN or ±inf values found ({report}); nothing was written to {out}. Expected none, or "
            "pass --fill-policy nearest (SST-style land gaps), mean or zero, or --allow-missing to keep them as NaN"
        )
    if report:
        kept = fill_policy == "error"  # --allow-missing: stored as NaN
        key, text = ("missing_values", report) if kept else ("nan_filled", f"{fill_policy}: {report}")
        zarr.open_group(str(tmp), mode="r+", zarr_format=2).attrs[key] = text


def write_store(
    make_dataset: Callable[[], xr.Dataset],
    out: str | Path,
    *,
    args: dict[str, Any],
    train_years: tuple[int, int] | None,
    source: str,
    time_chunk: int = 4,
    overwrite: bool = False,
    scheduler: str | None = None,
    progress: bool = True,
    fill_policy: str = "error",
    fingerprint: dict[str, Any] | None = None,
    allow_missing: bool = False,
    plausibility_check: bool = True,
    named: tuple[Sequence[str] | None, Sequence[float] | None] = (None, None),
) -> Path:
    """Write ``make_dataset()`` (a lazy canonical Dataset) to ``out`` with statistics, atomically.

    Before writing, a sample of the values is checked against the plausibility ranges of the known variables
    (``pipelines.plausibility``; ``plausibility_check=False`` skips it). Non-finite values (NaN and ±inf) are
    counted over every time step, chunk by chunk, in the same pass that writes the data (bounded memory): with
    ``fill_policy="error"`` any raises DataError with the counts per variable and level and nothing is written,
    unless ``allow_missing`` (then ±inf are stored as NaN and the counts recorded in ``attrs["missing_values"]``);
    "zero", "mean", "nearest" fill them (see ``pipelines.canonical.fill_nans``) and record the counts in
    ``attrs["nan_filled"]``; a field without one finite value is always refused. ``split_partial_levels`` splits
    variables present on some levels only (``named``: the command line's variables and levels, never dropped).

    Idempotent: when ``out`` exists and records the same ``args`` and source ``fingerprint`` it prints
    "up to date" and returns; other arguments, or a source that changed since, raise FileExistsError
    naming the path, unless ``overwrite``.
    """
    from pipelines.canonical import FILL_POLICIES, fill_nans

    out = Path(out)
    if fill_policy not in FILL_POLICIES:
        raise DataError(f"fill_policy {fill_policy!r} is not known; expected one of {FILL_POLICIES}")
    args = json.loads(json.dumps(args))  # normalise tuples → lists for the comparison
    fingerprint = json.loads(json.dumps(fingerprint)) if fingerprint is not None else None
    if out.exists() and not overwrite:
        why = store_mismatch(out, args, fingerprint)
        if why is None:
            print(f"{out}: up to date (same arguments and unchanged source; pass --overwrite to rebuild)")
            return out
        if why == "source":
            raise FileExistsError(
                f"{out}: the source {source} changed since this store was written (its fingerprint of file "
                "sizes, contents or modification times differs); pass --overwrite to rebuild it"
            )
        raise FileExistsError(
            f"{out} already exists (written with other arguments or not by smoe); "
            "pass --overwrite to replace it"
        )
    ds = make_dataset()
    if train_years is not None:  # fail before writing anything
        select_years(ds, train_years, "training years")
    ds = split_partial_levels(ds, source, *named)
    check_plausible({source: ds}, plausibility_check)
    steps = dask_time_chunk(ds, time_chunk) if "time" in ds.dims else time_chunk
    ds = ds.chunk({d: (steps if d == "time" else -1) for d in ds.dims})
    for name, var in ds.data_vars.items():  # analysis-ready: plain float32, no CF packing
        if np.issubdtype(var.dtype, np.floating) or var.encoding.get("scale_factor") is not None:
            ds[name] = var.astype(np.float32)
    counts = _nan_count_graph(ds)
    if fill_policy != "error" or allow_missing:  # ±inf are missing values too
        ds = ds.map(lambda v: v.where(np.isfinite(v)) if np.issubdtype(v.dtype, np.floating) else v, keep_attrs=True)
    if fill_policy != "error":
        ds = fill_nans(ds, fill_policy)
    for name, var in ds.variables.items():
        if name in ds.data_vars:
            var.encoding = {"chunks": tuple(time_chunk if d == "time" else var.sizes[d] for d in var.dims)}
        else:  # coordinates: keep only the time encoding
            var.encoding = {k: v for k, v in var.encoding.items() if k in ("units", "calendar")}
    ds.attrs.update(
        {
            "source": source,
            ARGS_ATTR: json.dumps(args, sort_keys=True),
            FINGERPRINT_ATTR: json.dumps(fingerprint, sort_keys=True),
            "code_version": code_version(),
            "written_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "statistics_group": "statistics",
        }
    )
    with atomic_path(out, overwrite=overwrite) as tmp, dask_client(scheduler) as client:
        delayed = ds.to_zarr(tmp, mode="w", compute=False, consolidated=False, zarr_format=2)
        names = list(counts)
        _, *values = compute([delayed, *counts.values()], client, progress, f"writing {out} (checking NaNs)")
        _record_counts(dict(zip(names, values)), ds, source, out, tmp, fill_policy, allow_missing)
        written = xr.open_zarr(tmp, consolidated=False, chunks={"time": steps} if "time" in ds.dims else {})
        stats = compute(
            compute_statistics(written, train_years),
            client,
            progress,
            "computing statistics over the training years",
        )
        stats.to_zarr(tmp, group="statistics", mode="w", consolidated=False, zarr_format=2)
        zarr.consolidate_metadata(str(tmp), zarr_format=2)
    if progress:
        print(f"wrote {out}")
    return out


Source = str | Path | Sequence[str | Path]


def _cds_hint(folder: Path) -> str:
    """A hint when ``folder`` directly holds GRIB/netCDF files (CDS downloads), else ""."""
    from pipelines.readers._files import sniff_format

    found = 0
    for p in sorted(folder.iterdir())[:200]:
        if p.is_file() and not p.name.endswith((".idx", ".tmp")):
            try:
                sniff_format(p)
                found += 1
            except (DataError, OSError):
                continue
    if not found:
        return ""
    return (
        f"; it holds {found} GRIB/netCDF file(s) directly: if they are Climate Data Store downloads, pass "
        "--format cds"
    )


def _open_weatherbench(root: str | Path, years: Sequence[int] | None) -> xr.Dataset:
    """Every variable folder of a WeatherBench v1 resolution root, for ``years`` (default: all found)."""
    from pipelines.readers import open_weatherbench

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--source {root}: not a folder; expected a WeatherBench v1 root (e.g. .../5.625deg)")
    files = sorted(root.glob("*/*_[0-9][0-9][0-9][0-9]_*.nc"))
    if not files:
        raise DataError(
            f"--source {root}: no '<folder>/<name>_<year>_<grid>.nc' files (WeatherBench v1 layout, the guess for "
            f"a folder without --format){_cds_hint(root)}"
        )
    grids = {f.stem.rsplit("_", 1)[-1] for f in files}
    if len(grids) > 1:
        raise DataError(f"--source {root}: files of several grids {sorted(grids)}; expected one resolution")
    (grid,) = grids
    folders = sorted({f.parent.name for f in files})
    if (root / "constants" / f"constants_{grid}.nc").is_file():
        folders.append("constants")
    if years:
        wanted = list(range(int(years[0]), int(years[-1]) + 1))
    else:
        wanted = sorted({int(f.stem.rsplit("_", 2)[-2]) for f in files})
    return open_weatherbench(root, folders, wanted, grid=grid, check_nans=False)


def _open(kind: str, source: Source, fmt: str | None, years: Sequence[int] | None = None,
          storage_options: dict[str, Any] | None = None, variables: Sequence[str] | None = None,
          allow_missing: bool = False) -> xr.Dataset:
    """Open ``source`` as a lazy canonical Dataset (ens10 without truth; see ``prepare``); zarr stores are
    checked for missing chunks (of ``variables``, default all; ``check_chunks``)."""
    from pipelines.readers.wb2_zarr import check_chunks

    if kind == "world":
        path = str(source)
        if path.endswith(".zarr") or Path(path).is_dir():
            return check_chunks(xr.open_zarr(path), path, variables, allow_missing=allow_missing)
        from pipelines.readers._files import open_data

        return open_data(path, "--source", chunks={})  # an empty or text file: one line naming it
    from pipelines.readers import open_source

    if kind == "era5":
        fmt = fmt or _guess_era5_format(source)
        if fmt not in ERA5_FORMATS:
            raise DataError(f"--format {fmt!r} unknown for era5; choose from {ERA5_FORMATS}")
        if fmt == "weatherbench":
            return _open_weatherbench(str(source), years)
        if fmt == "wb2":
            if stored_args(str(source)) is not None:  # a store written by `smoe data prepare`
                return check_chunks(xr.open_zarr(str(source)), str(source), variables, allow_missing=allow_missing)
            return open_source("wb2", str(source), variables=variables, storage_options=storage_options,
                               allow_missing=allow_missing)
        return open_source("cds", resolve_sources(source), check_nans=False)
    if kind == "cmip6":
        return open_source("cmip6", resolve_sources(source, "*.nc"), check_nans=False)
    raise DataError(f"kind {kind!r} has no reader here; choose from {KINDS}")


def _guess_era5_format(source: Source) -> str:
    if not isinstance(source, str | Path):
        return "cds"
    s = str(source).rstrip("/")
    if s.endswith(".zarr") or "://" in s:
        return "wb2"
    if Path(s).is_dir():
        return "weatherbench"
    return "cds"  # GRIB or netCDF file(s) from the Climate Data Store


def _regrid(ds: xr.Dataset, grid: float | None, what: str = "source") -> xr.Dataset:
    if grid is None:
        return ds
    return regrid(ds, weatherbench_grid(grid), what=what)


def _open_truth(truth: Source) -> xr.Dataset:
    """ERA5 truth: a prepared store, or any source the era5 path reads."""
    if stored_args(str(truth)) is not None:
        from pipelines.readers.wb2_zarr import check_chunks

        return check_chunks(xr.open_zarr(str(truth)), str(truth))
    return _open("era5", truth, None)


def _truth_on_grid(truth: xr.Dataset, forecast: xr.Dataset, where: str) -> xr.Dataset:
    """``truth`` on ``forecast``'s grid: unchanged, its subset of points, or conservatively regridded."""
    if same_grid(truth, forecast):
        return truth.assign_coords(latitude=forecast["latitude"], longitude=forecast["longitude"])
    lat, lon = truth["latitude"].values, truth["longitude"].values
    ilat = [int(np.argmin(np.abs(lat - v))) for v in forecast["latitude"].values]
    ilon = [int(np.argmin(np.abs(lon - v))) for v in forecast["longitude"].values]
    if np.allclose(lat[ilat], forecast["latitude"]) and np.allclose(lon[ilon], forecast["longitude"]):
        picked = truth.isel(latitude=ilat, longitude=ilon)
        return picked.assign_coords(latitude=forecast["latitude"], longitude=forecast["longitude"])
    return regrid(truth, forecast, what=f"truth {where}")


def _open_ens10(
    source: Source,
    truth: Source | None,
    members: int,
    grid: float | None,
    variables: Sequence[str] | None,
    levels: Sequence[int] | None,
) -> xr.Dataset:
    """ENS-10 forecast (regridded to ``grid``) with the ERA5 truth on the same grid as ``<name>_truth``."""
    from pipelines.readers import open_ens10
    from pipelines.readers.ens10 import add_truth

    files = resolve_sources(source, "output.*")
    where = str(source)
    ds = open_ens10(files, members=members, variables=variables, levels=levels)
    ds = _regrid(ds, grid, f"ENS-10 {where}")
    if truth is None:
        return ds
    verifying = _open_truth(truth)
    names = [n for n in ds.data_vars if n in verifying.data_vars]
    verifying = _truth_on_grid(verifying[names] if names else verifying, ds, str(truth))
    return add_truth(ds, verifying, where)


def level_value(p: float | int | str) -> int | float:
    """A pressure level (hPa) as int when integral (500), else float (0.1)."""
    f = float(p)
    return int(f) if f.is_integer() else f


def select(
    ds: xr.Dataset,
    years: Sequence[int] | None = None,
    variables: Sequence[str] | None = None,
    levels: Sequence[float] | None = None,
    source: str = "input",
) -> xr.Dataset:
    """Subset a canonical Dataset; DataError naming what is missing and what is available."""
    if variables:
        missing = [v for v in variables if v not in ds.data_vars]
        if missing:
            raise DataError(f"{source}: variables {missing} not found; available: {sorted(ds.data_vars)}")
        ds = ds[list(variables)]
    if levels:
        if "level" not in ds.dims:
            raise DataError(f"{source}: levels {list(levels)} requested but the data has no level dimension")
        have = ds["level"].values.astype(float)
        picked, missing = [], []
        for p in levels:  # float levels (0.1 hPa …) compared with a tolerance far below level spacing
            hit = np.flatnonzero(np.isclose(have, float(p), rtol=1e-6, atol=1e-9))
            (picked if hit.size else missing).append(int(hit[0]) if hit.size else level_value(p))
        if missing:
            raise DataError(
                f"{source}: levels {missing} hPa not found; available: {[level_value(x) for x in have]}"
            )
        ds = ds.isel(level=picked)
    if years:
        span = (int(years[0]), int(years[-1]))
        ds = select_years(ds, span, f"{source}: years")
    return ds


def prepare(
    kind: str,
    source: Source,
    out: str | Path,
    grid: float | None = 5.625,
    years: Sequence[int] | None = None,
    variables: Sequence[str] | None = None,
    levels: Sequence[float] | None = None,
    scheduler: str | None = None,
    overwrite: bool = False,
    train_years: tuple[int, int] | None = None,
    fmt: str | None = None,
    time_chunk: int = 4,
    progress: bool = True,
    truth: Source | None = None,
    members: int | None = None,
    fill_policy: str = "error",
    storage_options: dict[str, Any] | None = None,
    allow_missing: bool = False,
    plausibility_check: bool = True,
) -> Path:
    """Prepare an analysis-ready zarr store from a raw ``source`` (file(s), glob, folder, store or fsspec URL).

    ``kind``: era5 (``fmt`` weatherbench/wb2/cds, guessed from the source: a folder is WeatherBench v1, a
    ``.zarr``/URL is WB2 (or a prepared store), anything else CDS GRIB/netCDF), cmip6 (CMOR files, a glob
    or a folder of ``*.nc``), ens10 (``output.*`` GRIB files or their folder), or world (a store/netCDF
    already in the canonical layout). ``years``: inclusive ``(start, end)`` or one year; ``grid``: target
    resolution in degrees (conservative regridding when the source differs; None keeps the source grid;
    a source that does not cover the globe raises DataError); ``train_years``: inclusive range for the
    statistics (default: all selected years). ens10 only: ``truth`` (a prepared ERA5 store or any era5
    source) is brought onto the forecast grid and stored as ``<name>_truth`` at the valid time (init +
    48 h); ``members`` 5 or 10 (default 10). ``fill_policy``: what to do with NaNs (see ``write_store``:
    "error" refuses and writes nothing). The store records a fingerprint of the source files, so a
    changed source is never reported "up to date". ``storage_options``: fsspec options for a URL source (e.g.
    ``{"token": "anon"}`` for ``gs://weatherbench2``); not recorded in the store (they may hold credentials).
    Every time step is judged: a variable or level named in ``variables``/``levels`` is never dropped, NaN and
    ±inf are counted over the whole selection and a partial field is refused, or kept with the counts in
    ``attrs["missing_values"]`` when ``allow_missing``; a zarr source with a missing chunk is refused naming the
    store and variable. ``plausibility_check``: refuse implausible values (``pipelines.plausibility``).
    """
    if kind not in KINDS:
        raise DataError(f"unknown kind {kind!r}; choose from {KINDS}")
    if kind != "ens10" and (truth is not None or members is not None):
        raise DataError(f"--truth and --members apply to kind ens10 only, not {kind!r}")
    if kind == "ens10" and members is None:
        members = 10
    out = Path(out)
    args = {
        "kind": kind,
        "source": _normalise_source(source),
        "grid": grid,
        "years": list(years) if years else None,
        "variables": list(variables) if variables else None,
        "levels": [level_value(p) for p in levels] if levels else None,
        "train_years": list(train_years) if train_years else None,
        "format": fmt,
        "time_chunk": time_chunk,
        "fill_policy": fill_policy,
    }
    if kind == "ens10":
        args.update(truth=None if truth is None else _normalise_source(truth), members=members)
    if allow_missing:  # recorded only when set: stores written before the option stay "up to date"
        args["allow_missing"] = True

    def make() -> xr.Dataset:
        if kind == "ens10":
            ds = _open_ens10(source, truth, int(members), grid, variables, levels)
            return select(ds, years, source=str(source))
        ds = _open(kind, source, fmt, years, storage_options, variables, allow_missing)
        ds = select(ds, years, variables, levels, source=str(source))
        return _regrid(ds, grid, str(source))

    return write_store(
        make,
        out,
        args=args,
        train_years=tuple(train_years) if train_years else None,
        source=str(source),
        time_chunk=time_chunk,
        overwrite=overwrite,
        scheduler=scheduler,
        progress=progress,
        fill_policy=fill_policy,
        allow_missing=allow_missing,
        plausibility_check=plausibility_check,
        named=(list(variables) if variables else None, list(levels) if levels else None),
        fingerprint={
            "source": source_fingerprint(source),
            **({"truth": source_fingerprint(truth)} if truth is not None else {}),
        },
    )


def _normalise_source(source: Source) -> str | list[str]:
    if not isinstance(source, str | Path):
        return [str(_normalise_source(s)) for s in source]
    s = str(source)
    return s if "://" in s else str(Path(s).resolve())


def open_store(store: str | Path) -> tuple[xr.Dataset, xr.Dataset]:
    """Open a prepared store lazily: (data, statistics)."""
    store = str(store)
    if not Path(store).exists() and "://" not in store:
        raise FileNotFoundError(f"store {store} does not exist")
    return xr.open_zarr(store), xr.open_zarr(store, group="statistics")
