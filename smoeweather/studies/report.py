"""Reports of a study: ``study.md`` (:func:`markdown`) and ``study.json`` (:func:`write_study`) from the finished
runs' records."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from smoeweather.config import ConfigError, read_config
from smoeweather.io import write_json, write_text
from smoeweather.studies.config import StudyConfig
from smoeweather.studies.statistics import (
    REGIONS,
    check_one_dataset,
    paired_differences,
    region_targets,
    summarise,
)


def _fmt(x: float, digits: int = 4) -> str:
    return "nan" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def _interval_cell(d: dict[str, Any]) -> str:
    """``+mean [lo, hi] (n)``, bold when the 95 % interval excludes zero; records written before the
    intervals existed (mean, se, n only) get theirs from the SE and n."""
    if "lo" not in d:
        from scipy import stats

        n, se = d["n"], d["se"]
        t = float(stats.t.ppf(0.975, n - 1)) if n > 1 else float("nan")
        d = {**d, "lo": d["mean"] - t * se, "hi": d["mean"] + t * se}
        d["excludes_zero"] = bool(np.isfinite(d["lo"]) and (d["lo"] > 0 or d["hi"] < 0))
    text = f"{d['mean']:+.4g} [{_fmt(d['lo'], 3)}, {_fmt(d['hi'], 3)}] ({d['n']})"
    return f"**{text}**" if d.get("excludes_zero") else text


def markdown(study: dict[str, Any]) -> str:
    """study.md: one row per variant (mean ± std over seeds, n), then one of paired differences."""
    summary, leads, targets = study["summary"], study["leads"], study["targets"]
    cols = [f"{t}@{lead}" for lead in leads for t in targets]
    score = study.get("score", "RMSE")
    env = {k: " / ".join(map(str, v)) if isinstance(v, list) else v
           for k, v in (study.get("environment") or {}).items()}
    run_env = (f"Runs: {env.get('threads', '?')} thread(s) each, learning-rate schedule "
               f"{study.get('lr_schedule', 'config')}, CPU {env.get('cpu', '?')}"
               f"{' (' + str(env['cpu_capability']) + ')' if env.get('cpu_capability') else ''}, "
               f"code {env.get('code_version', '?')}."
               if env else "")
    lines = [f"# Study {study['name']} ({study['steps']} optimizer steps per run)", "",
             *([study["label"], ""] if study.get("label") else []),
             f"{score} in physical units on the test period, mean ± std over seeds (n); the std is the "
             "seed-to-seed spread of one arm.", "", *([run_env, ""] if run_env else []),
             "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for variant, entry in summary.items():
        cells = [f"{_fmt(entry[c]['mean'])} ± {_fmt(entry[c]['std'], 2)} ({entry[c]['n']})" for c in cols]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    for ref, scores in study.get("references", {}).items():
        lines.append(f"| {ref} | " + " | ".join(_fmt(scores[c.split('@')[1]][c.split('@')[0]]) for c in cols)
                     + " |")
    lines += ["", f"Paired difference to `{study['baseline']}` (variant − baseline, same seed): mean [95 % "
              "Student-t interval, n − 1 dof] (n); **bold** where the interval excludes zero.", "",
              "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for variant, entry in summary.items():
        if variant == study["baseline"]:
            continue
        cells = []
        for c in cols:
            d = entry[c].get("diff_to_baseline")
            if d is None:
                cells.append("–")
                continue
            cells.append(_interval_cell(d))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    pairs = [p for p in study.get("pairs") or [] if p["diff"]]
    if pairs:
        pcols = list(dict.fromkeys(c for p in pairs for c in p["diff"]))
        lines += ["", "Further paired differences (first − second arm, same seed): mean [95 % Student-t interval, "
                  "n − 1 dof] (n); **bold** where the interval excludes zero.", "",
                  "| pair | " + " | ".join(pcols) + " |", "|---" * (len(pcols) + 1) + "|"]
        for p in pairs:
            cells = [_interval_cell(p["diff"][c]) if c in p["diff"] else "–" for c in pcols]
            lines.append(f"| {p['variant']} − {p['against']} | " + " | ".join(cells) + " |")
    regional = study.get("summary_regions") or {}
    rcols = [c for c in next(iter(regional.values()), {})]
    if rcols:
        lines += ["", f"By region ({', '.join(REGIONS)}, weighted by the land fraction): mean ± std over seeds, "
                  f"then the paired difference to `{study['baseline']}` [95 % Student-t interval] (n).", "",
                  "| variant | " + " | ".join(rcols) + " |", "|---" * (len(rcols) + 1) + "|"]
        for variant, entry in regional.items():
            cells = [f"{_fmt(entry[c]['mean'])} ± {_fmt(entry[c]['std'], 2)} ({entry[c]['n']})" for c in rcols]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        for variant, entry in regional.items():
            if variant != study["baseline"]:
                cells = [_interval_cell(entry[c]["diff_to_baseline"]) if "diff_to_baseline" in entry[c] else "–"
                         for c in rcols]
                lines.append(f"| {variant} − {study['baseline']} | " + " | ".join(cells) + " |")
    ref = study.get("reference_baseline")
    if ref:
        lines += ["", f"Difference to the reference `{ref}` (variant − reference per seed): mean [95 % Student-t "
                  "interval] (n); **bold** where the interval excludes zero.", "",
                  "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for variant, entry in summary.items():
            cells = []
            for c in cols:
                d = entry[c].get("diff_to_reference")
                cells.append("–" if d is None else _interval_cell(d))
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    cost = study.get("cost")
    if cost:
        machine = [str(v) for k in ("cpu", "cpu_capability") if (v := (cost.get("environment") or {}).get(k))]
        where = " on " + " ".join(machine) if machine else ""
        lines += ["", f"Cost of one training step per arm, measured in one process on {cost['threads']} thread(s)"
                  f"{where}: "
                  f"parameters, FLOPs ({cost['flops']}), and the time of a training step and of an inference as a "
                  f"ratio to `{cost['reference']}` (interleaved, median of {cost['rounds']} rounds).", "",
                  "| variant | family | parameters | train GFLOP | train step × | inference × |",
                  "|---|---|---:|---:|---:|---:|"]
        for variant, c in cost["arms"].items():
            family = study.get("variants", {}).get(variant, {}).get("family", "")
            lines.append(f"| {variant} | {family} | {c['parameters']:,} | {c['train_flops'] / 1e9:.3g} | "
                         f"{c['train_step_ratio']:.2f} | {c['infer_ratio']:.2f} |")
    for metric, means in study.get("extra_means", {}).items():
        lines += ["", f"{metric.replace('_', '–')} (mean over seeds; references from one fit).", "",
                  "| variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for variant, entry in means.items():
            lines.append(f"| {variant} | " + " | ".join(_fmt(entry.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def portable(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it or beside it (``../shared/...``),
    else its file name: study files hold no absolute machine paths."""
    if not path:
        return ""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        rel = os.path.relpath(p, Path.cwd())
    except ValueError:
        return p.name
    return rel if not rel.startswith("../../") else p.name


