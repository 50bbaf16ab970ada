"""Do a study's numbers survive a re-run, and which learning-rate schedule? Three checks on one arm, from
study.json files of ``smoe study`` (configs/studies/gcm_ens_frontier_preview.yaml, gcm_ens_schedule_check.yaml,
gcm_ens_thread_spread.yaml):

* the same arm, same config and seeds, re-run in another process at the same thread count: the scores and
  validation losses must be bit-identical;
* the same arm at another thread count: the per-seed differences are the run-to-run spread across thread counts
  (float sums add in another order), next to the seed-to-seed spread (std over seeds) of the arm;
* cosine schedule vs the constant rate of the earlier studies, decided on the VALIDATION loss only (the best
  validation loss of each run, paired by seed, 95 % Student-t interval); test scores are not used.

Writes one markdown file (and a JSON beside it).
    python -m benchmarks.studies.study_rerun_checks --study P.json --rerun S.json --threads T.json --arm unet_16_32_64 \
        --schedule S.json --constant unet_16_32_64_constant --out benchmarks/studies/results/gcm_ens_rerun_checks.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Machine, write_results
from smoeweather.metrics.significance import t_interval
from smoeweather.studies.run import run_score


def _runs(study: dict[str, Any], arm: str) -> dict[int, dict[str, Any]]:
    return {int(r["seed"]): r for r in study["runs"] if r["variant"] == arm}


def _threads(runs: dict[int, dict[str, Any]]) -> Any:
    """The thread count the runs recorded (one value, or the list of the values found)."""
    found = list(dict.fromkeys((r.get("environment") or {}).get("threads") for r in runs.values()))
    return found[0] if len(found) == 1 else found


def checks(study: dict[str, Any], rerun: dict[str, Any] | None, threads: dict[str, Any] | None,
           schedule: dict[str, Any] | None, arm: str, constant: str, metric: str) -> dict[str, Any]:
    """The three checks as a JSON-able dict (missing inputs: the check is left out)."""
    base = _runs(study, arm)
    out: dict[str, Any] = {"arm": arm, "metric": metric, "study": study["name"], "threads": _threads(base)}
    scores = [run_score(r, metric) for r in base.values()]
    out["seed_spread"] = {"std": float(np.std(scores, ddof=1)) if len(scores) > 1 else float("nan"),
                          "n": len(scores)}
    if rerun is not None:
        again = _runs(rerun, arm)
        seeds = sorted(set(base) & set(again))
        out["rerun_same_threads"] = [
            {"seed": s, "first": run_score(base[s], metric), "second": run_score(again[s], metric),
             "identical": run_score(base[s], metric) == run_score(again[s], metric)
             and base[s].get("val_loss") == again[s].get("val_loss")} for s in seeds]
    if threads is not None:
        other = _runs(threads, arm)
        seeds = sorted(set(base) & set(other))
        diffs = [run_score(other[s], metric) - run_score(base[s], metric) for s in seeds]
        out["other_threads"] = {
            "threads": _threads(other),
            "per_seed": [{"seed": s, "base": run_score(base[s], metric), "other": run_score(other[s], metric)}
                         for s in seeds],
            "max_abs_diff": float(np.max(np.abs(diffs))) if diffs else float("nan"),
            "rms_diff": float(np.sqrt(np.mean(np.square(diffs)))) if diffs else float("nan")}
    if schedule is not None:
        cos, const = _runs(schedule, arm), _runs(schedule, constant)
        seeds = sorted(set(cos) & set(const))
        d = [cos[s]["val_loss"] - const[s]["val_loss"] for s in seeds]
        out["schedule"] = {"per_seed": [{"seed": s, "cosine": cos[s]["val_loss"], "constant": const[s]["val_loss"]}
                                        for s in seeds],
                           "cosine_minus_constant": t_interval(d),
                           "chosen": "cosine" if np.mean(d) < 0 else "constant"}
    return out


def markdown(c: dict[str, Any]) -> str:
    lines = [f"# Re-run checks: `{c['arm']}` of `{c['study']}`, {c['metric']}", ""]
    lines += [f"Seed-to-seed spread of the arm ({c['threads']} thread per run): std {c['seed_spread']['std']:.3g} over "
              f"{c['seed_spread']['n']} seeds.", ""]
    if "rerun_same_threads" in c:
        lines += ["## The same runs again (another process, same thread count)", "",
                  "| seed | first | second | bit-identical (score and validation loss) |", "|---:|---:|---:|---|"]
        lines += [f"| {r['seed']} | {r['first']!r} | {r['second']!r} | {'yes' if r['identical'] else 'NO'} |"
                  for r in c["rerun_same_threads"]]
        lines.append("")
    if "other_threads" in c:
        o = c["other_threads"]
        lines += [f"## Run-to-run spread across thread counts ({c['threads']} vs {o['threads']} threads per run)", "",
                  f"| seed | {c['threads']} thread(s) | {o['threads']} threads | difference |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['seed']} | {r['base']:.4f} | {r['other']:.4f} | {r['other'] - r['base']:+.4f} |"
                  for r in o["per_seed"]]
        lines += ["", f"Largest |difference| {o['max_abs_diff']:.3g}, RMS {o['rms_diff']:.3g}: the spread of one seed "
                  "re-run at another thread count.", ""]
    if "schedule" in c:
        s = c["schedule"]
        t = s["cosine_minus_constant"]
        lines += ["## Learning-rate schedule, chosen on the validation loss only", "",
                  "| seed | best val_loss, cosine | best val_loss, constant |", "|---:|---:|---:|"]
        lines += [f"| {r['seed']} | {r['cosine']:.5f} | {r['constant']:.5f} |" for r in s["per_seed"]]
        lines += ["", f"Cosine − constant: {t['mean']:+.3g} [{t['lo']:+.3g}, {t['hi']:+.3g}] (95 % t-interval, n = "
                  f"{t['n']}). Chosen: **{s['chosen']}** (lower mean validation loss).", ""]
    return "\n".join(lines)


def main() -> None:
    """The checks of the study files given; write the report (markdown and JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, required=True, help="study.json of the reference runs")
    p.add_argument("--rerun", type=Path, default=None, help="study.json with the same arm re-run, same threads")
    p.add_argument("--threads", type=Path, default=None, help="study.json with the same arm at other threads")
    p.add_argument("--schedule", type=Path, default=None, help="study.json with the arm and its constant-rate twin")
    p.add_argument("--arm", default="unet_16_32_64")
    p.add_argument("--constant", default="unet_16_32_64_constant")
    p.add_argument("--metric", default="geopotential_500@48h", help="TARGET@LEAD scored on the test block")
    p.add_argument("--out", type=Path, required=True, help="markdown file (a .json is written beside it)")
    a = p.parse_args()
    machine = Machine()
    load = lambda path: None if path is None else json.loads(path.read_text())  # noqa: E731
    try:
        c = checks(load(a.study), load(a.rerun), load(a.threads), load(a.schedule), a.arm, a.constant, a.metric)
    except ValueError as err:
        raise SystemExit(f"--metric {a.metric}: {err}") from err
    write_results(a.out, c, markdown(c), machine=machine)
    print(markdown(c))


if __name__ == "__main__":
    main()
