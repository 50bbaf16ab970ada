"""One row of the paper's heat-diffusion table (§3.1, Tables 1–2) at paper size on a GPU, within a wall-clock budget.

Runs ``smoeweather.heat.table.train_row`` (the ``smoe heat benchmark`` protocol of
``configs/heat/benchmark.yaml``, reference block: selection on validation % within 1 %, reference init,
damping factor 0.0) for one row and seed on an existing heat store, with two changes for the device call:

* a deadline: training stops at the epoch end after which one more epoch of the same length would overrun
  ``--minutes`` (the benchmark itself budgets in epochs only); the best checkpoint so far is then scored on the
  test split as usual, and the row records ``stopped_by_deadline``;
* ``deterministic=False`` (``index_add_`` has no deterministic CUDA kernel).

After every validation the epoch, validation % within 1 % and loss and the elapsed seconds are appended to
``OUT/heat_<row>_seed<k>_progress.jsonl``, so a kill still leaves the curve; the final row (test score, the
paper's number, epochs, steps, routing accuracy) goes to ``OUT/heat_<row>_seed<k>.json``.

    python -m benchmarks.gpu_heat --row smoe --store /tmp/heat.zarr --out /tmp/heat --minutes 3
    python -m benchmarks.gpu_heat --summary /tmp/heat   # heat_gpu.md: the rows found there against the paper
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any
from unittest import mock

import lightning as L
import torch

from benchmarks.harness import Machine, clock, write_results
from smoeweather.heat import table as heat
from smoeweather.models import registry


class Deadline(L.Callback):
    """Stop at the epoch end after which another epoch as long as the last would pass ``deadline`` (the harness's
    ``clock``); log each validation to ``path``."""

    def __init__(self, deadline: float, path: Path) -> None:
        self.deadline, self.path, self.start, self.stopped = deadline, path, clock(), False

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        m = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        with self.path.open("a") as f:
            f.write(json.dumps({"epoch": trainer.current_epoch, "step": trainer.global_step,
                                "seconds": round(clock() - self.start, 1), **m}) + "\n")

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.epoch_start = clock()

    def on_validation_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking or not hasattr(self, "epoch_start"):
            return
        now = clock()  # stop unless another epoch as long as this one ends before the deadline
        if now + (now - self.epoch_start) > self.deadline:
            trainer.should_stop, self.stopped = True, True


def run_row(row: str, seed: int, store: Path, out: Path, minutes: float, max_epochs: int | None) -> dict[str, Any]:
    """Train and score one row within ``minutes``; its result goes to ``OUT/heat_<row>_seed<k>.json``."""
    machine = Machine()
    cfg = heat.resolve_config(protocol="reference")
    training = {**cfg["training"], **(cfg.get("row_training", {}).get(row) or {}), "progress": False,
                "accelerator": "gpu" if torch.cuda.is_available() else "cpu"}
    if max_epochs:
        training["max_epochs"] = max_epochs
    out.mkdir(parents=True, exist_ok=True)
    progress = out / f"heat_{row}_seed{seed}_progress.jsonl"
    progress.unlink(missing_ok=True)
    stopper = Deadline(clock() + 60 * minutes, progress)

    class Trainer(L.Trainer):  # the benchmark's Trainer with the deadline and without determinism
        def __init__(self, *args: Any, callbacks: list | None = None, **kwargs: Any) -> None:
            kwargs["deterministic"] = False
            super().__init__(*args, callbacks=[*(callbacks or []), stopper], **kwargs)

    shim = types.SimpleNamespace(Trainer=Trainer, seed_everything=L.seed_everything, pytorch=L.pytorch)
    size = int(heat.open_heat(store)["region"].shape[0])
    with mock.patch.object(heat, "L", shim):
        result = heat.train_row(row, store, out / "runs", training, cfg.get("models", {}).get(row, {}) or {}, size,
                                seed=seed, init=cfg.get("init", "torch"), damping_factor=cfg.get("damping_factor"))
    result.pop("_model")
    result |= {"paper": cfg.get("paper", {}).get(row), "stopped_by_deadline": stopper.stopped,
               "minutes": minutes, "size": size, "protocol": cfg["protocol"],
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    write_results(out / f"heat_{row}_seed{seed}.json", result, machine=machine)
    return result


def summary(folder: Path) -> str:
    """Markdown table of the finished rows (``heat_*_seed*.json``) and the last validation of unfinished ones."""
    lines = ["# Heat diffusion at paper size on a GPU, wall-clock budget", "",
             "Reference protocol (configs/heat/benchmark.yaml); each row trained until the budget (stopped at an "
             "epoch end) or early stopping, best validation checkpoint scored on the test split.", "",
             "| row | seed | % within 1 % (test) | paper | epochs | optimizer steps | stopped by budget | "
             "routing acc. | device |", "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for path in sorted(folder.glob("heat_*_seed*.json")):
        r = json.loads(path.read_text())
        lines.append(f"| {r['name']} | {r['seed']} | {r['pct_within_1pct']:.2f} | {r['paper']} | {r['epochs']} | "
                     f"{r['steps']} | {r['stopped_by_deadline']} | {r.get('routing_accuracy', '–')} | {r['device']} |")
    for path in sorted(folder.glob("heat_*_progress.jsonl")):
        if not path.with_name(path.name.replace("_progress.jsonl", ".json")).exists() and path.read_text().strip():
            last = json.loads(path.read_text().strip().splitlines()[-1])
            lines.append(f"| {path.name.removeprefix('heat_').removesuffix('_progress.jsonl')} (unfinished) | – | "
                         f"val {last.get('val_pct_within_1pct', float('nan')):.2f} | – | {last['epoch'] + 1} | "
                         f"{last['step']} | – | – | – |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """One row (``--row``), or the summary of a folder of rows (``--summary``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, default=None, help="only write DIR/heat_gpu.md from DIR's results")
    parser.add_argument("--row", choices=sorted(registry.names("heat")), help="benchmark row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", type=Path, help="heat store (smoe heat generate)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget of the training")
    parser.add_argument("--max-epochs", type=int, default=None, help="override the config's max_epochs")
    args = parser.parse_args()
    if args.summary:
        write_results(args.summary / "heat_gpu.md", None, summary(args.summary))
        print(f"wrote {args.summary / 'heat_gpu.md'}")
        return
    if args.row is None or args.store is None or args.out is None:
        parser.error("--row, --store and --out are needed (or --summary DIR)")
    if not args.store.exists():
        parser.error(f"--store {args.store} does not exist; make it with `smoe heat generate --generator reference`")
    r = run_row(args.row, args.seed, args.store, args.out, args.minutes, args.max_epochs)
    print(f"{args.row} seed {args.seed}: {r['pct_within_1pct']:.2f} % within 1 % (paper {r['paper']}), "
          f"{r['epochs']} epochs, deadline stop {r['stopped_by_deadline']}")


if __name__ == "__main__":
    main()
