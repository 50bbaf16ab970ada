"""Which step budget, chosen on validation? The same arms trained at several step budgets (one study.json per
budget, e.g. configs/studies/gcm_ens_frontier_preview.yaml at 400 steps, gcm_ens_budget_check.yaml at 1,200 and
gcm_ens_frontier.yaml at 3,000; same data, seeds and validation split), and for every arm and seed the budget whose
run reached the lowest best VALIDATION loss, among the budgets the arm was run at. Test scores are only read for
the chosen runs; nothing is selected on them.

For every arm: the test score at each budget, the budgets chosen, the test score of the chosen runs, and the
training cost of the chosen runs in step units (training-step time relative to the study's reference network ×
optimizer steps, mean over seeds). Paired differences (same seed) of the chosen runs' scores to a baseline arm and
for named pairs: mean [95 % Student-t interval, n − 1 dof].

    python -m benchmarks.studies.budget_selection --study runs/a400/study.json --study runs/b1200/study.json \
        --study runs/c3000/study.json --baseline unet_16_32_64 --pair smoe_8_16_32 unet_16_32_64 \
        --out benchmarks/studies/results/gcm_ens_budget_selection.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Machine, write_results
from smoeweather.metrics.significance import t_interval
from smoeweather.studies.run import reference_mismatch, run_score


def _step_ratios(studies: list[dict[str, Any]]) -> dict[str, float]:
    """Training-step time relative to the reference network, per arm, from the last study that measured it."""
    out: dict[str, float] = {}
    for s in studies:
        for arm, c in ((s.get("cost") or {}).get("arms") or {}).items():
            if c.get("train_step_ratio") is not None:
                out[arm] = float(c["train_step_ratio"])
    return out


def select(studies: list[dict[str, Any]], metric: str, baseline: str,
           pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Per arm and seed, the budget with the lowest best validation loss; its test score and cost."""
    by_budget: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
    for s in studies[1:]:  # one dataset: the budgets' runs are compared seed by seed
        why = reference_mismatch(studies[0].get("references") or {}, s.get("references") or {})
        if why:
            raise SystemExit(f"studies {studies[0]['name']} and {s['name']} were scored on different data (reference "
                             f"{why}): pass studies of one dataset")
    for s in studies:
        steps = int(s["steps"])
        if steps in by_budget:
            raise SystemExit(f"two studies with {steps} steps ({s['name']}): pass one study.json per budget")
        by_budget[steps] = {(r["variant"], int(r["seed"])): r for r in s["runs"]}
    budgets = sorted(by_budget)
    ratios = _step_ratios(studies)
    arms = list(dict.fromkeys(r["variant"] for s in studies for r in s["runs"]))
    out: dict[str, Any] = {"metric": metric, "budgets": budgets, "studies": [s["name"] for s in studies],
                           "baseline": baseline, "arms": {}}
    chosen_scores: dict[str, dict[int, float]] = {}
    for arm in arms:
        seeds = sorted({seed for runs in by_budget.values() for (a, seed) in runs if a == arm})
        per_budget = {}
        for b in budgets:
            vals = [run_score(by_budget[b][(arm, s)], metric) for s in seeds if (arm, s) in by_budget[b]]
            per_budget[b] = {"mean": float(np.mean(vals)) if vals else None,
                             "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else None, "n": len(vals)}
        chosen: dict[int, int] = {}
        for s in seeds:
            cands = [(by_budget[b][(arm, s)].get("val_loss"), b) for b in budgets if (arm, s) in by_budget[b]]
            cands = [(v, b) for v, b in cands if v is not None]
            if cands:  # among the budgets this arm was run at (the table shows which)
                chosen[s] = min(cands)[1]
        if not chosen:
            continue
        scores = {s: run_score(by_budget[b][(arm, s)], metric) for s, b in chosen.items()}
        chosen_scores[arm] = scores
        ratio = ratios.get(arm)
        out["arms"][arm] = {
            "per_budget": {str(b): v for b, v in per_budget.items()},
            "chosen_budget": {str(s): b for s, b in chosen.items()},
            "chosen_score": {"mean": float(np.mean(list(scores.values()))),
                             "std": float(np.std(list(scores.values()), ddof=1)) if len(scores) > 1 else None,
                             "n": len(scores)},
            "train_step_ratio": ratio,
            "chosen_cost_step_units": None if ratio is None else float(ratio * np.mean(list(chosen.values())))}
    wanted = [(a, baseline) for a in out["arms"] if a != baseline] + list(pairs)
    out["pairs"] = []
    for a, b in dict.fromkeys(wanted):
        if a not in chosen_scores or b not in chosen_scores:
            continue
        seeds = sorted(set(chosen_scores[a]) & set(chosen_scores[b]))
        d = [chosen_scores[a][s] - chosen_scores[b][s] for s in seeds]
        out["pairs"].append({"first": a, "second": b, **t_interval(d)})
    return out


def _decimals(c: dict[str, Any]) -> int:
    """Decimals that show a score to four significant figures (2 for Z500 CRPS near 20, 4 for T850 near 0.2)."""
    means = [abs(v["chosen_score"]["mean"]) for v in c["arms"].values() if v["chosen_score"]["mean"]]
    return max(2, 3 - int(np.floor(np.log10(float(np.median(means)))))) if means else 2


def _ms(v: dict[str, Any] | None, nd: int) -> str:
    if not v or v.get("mean") is None:
        return ""
    return f"{v['mean']:.{nd}f}" + (f" ± {v['std']:.{nd}f}" if v.get("std") is not None else "") + f" ({v['n']})"


def markdown(c: dict[str, Any]) -> str:
    b = c["budgets"]
    nd = _decimals(c)
    lines = [f"# Step budget chosen on validation: {c['metric']}", "",
             f"Studies: {', '.join(f'`{n}`' for n in c['studies'])} ({', '.join(f'{x:,}' for x in b)} steps). For "
             "every arm and seed the budget with the lowest best validation loss; test score of that run, mean ± "
             "seed std (n). Cost: training-step time ratio × chosen steps, mean over seeds.", "",
             "| arm | " + " | ".join(f"{x:,} steps" for x in b) + " | budgets chosen | chosen on validation "
             "| training cost (step units) |", "|---|" + "---:|" * len(b) + "---|---:|---:|"]
    for arm, v in c["arms"].items():
        counts = {x: list(v["chosen_budget"].values()).count(x) for x in b}
        chosen = ", ".join(f"{x:,}×{counts[x]}" for x in b if counts[x])
        cost = "" if v["chosen_cost_step_units"] is None else f"{v['chosen_cost_step_units']:,.0f}"
        lines.append(f"| {arm} | " + " | ".join(_ms(v["per_budget"][str(x)], nd) for x in b)
                     + f" | {chosen} | {_ms(v['chosen_score'], nd)} | {cost} |")
    lines += ["", "Paired differences of the chosen runs (first − second, same seed): mean [95 % Student-t interval, "
              "n − 1 dof] (n); **bold** where the interval excludes zero.", "", "| pair | difference |", "|---|---:|"]
    for p in c["pairs"]:
        cell = f"{p['mean']:+.{nd}f} [{p['lo']:+.{nd}f}, {p['hi']:+.{nd}f}] ({p['n']})"
        lines.append(f"| {p['first']} − {p['second']} | " + (f"**{cell}**" if p["excludes_zero"] else cell) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Select on the studies given and write the report (markdown and JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, action="append", required=True,
                   help="study.json of one step budget (repeat, one per budget)")
    p.add_argument("--metric", default="geopotential_500@48h", help="TARGET@LEAD scored on the test block")
    p.add_argument("--baseline", default="unet_16_32_64", help="arm every other arm is paired to")
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("FIRST", "SECOND"),
                   help="a further pair of arms (first − second)")
    p.add_argument("--out", type=Path, required=True, help="markdown file (a .json is written beside it)")
    a = p.parse_args()
    machine = Machine()
    studies = []
    for path in a.study:
        if not path.is_file():
            raise SystemExit(f"--study {path}: no such file; pass the study.json written by `smoe study`")
        studies.append(json.loads(path.read_text()))
    try:
        c = select(studies, a.metric, a.baseline, [tuple(x) for x in a.pair])
    except ValueError as err:
        raise SystemExit(f"--metric {a.metric}: {err}") from err
    write_results(a.out, c, markdown(c), machine=machine)
    print(markdown(c))


if __name__ == "__main__":
    main()
