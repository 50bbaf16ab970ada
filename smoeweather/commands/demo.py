"""``smoe demo``: the whole chain on the embedded default data."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "demo"


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the demo on the embedded default data")
    demo.add_argument("--out", type=Path, default=Path("demo_output"), help="output directory")
    demo.add_argument("--steps", type=int, default=362,
                      help="optimizer steps per trained model (default 362 = 2 epochs of the default world, batch 32)")
    demo.add_argument("--threads", type=int, default=2,
                      help="intra-op threads of every step (default 2): fixed, so that runs on any machine "
                           "split reductions alike and two runs give the same tables")


def run(args: argparse.Namespace) -> int:
    from smoeweather.experiments.demo import run_demo

    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: expected a positive number of threads")
    return run_demo(args.out, steps=args.steps, threads=args.threads)
