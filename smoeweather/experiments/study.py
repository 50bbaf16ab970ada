"""Seeded study: a grid of model variants × seeds trained for an equal number of optimizer steps, each best
checkpoint scored on the test period in physical units, summarised as mean ± std over seeds and as the
paired (same seed) difference to a baseline variant.

A study config (``configs/studies/*.yaml``)::

    name: gcm_16x3
    seeds: [0, 1, 2]
    steps: 12000                 # trainer.max_steps of every run (never a wall-clock budget)
    val_every_steps: 500         # validation + best checkpoint every N steps (must divide steps)
    baseline: dense              # variant the paired differences are taken against
    leads_h: [72, 120]
    targets: [geopotential_500, temperature_850]
    overrides: [data.num_workers=4]          # applied to every variant (``key.sub=value``)
    threads: 1                   # torch intra-/inter-op threads (and OMP/MKL for workers) of every run
    lr_schedule: cosine          # training.lr_schedule of every run (cosine | plateau | config: as configured)
    warmup_steps: 0              # cosine: linear warm-up steps; min_lr_factor: final lr / lr (default 0)
    cost: {reference: dense}     # cost of every arm measured once (``cost.json``); ``cost: false`` skips it
    pairs: [[smoe_all_prior, dense]]   # further paired differences (first − second, same seed) in study.md
    variants:
      dense: {config: ../weatherbench/gcm_dense.yaml}
      smoe_all_prior: {config: ../weatherbench/gcm_smoe_all_prior.yaml, overrides: [model.smoe.rc=false]}

Variant config paths are relative to the study file. Layout of ``--out DIR``::

    DIR/runs/<variant>/seed<k>/            output_dir of ``smoe train`` (checkpoints/, logs/, config.yaml)
    DIR/runs/<variant>/seed<k>/result.json that run's scores, written last: its presence = run finished
    DIR/study.json, DIR/study.md           all finished runs + summary (rewritten after every run)

Reproducibility: every run pins its thread count (``threads``, default 1: float sums then always add in one
order, so one seed gives one number on one machine) and records it with the CPU model and code version
(:func:`environment`). Verdicts: paired differences (same seed) get a 95 % Student-t interval with n − 1
degrees of freedom (:func:`~smoeweather.metrics.significance.t_interval`); bold in ``study.md`` means the
interval excludes zero.

Resuming: a run with ``result.json`` is skipped; a run with ``checkpoints/last.ckpt`` continues from it
(Lightning restores optimizer, step and epoch), any other run starts fresh.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from smoeweather.config import Block, Bounded, ConfigError, apply_overrides, load_config, validate
from smoeweather.io import write_json, write_text
from smoeweather.metrics.significance import t_interval

STUDY_TASKS = ("weatherbench", "postprocess", "ens10")
REGIONS = ("land", "sea")  # forecast studies also score these (keys TARGET/land, TARGET/sea) when they can
POSTPROCESS_TASKS = ("postprocess", "ens10")

LR_SCHEDULES = ("cosine", "plateau", "config")
"""Study key ``lr_schedule``: ``cosine`` (the default: warm-up + cosine decay to the last step), ``plateau``
(ReduceLROnPlateau) or ``config`` (whatever each training config says; the committed studies before
schedules existed: plateau with a patience that never fires, i.e. a constant rate)."""

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# Every run trains exactly ``steps`` optimizer steps: no wall-clock stop, no early stop (patience larger
# than any possible number of validations), epochs unbounded.
EQUAL_STEPS_OVERRIDES = (
    "trainer.max_time=null",
    "trainer.max_epochs=-1",
    "training.early_stopping_patience=1000000000",
)


@dataclass
class Variant:
    """One arm of the study: a training config plus overrides."""

    name: str
    config: Path
    overrides: list[str] = field(default_factory=list)
    family: str | None = None  # dense | smoe | ensemble on a frontier plot (default: from the model config)


@dataclass
class StudyConfig:
    """A parsed study file (see the module docstring)."""

    name: str
    path: Path
    seeds: list[int]
    steps: int
    baseline: str
    variants: list[Variant]
    leads_h: list[int] = field(default_factory=lambda: [72, 120])
    targets: list[str] = field(default_factory=lambda: ["geopotential_500", "temperature_850"])
    overrides: list[str] = field(default_factory=list)
    scoring: str = "forecast"  # forecast (RMSE) | ensemble | auto (= forecast); post-processing tasks: by task
    val_every_steps: int | None = None
    reference_baseline: str | None = None  # post-processing: a reference method (e.g. emos_gridpoint) to pair with
    threads: int = 1
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr_factor: float = 0.0
    cost: dict[str, Any] | None = field(default_factory=dict)  # None: not measured; {}: defaults
    label: str | None = None  # one line shown at the top of study.md (e.g. "reduced preview: ...")
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (a, b): a − b paired by seed, beside the baseline's

    @property
    def families(self) -> dict[str, str | None]:
        return {v.name: v.family for v in self.variants}

    def schedule_overrides(self) -> list[str]:
        """``training.*`` overrides of the study's learning-rate schedule (none for ``config``)."""
        if self.lr_schedule == "config":
            return []
        return [f"training.lr_schedule={self.lr_schedule}", f"training.warmup_steps={self.warmup_steps}",
                f"training.min_lr_factor={self.min_lr_factor}"]

    def run_config(self, variant: Variant, seed: int, out: Path) -> dict[str, Any]:
        """The resolved training config of one (variant, seed) run writing to ``out``. The study's schedule
        comes first, so the study's and the variant's overrides can replace it."""
        cfg = load_config(variant.config, [*self.schedule_overrides(), *self.overrides, *variant.overrides])
        if cfg.get("task") not in STUDY_TASKS:
            raise ConfigError(f"study {self.path}: variant {variant.name!r} ({variant.config}) is task "
                              f"{cfg.get('task')!r}; a study scores {' or '.join(STUDY_TASKS)} runs only")
        every = self.val_every_steps or self.steps
        # validation (and so the best checkpoint) every ``every`` optimizer steps, across epoch ends
        budget = [f"trainer.max_steps={self.steps}", f"trainer.val_check_interval={every}",
                  "trainer.check_val_every_n_epoch=null"]
        return apply_overrides(cfg, [*EQUAL_STEPS_OVERRIDES, *budget, f"seed={seed}", f"output_dir={out}"])


