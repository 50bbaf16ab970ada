"""Every frontier study's arm costs re-measured on this machine, each SMoE arm through both CPU expert
computations, and every frontier figure re-drawn on the new costs. A benchmark, not a test.

Quiet-machine command (about 20 min on 2 cores; the studies read their data under ``data/``: ``data/gcm_world/``
from ``smoe data gcm-world`` and ``data/gcm_ens/`` from ``smoe data gcm-ens``, or links to those folders):

    .venv/bin/python -m benchmarks.studies.frontier_costs

Dry run (one study, 1 round; numbers mean nothing): ``--studies gcm_frontier_preview --rounds 1 --no-write``.

For each study with a frontier figure under ``benchmarks/studies/results/`` (its committed study JSON holds the
finished runs, so no training is repeated):

1. every arm's cost as ``smoe study --cost-only`` measures it (:func:`smoeweather.studies.cost.measure_costs`:
   parameters, training-step FLOPs, training-step and inference time as ratios to the study's reference arm, on
   the study's threads, interleaved rounds), each SMoE arm twice: as ``smoe train`` runs it
   (``expert_compute="auto"``, which is ``used`` on CPU) and with ``expert_compute="selected"``
   (``<arm>+selected``), both in the same rounds;
2. an SMoE arm's cost on the frontier is that of its faster path (the scores do not depend on the path: the
   selected path equals the used one to float32 rounding, tests/nn/test_smoe_selected.py);
3. the study JSON's ``cost`` becomes the re-measured one (the previous one is kept as ``cost_previous``) and every
   frontier figure of the study (the ``*.json`` specs beside it written by ``smoe plot frontier``) is re-drawn;
4. ``benchmarks/studies/results/frontier_costs.{json,md}``: per study and SMoE arm, the step-time ratio before and now
   (used, selected), and the paired difference to the dense frontier [95 % t-interval] at equal step time
   before and now, and at equal FLOPs and parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, Machine, Stopwatch, command, load_average, write_results

STUDIES = REPO / "benchmarks" / "studies" / "results"
RESULTS = STUDIES
SMOE_FAMILIES = ("smoe", "smoe_ensemble")
SELECTED = "+selected"


def frontier_specs(name: str) -> list[tuple[Path, dict[str, Any]]]:
    """The ``smoe plot frontier`` outputs (JSON specs) drawn from study ``name`` alone."""
    out = []
    for path in sorted(STUDIES.glob(f"{name}_*.json")):
        spec = json.loads(path.read_text())
        if isinstance(spec, dict) and "pairs" in spec and spec.get("studies") == [name]:
            out.append((path, spec))
    return out


def frontier_studies() -> list[str]:
    """Names of the committed studies with at least one frontier figure and a study config."""
    names = []
    for path in sorted(STUDIES.glob("*.json")):
        study = json.loads(path.read_text())
        if (isinstance(study, dict) and "runs" in study and "variants" in study and study.get("cost")
                and frontier_specs(path.stem) and (REPO / "configs" / "studies" / f"{path.stem}.yaml").is_file()):
            names.append(path.stem)
    return names


def use_selected(module: Any) -> None:
    """Switch every SMoE layer of ``module`` to ``expert_compute="selected"``."""
    from smoeweather.nn.smoe import smoe_layers

    for layer in smoe_layers(module):
        layer.expert_compute = "selected"


def measure(name: str, rounds: int | None) -> dict[str, Any]:
    """The re-measured ``cost`` block of study ``name`` with a ``+selected`` twin of each SMoE arm."""
    from smoeweather.studies.cost import CostOptions, measure_costs
    from smoeweather.studies.run import environment, load_study, pin_threads

    committed = json.loads((STUDIES / f"{name}.json").read_text())
    study = load_study(REPO / "configs" / "studies" / f"{name}.yaml")
    spec = dict(study.cost or {})
    options = CostOptions(reference=str(spec.get("reference", study.baseline)), steps=int(spec.get("steps", 3)),
                          rounds=int(rounds or spec.get("rounds", 5)), warmup=int(spec.get("warmup", 2)),
                          threads=study.threads)
    pin_threads(study.threads)
    configs: dict[str, dict[str, Any]] = {}
    prepare = {}
    with tempfile.TemporaryDirectory(prefix="frontier_costs") as tmp:
        for v in study.variants:
            cfg = study.run_config(v, study.seeds[0], Path(tmp) / v.name)
            cfg.setdefault("data", {})["num_workers"] = 0
            configs[v.name] = cfg
            if committed["variants"].get(v.name, {}).get("family") in SMOE_FAMILIES:
                configs[v.name + SELECTED] = cfg
                prepare[v.name + SELECTED] = use_selected
        with Stopwatch() as watch:
            cost = measure_costs(configs, options, log=lambda m: print(f"{name}: {m}", flush=True), prepare=prepare)
    cost["environment"] = environment({"threads": options.threads})
    cost["load_average_after"] = load_average()
    cost["seconds"] = round(watch.seconds, 1)
    return cost


def frontier_cost(measured: dict[str, Any]) -> dict[str, Any]:
    """The ``cost`` block a frontier reads: each SMoE arm with its faster path's numbers (``path``: used or
    selected), the ``+selected`` twins folded in."""
    arms = measured["arms"]
    out = {k: v for k, v in measured.items() if k != "arms"}
    out["arms"] = {}
    for name, row in arms.items():
        if name.endswith(SELECTED):
            continue
        twin = arms.get(name + SELECTED)
        if twin is None:
            out["arms"][name] = dict(row)
            continue
        faster = twin if twin["train_step_ratio"] < row["train_step_ratio"] else row
        out["arms"][name] = {**faster, "path": "selected" if faster is twin else "used",
                             "used": dict(row), "selected": dict(twin)}
    return out


def verdicts(study: dict[str, Any], metric: str, frontier: str = "dense", score: str | None = None
             ) -> dict[str, dict[str, Any]]:
    """Per arm off the ``frontier`` family: its paired difference to that frontier at equal time, FLOPs and
    parameters, on the study's main score or ``score``."""
    from smoeweather.plotting.frontier import frontier_table, load_arms

    out: dict[str, dict[str, Any]] = {}
    for cost in ("time", "flops", "params"):
        arms, _ = load_arms([study], cost, metric, frontier, score)
        for row in frontier_table(arms, frontier=frontier):
            out.setdefault(row["arm"], {})[cost] = {k: row.get(k) for k in ("cost", "mean", "lo", "hi", "n")}
    return out


