"""Experiment trackers of ``smoe train``: ``trainer.logger`` names csv (the default), tensorboard, mlflow, wandb.

``trainer.logger`` is one name (``csv``), a list (``[csv, tensorboard]``) or entries as mappings with their
options (``{name: mlflow, tracking_uri: sqlite:///mlflow.db, experiment_name: smoe}``); ``false`` or ``[]``: no
tracker. Each tracker's options are the fields of its settings class below (:class:`CSVTracker`,
:class:`TensorBoardTracker`, :class:`MLflowTracker`, :class:`WandbTracker`): defaults and bounds are set once
there and checked by :func:`~smoeweather.config.parse_settings` (an unknown key has did-you-mean).

The packages are optional extras (``pip install "smoeweather[tensorboard]"``, ``[mlflow]``, ``[wandb]``),
imported only when a config names them; a config naming one that is not installed is refused with that line.

Every tracker receives (:class:`TrackerLogging`, and what the modules and callbacks log themselves): the resolved
config as hyper-parameters, the losses (``train_loss``, ``val_loss``, ...), the learning rate (``lr``;
``lr/<group>`` for a named parameter group such as ``gates``) every ``trainer.log_every_n_steps`` optimizer
steps, the routing diagnostics of SMoE models once per epoch (``routing/<layer>/<metric>``,
:mod:`~smoeweather.training.diagnostics`) and the checkpoints' paths at the end of the fit: MLflow as the tags
``checkpoint.last``/``checkpoint.best`` (and the files as artifacts under ``checkpoints/`` with
``log_checkpoints: true``, beside the ``config.yaml`` artifact), W&B in the run summary (and a ``model``
artifact with ``log_checkpoints: true``), TensorBoard as the text entry ``checkpoint`` (and ``config``).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import yaml
from lightning.pytorch.loggers import CSVLogger, Logger

from smoeweather.config import ConfigError, flatten, parse_settings, setting
from smoeweather.training.callbacks import LastCheckpoint

__all__ = ["CSVTracker", "MLflowTracker", "TensorBoardTracker", "TrackerLogging", "WandbTracker", "TRACKERS",
           "build_loggers", "parse_trackers"]


@dataclass(frozen=True)
class CSVTracker:
    """``trainer.logger: csv``: ``<save_dir>/logs/version_N/metrics.csv`` (and ``hparams.yaml``)."""

    name: Literal["csv"] = setting("csv", doc="the tracker")
    save_dir: str | None = setting(None, example="runs/x", doc="folder of logs/ (default: the run's output_dir)")
    flush_logs_every_n_steps: int = setting(100, ge=1, doc="rows kept in memory before they are written")


@dataclass(frozen=True)
class TensorBoardTracker:
    """``trainer.logger: tensorboard``: event files under ``<save_dir>/tensorboard/version_N``."""

    name: Literal["tensorboard"] = setting("tensorboard", doc="the tracker")
    save_dir: str | None = setting(None, example="runs/x", doc="folder of tensorboard/ (default: output_dir)")


@dataclass(frozen=True)
class MLflowTracker:
    """``trainer.logger: mlflow``: one MLflow run per fit in ``experiment_name`` at ``tracking_uri``."""

    name: Literal["mlflow"] = setting("mlflow", doc="the tracker")
    tracking_uri: str | None = setting(None, example="sqlite:///mlflow.db",
                                       doc="default: $MLFLOW_TRACKING_URI, else MLflow's own default")
    experiment_name: str = setting("smoeweather", doc="the MLflow experiment (created when missing)")
    run_name: str | None = setting(None, example="smoe-all", doc="default: the run's output_dir")
    tags: dict[str, str] | None = setting(None, example="{group: baseline}", doc="tags of the run")
    artifact_location: str | None = setting(None, example="s3://bucket/mlartifacts",
                                            doc="artifact root of a NEW experiment (default: the store's)")
    log_checkpoints: bool = setting(False, doc="copy last.ckpt and the best checkpoint as artifacts")


@dataclass(frozen=True)
class WandbTracker:
    """``trainer.logger: wandb``: a Weights & Biases run; ``offline: true`` (or ``WANDB_MODE=offline``) writes
    it under ``<save_dir>/wandb`` for a later ``wandb sync``."""

    name: Literal["wandb"] = setting("wandb", doc="the tracker")
    project: str = setting("smoeweather", doc="the W&B project")
    entity: str | None = setting(None, example="my-team", doc="user or team (default: yours)")
    run_name: str | None = setting(None, example="smoe-all", doc="default: the run's output_dir")
    tags: list[str] | None = setting(None, example="[baseline]", doc="tags of the run")
    save_dir: str | None = setting(None, example="runs/x", doc="folder of wandb/ (default: output_dir)")
    offline: bool = setting(False, doc="write the run locally, no network")
    log_checkpoints: bool = setting(False, doc="last.ckpt and the best checkpoint as a model artifact")


TrackerSettings = CSVTracker | TensorBoardTracker | MLflowTracker | WandbTracker


@dataclass(frozen=True)
class Tracker:
    """One ``trainer.logger`` name: its settings class, the modules that provide it (any one will do), the
    ``smoeweather[extra]`` that installs it, and the builder of its Lightning logger."""

    settings: type
    modules: tuple[str, ...]
    extra: str | None
    build: Callable[[Any, Path], Logger]


def _csv(s: CSVTracker, output_dir: Path) -> Logger:
    return CSVLogger(s.save_dir or output_dir, name="logs", flush_logs_every_n_steps=s.flush_logs_every_n_steps)


def _tensorboard(s: TensorBoardTracker, output_dir: Path) -> Logger:
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(s.save_dir or output_dir, name="tensorboard", default_hp_metric=False)


def _mlflow(s: MLflowTracker, output_dir: Path) -> Logger:
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    # Lightning's own default (file:./mlruns) is refused by MLflow >= 3.7: MLflow's default instead
    uri = s.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    return MLFlowLogger(experiment_name=s.experiment_name, run_name=s.run_name or str(output_dir),
                        tracking_uri=uri, tags=dict(s.tags) if s.tags else None,
                        artifact_location=s.artifact_location)


def _wandb(s: WandbTracker, output_dir: Path) -> Logger:
    from lightning.pytorch.loggers import WandbLogger

    save_dir = Path(s.save_dir or output_dir)
    save_dir.mkdir(parents=True, exist_ok=True)  # wandb falls back to a temporary folder when it is missing
    return WandbLogger(project=s.project, entity=s.entity, name=s.run_name or str(output_dir),
                       tags=list(s.tags) if s.tags else None, save_dir=str(save_dir), offline=s.offline)


TRACKERS: dict[str, Tracker] = {
    "csv": Tracker(CSVTracker, (), None, _csv),
    "tensorboard": Tracker(TensorBoardTracker, ("tensorboard", "tensorboardX"), "tensorboard", _tensorboard),
    "mlflow": Tracker(MLflowTracker, ("mlflow",), "mlflow", _mlflow),
    "wandb": Tracker(WandbTracker, ("wandb",), "wandb", _wandb),
}
"""``trainer.logger`` name → :class:`Tracker`."""

DEFAULT_TRACKERS = ("csv",)
"""What a config without ``trainer.logger`` (or with ``null``/``true``) logs to."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _entry(entry: Any, path: str) -> TrackerSettings:
    """The settings of one ``trainer.logger`` entry (a name or a mapping with ``name``) at dotted ``path``."""
    names = ", ".join(TRACKERS)
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"config key {path!r} must be a tracker name ({names}) or a mapping with 'name', got "
                          f"{type(entry).__name__} {entry!r}")
    name = entry.get("name")
    if name is None:
        raise ConfigError(f"config key {path!r} lacks 'name': give the tracker, one of {names} "
                          f"(e.g. {{name: mlflow, {', '.join(f'{k}: ...' for k in list(entry)[:2])}}})")
    if name not in TRACKERS:
        close = difflib.get_close_matches(str(name).lower(), list(TRACKERS), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"config key '{path}.name' must be one of {names}, got {name!r}{hint}")
    tracker = TRACKERS[name]
    if tracker.modules and not any(installed(m) for m in tracker.modules):
        raise ConfigError(f"config key {path!r} names {name}, whose package {tracker.modules[0]} is not installed: "
                          f"pip install \"smoeweather[{tracker.extra}]\" (or leave {name} out of trainer.logger)")
    return parse_settings(tracker.settings, entry, path)


