"""The ``smoe`` command: one verb per stage of the pipeline (``smoe --help`` lists them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _add_heat(sub: argparse._SubParsersAction) -> None:
    heat = sub.add_parser("heat", help="location-dependent heat-diffusion benchmark (paper §3.1)")
    verbs = heat.add_subparsers(dest="heat_verb", required=True)
    gen = verbs.add_parser("generate", help="generate a heat-diffusion zarr store")
    gen.add_argument("--out", required=True, type=Path, help="output zarr store")
    gen.add_argument("--runs", type=int, default=1000, help="initial states in the train split (default 1000)")
    gen.add_argument("--val-runs", type=int, default=20, help="initial states in the validation split")
    gen.add_argument("--test-runs", type=int, default=20, help="initial states in the test split")
    gen.add_argument("--steps", type=int, default=100, help="time steps per run (default 100)")
    gen.add_argument("--size", type=int, default=64, help="grid size S (S×S, default 64)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the region map and the splits")
    gen.add_argument("--overwrite", action="store_true", help="replace an existing store")
    bench = verbs.add_parser("benchmark", help="train SMoE, baselines and ablations; write the results table")
    bench.add_argument("--out", required=True, type=Path, help="output directory")
    bench.add_argument("--quick", action="store_true", help="small data, few epochs (< 10 min on 2 cores)")
    bench.add_argument("--config", type=Path, default=None, help="benchmark YAML (default configs/heat/benchmark.yaml)")
    bench.add_argument("--only", default=None, type=lambda s: [r for r in s.split(",") if r],
                       help="comma-separated rows to run (e.g. smoe,conv)")
    bench.add_argument("--data", type=Path, default=None, help="existing heat store to use instead of generating")
    bench.add_argument("overrides", nargs="*", help="config overrides key.sub=value")


def _add_train(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model from a YAML config")
    train.add_argument("--config", required=True, type=Path, help="configs/<family>/<name>.yaml")
    train.add_argument("--init-from", type=Path, default=None, help="checkpoint to initialise weights from")
    train.add_argument("--resume", type=Path, default=None, help="checkpoint to resume training from")
    train.add_argument("overrides", nargs="*", help="config overrides key.sub=value")


def _add_skill(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("skill", help="skill vs persistence/climatology: `smoe skill {train,evaluate} -h`")


def _add_demo(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the demo on the embedded default data")
    demo.add_argument("--out", type=Path, default=Path("demo_output"), help="output directory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smoe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_heat(sub)
    from pipelines.cli import add_data_commands

    add_data_commands(sub)
    _add_train(sub)
    _add_skill(sub)
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["skill"]:  # its own parser (python -m smoeweather.experiments.skill)
        from smoeweather.experiments.skill import main as skill_main

        return skill_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "heat":
            from smoeweather.experiments import heat

            return heat.run_cli(args)
        if args.command == "data":
            from pipelines.cli import run_data_command

            return run_data_command(args)
        if args.command == "train":
            from smoeweather.training.run import run_cli

            return run_cli(args)
        if args.command == "demo":
            from smoeweather.experiments.demo import run_demo

            return run_demo(args.out)
    except (ValueError, FileExistsError, FileNotFoundError, KeyError) as err:
        print(f"smoe {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