def variant_family(cfg: dict[str, Any]) -> str:
    """``smoe_ensemble`` (E³: one SMoE network whose experts are the members), ``ensemble`` (any other ensemble
    network), ``smoe`` (any SMoE layer) or ``dense``: the curve an arm belongs to on a frontier plot (a
    variant's ``family`` key overrides it)."""
    model = cfg.get("model") or {}
    if str(model.get("name", "")).startswith("e3"):
        return "smoe_ensemble"
    if model.get("ensemble") or model.get("members") or str(model.get("name", "")).startswith("ensemble"):
        return "ensemble"
    if model.get("smoe") or model.get("e3") or model.get("moe"):
        return "smoe"
    return "dense"


def write_study(study: StudyConfig, records: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Assemble and atomically write ``study.json`` and ``study.md`` from finished run records (all scored on
    one dataset: :func:`check_one_dataset`)."""
    check_one_dataset(study.name, records)
    leads = [f"{lead}h" for lead in study.leads_h]
    refs = next((r["references"] for r in records if r.get("references")), {})
    runs = [{k: r[k] for k in ("variant", "seed", "steps", "scores", "best_checkpoint", "scoring")}
            | {"extra": r.get("extra", {}), "train_seconds": r.get("train_seconds"), "val_loss": r.get("val_loss"),
               "environment": r.get("environment")} for r in records]
    postprocess = any(r["scoring"] == "postprocess" for r in runs)
    ref_name = study.reference_baseline
    reference = (ref_name, refs[ref_name]) if ref_name and ref_name in refs else None
    extra_means: dict[str, dict[str, dict[str, float]]] = {}
    for metric in ("spread_skill", "bias") if postprocess else ():
        table: dict[str, dict[str, float]] = {}
        for variant in dict.fromkeys(r["variant"] for r in runs):
            vals = [r["extra"][metric] for r in runs if r["variant"] == variant and metric in r["extra"]]
            table[variant] = {f"{t}@{lead}": float(np.mean([v[lead][t] for v in vals]))
                              for lead in leads for t in study.targets} if vals else {}
        for method, scores in refs.items():
            if method.endswith(f":{metric}"):
                table[method.split(":")[0]] = {f"{t}@{lead}": float(scores[lead][t])
                                               for lead in leads for t in study.targets}
        extra_means[metric] = table
    import json

    envs = [r["environment"] for r in runs if r.get("environment")]
    keys = ("threads", "interop_threads", "cpu", "cpu_capability", "code_version", "torch")
    distinct = [dict(t) for t in dict.fromkeys(tuple((k, e.get(k)) for k in keys) for e in envs)]
    cost_path = out / "cost.json"
    families = {}
    for v in study.variants:
        try:
            cfg = read_config(v.config, [*study.overrides, *v.overrides])
        except (ConfigError, OSError):
            cfg = {}
        families[v.name] = study.families.get(v.name) or variant_family(cfg)
    study_json = {
        "name": study.name,
        "label": study.label,
        "config": portable(study.path),
        "threads": study.threads,
        "lr_schedule": study.lr_schedule if study.lr_schedule == "config" else
        f"{study.lr_schedule} (warm-up {study.warmup_steps} steps, final lr × {study.min_lr_factor:g})",
        # what the runs recorded: one value per key when all runs agree, else the list of values (a shared
        # checkout's code version moves with every commit; threads or CPU that differ break bit-for-bit equality;
        # a key a run did not record is left out here and kept as null in "environments")
        "environment": {k: vals[0] if len(vals) == 1 else vals
                        for k in keys if (vals := list(dict.fromkeys(e[k] for e in distinct if e[k] is not None)))},
        "environments": distinct,
        "cost": json.loads(cost_path.read_text()) if cost_path.is_file() else None,
        "steps": study.steps,
        "seeds": study.seeds,
        "baseline": study.baseline,
        "leads": leads,
        "targets": study.targets,
        "variants": {v.name: {"config": portable(v.config), "overrides": [*study.overrides, *v.overrides],
                              "family": families[v.name]} for v in study.variants},
        "score": "CRPS (latitude-weighted; Gaussian closed form, fair estimator for raw members)"
        if postprocess else "CRPS (latitude-weighted; fair for members, Gaussian closed form, MAE of a deterministic "
        "network)" if any(r["scoring"] == "ensemble" for r in runs) else "RMSE",
        "runs": runs,
        "references": {k: v for k, v in refs.items() if ":" not in k},
        "reference_baseline": ref_name if reference else None,
        "summary": summarise(runs, study.baseline, leads, study.targets, reference),
        "summary_regions": summarise(runs, study.baseline, leads, region_targets(runs, leads, study.targets)),
        "pairs": paired_differences(runs, study.pairs, leads,
                                    [*study.targets, *region_targets(runs, leads, study.targets)]),
        "extra_means": extra_means,
    }
    text = markdown(study_json)
    if any(r["scoring"] == "ensemble" for r in runs):
        from smoeweather.studies.ensembles import ensemble_markdown, ensemble_summary

        study_json["ensemble"] = ensemble_summary(runs, study.baseline, leads, study.targets)
        text += ensemble_markdown(study_json["ensemble"], study.baseline, leads, study.targets)
    write_json(out / "study.json", study_json)
    write_text(out / "study.md", text)
    return study_json
