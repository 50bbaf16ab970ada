"""A trained network as an export folder: weights in safetensors, the model card as JSON, optionally an ONNX graph.

``smoe export CKPT --out DIR`` writes (:func:`export_model`)::

    DIR/model.safetensors   the network's tensors (the checkpoint's ``model.*`` state, keys without ``model.``)
    DIR/model.json          {"format": "smoeweather-export", "export_version": 1, "weights": ..., "weights_sha256":
                             ..., "checkpoint": {"name", "sha256"}, "smoeweather": <the checkpoint's metadata>}
    DIR/model.onnx          with ``--format onnx``: the inference graph (:func:`write_onnx`)

The ``smoeweather`` block is the checkpoint's own metadata, verbatim: the registry name and settings of the network
(``config.model``), the channel and target names, the grid (``latitude``/``longitude``), the normalisation
statistics and, for checkpoints of this version, the model card of :mod:`smoeweather.models.card` (units, levels,
leads, land-sea prior digest, code version, training data). So an export is read exactly as a checkpoint is
(:func:`smoeweather.models.loader.load_network` accepts either): the same metadata, the same rebuild, the same
weights, hence the same forecast, bit for bit. Reading an export opens JSON and safetensors only: nothing is
unpickled. Networks exported: those :func:`~smoeweather.models.loader.load_network` rebuilds (tasks
``weatherbench`` and ``postprocess``: dense and SMoE ResNets and U-Nets, E³, deep ensembles, Gaussian and
MC-dropout ResNets, the post-processing U-Nets). The DRN of ``smoe postprocess fit --method drn`` is already a
data-only netCDF model file (:mod:`smoeweather.postprocess.model_file`) and has no export.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smoeweather.models.export_folder import (
    CARD_FILE,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    ONNX_FILE,
    WEIGHTS_FILE,
    is_export,
    safetensors_module,
)
from smoeweather.models.loader import (
    METADATA_KEY,
    NETWORK_TASKS,
    check_checkpoint,
    file_sha256,
    network_task,
    rebuild_network,
)
from smoeweather.numerics import float_tol, tolerance_ratio

__all__ = ["FORMATS", "ONNX_OPSET", "FrozenSMoE", "OnnxExportError", "check_onnx", "check_opset", "example_inputs",
           "export_model", "freeze_routing", "onnx_graph", "onnx_opsets", "rounding_ops", "write_onnx"]

FORMATS = ("safetensors", "onnx")
"""``smoe export --format``: ``safetensors`` (weights and card) or ``onnx`` (those plus ``model.onnx``)."""
ONNX_OPSET = 17
"""ONNX opset of the exported graphs (onnxruntime ≥ 1.14 runs it)."""
ONNX_EXTRA = "pip install 'smoeweather[onnx]'"


class OnnxExportError(ValueError):
    """A network that has no ONNX graph (its members are random draws, or onnx is not installed)."""


def onnx_opsets() -> tuple[int, int]:
    """The lowest and highest opset torch's exporter writes that onnxruntime runs: (7, 23) in torch 2.13 (its
    ``torch.onnx._constants``; 7 is also onnxruntime's lowest supported opset)."""
    try:
        from torch.onnx import _constants
        return int(_constants.ONNX_MIN_OPSET), int(_constants.ONNX_MAX_OPSET)
    except (ImportError, AttributeError):  # a torch without that private module: the opset tested here
        return ONNX_OPSET, ONNX_OPSET


def check_opset(opset: int) -> None:
    """OnnxExportError naming ``--opset`` where torch's exporter cannot write ``opset`` (:func:`onnx_opsets`)."""
    low, high = onnx_opsets()
    if not low <= opset <= high:
        raise OnnxExportError(f"--opset {opset}: torch {torch.__version__} exports ONNX opsets {low} to {high}; "
                              f"leave --opset out for the default {ONNX_OPSET}")


def _weights(net: nn.Module) -> dict[str, torch.Tensor]:
    """The network's state as independent contiguous tensors (safetensors refuses shared storage: a gate shared by
    several layers appears under each of their names, and loading copies the one value into the one tensor)."""
    return {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}


