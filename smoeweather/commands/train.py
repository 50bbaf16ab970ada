"""``smoe train``: train a model from a YAML config (weatherbench, ens10, heat, ...)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "train"
DATA_INPUTS = ("store", "source", "sources", "truth", "constants", "path")
"""The ``data`` keys of a training config that name inputs: ``output_dir`` may hold them, never be or lie inside
one (:func:`smoeweather.io.check_apart`)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model from a YAML config")
    train.add_argument("--config", required=True, type=Path,
                       help="a YAML file, or a built-in config by name (weatherbench/world_dense)")
    train.add_argument("--init-from", type=Path, default=None, help="checkpoint to initialise weights from")
    train.add_argument("--resume", type=Path, default=None, help="checkpoint to resume training from")
    train.add_argument("--overwrite", action="store_true",
                       help="train anew into an output_dir that holds a trained run (its checkpoints are replaced)")
    train.add_argument("overrides", nargs="*", help="config overrides key.sub=value")


def check_run_dir(run_dir: Path, resume: Path | None, overwrite: bool) -> None:
    """Refuse to train into a folder that holds a trained run (a checkpoint) unless resuming it or asked to
    replace it; with ``overwrite`` its old checkpoints are removed first, so none of them outlives the new run."""
    import shutil

    from pipelines.atomic import OutputExistsError

    if resume is not None or not run_dir.is_dir() or not any(run_dir.rglob("*.ckpt")):
        return
    if not overwrite:
        raise OutputExistsError(f"{run_dir} holds a trained run already (checkpoints); pass --overwrite to train it "
                                f"anew, or --resume {run_dir / 'checkpoints' / 'last.ckpt'} to continue it")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    """Load the config with its overrides, validated in full (a typed config) before anything runs, and train."""
    from smoeweather.io import check_apart
    from smoeweather.training.run import train
    from smoeweather.training.settings import load_config

    cfg = load_config(args.config, list(args.overrides or []))
    check_apart(cfg.run_dir, [args.config, args.init_from, *(cfg.data.get(k) for k in DATA_INPUTS)], adds_files=True)
    check_run_dir(Path(cfg.run_dir), args.resume, args.overwrite)
    result = train(cfg, init_from=args.init_from, resume=args.resume)
    if result.trainer.is_global_zero:
        best = result.best_checkpoint or "none (no validation ran: set trainer.max_epochs/val_check_interval)"
        print(f"smoe train: best checkpoint {best}; last {result.last_checkpoint}")
    return 0
