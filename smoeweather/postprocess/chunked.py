"""EMOS out of core on dask: fit, apply, ECC-Q members and quantiles on arrays chunked over space,
streamed to zarr chunk by chunk; the archive is never loaded whole.

Fit, in two stages:

1. **stage**: the training ensemble is reduced over its members (mean and variance, ddof = 1; with
   ``predictors="members"`` the members are kept) with the truth at the valid times, in one pass over the archive
   in its own chunks. When the reduced arrays fit :data:`MEMORY_BYTES` and dask runs here (no cluster or the
   local one), that pass computes them straight into memory, every chunk stored in place in arrays allocated once;
   otherwise (the members form of a large archive, an external ``tcp://`` cluster) they are written
   beside the output as a temporary zarr chunked over (time, space) and reopened in fit blocks;
2. **fit**: per grid point / site (``local``), every spatial block (all times) is one task that fits its points
   (the batched Newton solver of :mod:`.emos`); global (pooled over space), every Newton iteration is one pass of
   per-block sums of the CRPS and its derivatives (:func:`.emos.fit_blocks`), reduced over the blocks in block
   order. Rolling windows (:mod:`.rolling`) add the forecast date as a group dim. The blocks of an in-memory stage
   run on a thread pool in this process (numpy releases the GIL), those of a zarr stage as dask tasks on the
   cluster; both read the same values in the same blocks, so the coefficients are bit-identical.

The fits start when the stage is complete: every block needs all inits, the archive holds one init per chunk, and
the data counts (:mod:`.validate`) refuse a fit before anything is fitted.

Apply: μ, σ, the ECC-Q members and the quantiles are lazy functions of the forecast's own chunks (every one is
independent per point, init and lead) and are written together in one pass, so each chunk is read once.

Where dask runs follows ``smoe data prepare`` (:func:`pipelines.compute.dask_client`): a local
``dask.distributed`` cluster by default, ``tcp://host:port`` for an existing cluster, ``threads`` for none.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
import xarray as xr

from smoeweather.postprocess.emos import COEFFICIENTS, Block, fit_blocks, fit_groups_newton
from smoeweather.postprocess.options import PREDICTORS

SPACE_DIMS = ("latitude", "longitude", "site")
MEMBER = "member"

BLOCK_BYTES = 48e6  # staged float64 bytes per fit task (all times of one spatial block)
CHUNK_BYTES = 4e6  # bytes per chunk of the staged store
MEMORY_BYTES = 1.5e9  # reduced training arrays up to this size are held in memory (no zarr)
IN_MEMORY = "staged_in_memory"  # attribute of a stage held in memory (its blocks are fitted on threads here)


@contextlib.contextmanager
def scheduler(address: str | None) -> Iterator[Any]:
    """The dask client of ``smoe data prepare``'s ``--scheduler`` (None: a local cluster; ``threads``: none)."""
    from pipelines.compute import dask_client

    with dask_client(address) as client:
        yield client


def compute(obj: Any, client: Any, progress: bool, label: str) -> Any:
    """Compute a dask collection (or a list of them, together) on ``client``, with a progress bar."""
    from pipelines.compute import compute as compute_with_progress

    return compute_with_progress(obj, client, progress, label)


def space_dims(ds: xr.Dataset | xr.DataArray) -> tuple[str, ...]:
    """The spatial dims of a forecast: (``latitude``, ``longitude``) or (``site``,)."""
    dims = tuple(d for d in SPACE_DIMS if d in ds.dims)
    if not dims:
        raise ValueError(f"no spatial dimension (one of {SPACE_DIMS}) in dims {tuple(ds.dims)}")
    return dims


