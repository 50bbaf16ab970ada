"""``smoe data ...`` verbs (owned by the data pipeline; filled in by the data-pipeline work)."""

from __future__ import annotations

import argparse


def add_data_commands(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="prepare analysis-ready zarr from ERA5 / CMIP6 / ENS-10")
    data.add_subparsers(dest="data_verb", required=True)


def run_data_command(args: argparse.Namespace) -> int:
    raise NotImplementedError(args.data_verb)
