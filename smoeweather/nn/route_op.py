"""The SMoE routing as a ``torch.library`` custom operator, for ``torch.compile``.

Dynamo cannot trace the routing's autograd Function: its backward computes the RC labels with numpy, writes the
logged values onto the layer and memoises in the gate's selection, so every SMoE layer used to break the graph
(``torch._dynamo.explain``: one break per layer call). As an opaque custom operator with a registered autograd
formula the routing is one node of the graph in forward and one in backward; the compiler sees its shapes through
the fake implementations and runs the real ones, side effects included, eagerly. Only compiled code calls it: the
eager layer keeps its Function (and its memoised selection), which computes the same values.

The operator reaches its layer (the RC options, where the logged values go) through a registry of weak references
keyed by ``id(layer)``, and the routing Function's forward and backward through :func:`register`.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import torch

from smoeweather.nn.gates import flat_slot_index

_LAYERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_FUNCTION: dict[str, Any] = {}


def register(layer: Any, function: type) -> int:
    """Register ``layer`` and the routing Function (its static ``forward(ctx, expert_out, scores, idx, layer, …)``
    and ``backward(ctx, grad_y)``); returns the key :func:`route` takes."""
    _LAYERS[id(layer)] = layer
    _FUNCTION["route"] = function
    return id(layer)


def _context(layer_key: int, channels_last: bool, **values: Any) -> SimpleNamespace:
    """A stand-in for an autograd ctx, with what the routing Function reads and writes."""
    ctx = SimpleNamespace(layer=_LAYERS[layer_key], channels_last=channels_last, selection=None, **values)
    ctx.save_for_backward = lambda *tensors: setattr(ctx, "saved_tensors", tensors)
    return ctx


@torch.library.custom_op("smoeweather::route", mutates_args=())
def route(expert_out: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer_key: int,
          channels_last: bool) -> torch.Tensor:
    """The selected slots (B, E, F, H, W), contiguous, of all experts' outputs ``expert_out`` (B, |E|, F, H, W)."""
    ctx = _context(layer_key, channels_last)
    y = _FUNCTION["route"].forward(ctx, expert_out, scores, idx, ctx.layer, None, channels_last)
    return y.contiguous()


@route.register_fake
def _(expert_out: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer_key: int,
      channels_last: bool) -> torch.Tensor:
    b, _, f = expert_out.shape[:3]
    _, e, h, w = idx.shape
    return expert_out.new_empty(b, e, f, h, w)


@torch.library.custom_op("smoeweather::route_backward", mutates_args=())
def route_backward(grad_y: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer_key: int,
                   channels_last: bool, computed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """dL/d expert_out (B, ``computed``, F, H, W) and dL/d scores (damping, RC labels and loss, straight-through)
    of :func:`route`."""
    b, _, f, h, w = grad_y.shape
    flat = flat_slot_index(idx[0], computed, f, channels_last) if idx.shape[0] == 1 else None
    ctx = _context(layer_key, channels_last, needs_input_grad=(True, True), saved_tensors=(scores, idx),
                   expert_shape=torch.Size((b, computed, f, h, w)), flat=flat)
    grad_expert, grad_scores = _FUNCTION["route"].backward(ctx, grad_y)[:2]
    return grad_expert.contiguous(), grad_scores.contiguous()


@route_backward.register_fake
def _(grad_y: torch.Tensor, scores: torch.Tensor, idx: torch.Tensor, layer_key: int, channels_last: bool,
      computed: int) -> tuple[torch.Tensor, torch.Tensor]:
    b, _, f, h, w = grad_y.shape
    return grad_y.new_empty(b, computed, f, h, w), torch.empty_like(scores, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    expert_out, scores, idx, layer_key, channels_last = inputs
    ctx.save_for_backward(scores, idx)
    ctx.layer_key, ctx.channels_last, ctx.computed = layer_key, channels_last, expert_out.shape[1]


def _backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    scores, idx = ctx.saved_tensors
    grad_expert, grad_scores = route_backward(grad_y.contiguous(), scores, idx, ctx.layer_key, ctx.channels_last,
                                              ctx.computed)
    return grad_expert, grad_scores, None, None, None


route.register_autograd(_backward, setup_context=_setup_context)