STUDY_SCHEMA = Block({
    "name": (str,), "label": (str, type(None)),
    "seeds": (list,), "steps": Bounded((int,), example=1000, ge=1),
    "val_every_steps": Bounded((int, type(None)), example=500, ge=1),
    "baseline": (str,), "reference_baseline": (str, type(None)), "pairs": (list, type(None)),
    "leads_h": (list,), "targets": (list,), "overrides": (list, type(None)),
    "scoring": (str,), "threads": Bounded((int,), example=1, ge=1),
    "lr_schedule": (str,), "warmup_steps": Bounded((int,), example=0, ge=0),
    "min_lr_factor": Bounded((float,), example=0.0, ge=0, le=1),
    "cost": (bool, dict, type(None)),
    "variants": (dict,),
})
"""Keys of a study file (see the module docstring): an unknown key (with did-you-mean), a wrong type or a
number out of bounds is an error naming the key, before anything runs."""
VARIANT_SCHEMA = Block({"config": (str,), "overrides": (list, type(None)), "family": (str, type(None))})


def _default(key: str) -> Any:
    """The default of a study key: the field default of :class:`StudyConfig` (the one place it is set)."""
    spec = StudyConfig.__dataclass_fields__[key]
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def _check_study_keys(raw: Any, path: Path) -> None:
    """ConfigError naming the study file and the key (:data:`STUDY_SCHEMA`, :data:`VARIANT_SCHEMA`)."""
    try:
        validate(raw, STUDY_SCHEMA)
        for name, spec in (raw.get("variants") or {}).items():
            validate(spec, VARIANT_SCHEMA, f"variants.{name}")
    except ConfigError as err:
        raise ConfigError(f"study config {path}: {err}") from None


