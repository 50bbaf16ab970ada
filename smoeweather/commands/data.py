"""``smoe data prepare|world|stats``: raw files → analysis-ready zarr (the ``pipelines`` package)."""

from __future__ import annotations

import argparse

NAME = "data"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pipelines.cli import add_data_commands

    add_data_commands(sub)


def run(args: argparse.Namespace) -> int:
    from pipelines.cli import run_data_command

    return run_data_command(args)
