"""Interpretability figures of the vision MoE baselines: expert × class gate heatmaps and EMoE expert
selection frequency over training."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from smoeweather.io import atomic_path  # noqa: E402


def _save(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, overwrite=True) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def plot_expert_class_heatmap(matrix: np.ndarray, classes: list[str], title: str, path: str | Path) -> Path:
    """Heatmap of an (E, K) matrix of mean gate weight per expert (rows) and true class (columns)."""
    e, k = matrix.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * k + 2), max(2.5, 0.4 * e + 1.5)))
    im = ax.imshow(matrix, cmap="viridis", aspect="auto", vmin=0)
    ax.set_xticks(range(k), classes if k <= 20 else [""] * k)
    ax.set_yticks(range(e), [f"expert {i}" for i in range(e)])
    ax.set_xlabel("true class")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="mean gate weight")
    return _save(fig, Path(path))


def plot_selection_frequency(steps: np.ndarray, frequency: np.ndarray, path: str | Path,
                             title: str = "EMoE expert selection frequency") -> Path:
    """Lines of the fraction of tokens selecting each expert, (T, N) ``frequency`` at training ``steps``."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for n in range(frequency.shape[1]):
        ax.plot(steps, frequency[:, n], marker="o", ms=3, label=f"expert {n}")
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("fraction of tokens selecting the expert")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, Path(path))