def load_study(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> StudyConfig:
    """Parse a study YAML file; ``overrides`` (``key=value``) apply to the study file itself (e.g. ``steps=10``).
    The study's keys and every variant's training config (with the study's overrides) are checked in full
    here, before anything runs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study config {path} does not exist")
    raw = apply_overrides(yaml.safe_load(path.read_text()) or {}, list(overrides))
    if not isinstance(raw, dict):
        raise ConfigError(f"study config {path} must hold a mapping")
    _check_study_keys(raw, path)
    missing = [k for k in ("seeds", "steps", "variants", "baseline") if k not in raw]
    if missing:
        raise ConfigError(f"study config {path} lacks {missing}; expected seeds, steps, baseline, variants")
    variants_raw = raw["variants"]
    if not isinstance(variants_raw, dict) or not variants_raw:
        raise ConfigError(f"study config {path}: variants must be a non-empty mapping name → {{config, overrides}}")
    variants = []
    for name, spec in variants_raw.items():
        if not isinstance(spec, dict) or "config" not in spec:
            raise ConfigError(f"study config {path}: variant {name!r} needs a 'config' path")
        cfg_path = (path.parent / spec["config"]).resolve()
        if not cfg_path.is_file():
            raise FileNotFoundError(f"study config {path}: variant {name!r} config {cfg_path} does not exist")
        family = spec.get("family")
        variants.append(Variant(str(name), cfg_path, [str(o) for o in spec.get("overrides") or []],
                                None if family is None else str(family)))
    if raw["baseline"] not in variants_raw:
        raise ConfigError(f"study config {path}: baseline {raw['baseline']!r} is not a variant "
                          f"({sorted(variants_raw)})")
    steps = int(raw["steps"])
    seeds = [int(s) for s in raw["seeds"]]
    if steps < 1 or not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"study config {path}: steps must be ≥ 1 and seeds a non-empty list of distinct ints")
    every = raw.get("val_every_steps")
    if every is not None and (int(every) < 1 or steps % int(every)):
        raise ConfigError(f"study config {path}: val_every_steps={every} must divide steps={steps} (the last "
                          "step must be validated)")
    scoring = str(raw.get("scoring", _default("scoring")))
    if scoring not in ("auto", "forecast", "postprocess", "ensemble"):
        raise ConfigError(f"study config {path}: scoring must be 'forecast' (smoe forecast + smoe evaluate), "
                          f"'postprocess' (Gaussian CRPS of post-processing networks) or 'ensemble' (CRPS, "
                          f"spread/skill, ensemble-mean RMSE of ensemble networks), got {scoring!r}")
    threads = int(raw.get("threads", _default("threads")))
    schedule = str(raw.get("lr_schedule", _default("lr_schedule")))
    if threads < 1 or schedule not in LR_SCHEDULES:
        raise ConfigError(f"study config {path}: threads must be >= 1 and lr_schedule one of {LR_SCHEDULES}, got "
                          f"{threads} and {schedule!r}")
    cost = raw.get("cost", {})
    if cost is False or cost is None:
        cost = None
    elif cost is True:
        cost = {}
    elif not isinstance(cost, dict) or set(cost) - {"reference", "steps", "rounds", "warmup"}:
        raise ConfigError(f"study config {path}: cost must be false or a mapping of reference, steps, rounds, "
                          f"warmup; got {cost!r}")
    pairs = raw.get("pairs") or []
    names = [v.name for v in variants]
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and p[0] in names and p[1] in names and p[0] != p[1] for p in pairs):
        raise ConfigError(f"study config {path}: pairs must be a list of [variant, other variant] (two distinct "
                          f"names of {names}), got {pairs!r}")
    study = StudyConfig(
        name=str(raw.get("name", path.stem)),
        path=path,
        seeds=seeds,
        steps=steps,
        baseline=str(raw["baseline"]),
        variants=variants,
        leads_h=[int(v) for v in raw.get("leads_h", _default("leads_h"))],
        targets=[str(t) for t in raw.get("targets", _default("targets"))],
        overrides=[str(o) for o in raw.get("overrides") or []],
        scoring=scoring,
        val_every_steps=None if every is None else int(every),
        reference_baseline=None if raw.get("reference_baseline") is None else str(raw["reference_baseline"]),
        threads=threads,
        lr_schedule=schedule,
        warmup_steps=int(raw.get("warmup_steps", _default("warmup_steps"))),
        min_lr_factor=float(raw.get("min_lr_factor", _default("min_lr_factor"))),
        cost=cost,
        label=None if raw.get("label") is None else str(raw["label"]),
        pairs=[(str(a), str(b)) for a, b in pairs],
    )
    check_variant_configs(study)
    return study


def check_variant_configs(study: StudyConfig) -> None:
    """ConfigError naming the study file and variant when a variant's training config (with the study's and
    the variant's overrides) does not validate: a typo in a study override is refused before any run."""
    from smoeweather.training.settings import TrainConfig

    for variant in study.variants:
        try:
            TrainConfig.from_dict(study.run_config(variant, study.seeds[0], Path("study-check")))
        except ConfigError as err:
            raise ConfigError(f"study config {study.path}: variant {variant.name!r}: {err}") from None


# ---- reproducibility -------------------------------------------------------------------------------
def pin_threads(threads: int) -> dict[str, int]:
    """Pin this process to ``threads`` intra-op and inter-op threads (and ``OMP/MKL/OPENBLAS_NUM_THREADS``
    for worker processes started later); returns the counts in force. The inter-op count can be set only
    before the first parallel work of a process: if that has passed, the count in force is returned (it does
    not change any result; the intra-op count, which orders float sums, always is set)."""
    import torch

    for var in THREAD_ENV:
        os.environ[var] = str(threads)
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:
            pass
    return {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """:func:`pipelines.provenance.code_version` when first asked in this process (the code this process loaded,
    even if the checkout moves on while it runs)."""
    from pipelines.provenance import code_version as current

    return current()


def environment(threads: dict[str, int]) -> dict[str, Any]:
    """What a run's numbers depend on besides config and seed: threads, CPU (model and the vector instruction set
    torch's kernels use, e.g. AVX2 or AVX512: it moves step-time ratios between networks), code and library
    versions."""
    import torch

    return {**threads, "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "code_version": code_version(),
            "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ---- scoring ---------------------------------------------------------------------------------------
def score_with_forecast(checkpoint: str | Path, cfg: dict[str, Any], leads_h: list[int], targets: list[str],
                        work: Path) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, dict[str, float]]]]:
    """RMSE (physical units) via :func:`smoeweather.forecast.run_forecast` (initialisations every 12 h of the
    test period whose longest lead verifies inside it) and :func:`smoeweather.evaluate.evaluate`
    against the data store; returns ({"72h": {target: rmse}}, {"persistence": {"72h": {target: rmse}}}).
    When the store has a ``land_sea_mask`` the scores also hold ``TARGET/land`` and ``TARGET/sea`` (land and
    sea regions weighted by the land fraction, :mod:`smoeweather.metrics.regions`): what a land-sea routed
    SMoE claims to learn. The forecast and ``scores.{nc,json,md}`` stay in ``work``."""
    from smoeweather.evaluate import evaluate
    from smoeweather.forecast import run_forecast

    dcfg = cfg["data"]
    period = dcfg.get("test_period")
    if period is None:
        years = dcfg["test_years"]
        period = [f"{years[0]}-01-01", f"{years[-1]}-12-31T18:00"]
    end = np.datetime64(str(period[1])) - np.timedelta64(max(leads_h), "h")
    fc = run_forecast(dcfg["store"], checkpoint=str(checkpoint), init=(str(period[0]), str(end)), every="12h",
                      leads_h=tuple(leads_h), out=work / "forecast.zarr", progress=False)
    import xarray as xr

    with xr.open_zarr(dcfg["store"]) as store:
        regions = list(REGIONS) if "land_sea_mask" in store else []
    scores = evaluate({"model": Path(fc)}, dcfg["store"], out_dir=work / "scores",
                      regions=["global", *regions] if regions else None)
    out: dict[str, dict[str, dict[str, float]]] = {"model": {}, "persistence": {}}
    # positional lookups: plain index arrays, independent of how the coordinates are indexed
    methods = [str(m) for m in scores["method"].values]
    fields = [str(f) for f in scores["field"].values]
    leads = list(scores["prediction_timedelta"].values.astype("timedelta64[h]").astype(int))
    missing = [t for t in targets if t not in fields] + [h for h in leads_h if h not in leads]
    if missing:
        raise ValueError(f"{checkpoint}: the evaluation has no scores for {missing}")
    by_region = {"": scores["rmse"].sel(region="global") if regions else scores["rmse"]}
    by_region |= {f"/{r}": scores["rmse"].sel(region=r) for r in regions}
    for method in out:
        if method in methods:
            m = methods.index(method)
            out[method] = {f"{h}h": {} for h in leads_h}
            for suffix, da in by_region.items():
                rmse = da.transpose("method", "field", "prediction_timedelta").values
                for h in leads_h:
                    out[method][f"{h}h"] |= {f"{t}{suffix}": float(rmse[m, fields.index(t), leads.index(h)])
                                            for t in targets}
    model = out.pop("model")
    return model, {k: v for k, v in out.items() if v}