def parse_trackers(value: Any, where: str = "trainer.logger") -> tuple[TrackerSettings, ...]:
    """The trackers of a ``trainer.logger`` value (see the module docstring), validated: an unknown name or
    option (did-you-mean), a wrong type, a name given twice or a tracker whose package is not installed is a
    ConfigError naming the key."""
    if value is None or value is True:
        value = list(DEFAULT_TRACKERS)
    elif value is False:
        value = []
    entries = value if isinstance(value, list) else [value]
    out = tuple(_entry(e, f"{where}[{i}]" if isinstance(value, list) else where) for i, e in enumerate(entries))
    names = [t.name for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"config key {where!r} names {', '.join(twice)} more than once; give each tracker once, "
                          "with all its options in one entry")
    return out


class TrackerSpec:
    """Schema spec of ``trainer.logger`` (for a :class:`~smoeweather.config.Block`): :func:`parse_trackers`."""

    def check(self, value: Any, path: str) -> None:
        parse_trackers(value, path)


def build_loggers(trackers: tuple[TrackerSettings, ...], output_dir: Path) -> list[Logger]:
    """The Lightning loggers of ``trackers`` for a run writing to ``output_dir`` (their packages imported here)."""
    return [TRACKERS[t.name].build(t, Path(output_dir)) for t in trackers]


