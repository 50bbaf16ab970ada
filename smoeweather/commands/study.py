"""``smoe study --config configs/studies/<name>.yaml --out DIR [key=value ...]``: variants × seeds with equal
optimizer steps, each best checkpoint scored on the test period; writes ``DIR/study.{json,md}``. Re-running
the same command continues a half-finished grid (finished runs skipped, interrupted runs resumed)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "study"


def add_parser(sub: argparse._SubParsersAction) -> None:
    study = sub.add_parser("study", help="seeded grid of variants with equal step budgets, scored on test time")
    study.add_argument("--config", required=True, type=Path, help="configs/studies/<name>.yaml")
    study.add_argument("--out", required=True, type=Path, help="study directory (runs/, study.json, study.md)")
    study.add_argument("overrides", nargs="*", help="overrides of the study file, e.g. steps=100 seeds=[0]")


def run(args: argparse.Namespace) -> int:
    from smoeweather.experiments.study import load_study, run_study

    study = load_study(args.config, args.overrides)
    result = run_study(study, args.out)
    from smoeweather.experiments.study import markdown

    print(markdown(result))
    print(f"smoe study: wrote {args.out / 'study.json'} and {args.out / 'study.md'}")
    return 0
