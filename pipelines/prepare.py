"""``smoe data prepare``: raw source → analysis-ready, time-chunked, consolidated zarr + statistics.

Store layout (zarr format 2, consolidated metadata at the root):

- root: the canonical Dataset (dims ``time, [member], [level], latitude, longitude``; latitude ascending,
  longitude [0, 360), level hPa; units in attrs), chunked along ``time`` only;
  ``xr.open_zarr(store)`` opens it.
- group ``statistics``: the Dataset of :func:`pipelines.statistics.compute_statistics` over the training
  years (dim ``statistic`` = mean/std/diff_std); ``xr.open_zarr(store, group="statistics")`` opens it.
- root attrs: provenance — ``source``, ``prepare_args`` (JSON; used for the idempotency check),
  ``code_version``, ``written_utc``.

Writes are atomic (a temporary sibling is renamed onto the target only after everything, statistics and
consolidated metadata included, has been written) and stream chunk by chunk with dask.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr
import zarr

from pipelines.atomic import atomic_path
from pipelines.errors import DataError
from pipelines.grids import regrid, same_grid, weatherbench_grid
from pipelines.readers._files import resolve_sources
from pipelines.statistics import compute_statistics, select_years

KINDS = ("era5", "cmip6", "ens10", "world")
ERA5_FORMATS = ("weatherbench", "wb2", "cds")
ARGS_ATTR = "prepare_args"


def code_version() -> str:
    """Installed distribution version plus the git commit when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("smoeweather")
    except PackageNotFoundError:  # a plain checkout on PYTHONPATH
        __version__ = "0+unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+g{sha}" if sha else __version__


def stored_args(store: str | Path) -> dict[str, Any] | None:
    """The ``prepare_args`` recorded in an existing store, or None."""
    try:
        attrs = zarr.open_group(str(store), mode="r").attrs
    except Exception:  # noqa: BLE001 - anything unreadable is "not ours"
        return None
    raw = attrs.get(ARGS_ATTR)
    return json.loads(raw) if isinstance(raw, str) else None


