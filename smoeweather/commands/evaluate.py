"""``smoe evaluate FC.zarr [FC2.zarr ...] --truth STORE [--climatology STORE] [--regions ...] [--spectra] --out DIR``:
RMSE, bias, ACC (and CRPS, spread–skill, debiased ensemble-mean MSE, energy score for ensembles/Gaussian
forecasts) per region → DIR/scores.{nc,json,md} and DIR/wb2/METHOD.nc (WeatherBench 2 results layout)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "evaluate"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score forecasts against a truth store, with persistence/climatology")
    p.add_argument("forecasts", nargs="+", type=Path,
                   help="forecast stores (smoe forecast / smoe postprocess); NAME=PATH sets the method name")
    p.add_argument("--truth", required=True, nargs="+", help="prepared store or canonical netCDF file(s)")
    p.add_argument("--climatology", type=Path, default=None,
                   help="training store: day-of-year climatology for ACC and the climatology reference")
    p.add_argument("--climatology-years", nargs=2, type=int, default=None, metavar=("Y0", "Y1"))
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
    p.add_argument("--out", required=True, type=Path, help="output directory")


def run(args: argparse.Namespace) -> int:
    from smoeweather.evaluate import evaluate, scores_markdown

    forecasts: dict[str, Path] | list[Path] = [p for p in args.forecasts if "=" not in str(p)]
    named = [str(p).split("=", 1) for p in args.forecasts if "=" in str(p)]
    if named:
        if forecasts:
            raise ValueError("name every forecast (NAME=PATH) or none")
        forecasts = {k: Path(v) for k, v in named}
    truth = args.truth[0] if len(args.truth) == 1 else args.truth
    scores = evaluate(forecasts, truth, climatology=args.climatology, out_dir=args.out,
                      references=not args.no_references,
                      climatology_years=tuple(args.climatology_years) if args.climatology_years else None,
                      regions=args.regions or "default", land_sea_mask=args.land_sea_mask,
                      land_threshold=args.land_threshold, spectra=args.spectra,
                      spectra_band=tuple(args.spectra_band))
    print(scores_markdown(scores))
    print(f"smoe evaluate: wrote {args.out}/scores.nc, scores.json, scores.md, wb2/")
    return 0
