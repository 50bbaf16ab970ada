"""``smoe data ...`` verbs: ``prepare`` (raw → analysis-ready zarr), ``world`` (embedded default world),
``stats`` (print a store's normalisation statistics)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.errors import DataError
from pipelines.prepare import ERA5_FORMATS


def add_data_commands(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser(
        "data", help="prepare analysis-ready zarr from ERA5 / CMIP6 / ENS-10, or the default world"
    )
    verbs = data.add_subparsers(dest="data_verb", required=True)

    prep = verbs.add_parser("prepare", help="raw source → consolidated, time-chunked zarr + statistics")
    prep.add_argument("kind", choices=["era5", "cmip6", "ens10", "world"], help="what the source holds")
    prep.add_argument(
        "--source",
        required=True,
        nargs="+",
        help="file(s), glob, folder, zarr store or fsspec URL (cmip6/ens10: several files allowed)",
    )
    prep.add_argument("--out", required=True, type=Path, help="output zarr store (STORE.zarr)")
    prep.add_argument(
        "--format", choices=ERA5_FORMATS, default=None, help="era5 source format (default: guessed)"
    )
    prep.add_argument("--grid", type=float, default=5.625, help="target grid in degrees (default 5.625)")
    prep.add_argument("--native-grid", action="store_true", help="keep the source grid (no regridding)")
    prep.add_argument(
        "--years", type=int, nargs="+", default=None, metavar="YEAR", help="START [END], inclusive"
    )
    prep.add_argument(
        "--train-years",
        type=int,
        nargs=2,
        default=None,
        metavar=("START", "END"),
        help="years the statistics are computed over (default: all selected years)",
    )
    prep.add_argument("--variables", nargs="+", default=None, help="canonical variable names (default: all)")
    prep.add_argument(
        "--levels",
        type=float,
        nargs="+",
        default=None,
        help="pressure levels in hPa, e.g. 500 850 or 0.1 1 (default: all)",
    )
    prep.add_argument("--time-chunk", type=int, default=4, help="time steps per zarr chunk (default 4)")
    prep.add_argument(
        "--scheduler",
        default=None,
        help="dask.distributed scheduler address (default: a local cluster; 'threads' for no cluster)",
    )
    prep.add_argument(
        "--truth",
        default=None,
        help="ens10: ERA5 truth (a prepared ERA5 store or any era5 source), stored as <name>_truth at init + 48 h",
    )
    prep.add_argument(
        "--members", type=int, choices=[5, 10], default=None, help="ens10: ensemble members kept (default 10)"
    )
    prep.add_argument(
        "--fill-policy",
        choices=["error", "zero", "mean", "nearest"],
        default="error",
        help="NaNs in the source: refuse and write nothing (default), or fill with zero, the field mean or "
        "the nearest valid point",
    )
    prep.add_argument("--allow-missing", action="store_true",
                      help="keep fields with some NaN/±inf values (stored as NaN, counts in the store's "
                      "missing_values attribute) instead of refusing them")
    prep.add_argument("--no-plausibility-check", action="store_true",
                      help="do not refuse values outside the plausible range of a known variable (exotic data)")
    prep.add_argument("--storage-options", default=None, metavar="JSON",
                      help='fsspec options for a URL source, e.g. \'{"token": "anon"}\' for gs://weatherbench2')
    prep.add_argument("--overwrite", action="store_true", help="replace an existing store")
    prep.add_argument("--quiet", action="store_true", help="no progress bars")

    world = verbs.add_parser(
        "world", help="generate the embedded default world (synthetic, seconds, no downloads)"
    )
    world.add_argument("--out", required=True, type=Path, help="output zarr store")
    world.add_argument(
        "--years",
        type=int,
        nargs=2,
        default=(2000, 2003),
        metavar=("START", "END"),
        help="inclusive (default 2000 2003)",
    )
    world.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    world.add_argument("--levels", type=int, nargs="+", default=None, help="subset of 250 500 700 850 hPa")
    world.add_argument(
        "--train-years",
        type=int,
        nargs=2,
        default=None,
        metavar=("START", "END"),
        help="statistics years (default: all but the last two)",
    )
    world.add_argument("--time-chunk", type=int, default=4, help="time steps per zarr chunk (default 4)")
    world.add_argument("--overwrite", action="store_true", help="replace an existing store")
    world.add_argument("--quiet", action="store_true", help="no progress bars")

    stats = verbs.add_parser("stats", help="print the normalisation statistics stored in a prepared store")
    stats.add_argument("store", help="prepared zarr store")


def storage_options(text: str | None) -> dict | None:
    """``--storage-options JSON`` → dict; DataError naming the option when it is not a JSON object."""
    if text is None:
        return None
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"--storage-options must be a JSON object such as '{{\"token\": \"anon\"}}': {err}") from None
    if not isinstance(value, dict):
        raise DataError(f"--storage-options must be a JSON object, got {type(value).__name__}")
    return value


def run_data_command(args: argparse.Namespace) -> int:
    """Run one ``smoe data`` verb; returns the exit code (errors propagate to ``smoeweather.cli``)."""
    if args.data_verb == "prepare":
        from pipelines.atomic import check_apart
        from pipelines.prepare import prepare

        check_apart(args.out, [args.source, args.truth])  # never into or over a source, with or without --overwrite
        prepare(
            args.kind,
            args.source[0] if len(args.source) == 1 else args.source,
            args.out,
            grid=None if args.native_grid else args.grid,
            years=args.years,
            variables=args.variables,
            levels=args.levels,
            scheduler=args.scheduler,
            overwrite=args.overwrite,
            train_years=tuple(args.train_years) if args.train_years else None,
            fmt=args.format,
            time_chunk=args.time_chunk,
            progress=not args.quiet,
            truth=args.truth,
            members=args.members,
            fill_policy=args.fill_policy,
            storage_options=storage_options(args.storage_options),
            allow_missing=args.allow_missing,
            plausibility_check=not args.no_plausibility_check,
        )
        return 0
    if args.data_verb == "world":
        from pipelines.world import DEFAULT_LEVELS, generate_world

        generate_world(
            args.out,
            years=tuple(args.years),
            seed=args.seed,
            levels=args.levels or DEFAULT_LEVELS,
            train_years=tuple(args.train_years) if args.train_years else None,
            overwrite=args.overwrite,
            time_chunk=args.time_chunk,
            progress=not args.quiet,
        )
        return 0
    if args.data_verb == "stats":
        from pipelines.prepare import open_store

        _, stats = open_store(args.store)
        print(f"statistics of {args.store} ({stats.attrs})")
        if not int(stats.attrs.get("available", 1)):
            print(f"statistics unavailable: {stats.attrs.get('unavailable_reason', 'no reason recorded')}")
            return 0
        for name, var in stats.load().data_vars.items():
            table = var.to_pandas()
            table = table.T if getattr(table, "ndim", 1) == 2 else table
            print(f"\n{name} [{var.attrs.get('units', '?')}]\n{table.to_string()}")
        return 0
    raise ValueError(f"unknown data verb {args.data_verb!r}")
