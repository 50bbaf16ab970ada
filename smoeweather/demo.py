"""``smoe demo``: the product's whole chain on the embedded default world, through the same CLI a user types.

default world (synthetic, 5.625°) → train the dense ResNet and the SMoE ResNet with the land-sea gate prior
(equal optimizer steps) → forecast 3 and 5 days on the held-out year → score against persistence and
day-of-year climatology → post-process a small synthetic ensemble (EMOS per grid point: fit on 2002,
apply to 2003, with ECC-Q calibrated members) → maps of the learned routing, score curves, a forecast map
and the EMOS coefficients. Writes ``INDEX.md`` into the output folder (what every file is and how to read it)
and prints a short summary: the headline RMSE/ACC table and the paths of INDEX.md, the score tables and the
figure folders (:func:`summary`).

Every step is a ``smoe`` command (see :data:`DemoPlan.commands`), so the demo doubles as a worked example.
Budgets are optimizer steps, never wall-clock time: the numbers do not depend on how busy the machine is.

Reproducible: every step runs with a fixed intra-op thread count (``threads``, default 2, set through
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for each step's process, whatever the machine has), fixed seeds and
deterministic algorithms (the configs' ``trainer.deterministic: true``), so two runs on one machine write
byte-identical tables. Across machines, CPUs with other vector units (AVX2 / AVX-512) pick other kernels in
oneDNN/MKL and the last digits can differ; see docs/guide/results-reading.md for the measured size.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from smoeweather.config import BUILTIN_CONFIGS

CONFIGS = BUILTIN_CONFIGS

# The held-out year of the default world (configs/weatherbench/_world_base.yaml: test_years [2003, 2003]);
# the last init leaves room for the 120 h lead inside the year.
TEST_INITS = ("2003-01-01T00", "2003-12-26T00")
TRAIN_YEARS = ("2000", "2001")
# Budgets in optimizer steps (batch 32): the full demo trains 2 epochs of the default world (2 × 181 steps), the first
# demo 150 steps (under one epoch: it validates once, at its last step, so that it still keeps a best checkpoint).
EPOCH_STEPS = 181
FULL_STEPS = 2 * EPOCH_STEPS
QUICK_STEPS = 150
BEST = "best-*.ckpt"  # `smoe train` names its best checkpoint best-<epoch>.ckpt; resolved when the step runs
DEMO_THREADS = 2  # intra-op threads of every step: reductions split the same way on every machine
INDEX = "INDEX.md"
HEADLINE_METRICS = ("rmse", "acc")  # the closing printout's tables (everything else: scores/scores.md)
HEADLINE_LEADS = ("72h", "120h")

# What each output is, for INDEX.md (relative to the output folder; folders end in "/").
DESCRIPTIONS: dict[str, str] = {
    "data/.default_world.zarr.lock": "the lock that lets one process at a time build the default world (empty; "
    "safe to delete)",
    "data/default_world.zarr/": "the embedded default world (synthetic, 5.625°, 2000–2003, 6-hourly): Z and T "
    "at 250/500/700/850 hPa, land-sea mask, orography; the truth for every score. Z is geopotential in "
    "m² s⁻² (divide by 9.81 for metres), T in K",
    "runs/dense/": "the dense ResNet's training run: checkpoints/best-*.ckpt (best validation loss on 2002), "
    "checkpoints/last.ckpt, config.yaml (the resolved config), CSV logs",
    "runs/smoe_prior/": "the SMoE ResNet (every 3×3 conv an SMoE, gates initialised from the land-sea map), "
    "same budget and files as runs/dense/",
    "forecasts/dense.zarr/": "the dense ResNet's forecasts for every day of 2003 at 72 h and 120 h lead "
    "(WeatherBench 2 layout: time = init, prediction_timedelta = lead)",
    "forecasts/smoe_prior.zarr/": "the SMoE ResNet's forecasts, same layout",
    "scores/scores.md": "THE TABLE: latitude-weighted RMSE (lower is better; Z500 in m² s⁻², T850 in K), bias "
    "(near 0 is better), ACC (anomaly correlation, 1 is perfect, above 0.6 is useful) and CRPS (here the mean "
    "absolute error, lower is better) of both networks, persistence and day-of-year climatology, per lead",
    "scores/scores.nc": "the same scores as netCDF (method × field × lead × metric), for your own plots",
    "scores/scores.json": "the same scores as JSON",
    "scores/wb2/": "the same scores in WeatherBench 2's results layout, one netCDF per method (metric × region "
    "× lead_time, one variable per weather variable, estimator and ensemble size in the attributes)",
    "ensemble/synthetic_ens.zarr/": "a synthetic 10-member ensemble made from the world (biased, "
    "under-dispersive: a stand-in for a real ensemble forecast), every 72 h in 2002–2003",
    "ensemble/emos_gridpoint.nc": "the EMOS model fitted on 2002, one coefficient set (a, b, c, d) per grid "
    "point, field and lead: N(a + b·mean, c + d·variance)",
    "ensemble/emos.zarr/": "EMOS applied to the 2003 ensemble: Gaussian mean and standard deviation",
    "ensemble/emos_members.zarr/": "10 calibrated members drawn from the EMOS Gaussians, reordered like the raw "
    "members (ECC-Q)",
    "ensemble/scores/scores.md": "post-processing table: CRPS (lower is better, in the field's units; the "
    "raw ensemble's is the fair CRPS), spread–skill ratio (1 means calibrated; below 1 the ensemble is "
    "too narrow), RMSE of the mean",
    "ensemble/scores/scores.nc": "the same post-processing scores as netCDF",
    "ensemble/scores/scores.json": "the same post-processing scores as JSON",
    "ensemble/scores/rank_histograms.png": "rank histograms of the truth among the raw and the ECC-Q members per "
    "field and lead (flat, at the dashed line: calibrated; U-shaped: too narrow, the truth often outside)",
    "ensemble/scores/wb2/": "the same post-processing scores in WeatherBench 2's results layout, one netCDF per "
    "method",
    "maps/routing/": "where the SMoE's experts act: per gate, the dominant expert at each grid point (blue: "
    "experts initialised on sea, brown: on land; every expert dominating at least 0.5 % of the globe has its own "
    "colour, hatched grey pools the smaller ones), routing margin, usage histogram, the land-sea prior; routing "
    "as netCDF",
    "maps/scores/": "RMSE and ACC against lead time, one line per method, one row per region (global, land, sea)",
    "maps/scorecard/": "scorecards against the dense ResNet: per metric the % difference of the SMoE ResNet, "
    "persistence and climatology for every variable, lead and region (blue: better than dense, red: worse; "
    "hatched grey: not significant over the 2003 initialisations)",
    "maps/spectra/": "zonal energy spectra at 30–60° latitude: forecast / truth energy per wavenumber for every "
    "method and lead (1: the right energy at that scale, below 1: the forecast is smoother than the truth)",
    "maps/forecast/": "the SMoE's Z500 forecast at 72 h for 1 January 2003, the truth and their difference",
    "maps/emos/": "the EMOS coefficients as maps: a (bias, diverging around 0), b (slope on the ensemble "
    "mean, around 1), √c (spread floor) and d (1 = raw spread kept, above 1: the raw ensemble is too narrow)",
}


@dataclass
class DemoPlan:
    """The demo's ``smoe`` commands in order, and the files a person should look at afterwards."""

    out: Path
    steps: int
    commands: list[list[str]] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    pngs: list[str] = field(default_factory=list)