def learning_rates(trainer: L.Trainer) -> dict[str, float]:
    """``{"lr": ..., "lr/<name>": ...}``: the rate of each parameter group of the trainer's optimizers (the
    first unnamed group is ``lr``; others ``lr/<group name>``, or ``lr/<optimizer>.<group>``)."""
    out: dict[str, float] = {}
    for i, optimizer in enumerate(trainer.optimizers):
        for j, group in enumerate(optimizer.param_groups):
            key = f"lr/{group['name']}" if group.get("name") else ("lr" if "lr" not in out else f"lr/{i}.{j}")
            out[key] = float(group["lr"])
    return out


class TrackerLogging(L.Callback):
    """What the trackers get besides the modules' own ``self.log`` values: the resolved ``config`` as
    hyper-parameters at the fit start, the learning rates every ``trainer.log_every_n_steps`` optimizer steps
    (the rate the step is taken with), and the checkpoints at the fit end (see the module docstring)."""

    def __init__(self, config: dict[str, Any], trackers: tuple[TrackerSettings, ...], output_dir: Path) -> None:
        self.config, self.trackers, self.output_dir = config, trackers, Path(output_dir)
        self._logged_step = -1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        for logger, settings in zip(trainer.loggers, self.trackers):
            if isinstance(settings, TensorBoardTracker):
                tensorboard_hparams(logger, self.config, trainer.global_step)
            else:
                logger.log_hyperparams(self.config)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step = trainer.global_step
        if (not trainer.is_global_zero or step == self._logged_step or step % max(trainer.log_every_n_steps, 1)
                or not trainer.loggers):
            return
        rates = learning_rates(trainer)
        for logger in trainer.loggers:  # straight to the loggers: host floats, no per-key result collection
            logger.log_metrics(rates, step=step)
        self._logged_step = step

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the last ``last.ckpt`` is written, before Lightning closes the trackers' runs."""
        if not trainer.is_global_zero:
            return
        paths = checkpoint_paths(trainer)
        for logger, settings in zip(trainer.loggers, self.trackers):
            record_checkpoints(logger, settings, paths, self.output_dir / "config.yaml", trainer.global_step)
        self._finish_wandb(trainer, 0)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._finish_wandb(trainer, 1)

    def _finish_wandb(self, trainer: L.Trainer, exit_code: int) -> None:
        """End the W&B run of this fit (Lightning leaves it open: the next fit in this process, e.g. a study's
        next seed, would log into it)."""
        if not trainer.is_global_zero:
            return
        for logger, settings in zip(trainer.loggers, self.trackers):
            if isinstance(settings, WandbTracker) and getattr(logger, "_experiment", None) is not None:
                logger.experiment.finish(exit_code=exit_code)


