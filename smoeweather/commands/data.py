"""``smoe data prepare|world|stats|gcm-world|gcm-ens``: raw files → analysis-ready zarr (the ``pipelines``
package), and the GCM worlds generated on your CPU (``pipelines.gcm``, extra ``[gcm]``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

NAME = "data"
GCM_VERBS = ("gcm-world", "gcm-ens")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pipelines.cli import add_data_commands

    add_data_commands(sub)
    verbs = next(a for a in sub.choices["data"]._actions if isinstance(a, argparse._SubParsersAction))
    _add_gcm_verbs(verbs)


class PublishedConfig(NamedTuple):
    """A published GCM configuration, the defaults of its verb: its name, spectral truncation T, time step, and
    what its 200 days of spin-up come before."""

    name: str
    truncation: int
    dt_minutes: float
    before: str


GCM_WORLD = PublishedConfig("gcm_world", 31, 20.0, "output: about 25 min on one core before anything is written")
GCM_ENS = PublishedConfig("gcm_ens", 21, 30.0, "forecast")
PREVIEW_SPIN_UP_DAYS = 5.0


def _add_gcm_verbs(verbs: argparse._SubParsersAction) -> None:
    world = _gcm_parser(
        verbs, "gcm-world", GCM_WORLD,
        "simulate the GCM world (dry primitive equations, land-sea/seasonal/mountain forcing; needs .[gcm])",
        "Simulate the GCM world with the dinosaur-torch spectral core and write OUT/gcm_5.625deg_yearN.nc (the "
        "layout the configs read: 6-hourly Z and T on 250-925 hPa, surface pressure, land-sea mask, orography).",
        restarts=" (a restart file every 10 simulated days)")
    world.add_argument("--years", type=int, default=2, help="model years, one file each (default 2)")
    world.add_argument("--days", type=int, default=365, help="days per file (default 365; fewer for a preview)")
    world.add_argument("--seed", type=int, default=0, help="random seed of the initial state (default 0)")
    _model_args(world, GCM_WORLD)
    world.add_argument("--start", default="2001-01-01", help="date label of the first output (default 2001-01-01)")
    _run_args(world, replaces="existing files", transforms="the transforms")

    ens = _gcm_parser(
        verbs, "gcm-ens", GCM_ENS,
        "ensemble reforecasts of the GCM world by an imperfect model, with truth (needs .[gcm])",
        "A truth run of the GCM world and, every --every-days days, a --members-member ensemble of an imperfect "
        "forecast model (almost no land coupling) at 24 h and 48 h lead, written as OUT/gcm_ens_YEAR.nc in the "
        "layout the post-processing configs read.")
    ens.add_argument("--year", type=int, default=2005, help="calendar label of the stream (default 2005)")
    ens.add_argument("--days", type=int, default=300, help="days of initialisations (default 300)")
    ens.add_argument("--seed", type=int, default=2, help="seed of the truth run and perturbations (default 2)")
    ens.add_argument("--members", type=int, default=10, help="ensemble members (default 10)")
    ens.add_argument("--every-days", type=int, default=2, help="days between initialisations (default 2)")
    _model_args(ens, GCM_ENS)
    _run_args(ens, replaces="an existing file", transforms="the T21 transforms")


def _gcm_parser(verbs: argparse._SubParsersAction, name: str, published: PublishedConfig, summary: str, what: str,
                restarts: str = "") -> argparse.ArgumentParser:
    """The parser of the GCM verb ``name`` (help ``summary``; its description says ``what`` it writes, then the
    ``published`` defaults and the resumption, with ``restarts``), with its --out folder."""
    description = (f"{what} The defaults make the published {published.name} configuration (T{published.truncation}, "
                   f"{published.dt_minutes:g}-minute step, 200 days of spin-up before the first {published.before}; "
                   "--preview skips most of it). An interrupted run resumes where it stopped when the same command "
                   f"is run again{restarts}. Times: docs/guide/gcm-worlds.md.")
    parser = verbs.add_parser(name, help=summary, description=description)
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    return parser


def _model_args(parser: argparse.ArgumentParser, published: PublishedConfig) -> None:
    """--truncation, --dt-minutes and the spin-up options of a GCM verb, defaulting to the ``published``
    configuration's resolution and step."""
    parser.add_argument("--truncation", type=int, default=published.truncation, choices=(21, 31, 42),
                        help=f"spectral truncation T (default {published.truncation}, as the published "
                        f"{published.name})")
    parser.add_argument("--dt-minutes", type=float, default=published.dt_minutes,
                        help=f"time step in minutes (default {published.dt_minutes:g})")
    _spin_up_args(parser)


