"""One global map drawn by :func:`smoeweather.plotting.cartography.draw_field` (cells as projected quads) against the
same call through cartopy's own ``pcolormesh`` (``projected_corners`` patched to None: the fallback), interleaved.

Each variant draws a Robinson map of a smooth field with coastlines and graticule and renders it (``canvas.draw``);
warm (one map of each first), median of the per-round ratios. Grids: the embedded world's 5.625° (32 × 64) and
a 1.5° grid (120 × 240). Writes ``benchmarks/results/map_draw.{json,md}``. A measurement, never an assert.

    python -m benchmarks.map_draw [--rounds 7]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS, Machine, block_seconds, interleave, load_average, warm_up, write_results
from smoeweather.models.routing import regular_grid
from smoeweather.plotting import cartography

GRIDS = {"5.625° (32 × 64)": (32, 64), "1.5° (120 × 240)": (120, 240)}


def draw_map(lat: np.ndarray, lon: np.ndarray, field: np.ndarray, through_cartopy: bool) -> Callable[[], None]:
    """A callable drawing and rendering one map, through ``draw_field`` or through cartopy's ``pcolormesh``."""
    import matplotlib.pyplot as plt

    def draw() -> None:
        original = cartography.projected_corners
        if through_cartopy:
            cartography.projected_corners = lambda *args: None  # draw_field's fallback: cartopy's pcolormesh
        try:
            fig = plt.figure(figsize=(6, 3.2), dpi=100)
            ax = cartography.global_axes(fig, longitude=lon)
            cartography.draw_field(ax, field, lat, lon)
            fig.canvas.draw()
            plt.close(fig)
        finally:
            cartography.projected_corners = original
    return draw


def measure(rounds: int) -> dict[str, Any]:
    """Seconds per map of each variant on each grid, and the ratio cartopy / ours."""
    out: dict[str, Any] = {}
    for name, (h, w) in GRIDS.items():
        lat, lon = regular_grid(h, w)
        field = np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(2 * lon))[None]
        variants = {"projected quads": draw_map(lat, lon, field, False),
                    "cartopy pcolormesh": draw_map(lat, lon, field, True)}
        for fn in variants.values():
            warm_up(fn, 1)

        def progress(r: int, so_far: Any, name: str = name) -> None:
            print(f"{name} round {r}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in so_far.seconds.items()),
                  flush=True)
        result = interleave({k: (lambda fn=fn: block_seconds(fn)) for k, fn in variants.items()}, rounds,
                            on_round=progress)
        out[name] = {"seconds": result.medians(), "round_seconds": result.seconds,
                     "cartopy_over_quads": result.ratio("cartopy pcolormesh", "projected quads")}
    return out


def markdown(results: dict[str, Any], load: list[float]) -> list[str]:
    lines = ["# One Robinson map: cells as projected quads vs cartopy's pcolormesh", "",
             f"Load average at the end {load}; warm, median of interleaved rounds, each map drawn and rendered.", "",
             "| grid | projected quads s | cartopy pcolormesh s | cartopy / quads |", "|---|---:|---:|---:|"]
    for name, r in results.items():
        s = r["seconds"]
        lines.append(f"| {name} | {s['projected quads']:.3f} | {s['cartopy pcolormesh']:.3f} | "
                     f"×{r['cartopy_over_quads']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out-name", default="map_draw")
    args = parser.parse_args(argv)
    machine = Machine()
    results = measure(args.rounds)
    path = write_results(RESULTS / args.out_name, {"grids": results}, markdown(results, load_average()),
                         machine=machine)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
