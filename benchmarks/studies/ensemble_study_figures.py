"""Figures of the ensemble study from its finished runs: rank histograms (mean over seeds) of every
ensemble arm, and CRPS against training cost (each seed a point, paired to the deep ensemble). The CRPS is the
ECDF CRPS of the members where the runs have it (``extra.crps_ecdf``; docs/guide/ensembles.md, "Which CRPS"),
else the fair CRPS.

Reads ``<study>/runs/<variant>/seed<k>/result.json`` (written by ``smoe study`` with ``scoring: ensemble``),
writes ``<out>/<study dir name>_rank_histograms.png`` and ``<out>/<study dir name>_crps_cost.png``.

    python -m benchmarks.studies.ensemble_study_figures [--study runs/studies/gcm_ensembles_cpu]
        [--out benchmarks/studies/results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from smoeweather.plotting.ensembles import plot_rank_histograms  # noqa: E402


def load_runs(study: Path) -> list[dict]:
    runs = [json.loads(p.read_text()) for p in sorted(study.glob("runs/*/seed*/result.json"))]
    if not runs:
        raise FileNotFoundError(f"no finished runs (runs/*/seed*/result.json) under {study}")
    return runs


def rank_histograms(runs: list[dict]) -> xr.Dataset:
    """scores-like Dataset with ``rank_histogram`` (method, field, prediction_timedelta, rank), mean over seeds."""
    by: dict[str, list[dict]] = {}
    for r in runs:
        if "rank_histogram" in r.get("extra", {}):
            by.setdefault(r["variant"], []).append(r["extra"]["rank_histogram"])
    if not by:
        raise ValueError("no run holds a rank histogram (no ensemble arm finished)")
    first = next(iter(by.values()))[0]
    leads = list(first)
    fields = list(first[leads[0]])
    n_rank = max(len(h[lead][f]) for hs in by.values() for h in hs for lead in leads for f in fields)
    values = np.full((len(by), len(fields), len(leads), n_rank), np.nan)
    for i, hs in enumerate(by.values()):
        for j, f in enumerate(fields):
            for k, lead in enumerate(leads):
                mean = np.mean([h[lead][f] for h in hs], axis=0)
                values[i, j, k, : len(mean)] = mean
    tds = np.array([np.timedelta64(int(lead.rstrip("h")), "h") for lead in leads]).astype("timedelta64[ns]")
    return xr.Dataset({"rank_histogram": (("method", "field", "prediction_timedelta", "rank"), values)},
                      coords={"method": list(by), "field": fields, "prediction_timedelta": tds,
                              "rank": np.arange(1, n_rank + 1)})


def crps_cost(runs: list[dict], path: Path, baseline: str = "deep_ensemble") -> Path:
    """CRPS (Z500 and T850 at every lead) against training seconds, one point per run."""
    ecdf = all("crps_ecdf" in r.get("extra", {}) for r in runs)

    def crps(r: dict, lead: str, f: str) -> float:
        return r["extra"]["crps_ecdf"][lead][f] if ecdf else r["scores"][lead][f]

    leads = list(runs[0]["scores"])
    fields = list(runs[0]["scores"][leads[0]])
    fig, axes = plt.subplots(len(fields), len(leads), figsize=(4.2 * len(leads), 3.2 * len(fields)), squeeze=False,
                             constrained_layout=True)
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    for a, f in enumerate(fields):
        for b, lead in enumerate(leads):
            ax = axes[a][b]
            for c, v in enumerate(variants):
                pts = [(r["train_seconds"], crps(r, lead, f)) for r in runs
                       if r["variant"] == v and r.get("train_seconds")]
                if pts:
                    x, y = zip(*pts)
                    ax.scatter(x, y, color=f"C{c}", label=v, marker="s" if v == baseline else "o")
            ax.set_title(f"{f}, {lead}", fontsize=9)
            ax.set_xlabel("training wall time [s]")
            ax.set_ylabel("CRPS (ECDF)" if ecdf else "CRPS (fair)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("CRPS against training cost (one point per seed)", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", type=Path, default=Path("runs/studies/gcm_ensembles_cpu"))
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = p.parse_args()
    runs = load_runs(args.study)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.study.resolve().name
    print(plot_rank_histograms(rank_histograms(runs), args.out / f"{name}_rank_histograms.png"))
    print(crps_cost(runs, args.out / f"{name}_crps_cost.png"))


if __name__ == "__main__":
    main()
