"""An exported network on an accelerator: ``smoe forecast`` from the export folder equals the checkpoint's, and the
ONNX graph equals torch there.

``prepare --out DIR`` (here, on CPU, with the onnx extra): the tiny default world of the tests (100 days from
2000-01-01, seed 0), a continuous-lead SMoE ResNet with the land-sea prior trained 3 steps on it (the forecast
tests' settings), and ``smoe export --format onnx`` of it. DIR gets ``model.ckpt``, ``export/`` (model.safetensors,
model.json, model.onnx) and ``prepared.json`` (the commit); a few hundred kB, carried to the device in ``.gpu``.

``check --prepared DIR --device cuda`` (on the device): the same world again, then ``smoe forecast`` of the
checkpoint and of the export folder on ``--device`` (3 inits × leads 24, 48 h) and of the checkpoint on CPU:

- export against checkpoint on the device: every value equal (same weights, same kernels; cuDNN deterministic);
- device against CPU: per variable, the largest difference over ``2 n u (|cpu| + max|cpu|)`` (n: the rounding
  operations of the network, :func:`smoeweather.models.export.rounding_ops`; u = 2⁻²⁴), at most 1 to pass;
- ``model.onnx`` in onnxruntime, on the device's execution provider where the image has one (else on CPU, said
  so), against the checkpoint's network in torch on the device, on inputs read from the world as ``smoe forecast``
  reads them: the same per-channel tolerance. "not available" where onnxruntime is not installed.

Writes ``gpu_export_<device>.{json,md}`` under ``--out``.

    python -m benchmarks.gpu_export prepare --out .gpu/export
    python -m benchmarks.gpu_export check --prepared .gpu/export --device cuda --work /tmp/gpu_export
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import REPO, RESULTS, Machine, device_record, write_results
from smoeweather.numerics import tolerance_ratio

WORLD_DAYS = 100
INITS = ["2000-03-21", "2000-03-24"]  # first and last init, every 24 h (test period of the overrides below)
LEADS = ["24h", "48h"]
TRAIN = ["data.world=null", "data.sources=null", "data.num_workers=0", "data.batch_size=4",
         "data.variables=[geopotential_500, temperature_850, geopotential_250]", "data.train_years=null",
         "data.valid_years=null", "data.test_years=null", "data.train_period=[2000-01-01, 2000-02-29T18:00]",
         "data.valid_period=[2000-03-01, 2000-03-20]", "data.test_period=[2000-03-21, 2000-04-09]",
         "data.lead_h=null", "data.lead_choices_h=[24, 48]", "model.width=8", "model.blocks=1",
         "trainer.accelerator=cpu", "trainer.devices=1", "trainer.max_epochs=1", "trainer.limit_train_batches=3",
         "trainer.limit_val_batches=1", "trainer.max_time=null", "trainer.enable_progress_bar=false",
         "trainer.deterministic=true"]


def world_store(path: Path) -> Path:
    """The tests' tiny default world (seed 0, 400 six-hourly steps) as a canonical store at ``path``."""
    from pipelines.prepare import write_store
    from pipelines.world import simulate_world

    ds = simulate_world((2000, 2000), seed=0, n_steps=4 * WORLD_DAYS)
    write_store(lambda: ds, path, args={"benchmark": "gpu_export"}, train_years=None, source="gpu_export",
                time_chunk=8, scheduler="synchronous", progress=False)
    return path


def _commit() -> str:
    from pipelines.provenance import git_commit

    return git_commit() or "unknown"


