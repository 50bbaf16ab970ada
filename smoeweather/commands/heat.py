"""``smoe heat generate|benchmark``: the location-dependent heat-diffusion benchmark (paper §3.1)."""

from __future__ import annotations

import argparse
from pathlib import Path

from smoeweather.commands.options import benchmark_rows, benchmark_verb

NAME = "heat"


def add_parser(sub: argparse._SubParsersAction) -> None:
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
    gen.add_argument("--generator", choices=("project", "reference"), default="project",
                     help="reference: the reference code's drop and float64 choices (default project)")
    gen.add_argument("--mask", type=Path, default=None,
                     help="region map .npy (S×S ints 0..R-1, e.g. the reference heat/mask.npy); overrides --size")
    gen.add_argument("--diffusivities", type=float, nargs="+", default=None,
                     help="one per region type (default 0.25 0.025 0.0025; reference: 0.0025 0.025 0.25)")
    bench = benchmark_verb(verbs, "train SMoE, baselines and ablations; write the results table",
                           quick="small data, few epochs (< 10 min on 2 cores)")
    bench.add_argument("--protocol", choices=("reference", "project"), default=None,
                       help="reference (default: the reference code's selection, generator and init) or project")
    benchmark_rows(bench, "heat", only="comma-separated rows to run (e.g. smoe,conv)")
    bench.add_argument("--data", type=Path, default=None, help="existing heat store to use instead of generating")
    bench.add_argument("overrides", nargs="*", help="config overrides key.sub=value")


def run(args: argparse.Namespace) -> int:
    import logging
    import warnings

    from pipelines.heat_diffusion import generate
    from smoeweather.heat.table import markdown_table, run_benchmark

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    if args.heat_verb == "generate":
        path = generate(args.out, runs=args.runs, val_runs=args.val_runs, test_runs=args.test_runs,
                        steps=args.steps, size=args.size, seed=args.seed, overwrite=args.overwrite,
                        generator=args.generator, mask=args.mask, diffusivities=args.diffusivities)
        print(f"wrote {path}")
        return 0
    doc = run_benchmark(args.out, quick=args.quick, config=args.config, only=args.only, data=args.data,
                        overrides=args.overrides, protocol=args.protocol)
    print(markdown_table(doc["rows"], "Heat-diffusion benchmark"))
    print(f"wrote {args.out / 'heat_benchmark.json'} and {args.out / 'heat_benchmark.md'}")
    return 0