def postprocess_references(study: StudyConfig, cfg: dict[str, Any], out: Path,
                           log: Callable[[str], None] = print) -> dict[str, Any]:
    """Raw ensemble, global and per-grid-point EMOS (fitted on the train split) CRPS on the test split,
    computed once per study and kept in ``out/references.json``: {method: {lead: {target: crps}}}, plus
    ``<method>:spread_skill`` and ``<method>:bias`` entries."""
    import json

    from smoeweather.postprocess.scoring import reference_scores

    path = out / "references.json"
    if path.is_file():
        return json.loads(path.read_text())
    log(f"study {study.name}: scoring the raw ensemble and fitting EMOS (global, per grid point) on the train split")
    refs: dict[str, Any] = {}
    for method, scores in reference_scores(cfg["data"]).items():
        refs[method] = scores["crps"]
        for metric in ("spread_skill", "bias"):
            refs[f"{method}:{metric}"] = scores[metric]
    write_json(path, refs)
    return refs


# ---- summary ---------------------------------------------------------------------------------------
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


# ---- the runner ------------------------------------------------------------------------------------
def run_one(study: StudyConfig, variant: Variant, seed: int, out: Path,
            train_fn: Callable[..., Any] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) one run and score its best checkpoint; returns and writes ``result.json``."""
    from smoeweather.training.run import train

    train_fn = train_fn or train
    run_dir = out / "runs" / variant.name / f"seed{seed}"
    done = run_dir / "result.json"
    if done.is_file():
        import json

        log(f"study {study.name}: {variant.name} seed {seed}: finished earlier, skipped")
        return json.loads(done.read_text())
    cfg = study.run_config(variant, seed, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = last if last.is_file() else None
    if resume is None and run_dir.exists():  # a run killed before its first checkpoint: start clean
        shutil.rmtree(run_dir)
    threads = pin_threads(study.threads)
    log(f"study {study.name}: {variant.name} seed {seed}: "
        + (f"resuming from {resume}" if resume else f"training {study.steps} steps")
        + f" on {threads['threads']} thread(s)")
    t0 = time.perf_counter()
    result = train_fn(cfg, resume=resume)  # routing diagnostics are logged by every smoe train
    train_seconds = time.perf_counter() - t0  # wall time of this process's training (the cost of the run)
    steps = int(result.trainer.global_step)
    best = result.best_checkpoint or result.last_checkpoint
    if not best:
        raise ValueError(f"run {run_dir} left no checkpoint (steps {steps}); is the validation split empty?")
    mode, scores, extra, refs = score_run(study, cfg, best, out, run_dir, log)
    routing = _routing_at(result.trainer, str(best))
    if routing:  # SMoE runs: how far the routing moved from its initialisation by the best checkpoint
        extra["routing"] = routing
    monitor = getattr(getattr(result.trainer, "checkpoint_callback", None), "best_model_score", None)
    # the checkpoint relative to the study folder: study files hold no machine paths, and `out / path` finds it
    record = {"variant": variant.name, "seed": seed, "steps": steps,
              "best_checkpoint": os.path.relpath(Path(best).resolve(), Path(out).resolve()),
              "scoring": mode, "scores": scores, "extra": extra, "references": refs,
              "train_seconds": train_seconds if resume is None else None,
              "val_loss": None if monitor is None else float(monitor),  # the selection score (validation only)
              "environment": environment(threads)}
    write_json(done, record)
    return record


def score_run(study: StudyConfig, cfg: dict[str, Any], best: str | Path, out: Path, run_dir: Path,
              log: Callable[[str], None] = print) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(scoring mode, scores {lead: {target: value}}, extra scores, references) of one run's best checkpoint
    on the test period: post-processing CRPS (+ raw ensemble and EMOS references), ensemble CRPS, or the RMSE
    of a forecast (+ persistence)."""
    extra: dict[str, Any] = {}
    if cfg["task"] in POSTPROCESS_TASKS:
        from smoeweather.postprocess.scoring import score_checkpoint

        all_scores = score_checkpoint(str(best), cfg["data"])
        scores, extra = all_scores["crps"], {k: v for k, v in all_scores.items() if k != "crps"}
        return "postprocess", scores, extra, postprocess_references(study, cfg, out, log)
    if study.scoring == "ensemble":  # ensemble networks: CRPS, spread/skill, RMSE, rank histograms
        from smoeweather.experiments.ensembles import score_ensemble_run

        scores, extra = score_ensemble_run(best, cfg, study.leads_h, study.targets, run_dir)
        return "ensemble", scores, extra, {}
    scores, refs = score_with_forecast(best, cfg, study.leads_h, study.targets, run_dir)
    return "forecast", scores, extra, refs


