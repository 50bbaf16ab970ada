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

Layout by job: :mod:`~smoeweather.studies.config` (the study file), this module (running, scoring,
sharding, cost), :mod:`~smoeweather.studies.statistics` (statistics) and
:mod:`~smoeweather.studies.report` (``study.md``, ``study.json``); their public names are importable
from here too.

Resuming: a run with ``result.json`` is skipped; a run with ``checkpoints/last.ckpt`` continues from it
(Lightning restores optimizer, step and epoch), any other run starts fresh.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smoeweather.io import write_json
from smoeweather.studies.config import (  # noqa: F401 - re-exported
    EQUAL_STEPS_OVERRIDES,
    LR_SCHEDULES,
    POSTPROCESS_TASKS,
    STUDY_SCHEMA,
    STUDY_TASKS,
    VARIANT_SCHEMA,
    StudyConfig,
    Variant,
    check_variant_configs,
    load_study,
)
from smoeweather.studies.report import markdown, portable, variant_family, write_study  # noqa: F401
from smoeweather.studies.statistics import (  # noqa: F401 - re-exported
    REGIONS,
    check_one_dataset,
    paired_differences,
    reference_mismatch,
    region_targets,
    run_score,
    summarise,
)

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


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
    test period whose longest lead verifies inside it) and :func:`smoeweather.evaluate.run.evaluate`
    against the data store; returns ({"72h": {target: rmse}}, {"persistence": {"72h": {target: rmse}}}).
    When the store has a ``land_sea_mask`` the scores also hold ``TARGET/land`` and ``TARGET/sea`` (land and
    sea regions weighted by the land fraction, :mod:`smoeweather.metrics.regions`): what a land-sea routed
    SMoE claims to learn. The forecast and ``scores.{nc,json,md}`` stay in ``work``."""
    from smoeweather.evaluate.run import evaluate
    from smoeweather.studies.ensembles import forecast_test_period

    dcfg = cfg["data"]
    fc = forecast_test_period(checkpoint, cfg, leads_h, work)
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
        from smoeweather.studies.ensembles import score_ensemble_run

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


def measure_study_cost(study: StudyConfig, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every arm's cost (:func:`smoeweather.studies.cost.measure_costs`, on ``study.threads``
    threads, the first seed's config) and write ``out/cost.json``."""
    from smoeweather.studies.cost import CostOptions, measure_costs

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
