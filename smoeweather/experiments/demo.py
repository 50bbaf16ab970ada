"""``smoe demo``: the quick heat-diffusion benchmark on data the project generates itself (offline)."""

from __future__ import annotations

from pathlib import Path

from smoeweather.experiments.heat import markdown_table, run_benchmark


def run_demo(out: Path) -> int:
    """Run the quick heat benchmark into ``out/heat`` and print its table; returns the exit code."""
    out = Path(out)
    doc = run_benchmark(out / "heat", quick=True)
    print(markdown_table(doc["rows"], "Heat-diffusion benchmark (quick)"))
    print(f"results: {out / 'heat' / 'heat_benchmark.md'}, {out / 'heat' / 'heat_benchmark.json'}; "
          f"plots: {out / 'heat' / 'heat_routing.png'}, {out / 'heat' / 'heat_experts.png'}")
    return 0