def plan_demo(out: Path, steps: int = FULL_STEPS, every: str = "24h", members_n: int = 10) -> DemoPlan:
    """Build the command list for :func:`run_demo` (no side effects). A budget under one epoch validates once, at
    its last step (``trainer.val_check_interval``), so that each run still keeps its best checkpoint."""
    out = Path(out)
    store = out / "data" / "default_world.zarr"
    plan = DemoPlan(out=out, steps=steps)
    runs = {"dense": "world_dense.yaml", "smoe_prior": "world_smoe_all_prior.yaml"}
    budget = [
        f"data.store={store}",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        f"training.early_stopping_patience={steps}",
        *([f"trainer.val_check_interval={steps}"] if steps < EPOCH_STEPS else []),
    ]
    ckpts: dict[str, Path] = {}
    for name, config in runs.items():
        run_dir = out / "runs" / name
        plan.commands.append(["train", "--config", str(CONFIGS / "weatherbench" / config), "--overwrite",
                              f"output_dir={run_dir}", *budget])
        ckpts[name] = run_dir / "checkpoints" / BEST
    forecasts = []
    for name, ckpt in ckpts.items():
        fc = out / "forecasts" / f"{name}.zarr"
        plan.commands.append(["forecast", str(ckpt), "--data", str(store), "--init", *TEST_INITS, "--every", every,
                              "--lead", "72h", "120h", "--name", name, "--out", str(fc), "--overwrite"])
        forecasts.append(f"{name}={fc}")
    scores = out / "scores"
    plan.commands.append(["evaluate", *forecasts, "--truth", str(store), "--climatology", str(store),
                          "--climatology-years", *TRAIN_YEARS, "--spectra", "--out", str(scores), "--overwrite"])
    plan.tables.append(scores / "scores.md")

    ens = out / "ensemble" / "synthetic_ens.zarr"
    model = out / "ensemble" / "emos_gridpoint.nc"
    emos = out / "ensemble" / "emos.zarr"
    members = out / "ensemble" / "emos_members.zarr"
    pp_scores = out / "ensemble" / "scores"
    plan.commands.append(["postprocess", "synthetic", str(store), "--members", str(members_n),
                          "--init", "2002-01-01", "2003-12-30", "--every", "72h", "--out", str(ens), "--overwrite"])
    # fit once on 2002, apply to the held-out 2003 forecasts: Gaussian store + ECC-Q calibrated members
    plan.commands.append(["postprocess", "fit", "--method", "emos", "--per-gridpoint", "--forecast", str(ens),
                          "--truth", str(store), "--train-period", "2002", "2002", "--out", str(model), "--overwrite"])
    plan.commands.append(["postprocess", "apply", "--emos", str(model), "--forecast", str(ens),
                          "--apply-period", "2003", "2003", "--out", str(emos), "--members", str(members_n),
                          "--members-out", str(members), "--overwrite"])
    # scored on the inits they share: the held-out year 2003
    plan.commands.append(["evaluate", f"raw_ensemble={ens}", f"emos={emos}", f"emos_ecc_members={members}",
                          "--truth", str(store), "--no-references", "--out", str(pp_scores), "--overwrite"])
    plan.tables.append(pp_scores / "scores.md")

    maps = out / "maps"
    plan.commands.append(["plot", "routing", str(ckpts["smoe_prior"]), "--out", str(maps / "routing")])
    plan.commands.append(["plot", "scores", str(scores / "scores.nc"), "--out", str(maps / "scores")])
    plan.commands.append(["plot", "scorecard", str(scores / "scores.nc"), "--baseline", "dense", "--metrics", "rmse",
                          "acc", "--out", str(maps / "scorecard")])
    plan.commands.append(["plot", "spectra", str(scores / "scores.nc"), "--out", str(maps / "spectra")])
    plan.commands.append(["plot", "forecast", str(out / "forecasts" / "smoe_prior.zarr"), "--truth", str(store),
                          "--field", "geopotential_500", "--lead", "72h", "--init", TEST_INITS[0],
                          "--out", str(maps / "forecast")])
    plan.commands.append(["plot", "emos", str(model), "--out", str(maps / "emos")])
    for command in plan.commands:  # the demo makes its folder anew: every plot replaces its files
        if command[0] == "plot":
            command.append("--overwrite")
    plan.pngs = [str(maps / "routing"), str(maps / "scores"), str(maps / "scorecard"), str(maps / "spectra"),
                 str(maps / "forecast"), str(maps / "emos")]
    return plan


