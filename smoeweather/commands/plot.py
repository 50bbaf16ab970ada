"""``smoe plot routing|forecast|error|scores|scorecard|spectra``: global maps (cartopy, offline coastlines),
score curves, scorecards and spectra.

    smoe plot routing CKPT --out DIR [--land-sea STORE_OR_NC] [--member M]
    smoe plot forecast FC.zarr --truth STORE --field geopotential_500 --lead 72h --init 2003-01-01T00 --out DIR
    smoe plot error FC.zarr --truth STORE --field temperature_850 --lead 120h [--init T] --out DIR
    smoe plot scores DIR/scores.nc --out DIR
    smoe plot scorecard DIR/scores.nc --baseline METHOD --out DIR
    smoe plot spectra DIR/scores.nc --out DIR            (scores of smoe evaluate --spectra)
    smoe plot reliability DIR/scores.nc --out DIR       (probability forecasts or evaluate --thresholds)
    smoe plot pit DIR/scores.nc --out DIR               (Gaussian forecasts)
    smoe plot emos MODEL.nc --out DIR
    smoe plot frontier STUDY.json [STUDY.json ...] --cost {params,flops,time,infer} [--metric T@LEAD]
        [--frontier dense|ensemble] [--score crps_ecdf] --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "plot"
FILE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".gif", ".tif", ".tiff", ".eps", ".ps", ".webp", ".bmp",
                 ".html")  # an --out ending so names a figure, not the folder every plot verb writes into
PLOT_INPUTS = ("checkpoint", "land_sea", "forecast", "truth", "model", "scores", "studies")
"""The arguments of the plot verbs that name inputs: --out may hold them (files are added beside), never be or
lie inside one (:func:`smoeweather.io.check_apart`)."""
SCORES_HELP = "scores.nc written by `smoe evaluate`, or the folder it wrote (its --out)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    plot = sub.add_parser("plot", help="maps of routing, forecasts and errors; score-vs-lead curves")
    verbs = plot.add_subparsers(dest="plot_verb", required=True)
    maps = argparse.ArgumentParser(add_help=False)
    maps.add_argument("--projection", choices=("robinson", "platecarree"), default="robinson",
                      help="map projection (default robinson)")
    r = verbs.add_parser("routing", help="per SMoE gate: dominant expert, regions, margin, land-sea prior, "
                                         "usage histogram (PNG) and the routing as netCDF", parents=[maps])
    r.add_argument("checkpoint", type=Path, help="a weatherbench or ens10 checkpoint of `smoe train`")
    r.add_argument("--out", required=True, type=Path, help="output folder")
    r.add_argument("--land-sea", type=Path, default=None,
                   help="store or netCDF with land_sea_mask/lsm to rebuild the prior (default: the training store)")
    r.add_argument("--member", type=int, default=None,
                   help="E³ checkpoints: only the gates of this member (0-based), its routing within its expert group")
    for verb, text in (("forecast", "forecast, truth and their difference at one init and lead"),
                       ("error", "error map at one init, or time-mean error and RMSE maps over all inits")):
        p = verbs.add_parser(verb, help=text, parents=[maps])
        p.add_argument("forecast", type=Path, help="forecast store of `smoe forecast` (zarr or netCDF)")
        p.add_argument("--truth", required=True, help="prepared store or canonical netCDF file(s)")
        p.add_argument("--field", required=True, help="e.g. geopotential_500, temperature_850, 2m_temperature")
        p.add_argument("--lead", required=True, help="lead time, e.g. 72h")
        p.add_argument("--init", required=verb == "forecast", default=None,
                       help="initialisation time, e.g. 2003-01-01T00" + (" (required)" if verb == "forecast" else
                                                                          " (default: all inits, time mean)"))
        p.add_argument("--name", default=None, help="label of the forecast in titles (default: file name)")
        p.add_argument("--out", required=True, type=Path, help="output folder")
    e = verbs.add_parser("emos", help="maps of per-grid-point EMOS coefficients (a, b, √c, d) of a model file",
                         parents=[maps])
    e.add_argument("model", type=Path, help="model file of `smoe postprocess fit --per-gridpoint`")
    e.add_argument("--out", required=True, type=Path, help="output folder")
    s = verbs.add_parser("scores", help="score vs lead per field and metric, one line per method")
    s.add_argument("scores", type=Path, help=SCORES_HELP)
    s.add_argument("--out", required=True, type=Path, help="output folder")
    _add_frontier(verbs)
    _add_scorecard_spectra(verbs)
    for verb in verbs.choices.values():  # every plot adds files to --out: an existing one only with --overwrite
        verb.add_argument("--overwrite", action="store_true",
                          help="replace files of the same name in --out (default: refuse them)")


def _add_scorecard_spectra(verbs: argparse._SubParsersAction) -> None:
    """``smoe plot scorecard`` and ``smoe plot spectra`` (smoeweather.plotting.scorecard)."""
    c = verbs.add_parser("scorecard", help="per metric: %% difference of every method to a baseline, variables x "
                                          "leads x regions, non-significant cells hatched")
    c.add_argument("scores", type=Path, help=SCORES_HELP)
    c.add_argument("--baseline", required=True, help="the method every other is compared with, e.g. dense")
    c.add_argument("--methods", nargs="+", default=None, help="rows (default: every other method)")
    c.add_argument("--metrics", nargs="+", default=None,
                   help="metrics (default: rmse, acc, crps, ... those with per-initialisation scores)")
    c.add_argument("--alpha", type=float, default=0.05, help="significance level of the paired test (0.05)")
    c.add_argument("--limit", type=float, default=None, help="colour range +-LIMIT %% (default: from the data)")
    c.add_argument("--out", required=True, type=Path, help="output folder")
    sp = verbs.add_parser("spectra", help="forecast/truth zonal energy spectrum ratio vs wavenumber per lead")
    sp.add_argument("scores", type=Path, help=SCORES_HELP.replace("`smoe evaluate`", "`smoe evaluate --spectra`"))
    sp.add_argument("--methods", nargs="+", default=None, help="methods drawn (default: all)")
    sp.add_argument("--out", required=True, type=Path, help="output folder")
    for verb, text in (("reliability", "reliability diagram per field and threshold: observed frequency vs forecast "
                                       "probability, the diagonal, and the cases per bin"),
                       ("pit", "PIT histograms of Gaussian (mu/sigma) forecasts per field and lead")):
        c = verbs.add_parser(verb, help=text)
        c.add_argument("scores", type=Path, help=SCORES_HELP)
        c.add_argument("--methods", nargs="+", default=None, help="methods drawn (default: all that have it)")
        c.add_argument("--out", required=True, type=Path, help="output folder")


def _add_frontier(verbs: argparse._SubParsersAction) -> None:
    """``smoe plot frontier``: skill against measured cost of `smoe study` arms (smoeweather.plotting.frontier)."""
    from smoeweather.plotting.frontier import COSTS, FAMILIES, PAIRINGS

    f = verbs.add_parser("frontier", help="skill vs cost of study arms (one point per arm, seed t-intervals, the "
                                          "dense frontier as a line) and a table pairing each SMoE arm with it")
    f.add_argument("studies", type=Path, nargs="+", help="study.json files written by `smoe study`")
    f.add_argument("--cost", choices=tuple(COSTS), default="flops",
                   help="cost axis: parameters, training-step FLOPs, training-step or inference time ratio "
                        "(default flops)")
    f.add_argument("--metric", default=None,
                   help="TARGET@LEAD, e.g. geopotential_500@48h, or TARGET/REGION@LEAD for a study's land or sea "
                        "scores (default: the first target at the first lead)")
    f.add_argument("--pairing", choices=PAIRINGS, default="interpolate",
                   help="dense reference at an arm's cost: interpolate in log-cost between the two neighbouring "
                        "dense arms (default) or the nearest dense arm")
    f.add_argument("--frontier", choices=tuple(FAMILIES), default="dense",
                   help="the family drawn as the frontier line and paired with (default dense; `ensemble` pairs "
                        "E³ arms, family smoe_ensemble, with the deep ensembles of their cost)")
    f.add_argument("--score", default=None,
                   help="another score the runs recorded instead of the study's main one, e.g. crps_ecdf (the CRPS "
                        "of an ensemble's issued members)")
    f.add_argument("--name", default=None, help="file stem (default: <first study>_frontier)")
    f.add_argument("--out", required=True, type=Path, help="output folder")


def _run_frontier(args: argparse.Namespace) -> int:
    from smoeweather.plotting.frontier import plot_frontier

    for p in plot_frontier(args.studies, args.out, cost=args.cost, metric=args.metric, pairing=args.pairing,
                           name=args.name, frontier=args.frontier, score=args.score):
        args.lines.append(str(args.final_out / Path(p).relative_to(args.out)))
    return 0


def run(args: argparse.Namespace) -> int:
    """Draw into a staging folder, then add the files to ``--out`` (:func:`smoeweather.io.atomic_files`): a
    file of the same name is refused without --overwrite, before any is moved; a failed plot leaves none."""
    from smoeweather.io import atomic_files, check_apart

    check_out_folder(Path(args.out))
    check_apart(args.out, [getattr(args, name, None) for name in PLOT_INPUTS], adds_files=True)
    args.final_out, args.lines = Path(args.out), []
    try:
        with atomic_files(args.final_out, args.overwrite) as tmp:
            args.out = tmp
            try:
                rc = _run(args)
            finally:
                args.out = args.final_out
            if rc:  # a plot that failed (exit code != 0) adds no file either
                raise _Failed(rc)
    except _Failed as failed:
        return failed.rc
    for line in args.lines:  # said once the files are in place
        print(line)
    return rc


def check_out_folder(out: Path) -> None:
    """Refuse an ``--out`` that names a file (an image or document name, or an existing file): every plot verb
    writes its own named files into the folder ``--out``; ValueError with the fix."""
    if out.is_dir():
        return
    if out.exists() or out.suffix.lower() in FILE_SUFFIXES:
        what, fix = ("an existing file", out.parent / "figures") if out.exists() else \
            (f"a {out.suffix} file name", out.with_suffix(""))
        raise ValueError(f"--out {out} is {what}; expected the folder the figures are written into (each plot "
                         f"names its own files): give a folder, e.g. --out {fix}")


class _Failed(Exception):
    """A plot ended with a non-zero exit code: its staged files are dropped."""

    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


def _final(args: argparse.Namespace, paths: list) -> list[Path]:
    """``paths`` written under the staging folder ``args.out`` → where they land in ``--out``."""
    return [args.final_out / Path(p).relative_to(args.out) for p in paths]


def _run(args: argparse.Namespace) -> int:
    if args.plot_verb == "frontier":  # no maps: cartopy not needed
        return _run_frontier(args)
    if args.plot_verb in ("reliability", "pit"):
        from smoeweather.plotting.calibration import plot_pit, plot_reliability

        draw = plot_reliability if args.plot_verb == "reliability" else plot_pit
        args.lines += [str(p) for p in _final(args, draw(args.scores, args.out, methods=args.methods))]
        return 0
    try:
        from smoeweather.plotting.cartography import offline_cartopy

        offline_cartopy()
    except ImportError as err:
        print(f"smoe plot: error: {err}", file=sys.stderr)
        return 2
    if args.plot_verb == "routing":
        from smoeweather.plotting.routing import plot_routing

        result = plot_routing(args.checkpoint, args.out, args.land_sea, proj=args.projection, member=args.member)
        args.lines.append(json.dumps(result["gates"], indent=2).replace(str(args.out), str(args.final_out)))
        paths = result["netcdf"] + result["png"]
    elif args.plot_verb == "forecast":
        from smoeweather.plotting.fields import plot_forecast

        paths = [plot_forecast(args.forecast, args.truth, args.field, args.lead, args.init, args.out, args.name,
                               proj=args.projection)]
    elif args.plot_verb == "error":
        from smoeweather.plotting.fields import plot_error

        paths = [plot_error(args.forecast, args.truth, args.field, args.lead, args.out, args.init, args.name,
                            proj=args.projection)]
    elif args.plot_verb == "emos":
        from smoeweather.plotting.emos import plot_emos

        paths = plot_emos(args.model, args.out, proj=args.projection)
    elif args.plot_verb == "scorecard":
        from smoeweather.plotting.scorecard import plot_scorecard

        if not 0.0 < args.alpha < 1.0:
            raise ValueError(f"--alpha must lie in (0, 1), got {args.alpha}")
        paths = plot_scorecard(args.scores, args.out, args.baseline, methods=args.methods, metrics=args.metrics,
                               alpha=args.alpha, limit=args.limit)
    elif args.plot_verb == "spectra":
        from smoeweather.plotting.scorecard import plot_spectra

        paths = plot_spectra(args.scores, args.out, methods=args.methods)
    else:
        from smoeweather.plotting.scores import plot_scores

        paths = plot_scores(args.scores, args.out)
    args.lines += [str(p) for p in _final(args, paths)]
    return 0