def _run_args(parser: argparse.ArgumentParser, replaces: str, transforms: str) -> None:
    """--overwrite (help: replace ``replaces``), --threads (one by default: ``transforms`` are too small to gain
    from more) and --quiet of a GCM verb."""
    parser.add_argument("--overwrite", action="store_true", help=f"replace {replaces}")
    parser.add_argument("--threads", type=int, default=1,
                        help=f"intra-op threads (default 1: {transforms} are too small to gain from more)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _spin_up_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spin-up-days", type=float, default=None,
                        help="discarded spin-up in simulated days (default 200, as the published worlds)")
    parser.add_argument("--preview", action="store_true",
                        help=f"quick look: {PREVIEW_SPIN_UP_DAYS:g} days of spin-up instead of 200 (unless "
                        "--spin-up-days is given); the files are labelled UNSPUN PREVIEW (attributes "
                        "'preview', 'spun_up'), their statistics are not the world's")


def _announce(args: argparse.Namespace, gcm: object, spin_up_days: float) -> None:
    """Say up front how long the spin-up takes before anything is written, and label previews."""
    import sys

    rate = gcm.estimate_seconds_per_day(args.truncation, args.dt_minutes)
    minutes = spin_up_days * rate / 60
    verb = args.data_verb
    if gcm.is_preview(spin_up_days):
        print(f"smoe data {verb}: UNSPUN PREVIEW: {spin_up_days:g} days of spin-up instead of "
              f"{gcm.SPIN_UP_DAYS:g} (about {minutes:.0f} min); the files are labelled so and their statistics "
              "are not the published world's", file=sys.stderr)
    else:
        print(f"smoe data {verb}: first {spin_up_days:g} simulated days of spin-up (discarded) before any output: "
              f"about {minutes:.0f} min on one core at T{args.truncation} (~{rate:g} s a simulated day on a shared "
              "2-core machine); --preview for a quick unspun look", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.data_verb in GCM_VERBS:
        return _run_gcm(args)
    from pipelines.cli import run_data_command
    from pipelines.readers._files import decoding_errors

    with decoding_errors([getattr(args, "source", None), getattr(args, "truth", None)]):  # a truncated chunk
        return run_data_command(args)


def check_gcm_args(args: argparse.Namespace) -> None:
    """ValueError naming the option of a ``gcm-world`` / ``gcm-ens`` value that cannot run (checked before the
    model is built or anything is written)."""
    import math

    dt = args.dt_minutes
    if not (math.isfinite(dt) and dt > 0) or not math.isclose(round(360 / dt) * dt, 360):
        raise ValueError(f"--dt-minutes {dt:g}: expected a positive time step in minutes that divides 6 hours "
                         "(e.g. 20 or 30)")
    positive = {"--days": args.days, "--years": getattr(args, "years", 1), "--members": getattr(args, "members", 1),
                "--every-days": getattr(args, "every_days", 1), "--threads": args.threads}
    for option, value in positive.items():
        if value < 1:
            raise ValueError(f"{option} {value}: expected a positive number")
    if args.spin_up_days is not None and not (math.isfinite(args.spin_up_days) and args.spin_up_days >= 0):
        raise ValueError(f"--spin-up-days {args.spin_up_days:g}: expected a number of days >= 0")


def _run_gcm(args: argparse.Namespace) -> int:
    import sys

    check_gcm_args(args)
    try:
        from pipelines import gcm

        gcm.check_core()
    except ImportError as err:
        print(f"smoe data {args.data_verb}: error: {err}", file=sys.stderr)
        return 2
    import torch

    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: expected a positive number of threads")
    torch.set_num_threads(args.threads)
    spin_up = args.spin_up_days
    if spin_up is None:
        spin_up = PREVIEW_SPIN_UP_DAYS if args.preview else gcm.SPIN_UP_DAYS
    _announce(args, gcm, spin_up)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if args.data_verb == "gcm-world":
        paths = gcm.generate_world(args.out, years=args.years, days_per_year=args.days, seed=args.seed,
                                   truncation=args.truncation, dt_minutes=args.dt_minutes,
                                   spin_up_days=spin_up, start=args.start, overwrite=args.overwrite,
                                   progress=not args.quiet, log=log)
    else:
        paths = [gcm.generate_ensemble(args.out, year=args.year, days=args.days, seed=args.seed,
                                       members=args.members, every_days=args.every_days,
                                       truncation=args.truncation, dt_minutes=args.dt_minutes,
                                       spin_up_days=spin_up, overwrite=args.overwrite,
                                       progress=not args.quiet, log=log)]
    for p in paths:
        print(p)
    return 0
