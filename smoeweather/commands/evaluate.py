"""``smoe evaluate FC.zarr [FC2.zarr ...] --truth STORE [--climatology STORE] --out DIR``: RMSE, bias, ACC
(and CRPS, spread–skill for ensembles/Gaussian forecasts) → DIR/scores.{nc,json,md}."""

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
                      climatology_years=tuple(args.climatology_years) if args.climatology_years else None)
    print(scores_markdown(scores))
    print(f"smoe evaluate: wrote {args.out}/scores.nc, scores.json, scores.md")
    return 0