def redraw(name: str, study_path: Path) -> list[str]:
    """Re-draw every frontier figure of study ``name`` from ``study_path`` with its recorded settings."""
    from smoeweather.plotting.frontier import plot_frontier

    drawn = []
    for path, spec in frontier_specs(name):
        stem = path.stem.removesuffix(f"_{spec['cost']}")
        score = None if spec.get("score", "main") == "main" else spec["score"]
        with tempfile.TemporaryDirectory() as tmp:
            files = plot_frontier([study_path], Path(tmp), cost=spec["cost"], metric=spec["metric"],
                                  pairing=spec.get("pairing", "interpolate"), name=stem,
                                  frontier=spec.get("frontier", "dense"), score=score)
            for f in files:
                shutil.copyfile(f, STUDIES / f.name)
                drawn.append(f.name)
    return drawn


def markdown(report: dict[str, Any]) -> str:
    def iv(d: dict[str, Any] | None) -> str:
        if not d or d.get("mean") is None:
            return "–"
        bold = d["lo"] > 0 or d["hi"] < 0
        text = f"{d['mean']:+.3g} [{d['lo']:+.3g}, {d['hi']:+.3g}]"
        return f"**{text}**" if bold else text

    lines = ["# Frontier studies on the re-measured cost", "",
             f"Machine: {report['machine']}; load average at start {report['load_at_start']}, at the end "
             f"{report['load_at_end']}. Step time as a ratio to each study's reference arm (1 thread, interleaved "
             "rounds, median); an SMoE arm's frontier cost is its faster expert path's. Paired difference arm − "
             "dense frontier at the arm's cost (score units, lower score is better, so negative = beyond the "
             "frontier), mean [95 % t-interval over seeds]; **bold** where the interval excludes zero.", "",
             "| study | metric | frontier | SMoE arm | step ratio before | used | selected | − frontier at time, "
             "before | now | at FLOPs | at params |", "|---|---|---|---|---:|---:|---:|---|---|---|---|"]
    for name, s in report["studies"].items():
        for row in s["rows"].values():
            lines.append(f"| {name} | {row['metric']} | {row['frontier']} | {row['arm']} | {row['before']:.2f} | "
                         f"{row['used']:.2f} | "
                         f"{row['selected']:.2f} | {iv(row['verdict_before'].get('time'))} | "
                         f"{iv(row['verdict_now'].get('time'))} | {iv(row['verdict_now'].get('flops'))} | "
                         f"{iv(row['verdict_now'].get('params'))} |")
    return "\n".join(lines) + "\n"


