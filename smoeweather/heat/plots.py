"""Heat-diffusion figures (paper Fig. 3): learned routing vs true regions, learned experts vs stencils."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from smoeweather.io import atomic_path  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> None:
    with atomic_path(path, overwrite=True) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)


def plot_routing(routing: np.ndarray, regions: np.ndarray, path: str | Path) -> Path:
    """Side by side: true region map (S, S) and the SMoE's top-1 expert per location (S, S)."""
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    titles = ("true region map", "learned routing (top-1 expert, relabelled)")
    for ax, field, title in zip(axes, (regions, routing), titles):
        im = ax.imshow(field, cmap="viridis", interpolation="nearest")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, fraction=0.046, ticks=np.unique(field))
    _save(fig, path)
    return path


def plot_experts(experts: np.ndarray, stencils: np.ndarray, path: str | Path) -> Path:
    """Top row: true stencils (R, k, k); bottom row: learned expert kernels (|E|, k, k), values printed."""
    path = Path(path)
    cols = max(len(experts), len(stencils))
    fig, axes = plt.subplots(2, cols, figsize=(2.6 * cols, 5.4), squeeze=False)
    for row, (kernels, label) in enumerate(((stencils, "stencil"), (experts, "expert"))):
        for j in range(cols):
            ax = axes[row, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(kernels):
                ax.axis("off")
                continue
            k = kernels[j]
            ax.imshow(k, cmap="magma", vmin=0, vmax=1)
            for (a, b), v in np.ndenumerate(k):
                ax.text(b, a, f"{v:.4f}", ha="center", va="center", fontsize=7,
                        color="white" if v < 0.5 else "black")
            ax.set_title(f"{label} {j}")
    _save(fig, path)
    return path