def rescore_study(study: StudyConfig, out: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Score every finished run of ``study`` under ``out`` again from its best checkpoint with the scoring of
    this code (no training; e.g. once the scores gained land and sea) and rewrite ``result.json`` and
    ``study.{json,md}``. Training records (steps, time, validation loss, environment, routing) are kept; the
    post-processing references are recomputed."""
    out = Path(out)
    records = finished_records(study, out)
    if not records:
        raise ValueError(f"{out}: no finished run of study {study.name!r} to re-score (run `smoe study` first)")
    (out / "references.json").unlink(missing_ok=True)
    pin_threads(study.threads)
    variants = {v.name: v for v in study.variants}
    for record in records:
        variant, seed = variants[record["variant"]], int(record["seed"])
        run_dir = out / "runs" / variant.name / f"seed{seed}"
        # relative to the study folder (records before that: to the working directory they ran in)
        best = next((c for c in (out / record["best_checkpoint"], Path(record["best_checkpoint"]),
                                 run_dir / "checkpoints" / Path(record["best_checkpoint"]).name) if c.is_file()),
                    out / record["best_checkpoint"])
        if not best.is_file():
            raise ValueError(f"{run_dir}: its best checkpoint {best} is gone; it cannot be re-scored")
        log(f"study {study.name}: {variant.name} seed {seed}: re-scoring {best.name}")
        for derived in ("forecast.zarr", "scores"):  # outputs of the scoring, made again
            shutil.rmtree(run_dir / derived, ignore_errors=True)
        cfg = study.run_config(variant, seed, run_dir)
        mode, scores, extra, refs = score_run(study, cfg, best, out, run_dir, log)
        if "routing" in record.get("extra", {}):
            extra["routing"] = record["extra"]["routing"]
        record.update(scoring=mode, scores=scores, extra=extra, references=refs)
        write_json(run_dir / "result.json", record)
    return write_study(study, finished_records(study, out), out)


def _routing_at(trainer: Any, checkpoint: str) -> dict[str, dict[str, float]]:
    """Routing diagnostics of the run at the epoch of ``checkpoint`` (``best-epoch=NNN.ckpt``), if logged."""
    import re

    from smoeweather.training.diagnostics import RoutingDiagnostics, routing_summary

    callback = next((c for c in getattr(trainer, "callbacks", []) if isinstance(c, RoutingDiagnostics)), None)
    if callback is None:
        return {}
    match = re.search(r"epoch=(\d+)", Path(checkpoint).name)
    return routing_summary(callback.history, int(match.group(1)) if match else None)


def shard_runs(study: StudyConfig, k: int, n: int) -> list[tuple[int, Variant]]:
    """The (seed, variant) runs of shard ``k`` of ``n``, seed-major: variant ``v`` of the ``s``-th seed goes to
    shard (s + v) mod n. The shards rotate over the variants from seed to seed, so each shard trains every arm
    (its share of the time is balanced when arms differ in cost, and a lost shard leaves no arm without runs),
    where every n-th run in order would give one shard all runs of one arm whenever n divides the arm count."""
    return [(seed, variant) for s, seed in enumerate(study.seeds) for v, variant in enumerate(study.variants)
            if (s + v) % n == k]


def run_study(study: StudyConfig, out: str | Path, train_fn: Callable[..., Any] | None = None,
              log: Callable[[str], None] = print, shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Run (or continue) every (variant, seed) of ``study`` and write ``out/study.{json,md}``.

    Runs go seed-major (all variants of seed 0 first), so a half-finished grid already holds paired runs.
    ``shard`` (k, n): this process runs only its share of that order (:func:`shard_runs`), so n processes (one
    per core or GPU share) run the grid at once; the summary is rebuilt from every finished run found on disk,
    whichever process ran it. A single process (n = 1) first measures the arms' cost
    (:func:`measure_study_cost`, unless ``cost: false`` or ``cost.json`` exists); sharded grids measure it
    with ``smoe study --cost-only`` on a quiet machine. ``train_fn`` replaces :func:`smoeweather.training.run.train`.
    """
    out = Path(out)
    k, n = shard
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"shard must be K/N with 0 <= K < N, got {k}/{n}")
    if n == 1 and study.cost is not None and not (out / "cost.json").is_file():
        measure_study_cost(study, out, log=log)  # one process: the machine is as quiet as it will be
    result: dict[str, Any] = {}
    for seed, variant in shard_runs(study, k, n):
        run_one(study, variant, seed, out, train_fn=train_fn, log=log)
        result = write_study(study, finished_records(study, out), out)
    return result or write_study(study, finished_records(study, out), out)


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