def study_report(name: str, measured: dict[str, Any] | None, write: bool) -> dict[str, Any]:
    """Replace the study's cost (``measured``; None: the study JSON already holds the re-measured cost and the
    previous one as ``cost_previous``), re-draw its figures and compare the verdicts before and now, for every
    frontier (family, score) its figures draw."""
    path = STUDIES / f"{name}.json"
    study = json.loads(path.read_text())
    if measured is None:
        old, new = {**study, "cost": study["cost_previous"]}, study
    else:
        old, new = study, {**study, "cost": frontier_cost(measured), "cost_previous": study["cost"]}
    views = sorted({(spec["metric"], spec.get("frontier", "dense"), spec.get("score", "main"))
                    for _, spec in frontier_specs(name)})
    rows: dict[str, dict[str, Any]] = {}
    for metric, frontier, score in views:
        main = None if score == "main" else score
        before, now = verdicts(old, metric, frontier, main), verdicts(new, metric, frontier, main)
        for arm, row in new["cost"]["arms"].items():
            if "path" in row and arm in now:
                rows[f"{metric} {frontier} {score} {arm}"] = {
                    "metric": metric if score == "main" else f"{metric} ({score})", "frontier": frontier,
                    "arm": arm, "before": old["cost"]["arms"][arm]["train_step_ratio"],
                    "used": row["used"]["train_step_ratio"], "selected": row["selected"]["train_step_ratio"],
                    "path": row["path"], "verdict_before": before.get(arm, {}), "verdict_now": now.get(arm, {})}
    drawn = []
    if write and measured is not None:
        write_results(path, new)
        drawn = redraw(name, path)
    return {"rows": rows, "figures": drawn, "seconds": (measured or new["cost"]).get("seconds")}


def main() -> None:
    """Re-measure every frontier study (or rebuild the report only) and write the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--studies", nargs="*", default=None, help="study names (default: every frontier study)")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default: each study's own)")
    ap.add_argument("--no-write", action="store_true", help="measure and print only; change no committed file")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rebuild the report from the study JSONs' cost and cost_previous "
                         "(written by an earlier run)")
    args = ap.parse_args()
    machine = Machine()
    if args.report_only:
        old = json.loads((RESULTS / "frontier_costs.json").read_text())
        report = {**old, "studies": {name: study_report(name, None, False) for name in old["studies"]}}
        write_results(RESULTS / "frontier_costs", report, markdown(report), machine=machine)
        print(markdown(report))
        return
    report: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "load_at_start": machine.load_start,
                              "command": command(), "studies": {}}
    for name in args.studies or frontier_studies():
        print(f"== {name}", flush=True)
        report["studies"][name] = study_report(name, measure(name, args.rounds), not args.no_write)
    report["load_at_end"] = load_average()
    text = markdown(report)
    print(text)
    if not args.no_write:
        write_results(RESULTS / "frontier_costs", report, text, machine=machine)


if __name__ == "__main__":
    main()