def prepare(out: Path) -> dict[str, Any]:
    """Train the tiny SMoE ResNet, export it with ONNX, and write ``out`` (model.ckpt, export/, prepared.json)."""
    from smoeweather.config import apply_overrides, read_config
    from smoeweather.models.export import export_model
    from smoeweather.training.run import train

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = world_store(Path(tmp) / "world.zarr")
        cfg = read_config(REPO / "configs" / "weatherbench" / "world_smoe_all_prior.yaml")
        cfg = apply_overrides(cfg, [f"output_dir={tmp}/run", f"data.store={store}", *TRAIN])
        shutil.copyfile(train(cfg).last_checkpoint, out / "model.ckpt")
    card = export_model(out / "model.ckpt", out / "export", fmt="onnx")
    record = {"commit": _commit(), "config": "weatherbench/world_smoe_all_prior", "overrides": TRAIN,
              "onnx_check_on_cpu": card["onnx"]["check"]}
    (out / "prepared.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _forecast(model: Path, store: Path, device: str, out: Path) -> dict[str, np.ndarray]:
    """``smoe forecast MODEL`` on ``device`` through the CLI; the forecast's variables as float arrays."""
    import xarray as xr

    from smoeweather.cli import main

    argv = ["forecast", str(model), "--data", str(store), "--init", *INITS, "--every", "24h", "--lead", *LEADS,
            "--device", device, "--no-progress", "--out", str(out)]
    if main(argv) != 0:
        raise RuntimeError(f"smoe {' '.join(argv)} failed")
    ds = xr.open_zarr(out)
    return {v: ds[v].values for v in sorted(ds.data_vars)}


def _onnx_check(export: Path, ckpt: Path, store: Path, device: str, rtol: float) -> dict[str, Any]:
    """``export``'s model.onnx in onnxruntime (the device's provider where there is one) against the checkpoint
    ``ckpt`` in torch on the device."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        return {"available": False, "reason": f"onnxruntime is not installed here ({err})"}
    import xarray as xr

    from smoeweather.forecast.model import constants_tensor, network_inputs, prepared_input
    from smoeweather.models.ensemble import model_kind
    from smoeweather.models.export import _Physical
    from smoeweather.models.loader import load_network

    trained = load_network(ckpt, map_location=device)
    inits = np.array(["2000-03-21T00", "2000-03-25T12"], "datetime64[ns]")
    spec, ds = prepared_input(trained, xr.open_zarr(store), inits, [24], "test")
    _, _, _, x = next(network_inputs(spec, ds, constants_tensor(ds, spec, "test"), inits, [24], 1, 2, None))
    with torch.no_grad():
        want = _Physical(trained.model, model_kind(trained.config["model"]))(x.to(device)).cpu().numpy()
    available = ort.get_available_providers()
    wanted = "CUDAExecutionProvider" if device.startswith("cuda") else "CPUExecutionProvider"
    provider = wanted if wanted in available else "CPUExecutionProvider"
    session = ort.InferenceSession(str(export / "model.onnx"), providers=[provider])
    got = session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})[0]
    ratio, diff = tolerance_ratio(got, want, rtol)
    return {"available": True, "onnxruntime": ort.__version__, "providers_available": available,
            "provider": provider, "on_device": provider == wanted, "batch": int(x.shape[0]),
            "max_abs_diff": diff, "worst_ratio": ratio, "passed": ratio <= 1.0}


def check(prepared: Path, device: str, work: Path) -> dict[str, Any]:
    """Forecasts of the checkpoint and the export on ``device`` and CPU, and the ONNX graph (module docstring)."""
    from smoeweather.models.export import rounding_ops
    from smoeweather.models.loader import load_network
    from smoeweather.numerics import float_tol

    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    record = json.loads((prepared / "prepared.json").read_text())
    ckpt, export = prepared / "model.ckpt", prepared / "export"
    if work.exists():
        shutil.rmtree(work)
    store = world_store(work / "world.zarr")
    runs = {"checkpoint_device": (ckpt, device), "export_device": (export, device), "checkpoint_cpu": (ckpt, "cpu")}
    fc = {name: _forecast(model, store, dev, work / f"{name}.zarr") for name, (model, dev) in runs.items()}
    rtol = float_tol(torch.float32, rounding_ops(load_network(ckpt).model))["rtol"]
    variables: dict[str, Any] = {}
    for v, cpu in fc["checkpoint_cpu"].items():
        dev, exp = fc["checkpoint_device"][v], fc["export_device"][v]
        ratio, diff = tolerance_ratio(dev, cpu, rtol)
        variables[v] = {"export_equals_checkpoint_on_device": bool(np.array_equal(exp, dev, equal_nan=True)),
                        "device_vs_cpu_max_abs_diff": diff, "device_vs_cpu_worst_ratio": ratio,
                        "shape": list(cpu.shape)}
    onnx = _onnx_check(export, ckpt, store, device, rtol)
    passed = all(e["export_equals_checkpoint_on_device"] and e["device_vs_cpu_worst_ratio"] <= 1.0
                 for e in variables.values()) and onnx.get("passed", True)
    return {"setup": device_record(device) | {"prepared_commit": record["commit"], "commit": _commit(),
                                              "config": record["config"], "inits": INITS, "leads": LEADS,
                                              "rtol": rtol, "cudnn_deterministic": True, "tf32": False},
            "variables": variables, "onnx": onnx, "passed": passed}


def report_md(out: dict[str, Any]) -> list[str]:
    s, o = out["setup"], out["onnx"]
    lines = [f"# An exported SMoE ResNet forecasting on {s.get('gpu', s['device'])}", "",
             f"torch {s['torch']}; `smoe forecast` of `{s['config']}` (3 training steps on the tests' tiny world), "
             f"inits {s['inits'][0]} … {s['inits'][1]} every 24 h, leads {', '.join(s['leads'])}; TF32 off, cuDNN "
             f"deterministic. Device vs CPU: largest |difference| / (rtol (|cpu| + max|cpu|)), rtol {s['rtol']:.2g} "
             f"(2 n u), at most 1. Prepared at {s['prepared_commit'][:10]}, run at {s['commit'][:10]}.", "",
             "| variable | export = checkpoint on device | device vs CPU max abs diff | × tolerance |",
             "|---|---|---:|---:|"]
    for v, e in out["variables"].items():
        lines.append(f"| {v} | {'yes, every value' if e['export_equals_checkpoint_on_device'] else 'NO'} | "
                     f"{e['device_vs_cpu_max_abs_diff']:.3g} | {e['device_vs_cpu_worst_ratio']:.2f} |")
    lines.append("")
    if not o["available"]:
        lines.append(f"ONNX: not available: {o['reason']}.")
    else:
        where = "on the device" if o["on_device"] else "on CPU (this image has no device provider)"
        lines.append(f"ONNX (onnxruntime {o['onnxruntime']}, {o['provider']}, {where}) against the checkpoint in "
                     f"torch on {s['device']}, batch {o['batch']} read from the world: max |diff| "
                     f"{o['max_abs_diff']:.3g}, {o['worst_ratio']:.2f}× the tolerance: "
                     f"{'passed' if o['passed'] else 'FAILED'}.")
    lines += ["", f"**{'Passed' if out['passed'] else 'FAILED'}.**"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="train, export (with ONNX) and write DIR (here, on CPU)")
    p.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check", help="forecast from checkpoint and export on --device (on the device)")
    c.add_argument("--prepared", type=Path, required=True, help="the DIR of `prepare`")
    c.add_argument("--device", default="cuda")
    c.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpu_export")
    c.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.verb == "prepare":
        print(json.dumps(prepare(args.out), indent=1))
        return
    if not (args.prepared / "prepared.json").is_file():
        parser.error(f"check: {args.prepared} has no prepared.json; run `python -m benchmarks.gpu_export prepare "
                     f"--out {args.prepared}` where onnx is installed, and carry it")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device on this machine")
    machine = Machine()
    out = check(args.prepared, args.device, args.work)
    stem = args.out / f"gpu_export_{args.device}"
    write_results(stem, out, report_md(out), machine=machine)
    print(f"wrote {stem}.json and .md: {'passed' if out['passed'] else 'FAILED'}")


if __name__ == "__main__":
    main()