def export_model(checkpoint: str | Path, out: str | Path, fmt: str = "safetensors", overwrite: bool = False,
                 opset: int = ONNX_OPSET) -> dict[str, Any]:
    """Write the export folder ``out`` of a ``smoe train`` checkpoint (read as data, rebuilt and loaded strictly by
    :func:`~smoeweather.models.loader.rebuild_network`); ``fmt`` ``onnx`` adds ``model.onnx`` at ``opset``, checked
    against torch with onnxruntime (:func:`check_onnx`). Atomic: on any error nothing is left at ``out``. Returns
    the ``model.json`` written."""
    from smoeweather.io import atomic_output, check_output
    from smoeweather.models.card import code_record
    from smoeweather.models.checkpoint_io import read_checkpoint

    checkpoint, out = Path(checkpoint), Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if is_export(checkpoint):
        raise ValueError(f"{checkpoint} is an export folder already; export the .ckpt it was made from")
    if fmt == "onnx":
        check_opset(opset)
    check_output(out, overwrite, inputs=[checkpoint])
    ckpt = read_checkpoint(checkpoint)
    task = network_task(check_checkpoint(ckpt, str(checkpoint)), str(checkpoint))
    if task is None:
        raise ValueError(f"{checkpoint}: a {ckpt[METADATA_KEY].get('task')!r} checkpoint; smoe export writes the "
                         f"networks of the tasks {' and '.join(NETWORK_TASKS)} (forecasting and post-processing)")
    task, meta, net = rebuild_network(ckpt, str(checkpoint), task)
    net.eval()
    graph = onnx_graph(task, meta, net, str(checkpoint)) if fmt == "onnx" else None  # refused before writing
    card: dict[str, Any] = {"format": EXPORT_FORMAT, "export_version": EXPORT_VERSION, "weights": WEIGHTS_FILE}
    with atomic_output(out, overwrite, kind="dir") as tmp:
        safetensors_module().save_file(_weights(net), str(tmp / WEIGHTS_FILE), metadata={"format": EXPORT_FORMAT})
        card["weights_sha256"] = file_sha256(tmp / WEIGHTS_FILE)
        card["checkpoint"] = {"name": checkpoint.name, "sha256": file_sha256(checkpoint)}
        card["exported"] = {"utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            "code": code_record()}
        if graph is not None:
            card["onnx"] = write_onnx(graph, tmp / ONNX_FILE, opset)
        card[METADATA_KEY] = meta
        (tmp / CARD_FILE).write_text(json.dumps(card, indent=1, allow_nan=False) + "\n")
    return card


# ---- ONNX ----------------------------------------------------------------------------------------------------
class FrozenSMoE(nn.Module):
    """A trained :class:`~smoeweather.nn.smoe.SpatialMoE2d` with a tensor-routing gate, its routing fixed: the
    selected experts per location (input-independent after training) are constants, so the layer is a convolution
    of the experts selected somewhere and one gather with a constant index. (B, C, H, W) → (B, E·F, H, W), the
    values of the layer's evaluation forward (the same ops as its CPU path, ``expert_compute="used"``)."""

    def __init__(self, layer: nn.Module) -> None:
        from smoeweather.nn.gates import TensorRoutingGate, flat_expert_index

        super().__init__()
        gate = layer.gate
        if not isinstance(gate, TensorRoutingGate):
            raise OnnxExportError(f"an SMoE layer with a {type(gate).__name__} (input-dependent routing) has no "
                                  "frozen routing; only tensor-routing gates are exported")
        self.layer = layer
        with torch.no_grad():
            scores = layer.normalised_scores(torch.zeros(1, 1, gate.height, gate.width))  # (1, |E|, H, W)
            if layer.gate_norm in ("none", "softmax"):  # order-preserving: the gate's cached selection, as forward
                idx = gate.selection(layer.num_selected, layer.out_per_expert, channels_last=False).idx
            else:
                idx = scores.topk(layer.num_selected, dim=1, sorted=True).indices
            experts, local = layer._used_experts(idx)
            self.register_buffer("experts", experts)
            self.register_buffer("flat", flat_expert_index(local[0], layer.out_per_expert))
            self.register_buffer("weights", scores.gather(1, idx).unsqueeze(2) if layer.weighted else None)
        self.shape = (layer.num_selected, layer.out_per_expert, gate.height, gate.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        e, f, h, w = self.shape
        out = self.layer.apply_experts(x, False, self.experts)  # (B, n, F, H, W)
        y = out.reshape(b, -1).index_select(1, self.flat).view(b, e, f, h, w)
        if self.weights is not None:
            y = y * self.weights.to(y.dtype)
        return y.reshape(b, e * f, h, w)


def freeze_routing(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode) with every SMoE layer replaced by its :class:`FrozenSMoE`."""
    from smoeweather.nn.smoe import SpatialMoE2d

    model = copy.deepcopy(model).eval()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, SpatialMoE2d):
                module._modules[child_name] = FrozenSMoE(child)
    return model


class _Physical(nn.Module):
    """A forecast network with physical units in and out: (B, C_in, H, W) → (B, C_out, H, W) deterministic,
    (B, M, C_out, H, W) members or (B, 2, C_out, H, W) = (μ, σ)
    (:func:`~smoeweather.models.ensemble.physical_members`)."""

    def __init__(self, model: nn.Module, kind: str) -> None:
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from smoeweather.models.ensemble import physical_members

        return self.model(x) if self.kind == "deterministic" else physical_members(self.model, x, self.kind)


def example_inputs(task: str, meta: Mapping[str, Any], batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Seeded inputs of a rebuilt network of ``task`` (the checkpoint's metadata ``meta``): ``x`` (B, C_in, H, W) in
    physical units, around the training statistics, for a forecast network; ``x`` (B, C, H, W) normalised and the
    raw ensemble mean and std (B, T, H, W) for a post-processing network."""
    grid = (len(meta["latitude"]), len(meta["longitude"]))
    gen = torch.Generator().manual_seed(0)
    if task == "postprocess":
        n_in, n_t = len(meta["channel_names"]) - len(meta.get("static_names", [])), len(meta["target_names"])
        x, m = torch.randn(batch, n_in, *grid, generator=gen), torch.randn(batch, n_t, *grid, generator=gen)
        return x, m, torch.rand(batch, n_t, *grid, generator=gen) + 0.1
    stats, n_in = meta.get("normalisation") or {}, len(meta["channel_names"])
    mean = torch.as_tensor(stats.get("input_mean", [0.0] * n_in)).view(1, -1, 1, 1)
    std = torch.as_tensor(stats.get("input_std", [1.0] * n_in)).view(1, -1, 1, 1)
    return (mean + std * torch.randn(batch, n_in, *grid, generator=gen),)


def onnx_graph(task: str, meta: Mapping[str, Any], net: nn.Module, where: str) -> dict[str, Any]:
    """What :func:`write_onnx` exports of a rebuilt network: ``module`` (routing frozen), ``reference`` (the network
    as torch evaluates it, for :func:`check_onnx`), :func:`example_inputs` ``inputs``, ``input_names``,
    ``output_names`` and their ``shapes`` (``B`` the batch). OnnxExportError naming ``where`` for a network whose
    outputs are random (MC dropout)."""
    from smoeweather.models.ensemble import model_kind

    grid = [len(meta["latitude"]), len(meta["longitude"])]
    inputs = example_inputs(task, meta)
    mcfg = meta["config"]["model"]
    if task == "postprocess":
        n_in, n_t = inputs[0].shape[1], inputs[1].shape[1]
        return {"module": freeze_routing(net), "reference": net, "inputs": inputs,
                "input_names": ["x", "ens_mean", "ens_std"], "output_names": ["mu", "sigma"],
                "shapes": {"x": ["B", n_in, *grid], "ens_mean": ["B", n_t, *grid], "ens_std": ["B", n_t, *grid],
                           "mu": ["B", n_t, *grid], "sigma": ["B", n_t, *grid]}}
    if mcfg.get("name") == "mc_dropout":
        raise OnnxExportError(f"{where}: an mc_dropout network's members are random dropout draws of torch's RNG, "
                              "which an ONNX graph cannot reproduce; export it with --format safetensors")
    kind = model_kind(mcfg)
    n_in, n_out = len(meta["channel_names"]), len(meta["target_names"])
    members = [] if kind == "deterministic" else [2 if kind == "gaussian" else int(mcfg.get("members", 4))]
    return {"module": _Physical(freeze_routing(net), kind), "reference": _Physical(net, kind), "inputs": inputs,
            "input_names": ["x"], "output_names": ["y"],
            "shapes": {"x": ["B", n_in, *grid], "y": ["B", *members, n_out, *grid]}}


def write_onnx(graph: Mapping[str, Any], path: Path, opset: int = ONNX_OPSET) -> dict[str, Any]:
    """Export ``graph`` (:func:`onnx_graph`) to ``path`` at ``opset`` (batch dim dynamic) and check it with
    onnxruntime against torch on its example inputs (:func:`check_onnx`). Returns the card's ``onnx`` block."""
    try:
        import onnx  # noqa: F401 - the exporter needs it
    except ImportError:
        raise OnnxExportError(f"--format onnx needs onnx and onnxruntime: {ONNX_EXTRA}") from None
    module, inputs = graph["module"].eval(), tuple(graph["inputs"])  # (the exporter restores this mode after)
    names = [*graph["input_names"], *graph["output_names"]]
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice: it is the one without onnxscript
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=opset,
                          input_names=list(graph["input_names"]), output_names=list(graph["output_names"]),
                          dynamic_axes={n: {0: "B"} for n in names}, do_constant_folding=True)
    check = check_onnx(path, graph["reference"].eval(), inputs)
    return {"file": path.name, "opset": opset, "inputs": list(graph["input_names"]),
            "outputs": list(graph["output_names"]), "shapes": graph["shapes"], "check": check,
            "routing": "frozen: each SMoE layer's selected experts per grid point are constants of the graph",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def rounding_ops(model: nn.Module) -> int:
    """Roundings along the longest chain of a network's float32 evaluation, bounded by the sum of the fan-ins of
    its convolutions and linear layers plus one per module (activations, normalisations, the routing): the ``n`` of
    a float32 tolerance ``2 n u`` between two evaluations of it in different orders (torch and onnxruntime)."""
    total = 0
    for m in model.modules():
        total += 1
        if isinstance(m, nn.Conv2d):
            total += m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, nn.Linear):
            total += m.in_features
    return total


def check_onnx(path: Path, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """Run the graph at ``path`` with onnxruntime (CPU) and ``module`` with torch on ``inputs``; OnnxExportError when
    an output differs by more than ``2 n u (|torch| + max|torch| of its channel)`` (n: :func:`rounding_ops`, u =
    2⁻²⁴: :func:`smoeweather.numerics.float_tol`). Returns ``{"rtol", "max_abs_diff", "worst_ratio", "batch"}``
    (ratio: difference over tolerance)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise OnnxExportError(f"--format onnx checks the graph with onnxruntime: {ONNX_EXTRA}") from None
    try:  # onnxruntime's errors (InvalidGraph, NotImplemented, ...) derive from Exception only
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OnnxExportError(f"onnxruntime {ort.__version__} cannot run the exported graph: {first}; the graph "
                              "was not written") from err
    with torch.no_grad():
        want = module(*inputs)
    want = [w.numpy() for w in (want if isinstance(want, (tuple, list)) else (want,))]
    rtol = float_tol(torch.float32, rounding_ops(module))["rtol"]
    worst = diff = 0.0
    for g, w in zip(got, want):
        ratio, err = tolerance_ratio(g, w, rtol)  # per channel (C of (..., C, H, W))
        worst, diff = max(worst, ratio), max(diff, err)
    if worst > 1.0:
        raise OnnxExportError(f"{path}: onnxruntime differs from torch by up to {diff:.3g} ({worst:.2f}x the float32 "
                              f"tolerance, rtol {rtol:.2g}); the graph was not written")
    return {"rtol": rtol, "max_abs_diff": diff, "worst_ratio": worst, "batch": int(inputs[0].shape[0])}
