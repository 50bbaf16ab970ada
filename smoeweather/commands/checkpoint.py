"""``smoe checkpoint``: inspect a checkpoint safely, or convert one you trust into the safe plain form."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "checkpoint"


def add_parser(sub: argparse._SubParsersAction) -> None:
    ckpt = sub.add_parser("checkpoint", help="inspect a checkpoint as data, or convert a trusted old one")
    verbs = ckpt.add_subparsers(dest="checkpoint_command", required=True)
    info = verbs.add_parser("info", help="read a checkpoint or an export folder as data (never runs code) and "
                                         "print what it holds")
    info.add_argument("path", type=Path, help="a .ckpt file written by `smoe train`, or a folder of `smoe export`")
    convert = verbs.add_parser(
        "convert",
        help="rewrite a checkpoint YOU TRUST into the plain form every smoe command loads safely",
        description="Unpickles SOURCE with weights_only=False, which runs any code the file holds: only for a "
        "file you made yourself (e.g. with an older smoeweather). Writes TARGET with tensors and plain "
        "metadata only, which `smoe forecast`, `postprocess apply`, `plot routing` and `train` load safely.",
    )
    convert.add_argument("source", type=Path, help="the checkpoint to convert")
    convert.add_argument("target", type=Path, help="the converted checkpoint (must not exist)")
    convert.add_argument("--trust", action="store_true",
                         help="required: say that you trust SOURCE (loading it may run code from it)")


def _export_info(path: Path) -> str:
    """What an export folder holds, its weights checked against the card (:func:`read_export`)."""
    import json

    from smoeweather.models.export_folder import CARD_FILE, read_export

    ckpt, sha = read_export(path)
    card = json.loads((path / CARD_FILE).read_text())
    meta = ckpt.get("smoeweather") if isinstance(ckpt.get("smoeweather"), dict) else {}
    onnx = card.get("onnx")
    graph = f"model.onnx (opset {onnx.get('opset')})" if isinstance(onnx, dict) else "no ONNX graph"
    return (f"{path}: an export folder of `smoe export` (version {card.get('export_version')}), read as data; "
            f"{len(ckpt['state_dict'])} weight tensors, SHA-256 {sha[:12]}… as its card records; {graph}; task "
            f"{meta.get('task')!r}, network {meta.get('config', {}).get('model', {}).get('name')!r}, format version "
            f"{meta.get('format_version')!r}; exported from {card.get('checkpoint', {}).get('name')}")


def run(args: argparse.Namespace) -> int:
    """``info``: top-level keys, smoeweather task and format (of a checkpoint or an export folder); ``convert``:
    the plain rewrite."""
    from smoeweather.models.checkpoint_io import convert_trusted, read_checkpoint
    from smoeweather.models.export_folder import is_export

    if args.checkpoint_command == "info" and is_export(args.path):
        print(_export_info(args.path))
        return 0
    if args.checkpoint_command == "info":
        ckpt = read_checkpoint(args.path)
        meta = ckpt.get("smoeweather") if isinstance(ckpt.get("smoeweather"), dict) else {}
        n_tensors = len(ckpt.get("state_dict", {}))
        print(f"{args.path}: loads as data; keys {sorted(map(str, ckpt))}; {n_tensors} weight tensors; "
              f"task {meta.get('task')!r}, format version {meta.get('format_version')!r}")
        return 0
    if not args.trust:
        raise ValueError(
            f"converting {args.source} unpickles it unsafely (any code in it runs); pass --trust if you made "
            "this file yourself or otherwise trust it"
        )
    if args.target.exists():
        raise FileExistsError(f"{args.target} exists; choose a new name for the converted checkpoint")
    keys = convert_trusted(args.source, args.target)
    print(f"smoe checkpoint: wrote {args.target} (keys {', '.join(map(str, keys))}); it loads safely")
    return 0
