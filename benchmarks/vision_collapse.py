"""SMoE-CNN collapse study: accuracy over training and routing diagnostics for the CNN, the
SMoE-CNN with the layer's damping 0.1 and the fixed SMoE-CNN (configs/vision/collapse.yaml).

    python -m benchmarks.vision_collapse --out benchmarks/results/vision_collapse [--arms a,b] [--seeds 0,1]
    python -m benchmarks.vision_collapse --out benchmarks/results/vision_collapse --summary

Jobs already in OUT/jobs are skipped, so several processes with disjoint --arms/--seeds share the work.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import pin_threads, thread_defaults

thread_defaults(1, ["OMP_NUM_THREADS"])  # before torch and numpy load

from smoeweather.vision.table import collapse_study, collapse_summary  # noqa: E402


def main() -> None:
    """Run the study's jobs not done yet (unless ``--summary``), then aggregate them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None)
    parser.add_argument("--arms", default=None, type=lambda s: [a for a in s.split(",") if a])
    parser.add_argument("--seeds", default=None, type=lambda s: [int(a) for a in s.split(",") if a])
    parser.add_argument("--summary", action="store_true", help="only aggregate OUT/jobs into the result files")
    args = parser.parse_args()
    pin_threads(1)
    if not args.summary:
        collapse_study(args.out, args.config, args.arms, args.seeds)
    collapse_summary(args.out, args.config)


if __name__ == "__main__":
    main()