def as_dask(ds: xr.Dataset, target_bytes: float = 64e6) -> xr.Dataset:
    """``ds`` backed by dask: kept as it is when it already is, else chunked along ``time`` (≈ target bytes)."""
    if any(v.chunks is not None for v in ds.data_vars.values()):
        return ds
    per_step = max(sum(v.dtype.itemsize * v.size / max(v.sizes.get("time", 1), 1) for v in ds.data_vars.values()),
                   1.0)
    return ds.chunk({"time": max(1, int(target_bytes // per_step))} if "time" in ds.dims else {})


def zarr_chunks(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with dask chunks a zarr store can take: along every dim, all chunks equal and the last no larger.
    A dim whose chunks are not (e.g. (7, …, 7, 9) after ``isel`` with an index array, as a period selection
    does) is rechunked to its largest chunk; regular dims are left alone (no copy)."""
    irregular: dict[str, int] = {}
    for v in ds.variables.values():
        if v.chunks is None:
            continue
        for dim, sizes in zip(v.dims, v.chunks, strict=True):
            if len(sizes) > 1 and (len(set(sizes[:-1])) > 1 or sizes[-1] > sizes[0]):
                irregular[dim] = max(irregular.get(dim, 0), max(sizes))
    return ds.chunk(irregular) if irregular else ds


def _group_dims(da: xr.DataArray) -> list[str]:
    return [d for d in da.dims if d not in ("time", MEMBER, *SPACE_DIMS)]


def training_arrays(forecast: xr.Dataset, truth_at: xr.Dataset, predictors: str = "mean") -> xr.Dataset:
    """Lazy Dataset of what a fit reads, per field ``n``: ``n__mean`` (or ``n__members``), ``n__var`` and
    ``n__truth``, dims (groups…, time, space…[, member]), non-dim coords dropped, members numbered 0..M−1."""
    if predictors not in PREDICTORS:
        raise ValueError(f"--predictors must be one of {PREDICTORS}, got {predictors!r}")
    out = {}
    for n in forecast.data_vars:
        x = forecast[n]
        order = [*_group_dims(x), "time", *space_dims(x)]
        var = x.var(MEMBER, ddof=1, skipna=False).transpose(*order)  # a missing member: no sample
        if predictors == "mean":
            out[f"{n}__mean"] = x.mean(MEMBER, skipna=False).transpose(*order)
        else:
            out[f"{n}__members"] = x.transpose(*order, MEMBER).assign_coords({MEMBER: np.arange(x.sizes[MEMBER])})
        out[f"{n}__var"] = var
        out[f"{n}__truth"] = truth_at[n].transpose(*order).astype(var.dtype)
    ds = xr.Dataset(out)
    return ds.drop_vars([c for c in ds.coords if c not in ds.dims])


def _space_block(ds: xr.Dataset, local_window: int) -> int:
    """Size of a spatial block along the first spatial dim: ≈ :data:`BLOCK_BYTES` of float64 per fit task."""
    first = next(v for v in ds.data_vars.values())
    sp = space_dims(first)
    per_row = 8 * 3 * first.sizes["time"] * int(np.prod([first.sizes[d] for d in _group_dims(first)]))
    per_row *= int(np.prod([first.sizes[d] for d in sp[1:]])) * max(local_window, 1)
    if any(MEMBER in v.dims for v in ds.data_vars.values()):
        per_row *= ds.sizes[MEMBER]
    return int(max(1, min(first.sizes[sp[0]], BLOCK_BYTES // max(per_row, 1))))


def stage(arrays: xr.Dataset, path: Path, client: Any, progress: bool, window_factor: int = 1) -> xr.Dataset:
    """:func:`training_arrays` computed into memory (within :data:`MEMORY_BYTES`) or written to a zarr at ``path``
    chunked over (time, space) and reopened; either way chunked as the fit tasks: all times × one spatial block."""
    return stage_with(arrays, path, client, progress, window_factor)[0]


def in_memory(arrays: xr.Dataset, client: Any, memory_bytes: float | None = None) -> bool:
    """Whether :func:`stage_with` holds ``arrays`` in memory: they fit ``memory_bytes`` (default
    :data:`MEMORY_BYTES`) and dask runs here (no cluster, or the local one; an external cluster stages on disk,
    where its workers read and fit the blocks)."""
    budget = MEMORY_BYTES if memory_bytes is None else memory_bytes
    here = client is None or getattr(client, "cluster", None) is not None
    return here and sum(v.nbytes for v in arrays.data_vars.values()) <= budget


def stage_with(arrays: xr.Dataset, path: Path, client: Any, progress: bool, window_factor: int = 1,
               extra: Any = None, memory_bytes: float | None = None) -> tuple[xr.Dataset, Any]:
    """:func:`stage`, with ``extra`` (a lazy collection, e.g. the counts of :func:`.validate.data_counts`)
    computed in the same pass (each input chunk read once): (staged data, computed ``extra``).

    In memory (:func:`in_memory`): one compute of the reduced arrays (the values the zarr would hold, so the fits
    are bit-identical), wrapped in dask chunks of the fit blocks and marked :data:`IN_MEMORY`; else the zarr."""
    first = next(v for v in arrays.data_vars.values())
    sp = space_dims(first)
    rows = _space_block(arrays, window_factor)
    fit_chunks = {"time": -1, sp[0]: rows, **{d: -1 for d in arrays.dims if d not in ("time", sp[0])}}
    if in_memory(arrays, client, memory_bytes):
        held, done = _read_into_memory(arrays, extra, client, progress)
        held = held.chunk(fit_chunks, token=uuid.uuid4().hex)  # (a token: no hashing of the data for dask's names)
        held.attrs[IN_MEMORY] = 1
        return held, done
    point_bytes = first.dtype.itemsize * int(np.prod([first.sizes[d] for d in _group_dims(first)]))
    point_bytes *= rows * int(np.prod([first.sizes[d] for d in sp[1:]]))
    tc = int(max(1, min(first.sizes["time"], CHUNK_BYTES // max(point_bytes, 1))))
    chunks = {"time": tc, sp[0]: rows, **{d: -1 for d in arrays.dims if d not in ("time", sp[0])}}
    ds = arrays.chunk(chunks)
    for v in ds.variables.values():
        v.encoding = {}
    delayed = ds.to_zarr(path, mode="w", compute=False, zarr_format=2, consolidated=True)
    _, done = compute([delayed, extra], client, progress,
                      f"staging the training data ({first.sizes['time']} inits) to {path.name}")
    return xr.open_zarr(path, chunks=fit_chunks), done


def _read_into_memory(arrays: xr.Dataset, extra: Any, client: Any, progress: bool) -> tuple[xr.Dataset, Any]:
    """``arrays`` computed into numpy arrays allocated once, every chunk stored in place as it is computed (no
    list of chunks joined at the end: that held twice the arrays), with ``extra`` in the same pass. On this
    process's threads, not the local cluster's worker processes, whose results would be held there, sent and
    joined here (three copies at once: 4.8 GB peak at 1 deg x 51 members x 365 inits)."""
    import dask.array as da

    names = list(arrays.data_vars)
    targets = {n: np.empty(arrays[n].shape, arrays[n].dtype) for n in names}
    stored = da.store([da.asarray(arrays[n].data) for n in names], [targets[n] for n in names], lock=False,
                      compute=False)
    stored = list(stored) if isinstance(stored, (list, tuple)) else [stored]  # (a tuple for several arrays)
    first = arrays[names[0]]
    with dask.config.set(scheduler="threads", num_workers=_fit_threads(client)):
        *_, done = compute([*stored, extra], None, progress,
                           f"reading the training data ({first.sizes['time']} inits) into memory")
    return arrays.copy(data=targets), done


def _fit_threads(client: Any) -> int:
    """Threads of the in-memory fits: the local cluster's, else dask's local scheduler's."""
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    if dask.config.get("scheduler", None) in ("synchronous", "sync", "single-threaded"):
        return 1
    return max(1, int(dask.config.get("num_workers", None) or os.cpu_count() or 1))


@contextlib.contextmanager
def _fit_pool(staged: xr.Dataset, client: Any) -> Iterator[ThreadPoolExecutor | None]:
    """A thread pool for the blocks of an in-memory stage (numpy releases the GIL); None for a zarr stage."""
    if not staged.attrs.get(IN_MEMORY):
        yield None
        return
    with ThreadPoolExecutor(_fit_threads(client), thread_name_prefix="emos-fit") as pool:
        yield pool


def _held(block: tuple[Any, Any, Any, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A block of an in-memory stage as numpy (its one chunk per array, computed here, not on the cluster)."""
    xa, va, ya = dask.compute(*block[:3], scheduler="sync")
    return xa, va, ya, block[3]


def _samples(xm: np.ndarray, v: np.ndarray, y: np.ndarray, wsp: np.ndarray, local: bool,
             win: tuple[np.ndarray, np.ndarray] | None) -> Block:
    """A :data:`~.emos.Block` from arrays (g0, T, p[, M]) (mean or members), (g0, T, p) and weights (p,).

    Groups: local → (g0, [D,] p), pooled → (g0, [D]); D = forecast dates of the window ``win`` = (idx, valid)."""
    x = np.asarray(xm, np.float64)
    x = np.concatenate([np.ones((*x.shape[:3], 1)), x[..., None] if x.ndim == 3 else x], -1)
    v, y = np.asarray(v, np.float64), np.asarray(y, np.float64)
    w = np.broadcast_to(np.asarray(wsp, np.float64)[None, None, :], v.shape)
    g0, _, p, k = x.shape
    if win is not None:
        idx, valid = win
        x, v, y = x[:, idx], v[:, idx], y[:, idx]  # (g0, D, W, p, ...)
        w = w[:, idx] * valid[None, :, :, None]
        d, width = idx.shape
        if local:
            return {"X": x.transpose(0, 1, 3, 2, 4).reshape(g0 * d * p, width, k),
                    **{n: a.transpose(0, 1, 3, 2).reshape(g0 * d * p, width) for n, a in (("v", v), ("y", y),
                                                                                      ("w", w))}}
        return {"X": x.reshape(g0 * d, width * p, k), **{n: a.reshape(g0 * d, width * p) for n, a in
                                                          (("v", v), ("y", y), ("w", w))}}
    if local:
        return {"X": x.transpose(0, 2, 1, 3).reshape(g0 * p, -1, k),
                **{n: a.transpose(0, 2, 1).reshape(g0 * p, -1) for n, a in (("v", v), ("y", y), ("w", w))}}
    return {"X": x.reshape(g0, -1, k), **{n: a.reshape(g0, -1) for n, a in (("v", v), ("y", y), ("w", w))}}


def _fit_local(xm: np.ndarray, v: np.ndarray, y: np.ndarray, wsp: np.ndarray,
               win: tuple[np.ndarray, np.ndarray] | None, iterations: int, min_samples: int,
               distribution: str = "normal") -> np.ndarray:
    """Coefficients (groups, K + 3) = (a, b…, c, d, converged) of one spatial block, one fit per point
    (per point and date with a window); groups with fewer than ``min_samples`` valid samples get NaN."""
    b = _samples(xm, v, y, wsp, True, win)
    valid = np.isfinite(b["X"]).all(-1) & np.isfinite(b["v"]) & np.isfinite(b["y"]) & (b["w"] > 0)
    enough = valid.sum(1) >= min_samples
    k = b["X"].shape[-1]
    coef = np.full((len(enough), k + 3), np.nan)
    coef[:, -1] = 1.0  # groups without enough samples: no fit (NaN), nothing to converge
    if enough.any():
        sub = {n: a[enough] for n, a in b.items()}
        if k == 2 and distribution == "normal":  # the mean/spread form: the same solver as the in-memory fit_emos
            c, ok = fit_groups_newton(sub["X"][..., 1], sub["v"], sub["y"], sub["w"], iterations=iterations)
        else:
            c, ok = fit_blocks(lambda fn: fn(sub), iterations=iterations, distribution=distribution)
        coef[enough] = np.concatenate([c, ok[:, None].astype(np.float64)], 1)
    return coef


def _sum_dicts(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {k: np.array(v, np.float64, copy=True) for k, v in parts[0].items()}
    for p in parts[1:]:
        for k, v in p.items():
            out[k] += v
    return out


def _pooled_part(fn: Callable[[Block], dict[str, np.ndarray]], xm: np.ndarray, v: np.ndarray, y: np.ndarray,
                 wsp: np.ndarray, win: tuple[np.ndarray, np.ndarray] | None) -> dict[str, np.ndarray]:
    return fn(_samples(xm, v, y, wsp, False, win))


def _coefficient_labels(k: int, members: Sequence[Any] | None) -> list[str]:
    if k == 2:
        return list(COEFFICIENTS)
    return ["a", *[f"b_{m}" for m in members], "c", "d"]  # type: ignore[union-attr]


def _blocks(staged: xr.Dataset, xkey: str, name: str, local: bool) -> list[tuple[Any, Any, Any, np.ndarray]]:
    """Per spatial block of the stage (its chunks along the first spatial dim): (x (g0, T, p[, M]), var (g0, T, p),
    truth (g0, T, p), weights (p,)); global fits weight grid points by latitude, sites and local fits equally."""
    from smoeweather.metrics.weights import latitude_weights

    xm, v, y = staged[xkey], staged[f"{name}__var"], staged[f"{name}__truth"]
    sp = space_dims(v)
    groups = _group_dims(v)
    if "latitude" in sp and not local:
        wsp_full = latitude_weights(staged["latitude"]).broadcast_like(
            v.isel({d: 0 for d in ("time", *groups)}, drop=True)).transpose(*sp).values
    else:
        wsp_full = np.ones([v.sizes[d] for d in sp])
    members = (staged.sizes[MEMBER],) if xkey.endswith("__members") else ()
    starts = np.cumsum((0,) + v.chunks[v.get_axis_num(sp[0])])
    shape = (int(np.prod([v.sizes[d] for d in groups], dtype=np.int64)), v.sizes["time"], -1)
    blocks = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        sel = {sp[0]: slice(int(lo), int(hi))}
        blocks.append((xm.isel(sel).data.reshape(shape + members), v.isel(sel).data.reshape(shape),
                       y.isel(sel).data.reshape(shape), wsp_full[int(lo):int(hi)].reshape(-1)))
    return blocks


def _local_parts(blocks: list[tuple[Any, Any, Any, np.ndarray]], args: tuple[Any, ...],
                 pool: ThreadPoolExecutor | None, client: Any, progress: bool, label: str) -> list[np.ndarray]:
    """Per block, :func:`_fit_local` (``args``: its arguments after the arrays): one dask task per block on
    ``client``, or, for an in-memory stage, on ``pool``."""
    if pool is None:
        tasks = [dask.delayed(_fit_local)(xa, va, ya, wa, *args) for xa, va, ya, wa in blocks]
        return compute(tasks, client, progress, f"{label}: {len(tasks)} blocks of points")
    t0 = time.perf_counter()
    parts = list(pool.map(lambda b: _fit_local(*_held(b), *args), blocks))
    if progress:
        print(f"{label}: {len(blocks)} blocks of points (in memory) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
    return parts


def _pooled_sums(fn: Callable[[Block], dict[str, np.ndarray]], blocks: list[tuple[Any, Any, Any, np.ndarray]],
                 win: tuple[np.ndarray, np.ndarray] | None, pool: ThreadPoolExecutor | None, client: Any,
                 label: str) -> dict[str, np.ndarray]:
    """``fn`` of every block summed over the blocks, in block order (dask tasks, or ``pool`` in memory)."""
    if pool is not None:
        return _sum_dicts(list(pool.map(lambda b: _pooled_part(fn, *_held(b), win), blocks)))
    parts = [dask.delayed(_pooled_part)(fn, xa, va, ya, wa, win) for xa, va, ya, wa in blocks]
    return compute(dask.delayed(_sum_dicts)(parts), client, False, label)


def fit_staged(staged: xr.Dataset, names: Sequence[str], local: bool, client: Any, progress: bool,
               window: tuple[pd.DatetimeIndex, np.ndarray, np.ndarray] | None = None,
               members: Sequence[Any] | None = None, space_coords: dict[str, Any] | None = None,
               iterations: int = 50, min_samples: int | None = None, distribution: str = "normal") -> xr.Dataset:
    """EMOS coefficients in :func:`~.emos.fit_emos` form (per variable: dims groups…, [``time`` = forecast
    date], [space…], ``coefficient``) from a :func:`stage`-d store (a zarr, or held in memory: :data:`IN_MEMORY`,
    its blocks then fitted on a thread pool here rather than as dask tasks; the same numbers either way).

    ``window``: (dates, idx, valid) of :func:`.rolling.window_index`. ``members``: member labels of the
    members form. ``min_samples``: fewest valid samples of a local fit (default 2 × its parameter count).
    Global fits weight grid points by latitude (as :func:`~.emos.fit_emos`), sites equally.
    ``distribution``: ``normal`` or ``truncnormal`` (:mod:`.distributions`).
    """
    out = {}
    n_groups = n_bad = n_empty = 0
    win = (window[1], window[2]) if window is not None else None
    d = len(window[0]) if window is not None else None
    with _fit_pool(staged, client) as pool:
        for name in names:
            xkey = f"{name}__mean" if f"{name}__mean" in staged else f"{name}__members"
            v = staged[f"{name}__var"]
            sp, groups = space_dims(v), _group_dims(v)
            gshape = [v.sizes[g] for g in groups]
            k = 2 if xkey.endswith("__mean") else staged.sizes[MEMBER] + 1
            blocks = _blocks(staged, xkey, name, local)
            ms = min_samples if min_samples is not None else 2 * (k + 2)
            label = f"EMOS fit of {name}"
            if local:
                parts = _local_parts(blocks, (win, iterations, ms, distribution), pool, client, progress, label)
                # per block: (g0, [D,] p) groups → concatenate the blocks along p
                arrs = [p.reshape(int(np.prod(gshape)), 1 if d is None else d, int(np.prod(b[1].shape[2:])), -1)
                        for p, b in zip(parts, blocks)]
                coef = np.concatenate(arrs, 2)  # (g0, D, P, K + 3)
                coef = coef.reshape([*gshape, *([] if d is None else [d]), *[v.sizes[s] for s in sp], coef.shape[-1]])
                dims = [*groups, *(["time"] if window is not None else []), *sp]
            else:
                t0 = time.perf_counter()
                reduce = functools.partial(_pooled_sums, blocks=blocks, win=win, pool=pool, client=client, label=label)
                c, ok = fit_blocks(reduce, iterations=iterations, distribution=distribution)
                if progress:
                    print(f"{label}: pooled over {len(blocks)} blocks in {time.perf_counter() - t0:.1f} s", flush=True)
                coef = np.concatenate([c, ok[:, None].astype(np.float64)], 1)
                coef = coef.reshape([*gshape, *([] if d is None else [d]), coef.shape[-1]])
                dims = [*groups, *(["time"] if window is not None else [])]
            ok = coef[..., -1] > 0.5
            n_groups += ok.size
            n_bad += int((~ok).sum())
            n_empty += int(np.isnan(coef[..., 0]).sum())
            coords = {g: staged[g].values for g in groups}
            if window is not None:
                coords["time"] = window[0].values
            if local:
                coords.update({s: staged[s].values for s in sp})
            out[name] = xr.DataArray(coef[..., :-1], dims=(*dims, "coefficient"),
                                     coords={**coords, "coefficient": _coefficient_labels(k, members)})
    params = xr.Dataset(out)
    if space_coords and local:
        params = params.assign_coords(space_coords)
    params.attrs = {"method": "emos", "per_gridpoint": int(local), "solver": "newton", "iterations": iterations,
                    "groups": n_groups, "groups_not_converged": n_bad, "groups_without_data": n_empty,
                    "distribution": distribution}
    return params


@contextlib.contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` (where the workers can reach it too), removed afterwards; one left by
    a killed run is removed by the next (:func:`smoeweather.io.work_dir`)."""
    from smoeweather.io import work_dir

    with work_dir(out) as path:
        yield path
