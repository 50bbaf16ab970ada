"""Rank histograms (Talagrand diagrams) of ensemble forecasts from ``smoe evaluate``'s scores.

``scores["rank_histogram"]`` (method, field, prediction_timedelta, rank): relative frequency of the truth's
rank among the M members, ranks 1 … M + 1 (NaN beyond M + 1 for methods with fewer members). One panel per
(field, lead), one group of bars per ensemble method, the flat 1/(M + 1) of a calibrated ensemble dashed.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402


def plot_rank_histograms(scores: xr.Dataset, path: str | Path) -> Path:
    """Write the rank histograms of every ensemble method in ``scores`` to ``path`` (PNG); ValueError when
    ``scores`` has none."""
    if "rank_histogram" not in scores:
        raise ValueError("the scores hold no rank_histogram (no ensemble forecast was evaluated)")
    rh = scores["rank_histogram"].transpose("method", "field", "prediction_timedelta", "rank")
    values = rh.values
    methods = [str(m) for m in rh["method"].values]
    keep = [i for i in range(len(methods)) if np.isfinite(values[i]).any()]
    fields = [str(f) for f in rh["field"].values]
    leads = [int(td // np.timedelta64(1, "h")) for td in rh["prediction_timedelta"].values]
    fig, axes = plt.subplots(len(fields), len(leads), figsize=(3.6 * len(leads), 2.8 * len(fields)),
                             squeeze=False, constrained_layout=True)
    width = 0.8 / max(1, len(keep))
    for a, f in enumerate(fields):
        for b, lead in enumerate(leads):
            ax = axes[a][b]
            for k, i in enumerate(keep):
                freq = values[i, a, b]
                freq = freq[np.isfinite(freq)]
                if not len(freq):
                    continue
                ranks = np.arange(1, len(freq) + 1)
                ax.bar(ranks + (k - (len(keep) - 1) / 2) * width, freq, width=width, label=methods[i])
                ax.hlines(1.0 / len(freq), 0.5, len(freq) + 0.5, colors=f"C{k}", linestyles="dashed", linewidth=0.8)
            ax.set_title(f"{f}, {lead} h", fontsize=9)
            ax.set_xlabel("rank of the truth among the members")
            ax.set_ylabel("relative frequency")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Rank histograms (dashed: flat, a calibrated ensemble)", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