def measure_study_cost(study: StudyConfig, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every arm's cost (:func:`smoeweather.experiments.cost.measure_costs`, on ``study.threads``
    threads, the first seed's config) and write ``out/cost.json``."""
    from smoeweather.experiments.cost import CostOptions, measure_costs

    spec = dict(study.cost or {})
    options = CostOptions(reference=str(spec.get("reference", study.baseline)), steps=int(spec.get("steps", 3)),
                          rounds=int(spec.get("rounds", 5)), warmup=int(spec.get("warmup", 2)),
                          threads=study.threads)
    pin_threads(study.threads)
    log(f"study {study.name}: measuring the cost of {len(study.variants)} arms (reference {options.reference}, "
        f"{options.threads} thread(s), {options.rounds} interleaved rounds)")
    cfgs = {}
    for v in study.variants:
        cfg = study.run_config(v, study.seeds[0], out / "cost_probe")
        cfg.setdefault("data", {})["num_workers"] = 0
        cfgs[v.name] = cfg
    cost = measure_costs(cfgs, options, log=log)
    cost["environment"] = environment({"threads": options.threads, "interop_threads": _interop()})
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "cost.json", cost)
    shutil.rmtree(out / "cost_probe", ignore_errors=True)
    return cost


def _interop() -> int:
    import torch

    return torch.get_num_interop_threads()


def finished_records(study: StudyConfig, out: Path) -> list[dict[str, Any]]:
    """The ``result.json`` records of every finished run of ``study`` under ``out`` (seed-major order)."""
    import json

    records = []
    for seed in study.seeds:
        for variant in study.variants:
            path = out / "runs" / variant.name / f"seed{seed}" / "result.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
    return records


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
            cfg = load_config(v.config, [*study.overrides, *v.overrides])
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
        from smoeweather.experiments.ensembles import ensemble_markdown, ensemble_summary

        study_json["ensemble"] = ensemble_summary(runs, study.baseline, leads, study.targets)
        text += ensemble_markdown(study_json["ensemble"], study.baseline, leads, study.targets)
    write_json(out / "study.json", study_json)
    write_text(out / "study.md", text)
    return study_json
