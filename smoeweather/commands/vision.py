"""``smoe vision benchmark``: the vision MoE baselines (ViT, V-MoE, E³, ResBlock-MoE, EMoE, SMoE-CNN, CNN)."""

from __future__ import annotations

import argparse
from pathlib import Path

from smoeweather.commands.options import benchmark_rows, benchmark_verb

NAME = "vision"


def add_parser(sub: argparse._SubParsersAction) -> None:
    vision = sub.add_parser("vision", help="vision MoE baselines on images (V-MoE, E³, ResBlock-MoE, EMoE, SMoE)")
    verbs = vision.add_subparsers(dest="vision_verb", required=True)
    bench = benchmark_verb(verbs, "train every row with one step budget; write the results table",
                           quick="fewer steps and smaller models (< 15 min on 2 cores)")
    benchmark_rows(bench, "vision", only="comma-separated rows (e.g. vit,vmoe_k2,e3)")
    bench.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    bench.add_argument("overrides", nargs="*", help="config overrides key.sub=value (e.g. steps=100)")


def run(args: argparse.Namespace) -> int:
    import torch

    from smoeweather.vision.table import markdown, run_benchmark

    # one intra-op thread: these models are small (batch 64 of 8×8 images), where thread hand-offs cost more than
    # they save, badly so on a loaded machine
    torch.set_num_threads(int(args.threads))
    results = run_benchmark(args.out, quick=args.quick, config=args.config, only=args.only, overrides=args.overrides)
    print(markdown(results))
    print(f"smoe vision benchmark: wrote {Path(args.out) / 'vision_benchmark.json'}")
    return 0
