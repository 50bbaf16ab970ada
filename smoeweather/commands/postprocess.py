"""``smoe postprocess``: fit a post-processing model once, apply it to any later forecast; EMOS
cross-validation; a synthetic imperfect ensemble for demos.

    smoe postprocess fit [--method emos] [--per-gridpoint] --forecast ENS ... [--truth TRUTH]
                         [--train-period A B] [--variables VAR ...] --out MODEL.nc
    smoe postprocess fit --method drn --forecast ENS ... [--window 25D --lag 2D] [--drn-epochs N]
                         --out DRN.nc
    smoe postprocess apply (--emos MODEL.nc | --drn DRN.nc | --network CKPT) --forecast NEW ...
                           --out PP.zarr|PP.nc [--apply-period A B]
                           [--members N [--members-out ENS_PP.zarr]]
                           [--quantiles 0.1 0.5 0.9 [--quantiles-out Q.zarr]]
                           [--thresholds (T ... | VAR=T1,T2 ...) [--below]] [--percentiles 10 50 90]
    smoe postprocess crossval --forecast ENS ... [--truth TRUTH] [--fold year|month] --out DIR
    smoe postprocess synthetic STORE --out ENS.zarr [--members 10] [--lead 24h 48h]
                               [--init A B] [--seed 0]

ENS/NEW: an ensemble store (WeatherBench 2 conventions), a gcm_ens reforecast file or a forecast file such as
SEAS5 hindcasts (sdate/ftime/member); TRUTH: a canonical store with valid times (default: the truth inside ENS).
MODEL.nc (``--emos``): CF netCDF of the EMOS coefficients (smoeweather.postprocess.model_file);
CKPT (``--network``): a post-processing network checkpoint of ``smoe train`` (loaded without Lightning).
``apply`` writes the Gaussian (μ, σ) store to --out, and with --members N the ECC-Q calibrated members
(an ensemble store, default PP_members.zarr) and with --quantiles a quantile store (default
PP_quantiles.zarr): one store per product, each with its own forecast_kind, all scored by ``smoe evaluate``,
all in IMPROVER's names (probability_of_X_above_threshold, realization). An output named .nc is a CF netCDF
file (IMPROVER's layout: time = validity, forecast_reference_time, forecast_period), one named .zarr a zarr
store; the default paths take --out's suffix.
Every check (model vs forecast: field, level, lead, members, grid; outputs that exist without --overwrite)
runs before anything is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from smoeweather.commands.options import add_settings, settings_of_args
from smoeweather.postprocess.options import (
    FIT_METHODS,
    DRNSettings,
    EMOSSettings,
    NetworkSettings,
    add_table_arguments,
)

NAME = "postprocess"


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """Where dask runs, progress and the site-table columns: every ``fit`` and ``apply``."""
    p.add_argument("--scheduler", default=None,
                   help="dask.distributed scheduler address tcp://host:port (default: a local cluster; "
                        "'threads' for no cluster)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_table_arguments(p)


def _window_arguments(p: argparse.ArgumentParser) -> None:
    """Rolling training windows of a fit (EMOS and DRN, :mod:`smoeweather.postprocess.rolling`)."""
    p.add_argument("--window", help="rolling training window, e.g. 25D: one fit per forecast date")
    p.add_argument("--lag", default=None,
                   help="with --window: the window ends this long before each date (default: the longest lead)")
    p.add_argument("--dates", nargs=2, metavar=("START", "END"),
                   help="with --window: forecast dates to fit (default: every date with a full window)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("postprocess", help="post-process ensembles: fit once (EMOS), apply many (EMOS or network)",
                       description=__doc__)  # its indented synopsis keeps its lines (cli._PlainHelpFormatter)
    verbs = p.add_subparsers(dest="pp_verb", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--overwrite", action="store_true", help="replace existing outputs")

    f = verbs.add_parser("fit", parents=[common], help="fit EMOS coefficients → CF netCDF model file")
    f.add_argument("--method", choices=FIT_METHODS, default=FIT_METHODS[0],
                   help="emos (default) or drn: a distributional regression network with a location embedding")
    f.add_argument("--forecast", type=Path, nargs="+", required=True,
                   help="training ensemble: store(s) or forecast file(s), concatenated along init time")
    f.add_argument("--truth", type=Path, help="truth store (valid times); default: the truth inside --forecast")
    f.add_argument("--train-period", nargs=2, metavar=("A", "B"),
                   help="init times used for fitting (dates or years, inclusive; default: all)")
    f.add_argument("--variables", nargs="+", help="ensemble variables to fit (default: all)")
    f.add_argument("--out", type=Path, required=True, help="model file (netCDF, e.g. emos.nc)")
    f.add_argument("--no-plausibility-check", action="store_true",
                   help="do not refuse ensemble/truth values outside the plausible range of a known variable")
    add_settings(f, EMOSSettings)  # --per-gridpoint/--per-site, --predictors, --distribution, --iterations
    _window_arguments(f)
    _run_arguments(f)
    add_settings(f.add_argument_group("DRN (--method drn): distributional regression network"), DRNSettings)

    a = verbs.add_parser("apply", parents=[common], help="calibrate a forecast with EMOS or a network")
    which = a.add_mutually_exclusive_group()
    which.add_argument("--emos", type=Path, metavar="MODEL.nc", help="EMOS model file of `smoe postprocess fit`")
    which.add_argument("--drn", type=Path, metavar="MODEL.nc", help="DRN model file of `smoe postprocess fit "
                       "--method drn`")
    which.add_argument("--network", type=Path, metavar="CKPT",
                       help="post-processing network checkpoint of `smoe train` (task postprocess), or its export "
                            "folder")
    a.add_argument("legacy_model", nargs="?", type=Path, help=argparse.SUPPRESS)  # the old spelling: refused
    a.add_argument("--forecast", type=Path, nargs="+", required=True,
                   help="ensemble store(s) or forecast file(s) to calibrate (several: concatenated along init time)")
    a.add_argument("--out", type=Path, required=True,
                   help="Gaussian (μ, σ) output: PP.zarr (zarr store) or PP.nc (CF netCDF, IMPROVER's layout)")
    a.add_argument("--apply-period", nargs=2, metavar=("A", "B"), help="init times to calibrate (default: all)")
    a.add_argument("--members", type=int, help="also write N ECC-Q calibrated members (N = raw member count)")
    a.add_argument("--members-out", type=Path,
                   help="members output, .zarr or .nc (default: <out>_members.<suffix of --out>)")
    a.add_argument("--quantiles", nargs="+", type=float, help="also write these predictive quantiles, e.g. 0.1 0.5 0.9")
    a.add_argument("--quantiles-out", type=Path,
                   help="quantile output, .zarr or .nc (default: <out>_quantiles.<suffix of --out>)")
    a.add_argument("--thresholds", nargs="+", metavar="T",
                   help="also write probabilities of exceeding these thresholds (the variable's units, or a number's "
                        "own: -5degC), e.g. --thresholds 273.15 283.15; per variable: --thresholds "
                        "temperature=265,275 geopotential=54000")
    a.add_argument("--below", action="store_true", help="with --thresholds: probabilities of not exceeding them")
    a.add_argument("--thresholds-out", type=Path,
                   help="probability output, .zarr or .nc (default: <out>_probabilities.<suffix of --out>; several "
                        "variables: one per variable, <...>_<variable>)")
    a.add_argument("--percentiles", nargs="+", type=float, metavar="P",
                   help="also write these percentiles (0-100) of the predictive distribution, e.g. 10 50 90")
    a.add_argument("--percentiles-out", type=Path,
                   help="percentile output, .zarr or .nc (default: <out>_percentiles.<suffix of --out>)")
    a.add_argument("--netcdf", action="store_true",
                   help="also write every .zarr output as CF netCDF beside it (<name>.nc, IMPROVER's layout: time = "
                        "validity, forecast_reference_time, forecast_period); an output named .nc is netCDF already")
    add_settings(a, NetworkSettings)  # --batch-size
    _run_arguments(a)

    c = verbs.add_parser("crossval", parents=[common],
                         help="leave-one-year/month-out EMOS vs raw CRPS → DIR/crossval.{json,md}")
    c.add_argument("--forecast", type=Path, nargs="+", required=True,
                   help="ensemble store(s) or forecast file(s) with their truth")
    c.add_argument("--truth", type=Path, help="truth store (valid times); default: the truth inside --forecast")
    c.add_argument("--variables", nargs="+", help="ensemble variables to cross-validate (default: all)")
    c.add_argument("--fold", choices=["year", "month"], default="year", help="folds (default year)")
    add_settings(c, EMOSSettings, only=("iterations",))
    c.add_argument("--out", type=Path, required=True, help="output folder")

    s = verbs.add_parser("synthetic", parents=[common], help="seeded imperfect ensemble of a canonical store")
    s.add_argument("store", type=Path, help="canonical store (the truth)")
    s.add_argument("--out", type=Path, required=True, help="ensemble store (zarr)")
    s.add_argument("--members", type=int, default=10, help="members (default 10)")
    s.add_argument("--lead", nargs="+", default=["24h", "48h"], help="lead times (default 24h 48h)")
    s.add_argument("--init", nargs=2, metavar=("START", "END"), help="init period (default: all)")
    s.add_argument("--every", default="24h", help="init spacing (default 24h)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--variables", nargs="+", help="fields, e.g. geopotential_500 (default Z500, T850)")


def _sibling(out: Path, suffix: str) -> Path:
    return out.with_name(f"{out.stem}_{suffix}{out.suffix or '.zarr'}")


def run(args: argparse.Namespace) -> int:
    return {"fit": _fit, "apply": _apply, "crossval": _crossval, "synthetic": _synthetic}[args.pp_verb](args)


def _synthetic(args: argparse.Namespace) -> int:
    from smoeweather.postprocess.synthetic import write_synthetic_ensemble

    print(write_synthetic_ensemble(args.store, args.out, members=args.members, leads=args.lead, init=args.init,
                                   every=args.every, seed=args.seed, variables=args.variables,
                                   overwrite=args.overwrite))
    return 0


def _crossval(args: argparse.Namespace) -> int:
    from smoeweather.postprocess.crossval import crossvalidate_files

    iterations = settings_of_args(EMOSSettings, args).iterations  # checked by name before anything is read
    print(crossvalidate_files(args.forecast, args.out, truth=args.truth, variables=args.variables, fold=args.fold,
                              iterations=iterations, overwrite=args.overwrite))
    return 0


def _table_options(args: argparse.Namespace) -> dict[str, object]:
    """The site-table column options (``--table-*``) as :func:`smoeweather.data.sites.open_sites` takes them."""
    return {"variable": args.table_variable, "lead": args.table_lead, "time_kind": args.table_time,
            "members": args.table_members, "units": args.units}


def _fit(args: argparse.Namespace) -> int:
    from smoeweather.postprocess.calibrator import calibrator, fit_files
    from smoeweather.postprocess.pipeline import Run

    emos, drn = settings_of_args(EMOSSettings, args), settings_of_args(DRNSettings, args)  # checked by name
    plain = EMOSSettings()
    if args.method == "drn" and (emos.predictors != plain.predictors or emos.per_gridpoint != plain.per_gridpoint):
        raise ValueError("--method drn: --predictors members and --per-site/--per-gridpoint are EMOS options "
                         "(the DRN reads the ensemble mean and spread, and its location embedding is per site)")
    cal = calibrator(args.method, drn if args.method == "drn" else emos)
    print(fit_files(cal, args.forecast, args.out, truth=args.truth, variables=args.variables,
                    train_period=args.train_period, window=args.window, lag=args.lag, dates=args.dates,
                    table=_table_options(args), run=Run(args.scheduler, progress=not args.quiet),
                    overwrite=args.overwrite, plausibility_check=not args.no_plausibility_check))
    return 0


def apply_model(args: argparse.Namespace) -> tuple[str, Path]:
    """("emos" | "network", path) said by ``--emos`` / ``--network``; ValueError naming the new spelling for
    the old one (the model as a positional argument, told apart by its suffix)."""
    if args.legacy_model is not None:
        flag = "--network" if args.legacy_model.suffix == ".ckpt" else "--emos"
        raise ValueError(f"smoe postprocess apply {args.legacy_model}: say which model it is, e.g. "
                         f"`smoe postprocess apply {flag} {args.legacy_model} --forecast ...` (--emos MODEL.nc for "
                         "an EMOS model file, --network CKPT for a post-processing network checkpoint)")
    drn = getattr(args, "drn", None)
    if args.emos is None and args.network is None and drn is None:
        raise ValueError("smoe postprocess apply needs --emos MODEL.nc (EMOS model file of `smoe postprocess fit`), "
                         "--drn MODEL.nc (DRN model file of `smoe postprocess fit --method drn`) "
                         "or --network CKPT (post-processing network checkpoint of `smoe train`)")
    if drn is not None:
        return "drn", drn
    return ("emos", args.emos) if args.emos is not None else ("network", args.network)


def _output_forms(args: argparse.Namespace) -> object:
    """The :class:`~smoeweather.postprocess.forms.OutputForms` of ``--thresholds``/``--below``/``--percentiles``
    (checked)."""
    from smoeweather.postprocess.forms import OutputForms, check_percentiles, parse_thresholds

    if args.below and not args.thresholds:
        raise ValueError("--below needs --thresholds (probabilities of not exceeding them)")
    if args.thresholds_out and not args.thresholds:
        raise ValueError("--thresholds-out needs --thresholds")
    if args.percentiles_out and not args.percentiles:
        raise ValueError("--percentiles-out needs --percentiles")
    thresholds = parse_thresholds(args.thresholds) if args.thresholds else None
    percentiles = check_percentiles(args.percentiles) if args.percentiles else None
    thresholds_out = (args.thresholds_out or _sibling(args.out, "probabilities")) if thresholds else None
    percentiles_out = (args.percentiles_out or _sibling(args.out, "percentiles")) if percentiles is not None else None
    return OutputForms(thresholds=thresholds, below=args.below, thresholds_out=thresholds_out,
                       percentiles=percentiles, percentiles_out=percentiles_out)


def _apply(args: argparse.Namespace) -> int:
    from smoeweather.postprocess.calibrator import apply_files, load
    from smoeweather.postprocess.ecc import check_quantile_levels
    from smoeweather.postprocess.forms import Outputs
    from smoeweather.postprocess.pipeline import Run

    # every check before anything is computed or written
    method, model = apply_model(args)
    inputs = [model, args.forecast]
    outputs = Outputs(args.out, members_out=(args.members_out or _sibling(args.out, "members"))
                      if args.members is not None else None, members=args.members,
                      quantiles_out=(args.quantiles_out or _sibling(args.out, "quantiles")) if args.quantiles else None,
                      levels=check_quantile_levels(args.quantiles) if args.quantiles else None,
                      forms=_output_forms(args)).check(args.overwrite, inputs=inputs)
    if args.netcdf:  # the CF netCDF twins beside each output are outputs too
        from smoeweather.io import check_apart

        outs = [Path(p) for p in (args.out, outputs.members_out, outputs.quantiles_out, outputs.forms.thresholds_out,
                                  outputs.forms.percentiles_out) if p is not None]
        for p in outs:
            if p.suffix != ".nc":
                if p.with_suffix(".nc") in outs:
                    raise ValueError(f"--netcdf: the netCDF twin of {p} would be the output {p.with_suffix('.nc')}; "
                                     "name that output otherwise, or leave --netcdf out")
                check_apart(p.with_suffix(".nc"), inputs)
    network = settings_of_args(NetworkSettings, args)
    cal = load(model, method, network if method == "network" else None)
    for p in apply_files(cal, args.forecast, outputs, apply_period=args.apply_period, table=_table_options(args),
                         run=Run(args.scheduler, progress=not args.quiet), overwrite=args.overwrite):
        _written(p, args)
    return 0


def _written(path: Path, args: argparse.Namespace) -> None:
    """Print a written store; with ``--netcdf`` write its CF netCDF twin too."""
    print(path)
    if args.netcdf and Path(path).suffix != ".nc":
        from smoeweather.postprocess.forms import write_cf_netcdf

        print(write_cf_netcdf(Path(path), Path(path).with_suffix(".nc"), overwrite=args.overwrite))