def step_environment(threads: int = DEMO_THREADS) -> dict[str, str]:
    """The environment of every demo step: this one with a fixed thread count and hash seed."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}


def _scores_block(path: Path) -> dict:
    """The ``scores`` block of a ``scores.json`` that ``smoe evaluate`` wrote; empty where there is none."""
    return json.loads(path.read_text()).get("scores", {}) if path.is_file() else {}


def write_index(out: Path) -> Path:
    """Write ``out/INDEX.md``: every file and folder the demo wrote, each with what it is and how to read it.

    It opens with the result (:func:`bottom_line`, from the score files); entries come from :data:`DESCRIPTIONS`
    (only those that exist) plus the PNG files under ``maps/``; a file the demo wrote that has no description is
    listed as such, so the index never hides an output.
    """
    out = Path(out)
    result = bottom_line(*(_scores_block(out / rel) for rel in ("scores/scores.json", "ensemble/scores/scores.json")))
    lines = ["# What `smoe demo` wrote", "", *(["## The result", "", *result, ""] if result else []),
             "## The files", "",
             "Read scores/scores.md first (lower RMSE and CRPS are better; ACC and spread–skill near 1 are "
             "better), then the maps. How to read every score: docs/guide/results-reading.md.", ""]
    described: set[Path] = set()
    for rel, text in DESCRIPTIONS.items():
        path = out / rel.rstrip("/")
        if path.exists():
            lines.append(f"- `{rel}`: {text}.")
            described.add(path)
            if rel.startswith("maps/"):
                lines += [f"    - `{p.relative_to(out)}`" for p in sorted(path.rglob("*.png"))]
    covered = lambda p: any(p == d or d in p.parents for d in described)  # noqa: E731
    others = [p for p in sorted(out.rglob("*")) if p.is_file() and not covered(p) and p.name != INDEX]
    lines += [f"- `{p.relative_to(out)}`: (no description)" for p in others]
    index = out / INDEX
    tmp = index.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(index)
    return index


def run_demo(out: Path, steps: int = QUICK_STEPS, threads: int = DEMO_THREADS) -> int:
    """Run every command of :func:`plan_demo`; stop at the first failure (its exit code is returned).

    Each step runs with ``threads`` intra-op threads (:func:`step_environment`); at the end the demo writes
    ``INDEX.md`` (:func:`write_index`).

    Each step runs as its own ``python -m smoeweather`` process, exactly the command a user would type.
    The whole chain also runs in one process (tests/training/test_one_process.py). It used to abort at interpreter exit
    with ``free(): invalid pointer`` (exit 134): eccodes, imported by xarray's engine guessing, loads eckitlib's
    bundled PROJ/curl with RTLD_GLOBAL, and pyproj (imported by cartopy for the maps) then bound to that PROJ
    instead of its own, so two PROJ copies freed the same objects at exit. ``smoeweather/__init__.py`` now
    loads pyproj and netCDF4 before anything can import eccodes (details and upstream issue there).
    """
    plan = plan_demo(out, steps=steps)
    started = time.perf_counter()
    for i, argv in enumerate(plan.commands, 1):
        argv = [_resolve_best(a) for a in argv]
        print(f"\n[demo {i}/{len(plan.commands)}] smoe {shlex.join(argv)}", flush=True)
        rc = subprocess.run([sys.executable, "-m", "smoeweather", *argv], check=False,
                            env=step_environment(threads)).returncode
        if rc:
            print(f"smoe demo: step {i} failed (exit {rc}): smoe {shlex.join(argv)}")
            return rc
    index = write_index(out)
    print("\n" + summary(plan, index, time.perf_counter() - started), end="")
    return 0


def _headline_table(scores: dict, units: dict[str, str], metric: str) -> list[str]:
    """Markdown rows of one metric from scores.json's ``scores`` block: methods × (field, lead); none when no
    method has that metric (ACC needs a climatology)."""
    fields = next((list(table[metric]) for table in scores.values() if metric in table), [])
    if not fields:
        return []
    cols = [(f, lead) for f in fields for lead in HEADLINE_LEADS]
    unit = lambda f: "" if metric == "acc" else f" [{units.get(f, '?')}]"  # noqa: E731
    lines = [f"| {metric.upper()} | " + " | ".join(f"{f} {lead}{unit(f)}" for f, lead in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for method, table in scores.items():
        values = [table.get(metric, {}).get(f, {}).get(lead) for f, lead in cols]
        lines.append(f"| {method} | " + " | ".join("–" if v is None else f"{v:.4g}" for v in values) + " |")
    return lines


def _relative(scores: dict, metric: str, method: str, baseline: str) -> dict[str, float]:
    """{"field lead": 100 · (method / baseline − 1)} of ``metric`` where both have it (negative: method lower)."""
    a, b = scores.get(method, {}).get(metric, {}), scores.get(baseline, {}).get(metric, {})
    return {f"{f} {lead}": 100.0 * (a[f][lead] / b[f][lead] - 1.0) for f in a for lead in a[f]
            if f in b and b[f].get(lead) and a[f][lead] is not None}


def _spread(diffs: dict[str, float]) -> str:
    """'+3.1 % (geopotential_500 72h) … +9.8 % (temperature_850 120h)': the smallest and largest of ``diffs``."""
    lo, hi = min(diffs, key=diffs.get), max(diffs, key=diffs.get)
    return f"{diffs[lo]:+.1f} % ({lo})" if lo == hi else f"{diffs[lo]:+.1f} % ({lo}) to {diffs[hi]:+.1f} % ({hi})"


def _best_rmse(scores: dict, methods: tuple[str, ...]) -> dict[str, float]:
    """{"field lead": the lowest RMSE among ``methods``} over the field-leads any of them has."""
    best: dict[str, float] = {}
    for m in methods:
        for f, leads in scores.get(m, {}).get("rmse", {}).items():
            for lead, v in leads.items():
                if v is not None:
                    best[f"{f} {lead}"] = min(v, best.get(f"{f} {lead}", v))
    return best


def bottom_line(scores: dict, pp_scores: dict | None = None) -> list[str]:
    """The demo's result in plain sentences, computed from its score files (``scores.json``'s ``scores`` block of
    the networks' evaluation and, when given, of the post-processing one): the SMoE against the dense ResNet at
    equal optimizer steps, the better network against the better reference, EMOS against the raw ensemble."""
    lines = []
    smoe = _relative(scores, "rmse", "smoe_prior", "dense")
    if smoe:
        lower = sum(v < 0 for v in smoe.values())
        verdict = ("higher than the dense ResNet's in every field-lead" if lower == 0 else
                   "lower than the dense ResNet's in every field-lead" if lower == len(smoe) else
                   f"lower than the dense ResNet's in {lower} of {len(smoe)} field-leads")
        lines.append(f"- At equal optimizer steps the SMoE ResNet's RMSE is {verdict}: {_spread(smoe)}.")
    best_net, best_ref = _best_rmse(scores, ("dense", "smoe_prior")), _best_rmse(scores, ("persistence", "climatology"))
    skill = {k: 100.0 * (best_net[k] / best_ref[k] - 1.0) for k in best_net if best_ref.get(k)}
    if skill:
        wins = sum(v < 0 for v in skill.values())
        where = "every field-lead" if wins == len(skill) else f"{wins} of {len(skill)} field-leads"
        lines.append(f"- The better network beats the better of persistence and climatology in {where}: its RMSE "
                     f"against theirs {_spread(skill)}.")
    emos = _relative(pp_scores or {}, "crps", "emos", "raw_ensemble")
    if emos:
        lines.append(f"- EMOS {'lowers' if max(emos.values()) < 0 else 'changes'} the raw ensemble's CRPS on the "
                     f"held-out year: {_spread(emos)}.")
    return lines


def summary(plan: DemoPlan, index: Path, seconds: float) -> str:
    """The demo's closing printout (under 40 lines): the headline RMSE and ACC of both networks, persistence and
    climatology at 72 h and 120 h (global, held-out 2003, from ``scores/scores.json``), and where everything
    else is: INDEX.md, the full score tables (every metric and region, post-processing) and the figure folders."""
    scores_json = plan.tables[0].with_suffix(".json")
    written = json.loads(scores_json.read_text())
    lines = [f"smoe demo: done in {seconds:.0f} s. Scores on the held-out year 2003, global "
             "(RMSE: lower is better; ACC: 1 is perfect, above 0.6 is useful):", ""]
    for metric in HEADLINE_METRICS:
        table = _headline_table(written["scores"], written.get("units", {}), metric)
        lines += [*table, ""] if table else []
    result = bottom_line(written["scores"], _scores_block(plan.tables[1].with_suffix(".json")))
    lines += ["Bottom line:", *result, ""] if result else []
    lines += [f"What every file is and how to read it: {index}",
              "Every score (bias, CRPS, land and sea regions, spectra; the post-processing table):",
              *(f"  {table}" for table in plan.tables), "Figures:"]
    for folder in plan.pngs:
        lines.append(f"  {folder}/ ({len(list(Path(folder).rglob('*.png')))} PNG)")
    return "\n".join(lines) + "\n"


def _resolve_best(arg: str) -> str:
    """The newest ``best-*.ckpt`` for an argument ending in :data:`BEST`, else ``arg`` unchanged."""
    if not arg.endswith(BEST):
        return arg
    folder = Path(arg).parent
    found = sorted(folder.glob(BEST), key=lambda p: p.stat().st_mtime)
    if found:
        return str(found[-1])
    if (folder / "last.ckpt").exists():  # a budget shorter than one epoch never validated: no best yet
        print(f"smoe demo: no {BEST} in {folder} (training stopped before its first validation); using last.ckpt")
        return str(folder / "last.ckpt")
    raise FileNotFoundError(f"no {BEST} or last.ckpt in {folder} (did training write a checkpoint?)")
