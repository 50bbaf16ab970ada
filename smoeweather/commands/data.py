"""``smoe data prepare|world|stats|gcm-world|gcm-ens``: raw files → analysis-ready zarr (the ``pipelines``
package), and the GCM worlds generated on your CPU (``pipelines.gcm``, extra ``[gcm]``)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "data"
GCM_VERBS = ("gcm-world", "gcm-ens")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pipelines.cli import add_data_commands

    add_data_commands(sub)
    verbs = next(a for a in sub.choices["data"]._actions if isinstance(a, argparse._SubParsersAction))
    _add_gcm_verbs(verbs)


def _add_gcm_verbs(verbs: argparse._SubParsersAction) -> None:
    world = verbs.add_parser(
        "gcm-world",
        help="simulate the GCM world (dry primitive equations, land-sea/seasonal/mountain forcing; needs .[gcm])",
        description="Simulate the GCM world with the dinosaur-torch spectral core and write "
        "OUT/gcm_5.625deg_yearN.nc (the layout the configs read: 6-hourly Z and T on 250-925 hPa, surface "
        "pressure, land-sea mask, orography). Time on 2 CPU cores: docs/guide/gcm-worlds.md.",
    )
    world.add_argument("--out", required=True, type=Path, help="output folder")
    world.add_argument("--years", type=int, default=2, help="model years, one file each (default 2)")
    world.add_argument("--days", type=int, default=365, help="days per file (default 365; fewer for a preview)")
    world.add_argument("--seed", type=int, default=0, help="random seed of the initial state (default 0)")
    world.add_argument("--truncation", type=int, default=21, choices=(21, 31, 42),
                       help="spectral truncation T (default 21; the shared gcm_world used 31)")
    world.add_argument("--dt-minutes", type=float, default=30.0, help="time step in minutes (default 30)")
    world.add_argument("--spin-up-days", type=float, default=200.0, help="discarded spin-up (default 200)")
    world.add_argument("--start", default="2001-01-01", help="date label of the first output (default 2001-01-01)")
    world.add_argument("--overwrite", action="store_true", help="replace existing files")
    world.add_argument("--threads", type=int, default=1,
                     help="intra-op threads (default 1: the T21 transforms are too small to gain from more)")
    world.add_argument("--quiet", action="store_true", help="no progress bars")

    ens = verbs.add_parser(
        "gcm-ens",
        help="ensemble reforecasts of the GCM world by an imperfect model, with truth (needs .[gcm])",
        description="A truth run of the GCM world and, every --every-days days, a --members-member "
        "ensemble of an imperfect forecast model (almost no land coupling) at 24 h and 48 h lead, written "
        "as OUT/gcm_ens_YEAR.nc in the layout the post-processing configs read. Time on 2 CPU cores: "
        "docs/guide/gcm-worlds.md.",
    )
    ens.add_argument("--out", required=True, type=Path, help="output folder")
    ens.add_argument("--year", type=int, default=2005, help="calendar label of the stream (default 2005)")
    ens.add_argument("--days", type=int, default=300, help="days of initialisations (default 300)")
    ens.add_argument("--seed", type=int, default=2, help="seed of the truth run and perturbations (default 2)")
    ens.add_argument("--members", type=int, default=10, help="ensemble members (default 10)")
    ens.add_argument("--every-days", type=int, default=2, help="days between initialisations (default 2)")
    ens.add_argument("--truncation", type=int, default=21, choices=(21, 31, 42),
                     help="spectral truncation T (default 21, as the shared gcm_ens)")
    ens.add_argument("--dt-minutes", type=float, default=30.0, help="time step in minutes (default 30)")
    ens.add_argument("--spin-up-days", type=float, default=200.0, help="discarded spin-up (default 200)")
    ens.add_argument("--overwrite", action="store_true", help="replace an existing file")
    ens.add_argument("--threads", type=int, default=1,
                     help="intra-op threads (default 1: the T21 transforms are too small to gain from more)")
    ens.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    if args.data_verb in GCM_VERBS:
        return _run_gcm(args)
    from pipelines.cli import run_data_command

    return run_data_command(args)


def _run_gcm(args: argparse.Namespace) -> int:
    import sys

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
    if args.data_verb == "gcm-world":
        paths = gcm.generate_world(args.out, years=args.years, days_per_year=args.days, seed=args.seed,
                                   truncation=args.truncation, dt_minutes=args.dt_minutes,
                                   spin_up_days=args.spin_up_days, start=args.start, overwrite=args.overwrite,
                                   progress=not args.quiet)
    else:
        paths = [gcm.generate_ensemble(args.out, year=args.year, days=args.days, seed=args.seed,
                                       members=args.members, every_days=args.every_days,
                                       truncation=args.truncation, dt_minutes=args.dt_minutes,
                                       spin_up_days=args.spin_up_days, overwrite=args.overwrite,
                                       progress=not args.quiet)]
    for p in paths:
        print(p)
    return 0