@contextlib.contextmanager
def dask_client(scheduler: str | None) -> Iterator[Any]:
    """Where dask runs: ``None`` → a local in-process ``distributed`` cluster; ``"threads"`` /
    ``"synchronous"`` → dask's local scheduler (no cluster); anything else → address of an existing
    ``dask.distributed`` scheduler (e.g. ``tcp://host:8786``)."""
    if scheduler in ("threads", "synchronous"):
        with dask.config.set(scheduler=scheduler):
            yield None
        return
    from distributed import Client, LocalCluster

    if scheduler is None:
        with (
            LocalCluster(
                processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
    else:
        with Client(scheduler) as client:
            yield client


def _compute(obj: Any, client: Any, progress: bool, label: str) -> Any:
    """Compute a dask collection with a progress bar, on ``client`` when given."""
    if progress:
        print(f"{label} ...", flush=True)
    if client is None:
        if progress:
            from dask.diagnostics import ProgressBar

            with ProgressBar(dt=1.0):
                return dask.compute(obj)[0]
        return dask.compute(obj)[0]
    from distributed import progress as show_progress

    future = client.compute(obj)
    if progress:
        show_progress(future)
        print(flush=True)
    return future.result()


def dask_time_chunk(ds: xr.Dataset, time_chunk: int, target_bytes: float = 16e6) -> int:
    """Time steps per dask task: a multiple of the zarr ``time_chunk`` with ≈ ``target_bytes`` per task."""
    per_step = sum(
        v.dtype.itemsize * v.size / v.sizes["time"] for v in ds.data_vars.values() if "time" in v.dims
    )
    per_step = max(per_step / max(len(ds.data_vars), 1), 1.0)  # one variable's bytes per step
    return time_chunk * max(1, int(target_bytes // (per_step * time_chunk)))


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
) -> Path:
    """Write ``make_dataset()`` (a lazy canonical Dataset) to ``out`` with statistics, atomically.

    Idempotent: when ``out`` exists and records the same ``args`` it prints "up to date" and returns;
    when it records other arguments (or none) it raises FileExistsError naming the path, unless
    ``overwrite``.
    """
    out = Path(out)
    args = json.loads(json.dumps(args))  # normalise tuples → lists for the comparison
    if out.exists() and not overwrite:
        if stored_args(out) == args:
            print(f"{out}: up to date (same arguments; pass --overwrite to rebuild)")
            return out
        raise FileExistsError(
            f"{out} already exists (written with other arguments or not by smoe); "
            "pass --overwrite to replace it"
        )
    ds = make_dataset()
    if train_years is not None:  # fail before writing anything
        select_years(ds, train_years, "training years")
    steps = dask_time_chunk(ds, time_chunk)
    ds = ds.chunk({d: (steps if d == "time" else -1) for d in ds.dims})
    for name, var in ds.data_vars.items():  # analysis-ready: plain float32, no CF packing
        if np.issubdtype(var.dtype, np.floating) or var.encoding.get("scale_factor") is not None:
            ds[name] = var.astype(np.float32)
    for name, var in ds.variables.items():
        if name in ds.data_vars:
            var.encoding = {"chunks": tuple(time_chunk if d == "time" else var.sizes[d] for d in var.dims)}
        else:  # coordinates: keep only the time encoding
            var.encoding = {k: v for k, v in var.encoding.items() if k in ("units", "calendar")}
    ds.attrs.update(
        {
            "source": source,
            ARGS_ATTR: json.dumps(args, sort_keys=True),
            "code_version": code_version(),
            "written_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "statistics_group": "statistics",
        }
    )
    with atomic_path(out, overwrite=overwrite) as tmp, dask_client(scheduler) as client:
        delayed = ds.to_zarr(tmp, mode="w", compute=False, consolidated=False, zarr_format=2)
        _compute(delayed, client, progress, f"writing {out}")
        written = xr.open_zarr(tmp, consolidated=False, chunks={"time": steps})
        stats = _compute(
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


def _open_weatherbench(root: str | Path, years: Sequence[int] | None) -> xr.Dataset:
    """Every variable folder of a WeatherBench v1 resolution root, for ``years`` (default: all found)."""
    from pipelines.readers import open_weatherbench

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--source {root}: not a folder; expected a WeatherBench v1 root (e.g. .../5.625deg)")
    files = sorted(root.glob("*/*_[0-9][0-9][0-9][0-9]_*.nc"))
    if not files:
        raise DataError(f"--source {root}: no '<folder>/<name>_<year>_<grid>.nc' files (WeatherBench v1 layout)")
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


def _open(kind: str, source: Source, fmt: str | None, years: Sequence[int] | None = None) -> xr.Dataset:
    """Open ``source`` as a lazy canonical Dataset (ens10 without truth; see ``prepare``)."""
    if kind == "world":
        path = str(source)
        if path.endswith(".zarr") or Path(path).is_dir():
            return xr.open_zarr(path)
        return xr.open_dataset(path, chunks={})
    from pipelines.readers import open_source

    if kind == "era5":
        fmt = fmt or _guess_era5_format(source)
        if fmt not in ERA5_FORMATS:
            raise DataError(f"--format {fmt!r} unknown for era5; choose from {ERA5_FORMATS}")
        if fmt == "weatherbench":
            return _open_weatherbench(str(source), years)
        if fmt == "wb2":
            if stored_args(str(source)) is not None:  # a store written by `smoe data prepare`
                return xr.open_zarr(str(source))
            return open_source("wb2", str(source))
        return open_source("cds", resolve_sources(source))
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
        return xr.open_zarr(str(truth))
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


def select(
    ds: xr.Dataset,
    years: Sequence[int] | None = None,
    variables: Sequence[str] | None = None,
    levels: Sequence[int] | None = None,
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
        have = [int(p) for p in ds["level"].values]
        missing = [int(p) for p in levels if int(p) not in have]
        if missing:
            raise DataError(f"{source}: levels {missing} hPa not found; available: {have}")
        ds = ds.sel(level=[int(p) for p in levels])
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
    levels: Sequence[int] | None = None,
    scheduler: str | None = None,
    overwrite: bool = False,
    train_years: tuple[int, int] | None = None,
    fmt: str | None = None,
    time_chunk: int = 4,
    progress: bool = True,
    truth: Source | None = None,
    members: int | None = None,
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
    48 h); ``members`` 5 or 10 (default 10).
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
        "levels": [int(p) for p in levels] if levels else None,
        "train_years": list(train_years) if train_years else None,
        "format": fmt,
        "time_chunk": time_chunk,
    }
    if kind == "ens10":
        args.update(truth=None if truth is None else _normalise_source(truth), members=members)

    def make() -> xr.Dataset:
        if kind == "ens10":
            ds = _open_ens10(source, truth, int(members), grid, variables, levels)
            return select(ds, years, source=str(source))
        ds = _open(kind, source, fmt, years)
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
