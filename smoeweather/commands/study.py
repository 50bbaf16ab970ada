"""``smoe study --config configs/studies/<name>.yaml --out DIR [key=value ...]``: variants × seeds with equal
optimizer steps, each best checkpoint scored on the test period; writes ``DIR/study.{json,md}``. Re-running
the same command continues a half-finished grid (finished runs skipped, interrupted runs resumed). Every run
pins its thread count (study key ``threads``, default 1); ``--cost-only`` measures the arms' cost alone;
``--rescore`` scores the finished runs' checkpoints again without training."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smoeweather.studies.config import StudyConfig

NAME = "study"


def add_parser(sub: argparse._SubParsersAction) -> None:
    study = sub.add_parser("study", help="seeded grid of variants with equal step budgets, scored on test time")
    study.add_argument("--config", required=True, type=Path, help="configs/studies/<name>.yaml")
    study.add_argument("--out", required=True, type=Path, help="study directory (runs/, study.json, study.md)")
    study.add_argument("--shard", default="0/1", metavar="K/N",
                       help="run only shard K of N (start N processes K = 0..N-1 to run a grid in parallel; "
                            "each trains every arm for some seeds and rewrites the summary from all finished runs); "
                            "default 0/1")
    study.add_argument("--cost-only", action="store_true",
                       help="only measure the arms' cost (parameters, training-step FLOPs, step and inference time "
                            "as a ratio to the reference arm) into DIR/cost.json; run it on a quiet machine")
    study.add_argument("--rescore", action="store_true",
                       help="score every finished run's best checkpoint again with this code's scoring (no "
                            "training; e.g. to add land and sea scores) and rewrite the study files")
    study.add_argument("overrides", nargs="*",
                       help="overrides of the study file, e.g. steps=100 seeds=[0] threads=1 lr_schedule=cosine")


def run(args: argparse.Namespace) -> int:
    from smoeweather.studies.run import load_study, run_study

    try:
        k, n = (int(v) for v in str(args.shard).split("/"))
    except ValueError as err:
        raise ValueError(f"--shard must be K/N (e.g. 0/2), got {args.shard!r}") from err
    study = load_study(args.config, args.overrides)
    check_study_out(study, args.out)
    if args.cost_only:
        from smoeweather.studies.run import finished_records, measure_study_cost, write_study

        measure_study_cost(study, args.out)
        write_study(study, finished_records(study, args.out), args.out)
        print(f"smoe study: wrote {args.out / 'cost.json'}")
        return 0
    if args.rescore:
        from smoeweather.studies.run import rescore_study

        result = rescore_study(study, args.out)
    else:
        result = run_study(study, args.out, shard=(k, n))
    from smoeweather.studies.run import markdown

    print(markdown(result))
    print(f"smoe study: wrote {args.out / 'study.json'} and {args.out / 'study.md'}")
    return 0


def check_study_out(study: StudyConfig, out: Path) -> None:
    """Refuse a study ``--out`` that is or lies inside an input: the study file, a variant's config or its
    ``data`` store (:func:`smoeweather.io.check_apart`; the study folder may hold them beside its runs)."""
    from smoeweather.commands.train import DATA_INPUTS
    from smoeweather.io import check_apart

    inputs: list[object] = [study.path]
    for variant in study.variants:
        data = study.run_config(variant, study.seeds[0] if study.seeds else 0, out / "runs").get("data") or {}
        inputs += [variant.config, *(data.get(k) for k in DATA_INPUTS)]
    check_apart(out, inputs, adds_files=True)
