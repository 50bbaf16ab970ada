"""Ensemble scoring of ``smoe study`` runs (``scoring: ensemble``) and its summary tables.

Every run's best checkpoint forecasts the test period with :func:`smoeweather.forecast.run_forecast` (members of
``e3``/``deep_ensemble``, μ and σ of ``gaussian``, one field of a deterministic network), and
:func:`smoeweather.evaluate.run.evaluate` scores it against the data store: the fair CRPS (closed form for
``gaussian``; a deterministic forecast is a one-member ensemble, its CRPS its MAE), the spread/skill ratio with
√((M+1)/M), the RMSE of the ensemble mean (or μ), the rank histogram and the member diversity. The study's
main score is the CRPS; :func:`ensemble_summary` adds the other metrics and the training cost, each paired
to the baseline (same seed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

EXTRA_METRICS = ("crps_ecdf", "rmse", "spread_skill", "diversity_ratio")
"""Metrics kept per run beside the CRPS (``extra`` of ``result.json``): {metric: {lead: {target: value}}}."""


def forecast_test_period(checkpoint: str | Path, cfg: dict[str, Any], leads_h: list[int], work: Path) -> Path:
    """The forecast store ``work/forecast.zarr`` of ``checkpoint`` from initialisations every 12 h of the
    config's test period (``data.test_period``, else its ``data.test_years``) whose longest lead verifies
    inside it."""
    from smoeweather.forecast import run_forecast

    dcfg = cfg["data"]
    period = dcfg.get("test_period")
    if period is None:
        years = dcfg["test_years"]
        period = [f"{years[0]}-01-01", f"{years[-1]}-12-31T18:00"]
    end = np.datetime64(str(period[1])) - np.timedelta64(max(leads_h), "h")
    return run_forecast(dcfg["store"], checkpoint=str(checkpoint), init=(str(period[0]), str(end)), every="12h",
                        leads_h=tuple(leads_h), out=work / "forecast.zarr", progress=False)


def score_ensemble_run(checkpoint: str | Path, cfg: dict[str, Any], leads_h: list[int], targets: list[str],
                       work: Path) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """(CRPS {"72h": {target: value}}, extra) of one checkpoint on the test period; the forecast store and
    ``scores.{nc,json,md}`` (with rank histograms) stay in ``work``. ``extra`` holds :data:`EXTRA_METRICS`
    (those the forecast kind has), ``rank_histogram`` {lead: {target: [frequencies]}} and
    ``forecast_seconds`` (wall time of the test forecast)."""
    from smoeweather.evaluate.run import evaluate

    dcfg = cfg["data"]
    t0 = time.perf_counter()
    fc = forecast_test_period(checkpoint, cfg, leads_h, work)
    seconds = time.perf_counter() - t0
    scores = evaluate({"model": Path(fc)}, dcfg["store"], out_dir=work / "scores", references=False)
    fields = [str(f) for f in scores["field"].values]
    leads = [int(v) for v in scores["prediction_timedelta"].values.astype("timedelta64[h]").astype(int)]
    missing = [t for t in targets if t not in fields] + [h for h in leads_h if h not in leads]
    if missing or "crps" not in scores:
        raise ValueError(f"{checkpoint}: the evaluation has no CRPS for {missing or targets}")

    def table(metric: str) -> dict[str, dict[str, float]]:
        values = scores[metric].sel({"method": "model"}).transpose("field", "prediction_timedelta").values
        return {f"{h}h": {t: float(values[fields.index(t), leads.index(h)]) for t in targets} for h in leads_h}

    extra: dict[str, Any] = {m: table(m) for m in EXTRA_METRICS if m in scores}
    if "rank_histogram" in scores:
        rh = scores["rank_histogram"].sel({"method": "model"}).transpose("field", "prediction_timedelta", "rank").values
        extra["rank_histogram"] = {f"{h}h": {t: [float(v) for v in rh[fields.index(t), leads.index(h)]
                                                 if np.isfinite(v)] for t in targets} for h in leads_h}
    extra["forecast_seconds"] = seconds
    return table("crps"), extra


def _paired(values: dict[int, float], base: dict[int, float]) -> dict[str, Any] | None:
    """Mean, SE and 95 % Student-t interval of the same-seed differences ``values − base``."""
    from smoeweather.metrics.significance import t_interval

    seeds = sorted(set(values) & set(base))
    if not seeds:
        return None
    return t_interval([values[s] - base[s] for s in seeds])


def ensemble_summary(runs: list[dict[str, Any]], baseline: str, leads: list[str], targets: list[str]) -> dict[str, Any]:
    """Per variant: {metric: {"<target>@<lead>": {mean, std, n, diff_to_baseline}}} for the CRPS and
    :data:`EXTRA_METRICS`, plus ``cost``: training seconds (mean ± std, ratio to the baseline's mean per seed)."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["variant"], {})[int(r["seed"])] = r
    out: dict[str, Any] = {}
    base = by.get(baseline, {})

    def metric_values(rec: dict[str, Any], metric: str, lead: str, t: str) -> float | None:
        src = rec["scores"] if metric == "crps" else rec.get("extra", {}).get(metric)
        return None if src is None else float(src[lead][t])

    for variant, seeds in by.items():
        entry: dict[str, Any] = {}
        for metric in ("crps", *EXTRA_METRICS):
            cells: dict[str, Any] = {}
            for lead in leads:
                for t in targets:
                    vals = {s: v for s, r in seeds.items() if (v := metric_values(r, metric, lead, t)) is not None}
                    if not vals:
                        continue
                    a = np.array(list(vals.values()))
                    cell: dict[str, Any] = {"mean": float(a.mean()), "n": len(a),
                                            "std": float(a.std(ddof=1)) if len(a) > 1 else float("nan")}
                    bvals = {s: v for s, r in base.items() if (v := metric_values(r, metric, lead, t)) is not None}
                    if variant != baseline and (d := _paired(vals, bvals)) is not None:
                        cell["diff_to_baseline"] = d
                    cells[f"{t}@{lead}"] = cell
            if cells:
                entry[metric] = cells
        train = {s: float(r["train_seconds"]) for s, r in seeds.items() if r.get("train_seconds") is not None}
        if train:
            a = np.array(list(train.values()))
            btrain = {s: float(r["train_seconds"]) for s, r in base.items() if r.get("train_seconds") is not None}
            paired = sorted(set(train) & set(btrain))
            ratios = [train[s] / btrain[s] for s in paired]
            entry["cost"] = {"train_seconds": float(a.mean()), "train_seconds_std": float(a.std(ddof=1))
                             if len(a) > 1 else float("nan"),
                             "ratio_to_baseline": float(np.mean(ratios)) if ratios else float("nan"),
                             "forecast_seconds": float(np.mean([r["extra"].get("forecast_seconds", np.nan)
                                                                for r in seeds.values()]))}
        out[variant] = entry
    return out


def _f(x: float | None, digits: int = 4) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def ensemble_markdown(summary: dict[str, Any], baseline: str, leads: list[str], targets: list[str]) -> str:
    """Tables of :func:`ensemble_summary`: per metric the mean ± std over seeds, then the paired difference to
    the baseline (mean [95 % Student-t interval] (n), **bold** where the interval excludes zero), then the
    training cost."""
    cols = [f"{t}@{lead}" for lead in leads for t in targets]
    names = {"crps": "CRPS (fair; Gaussian closed form; MAE of a deterministic network)",
             "crps_ecdf": "CRPS of the members' empirical distribution (standard estimator; Gaussian closed form; "
                          "MAE of a deterministic network)",
             "rmse": "RMSE of the ensemble mean (μ)", "spread_skill": "spread/skill √((M+1)/M)·spread/RMSE",
             "diversity_ratio": "member diversity D/E (mean pairwise member distance / mean member error)"}
    lines: list[str] = []
    for metric, title in names.items():
        rows = [(v, e[metric]) for v, e in summary.items() if metric in e]
        if not rows:
            continue
        lines += ["", f"### {title}", "", "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for v, cells in rows:
            lines.append(f"| {v} | " + " | ".join(
                f"{_f(cells[c]['mean'])} ± {_f(cells[c]['std'], 2)} ({cells[c]['n']})" if c in cells else "–"
                for c in cols) + " |")
        diffs = [(v, cells) for v, cells in rows if v != baseline]
        if metric != "diversity_ratio" and diffs:
            lines += ["", f"Paired difference to `{baseline}` (same seed): mean [95 % Student-t interval, n − 1 "
                      "dof] (n); **bold** where the interval excludes zero.",
                      "", "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
            for v, cells in diffs:
                out = []
                for c in cols:
                    d = cells.get(c, {}).get("diff_to_baseline")
                    if d is None:
                        out.append("–")
                        continue
                    text = f"{d['mean']:+.4g} [{_f(d.get('lo'), 3)}, {_f(d.get('hi'), 3)}] ({d['n']})"
                    out.append(f"**{text}**" if d.get("excludes_zero") else text)
                lines.append(f"| {v} | " + " | ".join(out) + " |")
    costs = [(v, e["cost"]) for v, e in summary.items() if "cost" in e]
    if costs:
        lines += ["", "### Training cost (wall time of `smoe train` on this machine, all steps)", "",
                  f"| variant | train s (mean ± std) | ratio to `{baseline}` (paired) | test forecast s |",
                  "|---|---|---|---|"]
        for v, c in costs:
            lines.append(f"| {v} | {_f(c['train_seconds'])} ± {_f(c['train_seconds_std'], 2)} | "
                         f"{_f(c['ratio_to_baseline'], 3)} | {_f(c['forecast_seconds'], 3)} |")
    return "\n".join(lines) + "\n"
