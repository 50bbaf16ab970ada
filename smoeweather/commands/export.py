"""``smoe export CKPT --out DIR [--format safetensors|onnx]``: a trained network as weights, a model card and,
optionally, an ONNX graph, read without smoeweather's class layout or any pickle (:mod:`smoeweather.models.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "export"

DESCRIPTION = """Write a trained network of `smoe train` (task weatherbench or postprocess) as an export folder:
model.safetensors (the weights), model.json (the model card: registry name and settings, input and output
variables with units and levels, grid, lead times, normalisation statistics, land-sea prior digest, code version,
training data) and, with --format onnx, model.onnx (the inference graph, SMoE routing frozen, checked against
torch with onnxruntime). smoe forecast DIR, smoe postprocess apply --network DIR and smoeweather.load_model(DIR)
read the folder as they read the checkpoint, with the same results, bit for bit.

  smoe export runs/world_smoe/checkpoints/last.ckpt --out exports/world_smoe
  smoe export runs/world_smoe/checkpoints/last.ckpt --out exports/world_smoe_onnx --format onnx
  smoe forecast exports/world_smoe --data STORE --init 2003-01-01 2003-01-31 --lead 72h --out fc.zarr"""


FORMATS = ("safetensors", "onnx")
ONNX_OPSET = 17
"""Those of :mod:`smoeweather.models.export`, written here so that ``smoe --help`` imports no torch (a test checks
that they agree)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a trained network as safetensors weights + a JSON model card (or ONNX)",
                       description=DESCRIPTION)
    p.add_argument("checkpoint", type=Path, help="a weatherbench or postprocess checkpoint (.ckpt) of `smoe train`")
    p.add_argument("--out", required=True, type=Path, help="the export folder to write (must not exist)")
    p.add_argument("--format", choices=FORMATS, default="safetensors",
                   help="safetensors (default): weights and model card; onnx: those plus model.onnx "
                        "(needs the onnx extra: pip install 'smoeweather[onnx]')")
    p.add_argument("--opset", type=int, default=ONNX_OPSET, help=f"ONNX opset of --format onnx (default {ONNX_OPSET})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args: argparse.Namespace) -> int:
    from smoeweather.models.export import export_model

    card = export_model(args.checkpoint, args.out, fmt=args.format, overwrite=args.overwrite, opset=args.opset)
    meta = card["smoeweather"]
    extra = ""
    if "onnx" in card:
        check = card["onnx"]["check"]
        extra = (f", model.onnx (opset {card['onnx']['opset']}; onnxruntime vs torch: max |diff| "
                 f"{check['max_abs_diff']:.3g}, {check['worst_ratio']:.2g}x the float32 tolerance)")
    print(f"smoe export: wrote {args.out}: {meta.get('task')} network {meta['config']['model'].get('name')!r}, "
          f"model.safetensors, model.json{extra}")
    return 0
