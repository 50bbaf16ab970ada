"""Statistics of a study: per-arm mean ± std over seeds, paired (same seed) differences with 95 % Student-t
intervals (:func:`~smoeweather.metrics.significance.t_interval`), and the check that all runs were scored on
one dataset."""

from __future__ import annotations

from typing import Any

import numpy as np

from smoeweather.metrics.significance import t_interval

REGIONS = ("land", "sea")  # forecast studies also score these (keys TARGET/land, TARGET/sea) when they can


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, np.float64)
    std = float(a.std(ddof=1)) if len(a) > 1 else float("nan")
    return {"mean": float(a.mean()), "std": std, "n": len(a)}


def _scores_by_variant(runs: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """variant → seed → that run's scores ({lead: {target: value}})."""
    by_variant: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by_variant.setdefault(r["variant"], {})[int(r["seed"])] = r["scores"]
    return by_variant


def run_score(run: dict[str, Any], metric: str) -> float:
    """One finished run's test score of ``metric`` (``TARGET@LEAD``, e.g. ``geopotential_500@48h``, or
    ``TARGET/REGION@LEAD`` where the study scored land and sea) from a study.json run record."""
    target, _, lead = metric.partition("@")
    try:
        return float(run["scores"][lead][target])
    except KeyError as err:
        have = {ld: sorted(v) for ld, v in run.get("scores", {}).items()}
        raise ValueError(f"run {run.get('variant')} seed {run.get('seed')} has no score {metric!r} (lead {lead!r}, "
                         f"target {target!r}; it has {have}); name the metric as TARGET@LEAD, e.g. "
                         "geopotential_500@48h") from err


def summarise(runs: list[dict[str, Any]], baseline: str, leads: list[str], targets: list[str],
              reference: tuple[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per variant, lead and target: mean ± std over seeds (ddof 1) and the paired difference to
    ``baseline`` over the seeds both have: mean, standard error std(d)/√n, n and the 95 % Student-t
    interval ``lo``…``hi`` (n − 1 dof,
    :func:`~smoeweather.metrics.significance.t_interval`; d < 0: better). With ``reference`` (name, {lead:
    {target: value}}) of a seed-free method, also the difference to it (``diff_to_reference``, same fields)."""
    by_variant = _scores_by_variant(runs)
    base = by_variant.get(baseline, {})
    out: dict[str, Any] = {}
    for variant, seeds in by_variant.items():
        entry: dict[str, Any] = {}
        for lead in leads:
            for t in targets:
                key = f"{t}@{lead}"
                item: dict[str, Any] = _stats([s[lead][t] for s in seeds.values()])
                paired = sorted(set(seeds) & set(base))
                if variant != baseline and paired:
                    d = [seeds[k][lead][t] - base[k][lead][t] for k in paired]
                    item["diff_to_baseline"] = {**t_interval(d), "seeds": paired}
                if reference is not None:
                    d = [s[lead][t] - reference[1][lead][t] for s in seeds.values()]
                    item["diff_to_reference"] = {"reference": reference[0], **t_interval(d)}
                entry[key] = item
        out[variant] = entry
    return out


def paired_differences(runs: list[dict[str, Any]], pairs: list[tuple[str, str]], leads: list[str],
                       targets: list[str]) -> list[dict[str, Any]]:
    """Per pair (a, b), lead and target that both arms scored: the difference a − b over the seeds both have,
    mean, SE, n and 95 % Student-t interval (:func:`~smoeweather.metrics.significance.t_interval`)."""
    by_variant = _scores_by_variant(runs)
    out = []
    for a, b in pairs:
        sa, sb = by_variant.get(a, {}), by_variant.get(b, {})
        seeds = sorted(set(sa) & set(sb))
        diffs = {}
        for lead in leads:
            for t in targets:
                if seeds and all(t in sa[k].get(lead, {}) and t in sb[k].get(lead, {}) for k in seeds):
                    d = [sa[k][lead][t] - sb[k][lead][t] for k in seeds]
                    diffs[f"{t}@{lead}"] = {**t_interval(d), "seeds": seeds}
        out.append({"variant": a, "against": b, "diff": diffs})
    return out


def region_targets(runs: list[dict[str, Any]], leads: list[str], targets: list[str]) -> list[str]:
    """``TARGET/REGION`` score keys (:data:`REGIONS`) that every run has at every lead, region-major."""
    keys = [f"{t}/{r}" for r in REGIONS for t in targets]
    return [k for k in keys if runs and all(k in r["scores"].get(lead, {}) for r in runs for lead in leads)]


def _leaves(tree: Any, prefix: str = "") -> dict[str, float]:
    """{"a/b/c": number} of the numbers in nested dicts."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _leaves(sub, f"{prefix}{key}/").items()}
    return {prefix.rstrip("/"): float(tree)} if isinstance(tree, int | float) else {}


def reference_mismatch(a: dict[str, Any], b: dict[str, Any], rtol: float = 1e-9) -> str | None:
    """The first reference score (``method/lead/target``) on which two runs' or studies' ``references`` differ
    by more than ``rtol`` relative, or None. Reference scores (persistence, the raw ensemble, EMOS) depend on the
    data only: on one store they agree to the rounding of a float64 sum over the test block (relative 1e-15;
    ``rtol`` leaves room for a change of summation order), while two GCM worlds differ by percent."""
    la, lb = _leaves(a), _leaves(b)
    bad = sorted(k for k in la.keys() & lb.keys() if abs(la[k] - lb[k]) > rtol * max(abs(la[k]), abs(lb[k])))
    return f"{bad[0]}: {lb[bad[0]]:.6g} against {la[bad[0]]:.6g}" if bad else None


def check_one_dataset(name: str, records: list[dict[str, Any]]) -> None:
    """Raise when the runs of one study were scored on different data (:func:`reference_mismatch`): a run trained
    on another store (``data.sources`` pointing elsewhere for one shard) would otherwise be paired with the rest."""
    runs = [r for r in records if r.get("references")]
    for record in runs[1:]:
        why = reference_mismatch(runs[0]["references"], record["references"])
        if why:
            raise ValueError(
                f"study {name}: run {record['variant']} seed {record['seed']} was scored on other data than run "
                f"{runs[0]['variant']} seed {runs[0]['seed']} (reference {why}). The runs of one study must "
                "share one data store: delete the runs made on the other data (runs/VARIANT/seedK under the "
                "study folder) and run them again")
