"""``smoe evaluate FC.zarr [FC2.zarr ...] --truth STORE [--climatology STORE] [--regions ...] [--spectra] --out DIR``:
RMSE, bias, ACC (and CRPS, spread–skill, debiased ensemble-mean MSE, energy score for ensembles/Gaussian
forecasts) per region → DIR/scores.{nc,json,md} and DIR/wb2/METHOD/EVALUATION.nc (WeatherBench 2's evaluation
files: deterministic, deterministic_temporal, probabilistic, ensemble_binary, gaussian_*). Site (station)
forecasts (site tables, CF timeSeries files, ``smoe postprocess apply`` outputs on sites) are scored against a
site table/file's observations (:mod:`smoeweather.evaluate.sites`): DIR/scores.{nc,json,md}, no WB2 files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

NAME = "evaluate"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score forecasts against a truth store, with persistence/climatology")
    p.add_argument("forecasts", nargs="+",
                   help="forecast stores (smoe forecast / smoe postprocess, WB2 zarrs), local paths or fsspec URLs "
                        "(gs://, s3://, https://); site forecasts: site tables (CSV/Parquet), CF timeSeries files "
                        "and `smoe postprocess apply` outputs on sites; NAME=PATH sets the method name")
    p.add_argument("--truth", required=True, nargs="+",
                   help="prepared store or canonical netCDF file(s); site forecasts: the site table or CF timeSeries "
                        "file holding the station observations")
    p.add_argument("--climatology", default=None,
                   help="training store (day-of-year climatology, 31-day window) or a WeatherBench 2 climatology "
                        "zarr (dayofyear, hour), local or a URL: ACC, the climatology reference and the binary "
                        "scores' thresholds")
    p.add_argument("--climatology-years", nargs=2, type=int, default=None, metavar=("Y0", "Y1"),
                   help="years of a training-store --climatology (default: the store's statistics years, else all)")
    p.add_argument("--no-references", action="store_true", help="do not add persistence/climatology")
    p.add_argument("--regions", nargs="+", default=None, metavar="REGION",
                   help="regions scored (every metric gets a region dim): 'default' (global, land, sea; the "
                        "default), 'wb2' (WeatherBench 2's list), names such as tropics, europe, global_land, "
                        "europe_sea, a box NAME=LAT0:LAT1,LON0:LON1 or a mask file NAME=PATH.nc")
    p.add_argument("--land-sea-mask", default=None, metavar="STORE_OR_NC",
                   help="store or netCDF with land_sea_mask/lsm for land and sea regions (default: the truth's)")
    p.add_argument("--land-threshold", type=float, default=None, metavar="F",
                   help="land = land_sea_mask > F (default: weight every point by its land fraction, as WB2)")
    p.add_argument("--spectra", action="store_true",
                   help="also zonal energy spectra of forecasts and truth per lead (plot: smoe plot spectra)")
    p.add_argument("--spectra-band", nargs=2, type=float, default=(30.0, 60.0), metavar=("LAT0", "LAT1"),
                   help="latitude band averaged in the spectra (default 30 60, as WeatherBench 2)")
    p.add_argument("--spectra-recipe", choices=("wavenumber", "wb2"), default="wavenumber",
                   help="latitude average of the band: at equal wavenumber (default) or WB2's (every latitude "
                        "interpolated to common zonal frequencies first; curves comparable with WB2's)")
    p.add_argument("--binary-quantiles", nargs="+", type=float, default=[0.1, 0.5, 0.9], metavar="Q",
                   help="climatological quantiles whose exceedance the WB2 binary files score (default 0.1 0.5 0.9)")
    p.add_argument("--thresholds", nargs="+", default=None, metavar="FIELD=T1,T2",
                   help="events scored by the Brier score, reliability table and Brier skill score, per field in "
                        "its units or with their own, e.g. temperature_850=265,275 or temperature_850=-5degC "
                        "(probability forecasts bring their own)")
    p.add_argument("--bss-reference", default=None, metavar="METHOD",
                   help="the method the Brier skill score is measured against besides climatology (default: the "
                        "first ensemble, i.e. the raw ensemble)")
    p.add_argument("--ensemble-dim", default=None, metavar="DIM",
                   help="the forecasts' ensemble dim (default: found by name: member, realization, number, ensemble)")
    p.add_argument("--storage-options", default=None, metavar="JSON",
                   help='fsspec options for URLs, e.g. \'{"token": "anon"}\' for gs://weatherbench2')
    p.add_argument("--allow-missing", action="store_true",
                   help="score only the complete initialisations of a forecast with missing values (default: "
                        "refuse it)")
    p.add_argument("--no-plausibility-check", action="store_true",
                   help="do not refuse forecast/truth values outside the plausible range of a known variable")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="score the gridded forecasts on dask.distributed, one task per method and field: a "
                        "scheduler address tcp://host:port or 'local' for a local cluster (default: threads in this "
                        "process; 'threads' too); the same scores bit for bit where the workers' BLAS runs on as many "
                        "threads as this process's")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder (as a whole)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    from smoeweather.postprocess.options import add_table_arguments

    add_table_arguments(p)  # site forecasts: the columns of a site table (CSV/Parquet)


def parse_thresholds(items: list[str] | None) -> dict[str, list[Any]] | None:
    """``["temperature_850=265,275", "temperature_500=-5degC"]`` → {field: [values]}: plain numbers (in the
    field's units) as floats, numbers with units as :class:`smoeweather.units.Quantity` (converted to the
    truth's units when it is opened); ValueError naming --thresholds otherwise."""
    from smoeweather.units import parse_quantity

    if not items:
        return None
    out: dict[str, list[Any]] = {}
    for item in items:
        name, _, values = item.partition("=")
        try:
            quantities = [parse_quantity(v, "--thresholds") for v in values.split(",") if v.strip()]
        except ValueError:
            quantities = []
        out[name] = [q.value if q.units is None else q for q in quantities]
        if not name or not out[name]:
            raise ValueError(f"--thresholds {item!r}: expected FIELD=T1[,T2...] with numbers in the field's units "
                             "or with their own, e.g. temperature_850=265,275 or temperature_850=-5degC")
    return out


def check_method_names(named: list[list[str]]) -> None:
    """ValueError naming a method given twice or without a name in the forecasts' ``NAME=PATH`` (the second
    replaced the first, which was never scored)."""
    from smoeweather.io import printable

    names = [name for name, _ in named]
    if "" in names:
        raise ValueError(f"forecast {printable(named[names.index('')][1])}: '=PATH' names no method; give NAME=PATH")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        paths = [path for name, path in named if name == twice[0]]
        raise ValueError(f"method name {printable(twice[0])!r} is given twice ({', '.join(map(printable, paths))}): "
                         "give every forecast its own NAME=PATH")


def run(args: argparse.Namespace) -> int:
    from pipelines.cli import storage_options as json_storage_options
    from pipelines.readers._files import decoding_errors
    from smoeweather.evaluate.run import evaluate
    from smoeweather.evaluate.sites import is_site_run

    forecasts: dict[str, str] | list[str] = [p for p in args.forecasts if "=" not in p]
    named = [p.split("=", 1) for p in args.forecasts if "=" in p]
    if named:
        if forecasts:
            raise ValueError("name every forecast (NAME=PATH) or none")
        check_method_names(named)
        forecasts = {k: v for k, v in named}
    for q in args.binary_quantiles:
        if not 0.0 < q < 1.0:
            raise ValueError(f"--binary-quantiles must lie in (0, 1), got {q}")
    truth = args.truth[0] if len(args.truth) == 1 else args.truth
    sites = is_site_run(forecasts, truth)
    with decoding_errors([forecasts, truth, args.climatology, args.land_sea_mask]):  # a truncated zarr chunk
        scores = evaluate(forecasts, truth, climatology=args.climatology, out_dir=args.out,
                          references=not args.no_references,
                          climatology_years=tuple(args.climatology_years) if args.climatology_years else None,
                          regions=args.regions or (None if sites else "default"), land_sea_mask=args.land_sea_mask,
                          land_threshold=args.land_threshold, spectra=args.spectra,
                          spectra_band=tuple(args.spectra_band), spectra_recipe=args.spectra_recipe,
                          storage_options=json_storage_options(args.storage_options),
                          ensemble_dim=args.ensemble_dim, binary_quantiles=tuple(args.binary_quantiles),
                          allow_missing=args.allow_missing, thresholds=parse_thresholds(args.thresholds),
                          bss_reference=args.bss_reference, overwrite=args.overwrite, progress=not args.quiet,
                          plausibility_check=not args.no_plausibility_check, scheduler=args.scheduler,
                          table={"variable": args.table_variable, "lead": args.table_lead, "time_kind": args.table_time,
                                 "members": args.table_members, "units": args.units})
    if "rank_histogram" in scores:  # ensembles: rank histograms also as a figure
        from smoeweather.plotting.ensembles import plot_rank_histograms

        plot_rank_histograms(scores, args.out / "rank_histograms.png")
    _summary(scores, *(["sqrt of the mean over the (initialisation, station) cases"] if sites else []))
    print(f"smoe evaluate: wrote {args.out}/scores.nc, scores.json, scores.md (all scores)"
          + (" (site forecasts: no WeatherBench 2 files, they are for grids)" if sites else
             ", wb2/ (WeatherBench 2 evaluation files)"))
    return 0


def _summary(scores: Any, where: str = "sqrt after the time mean, global") -> None:
    """A short printout: the headline RMSE table (the rest is in scores.md)."""
    from smoeweather.data.forecast_stores import lead_label
    from smoeweather.evaluate.files import headline

    h = headline(scores)
    leads = [lead_label(td) for td in h["prediction_timedelta"].values]
    print(f"RMSE ({where}):")
    for f in h["field"].values.tolist():
        row = "  ".join(f"{lead}" for lead in leads)
        print(f"  {f}  [{row}]")
        for m in h["method"].values.tolist():
            vals = h["rmse"].sel({"method": m, "field": f}).values
            print(f"    {m:<20} " + "  ".join("–" if np.isnan(v) else f"{v:.4g}" for v in vals))
