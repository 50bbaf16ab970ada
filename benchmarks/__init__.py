"""Speed and memory benchmarks (ratios against a baseline measured in the same run) and the studies' reports; run
each from the repository root as ``python -m benchmarks.NAME`` (:mod:`benchmarks.harness` times and records)."""