HPARAM_METRICS = ("val_loss", "train_loss_epoch")
"""The metrics TensorBoard's HParams dashboard shows beside the hyper-parameters of each run."""


def tensorboard_hparams(logger: Logger, config: dict[str, Any], step: int) -> None:
    """The resolved ``config`` in a TensorBoard run: ``hparams.yaml``, the HParams dashboard's entry (flattened
    ``training/lr`` ..., with :data:`HPARAM_METRICS`) and the text entry ``config`` (the YAML)."""
    try:
        from torch.utils.tensorboard.summary import hparams
    except ImportError:  # tensorboardX instead of tensorboard, as Lightning's logger then uses
        from tensorboardX.summary import hparams

    logger.log_hyperparams(config)  # hparams.yaml only: Lightning writes the dashboard entry only with metrics
    params = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in flatten(config, "/").items()}
    writer = logger.experiment._get_file_writer()  # what Lightning's own log_hyperparams writes to
    for summary in hparams(params, dict.fromkeys(HPARAM_METRICS, 0.0)):  # the values are not written
        writer.add_summary(summary, step)
    text = "    " + yaml.safe_dump(config, sort_keys=False).replace("\n", "\n    ")  # a Markdown code block
    logger.experiment.add_text("config", text, step)


def checkpoint_paths(trainer: L.Trainer) -> dict[str, str]:
    """``{"last": ..., "best": ...}``: absolute paths of the run's checkpoints that exist."""
    last = next((c.last_model_path for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint)), "")
    best = getattr(trainer.checkpoint_callback, "best_model_path", "")
    return {k: str(Path(v).resolve()) for k, v in (("last", last), ("best", best)) if v and Path(v).is_file()}


def record_checkpoints(logger: Logger, settings: TrackerSettings, paths: dict[str, str], config: Path,
                       step: int) -> None:
    """The checkpoints of a finished fit (``paths``: :func:`checkpoint_paths`) in one tracker: MLflow tags and
    artifacts (with the run's ``config`` file), W&B summary and artifact, TensorBoard text (CSV: nothing, its
    folder is beside them)."""
    if not paths:
        return
    if isinstance(settings, MLflowTracker):
        client, run_id = logger.experiment, logger.run_id
        for key, path in paths.items():
            client.set_tag(run_id, f"checkpoint.{key}", path)
        if config.is_file():
            client.log_artifact(run_id, str(config))
        if settings.log_checkpoints:
            for path in dict.fromkeys(paths.values()):
                client.log_artifact(run_id, path, "checkpoints")
    elif isinstance(settings, WandbTracker):
        run = logger.experiment
        run.summary.update({f"checkpoint/{key}": path for key, path in paths.items()})
        if settings.log_checkpoints:
            import wandb

            artifact = wandb.Artifact(f"model-{run.id}", type="model", metadata=paths)
            for path in dict.fromkeys(paths.values()):
                artifact.add_file(path)
            run.log_artifact(artifact)
    elif isinstance(settings, TensorBoardTracker):
        logger.experiment.add_text("checkpoint", "  \n".join(f"{k}: {v}" for k, v in paths.items()), step)
