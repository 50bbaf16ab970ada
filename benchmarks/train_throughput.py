"""Training throughput: the real ``smoe train`` step loop (data module from the config, Lightning, the
project's callbacks) against the same model fed synthetic batches already in memory.

For each model (dense and all-SMoE + land-sea prior ResNet of the config) it measures samples/s of
(a) Lightning fitting the ForecastingModule on the config's real train loader, for each loader setup
(``--workers``, streamed from zarr and with ``data.cache``), and (b) the same module on random tensors of
the same shapes held in memory (one worker-less DataLoader). real / synthetic is the share of the step time
the model gets; the gap is the loader's and the framework's. Timing starts after ``--warmup`` steps.
Writes ``benchmarks/results/train_throughput_<cpu|cuda>.json`` and prints one JSON line.

CPU (small): python -m benchmarks.train_throughput --width 16 --blocks 3 --batch 32 --steps 20
GPU: python -m benchmarks.train_throughput --width 128 --blocks 19 --batch 64 --precision bf16-mixed \\
                  --workers 4 8 --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.harness import REPO, RESULTS, Machine, command, step_clock, write_results
from smoeweather.config import read_config
from smoeweather.training.tasks import build

MODELS = {"dense": "configs/weatherbench/gcm_dense.yaml",
          "smoe_all_prior": "configs/weatherbench/gcm_smoe_all_prior.yaml"}


def fit_rate(module: L.LightningModule, loader: DataLoader, steps: int, warmup: int, precision: str,
             batch: int) -> float:
    """Samples/s of Lightning fitting ``module`` on ``loader``, timed from step ``warmup`` on."""
    timer = step_clock(warmup, sync_cuda=True)
    # Adam alone: the config's ReduceLROnPlateau needs a val_loss, and no validation runs here
    module.configure_optimizers = lambda: torch.optim.Adam(module.model.parameters(), lr=module.lr)  # type: ignore
    trainer = L.Trainer(max_steps=warmup + steps, limit_val_batches=0, callbacks=[timer], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="auto", devices=1, precision=precision)
    trainer.fit(module, train_dataloaders=loader)
    return timer.timed * batch / timer.seconds


def main() -> None:
    """Each model on the real loader (every cache and worker setting) and on synthetic batches; write the rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="runs/data/gcm_world.zarr", help="data.store (created from the "
                        "GCM world sources when missing)")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    machine = Machine()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name in args.models:
        base = [f"data.store={args.store}", f"model.width={args.width}", f"model.blocks={args.blocks}",
                f"data.batch_size={args.batch}", "trainer.max_time=null"]
        synthetic = None
        for cache in (False, True):
            for workers in args.workers:
                cfg = read_config(REPO / MODELS[name], [*base, f"data.num_workers={workers}",
                                                        f"data.cache={str(cache).lower()}"])
                L.seed_everything(0, verbose=False)
                data, module = build(cfg)
                data.setup()
                loader = data.train_dataloader()
                if synthetic is None:  # same module, random in-memory batches of the real shapes
                    x, y = next(iter(loader))
                    n = args.batch * (args.warmup + args.steps + 1)  # no epoch end in the timed part
                    xs, ys = torch.randn(n, *x.shape[1:]), torch.randn(n, *y.shape[1:])
                    syn_loader = DataLoader(TensorDataset(xs, ys), batch_size=args.batch, shuffle=True,
                                            drop_last=True, pin_memory=device == "cuda")
                    L.seed_everything(0, verbose=False)
                    _, syn_module = build(cfg)
                    synthetic = fit_rate(syn_module, syn_loader, args.steps, args.warmup, args.precision,
                                         args.batch)
                    print(f"{name}: synthetic in-memory batches: {synthetic:8.1f} samples/s", file=sys.stderr)
                rate = fit_rate(module, loader, args.steps, args.warmup, args.precision, args.batch)
                print(f"{name}: real loader cache={cache!s:5} workers={workers}: {rate:8.1f} samples/s "
                      f"({rate / synthetic:.0%} of synthetic)", file=sys.stderr)
                rows.append({"model": name, "cache": cache, "workers": workers, "samples_per_s": round(rate, 1),
                             "synthetic_samples_per_s": round(synthetic, 1),
                             "real_over_synthetic": round(rate / synthetic, 3)})
    doc = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else f"{platform.machine()} CPU",
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "setup": {"store": args.store, "width": args.width, "blocks": args.blocks, "batch": args.batch,
                  "precision": args.precision, "timed_steps": args.steps, "warmup_steps": args.warmup},
        "command": command(),
        "target": "real >= 90 % of synthetic for both 128x19 models on the GPU with <= 8 workers",
        "rows": rows,
    }
    write_results(RESULTS / f"train_throughput_{device}", doc, machine=machine)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
