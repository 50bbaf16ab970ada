"""``smoe train``: train a model from a YAML config (weatherbench, ens10, heat, ...)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "train"


def add_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model from a YAML config")
    train.add_argument("--config", required=True, type=Path, help="configs/<family>/<name>.yaml")
    train.add_argument("--init-from", type=Path, default=None, help="checkpoint to initialise weights from")
    train.add_argument("--resume", type=Path, default=None, help="checkpoint to resume training from")
    train.add_argument("overrides", nargs="*", help="config overrides key.sub=value")


def run(args: argparse.Namespace) -> int:
    from smoeweather.training.run import run_cli

    return run_cli(args)
