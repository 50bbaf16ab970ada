"""``smoe postprocess``: ensemble forecasts → Gaussian (μ, σ) forecast stores; EMOS cross-validation; a
synthetic imperfect ensemble for demos.

    smoe postprocess --method emos [--per-gridpoint] --forecast ENS --truth TRUTH --train-period A B --out PP.zarr
    smoe postprocess --checkpoint CKPT --forecast ENS --out PP.zarr
    smoe postprocess --crossval --forecast ENS [--truth TRUTH] [--fold year|month] --out DIR
    smoe postprocess --synthetic STORE --out ENS.zarr [--members 10] [--lead 24h 48h] [--init A B] [--seed 0]

ENS: an ensemble store (WeatherBench 2 conventions) or a forecast file such as SEAS5 hindcasts
(sdate/ftime/member); TRUTH: a canonical store with valid times (default: the truth inside ENS).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "postprocess"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("postprocess", help="post-process ensembles (EMOS, ENS-10 networks) into μ/σ stores",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--method", choices=["emos"], help="statistical post-processing method")
    mode.add_argument("--checkpoint", type=Path, help="ENS-10 U-Net / SMoE-U-Net checkpoint of `smoe train`")
    mode.add_argument("--crossval", action="store_true",
                      help="leave-one-year/month-out EMOS vs raw ensemble CRPS → DIR/crossval.{json,md}")
    mode.add_argument("--synthetic", type=Path, metavar="STORE",
                      help="build a seeded imperfect ensemble (with truth = STORE) → --out ENS.zarr")
    p.add_argument("--forecast", type=Path, help="ensemble store or forecast file")
    p.add_argument("--truth", type=Path, help="truth store (valid times); default: the truth inside --forecast")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--per-gridpoint", action="store_true", help="EMOS: one fit per grid point (default global)")
    p.add_argument("--train-period", nargs=2, metavar=("A", "B"),
                   help="EMOS: init times used for fitting (dates or years, inclusive)")
    p.add_argument("--apply-period", nargs=2, metavar=("A", "B"),
                   help="init times written (default: those outside --train-period)")
    p.add_argument("--variables", nargs="+", help="ensemble variables to use (default: all)")
    p.add_argument("--iterations", type=int, default=300, help="EMOS: L-BFGS iterations (default 300)")
    p.add_argument("--fold", choices=["year", "month"], default="year", help="--crossval folds (default year)")
    p.add_argument("--members", type=int, default=10, help="--synthetic: members (default 10)")
    p.add_argument("--lead", nargs="+", default=["24h", "48h"], help="--synthetic: lead times (default 24h 48h)")
    p.add_argument("--init", nargs=2, metavar=("START", "END"), help="--synthetic: init period (default: all)")
    p.add_argument("--every", default="24h", help="--synthetic: init spacing (default 24h)")
    p.add_argument("--seed", type=int, default=0, help="--synthetic: random seed (default 0)")
    p.add_argument("--batch-size", type=int, default=8, help="--checkpoint: init times per batch")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def _need(args: argparse.Namespace, *names: str) -> None:
    for n in names:
        if getattr(args, n) is None:
            mode = "--method emos" if args.method else "--checkpoint" if args.checkpoint else "--crossval"
            raise ValueError(f"{mode} needs --{n.replace('_', '-')}")


def run(args: argparse.Namespace) -> int:
    from smoeweather.postprocess import stores

    if args.synthetic is not None:
        from smoeweather.postprocess.synthetic import write_synthetic_ensemble

        out = write_synthetic_ensemble(args.synthetic, args.out, members=args.members, leads=args.lead,
                                       init=args.init, every=args.every, seed=args.seed,
                                       variables=args.variables, overwrite=args.overwrite)
        print(out)
        return 0
    _need(args, "forecast")
    forecast = stores.open_ensemble(args.forecast, args.variables)
    if args.checkpoint is not None:
        from smoeweather.postprocess.neural import apply_checkpoint

        if args.apply_period:
            forecast = stores.select_period(forecast, args.apply_period)
        mu, sigma, attrs = apply_checkpoint(args.checkpoint, forecast, batch_size=args.batch_size)
        print(stores.write_gaussian(mu, sigma, args.out, {**attrs, "forecast": str(args.forecast)},
                                    overwrite=args.overwrite))
        return 0
    if not args.crossval:
        _need(args, "train_period")
    truth = stores.truth_at_valid_times(forecast, stores.open_truth(args.truth, args.forecast))
    if args.crossval:
        from smoeweather.io import write_json, write_text
        from smoeweather.postprocess.crossval import crossvalidate, markdown

        result = crossvalidate(forecast, truth, fold=args.fold, iterations=args.iterations,
                               source=str(args.forecast))
        write_json(args.out / "crossval.json", result)
        write_text(args.out / "crossval.md", markdown(result))
        print(markdown(result))
        return 0
    from smoeweather.postprocess.emos import apply_emos, fit_emos

    train_fc = stores.select_period(forecast, args.train_period)
    train_truth = truth.sel(time=train_fc["time"])
    params = fit_emos(train_fc.load(), train_truth.load(), per_gridpoint=args.per_gridpoint,
                      iterations=args.iterations)
    if args.apply_period:
        target = stores.select_period(forecast, args.apply_period)
    else:
        target = stores.select_period(forecast, args.train_period, invert=True)
    mu, sigma = apply_emos(params, target)
    attrs = {"method": "emos", "per_gridpoint": int(args.per_gridpoint), "forecast": str(args.forecast),
             "truth": str(args.truth or args.forecast), "train_period": " ".join(map(str, args.train_period)),
             "lbfgs_iterations": args.iterations,
             # global fits are small enough to keep in the store's attrs (per grid point: too large)
             "emos_coefficients": None if args.per_gridpoint else json.dumps(
                 {n: {"dims": list(params[n].dims), "values": params[n].values.tolist()} for n in params.data_vars})}
    print(stores.write_gaussian(mu, sigma, args.out, attrs, overwrite=args.overwrite))
    return 0
