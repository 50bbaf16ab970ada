"""``smoe demo``: the whole chain on the embedded default data."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "demo"


def add_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the demo on the embedded default data")
    demo.add_argument("--out", type=Path, default=Path("demo_output"), help="output directory")
    demo.add_argument("--full", action="store_true",
                      help="the full demo: 362 optimizer steps per model (2 epochs of the default world, batch 32; "
                           "about 14 min on a quiet 2-core machine) instead of the first demo's 150 (about 4 min)")
    demo.add_argument("--steps", type=int, default=None,
                      help="optimizer steps per trained model (default 150, or 362 with --full)")
    demo.add_argument("--threads", type=int, default=2,
                      help="intra-op threads of every step (default 2): fixed, so that runs on any machine "
                           "split reductions alike and two runs give the same tables")


def run(args: argparse.Namespace) -> int:
    from smoeweather.demo import FULL_STEPS, QUICK_STEPS, run_demo

    if args.threads < 1:
        raise ValueError(f"--threads {args.threads}: expected a positive number of threads")
    steps = args.steps if args.steps is not None else FULL_STEPS if args.full else QUICK_STEPS
    if steps < 1:
        raise ValueError(f"--steps {steps}: expected a positive number of optimizer steps")
    return run_demo(args.out, steps=steps, threads=args.threads)
