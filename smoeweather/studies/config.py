"""Study files (``configs/studies/*.yaml``): :class:`StudyConfig` and :func:`load_study`, every key checked
(:data:`STUDY_SCHEMA`: unknown keys with did-you-mean, types, bounds) and every variant's training config
validated in full before anything runs. See :mod:`smoeweather.studies.run` for the file format."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from smoeweather.config import (
    Block,
    ConfigError,
    apply_overrides,
    parse_settings,
    read_config,
    setting,
    settings_specs,
    validate,
)

STUDY_TASKS = ("weatherbench", "postprocess", "ens10")
POSTPROCESS_TASKS = ("postprocess", "ens10")

LR_SCHEDULES = ("cosine", "plateau", "config")
"""Study key ``lr_schedule``: ``cosine`` (the default: warm-up + cosine decay to the last step), ``plateau``
(ReduceLROnPlateau) or ``config`` (whatever each training config says; the committed studies before
schedules existed: plateau with a patience that never fires, i.e. a constant rate)."""

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
    steps: int = setting(example=1000, ge=1, doc="trainer.max_steps of every run")
    baseline: str = setting(doc="the variant paired differences are taken against")
    variants: list[Variant] = setting(doc="name → {config, overrides, family}")
    leads_h: list[int] = setting([72, 120], doc="scored lead times (hours)")
    targets: list[str] = setting(["geopotential_500", "temperature_850"], doc="scored fields")
    overrides: list[str] = setting([], doc="overrides applied to every variant")
    scoring: Literal["auto", "forecast", "postprocess", "ensemble"] = setting(
        "forecast", doc="forecast (RMSE) | ensemble | auto (= forecast); post-processing tasks: by task")
    val_every_steps: int | None = setting(None, example=500, ge=1, doc="validation every N steps (divides steps)")
    reference_baseline: str | None = setting(None, doc="post-processing: a reference method to pair with")
    threads: int = setting(1, ge=1, doc="torch threads of every run")
    lr_schedule: Literal["cosine", "plateau", "config"] = setting("cosine", doc="learning-rate schedule of every run")
    warmup_steps: int = setting(0, ge=0, doc="cosine: linear warm-up steps")
    min_lr_factor: float = setting(0.0, ge=0, le=1, doc="cosine: final lr / lr")
    cost: dict[str, Any] | None = setting({}, doc="None: not measured; {}: defaults")
    label: str | None = setting(None, doc="one line shown at the top of study.md")
    pairs: list[tuple[str, str]] = setting([], doc="(a, b): a − b paired by seed, beside the baseline's")

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
        cfg = read_config(variant.config, [*self.schedule_overrides(), *self.overrides, *variant.overrides])
        if cfg.get("task") not in STUDY_TASKS:
            raise ConfigError(f"study {self.path}: variant {variant.name!r} ({variant.config}) is task "
                              f"{cfg.get('task')!r}; a study scores {' or '.join(STUDY_TASKS)} runs only")
        every = self.val_every_steps or self.steps
        # validation (and so the best checkpoint) every ``every`` optimizer steps, across epoch ends
        budget = [f"trainer.max_steps={self.steps}", f"trainer.val_check_interval={every}",
                  "trainer.check_val_every_n_epoch=null"]
        return apply_overrides(cfg, [*EQUAL_STEPS_OVERRIDES, *budget, f"seed={seed}", f"output_dir={out}"])


STUDY_SCHEMA = Block({
    **settings_specs(StudyConfig, ("seeds", "steps", "baseline", "leads_h", "targets", "scoring", "val_every_steps",
                                   "reference_baseline", "threads", "lr_schedule", "warmup_steps", "min_lr_factor",
                                   "label")),
    "name": (str,), "overrides": (list, type(None)), "pairs": (list, type(None)), "cost": (bool, dict, type(None)),
    "variants": (dict,),
})
"""Keys of a study file (see the module docstring): an unknown key (with did-you-mean), a wrong type or a
number out of bounds is an error naming the key, before anything runs."""
VARIANT_SCHEMA = Block({"config": (str,), "overrides": (list, type(None)), "family": (str, type(None))})


def _check_study_keys(raw: Any, path: Path) -> None:
    """ConfigError naming the study file and the key (:data:`STUDY_SCHEMA`, :data:`VARIANT_SCHEMA`)."""
    try:
        validate(raw, STUDY_SCHEMA)
        for name, spec in (raw.get("variants") or {}).items():
            validate(spec, VARIANT_SCHEMA, f"variants.{name}")
    except ConfigError as err:
        raise ConfigError(f"study config {path}: {err}") from None


def _variants(raw: dict[str, Any], path: Path) -> list[Variant]:
    """The ``variants`` block: each variant's config resolved relative to the study file (which must exist)."""
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
    return variants


def _cost(raw: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The ``cost`` key: false/null → None (not measured), true → {} (defaults), else the mapping as given."""
    cost = raw.get("cost", {})
    if cost is False or cost is None:
        return None
    if cost is True:
        return {}
    if not isinstance(cost, dict) or set(cost) - {"reference", "steps", "rounds", "warmup"}:
        raise ConfigError(f"study config {path}: cost must be false or a mapping of reference, steps, rounds, "
                          f"warmup; got {cost!r}")
    return cost


def _pairs(raw: dict[str, Any], names: list[str], path: Path) -> list[tuple[str, str]]:
    """The ``pairs`` key: [a, b] lists of two distinct variant names, as tuples."""
    pairs = raw.get("pairs") or []
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and p[0] in names and p[1] in names and p[0] != p[1] for p in pairs):
        raise ConfigError(f"study config {path}: pairs must be a list of [variant, other variant] (two distinct "
                          f"names of {names}), got {pairs!r}")
    return [(str(a), str(b)) for a, b in pairs]


def load_study(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> StudyConfig:
    """Parse a study YAML file; ``overrides`` (``key=value``) apply to the study file itself (e.g. ``steps=10``).
    The study's keys (:func:`~smoeweather.config.parse_settings` of :class:`StudyConfig`: unknown keys with
    did-you-mean, types, bounds, the field defaults) and every variant's training config (with the study's
    overrides) are checked in full here, before anything runs."""
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
    variants = _variants(raw, path)
    seeds, steps, every = raw["seeds"], raw["steps"], raw.get("val_every_steps")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"study config {path}: steps must be ≥ 1 and seeds a non-empty list of distinct ints")
    if every is not None and steps % every:
        raise ConfigError(f"study config {path}: val_every_steps={every} must divide steps={steps} (the last "
                          "step must be validated)")
    values = {**raw, "name": raw.get("name", path.stem), "path": path, "variants": variants,
              "overrides": [str(o) for o in raw.get("overrides") or []], "cost": _cost(raw, path),
              "pairs": _pairs(raw, [v.name for v in variants], path)}
    try:
        study = parse_settings(StudyConfig, values, "")
    except ConfigError as err:
        raise ConfigError(f"study config {path}: {err}") from None
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
