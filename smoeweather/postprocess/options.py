"""Command-line options of out-of-core EMOS for ``smoe postprocess fit`` / ``apply``: where dask runs,
progress, site tables, and for ``fit`` the predictors, per-site fits and rolling training windows. Kept free
of heavy imports: the parser is built on every ``smoe`` call."""

from __future__ import annotations

import argparse

PREDICTORS = ("mean", "members")


def add_arguments(p: argparse.ArgumentParser, verb: str) -> None:
    """Add the options to the ``fit`` (``verb="fit"``) or ``apply`` parser."""
    p.add_argument("--scheduler", default=None,
                   help="dask.distributed scheduler address tcp://host:port (default: a local cluster; "
                        "'threads' for no cluster)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_table_arguments(p)
    if verb == "fit":
        p.add_argument("--per-site", dest="per_gridpoint", action="store_true",
                       help="site forecasts: one fit per site (default: global, pooled over sites)")
        p.add_argument("--predictors", choices=PREDICTORS, default="mean",
                       help="mean: mu = a + b * ensemble mean (exchangeable members, default); members: one "
                            "weight per member, mu = a + sum b_k x_k (non-exchangeable, e.g. a multi-model ensemble)")
        p.add_argument("--distribution", choices=("normal", "truncnormal"), default="normal",
                       help="predictive distribution: normal (default) or normal truncated at 0 (truncnormal, for "
                            "non-negative targets such as wind speed; EMOS and DRN)")
        d = p.add_argument_group("DRN (--method drn): distributional regression network")
        d.add_argument("--drn-hidden", type=int, default=32, help="hidden ReLU units (default 32)")
        d.add_argument("--drn-embedding", type=int, default=2, help="location embedding size (default 2)")
        d.add_argument("--drn-epochs", type=int, default=3, help="training epochs (default 3)")
        d.add_argument("--drn-seeds", type=int, default=3, help="networks averaged, one per seed (default 3)")
        d.add_argument("--drn-batch-size", type=int, default=256, help="cases per mini-batch (default 256)")
        d.add_argument("--drn-learning-rate", type=float, default=1e-2,
                       help="Adam learning rate, decaying linearly to 0 (default 1e-2)")
        d.add_argument("--drn-seed", type=int, default=0, help="random seed (default 0)")
        d.add_argument("--drn-extra", nargs="+", default=(), metavar="VAR",
                       help="extra predictors: ensemble means of these forecast variables")
        d.add_argument("--drn-warm-start", type=int, default=None, metavar="EPOCHS",
                       help="with --window: train the dates in turn, each from the previous date's weights for "
                            "EPOCHS epochs (default: every date from scratch, all dates at once)")
        p.add_argument("--window", help="rolling training window, e.g. 25D: one fit per forecast date")
        p.add_argument("--lag", default=None,
                       help="with --window: the window ends this long before each date (default: the longest lead)")
        p.add_argument("--dates", nargs=2, metavar=("START", "END"),
                       help="with --window: forecast dates to fit (default: every date with a full window)")


def add_table_arguments(p: argparse.ArgumentParser) -> None:
    """The site-table column options (``--table-*``, ``--units``), shared with ``smoe evaluate``."""
    t = p.add_argument_group("site tables (CSV/Parquet: one row per station and date)")
    t.add_argument("--table-variable", default="2m_temperature", help="field name of the table's values")
    t.add_argument("--table-lead", default="48h", help="lead time of the table's forecasts (default 48h)")
    t.add_argument("--table-time", choices=["valid", "init"], default="valid",
                   help="the date column is the valid date (default, as ensembleBMA) or the init date")
    t.add_argument("--table-members", nargs="+", help="member columns (default: every other numeric column)")
    t.add_argument("--units", default=None,
                   help="units of the table's values, e.g. K, degC or m s-1 (a table carries none; default: unset)")
