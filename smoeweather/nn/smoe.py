"""The Spatial Mixture-of-Experts layer (paper §2): convolutional experts, top-E routing per location,
and the routing-classification (RC) loss and expert error damping computed inside the layer's backward.

Design decisions (differences from the reference code, each tested in ``tests/nn/test_smoe_layer.py``; the
measurements behind them are in docs/smoe-weather-findings.md, "Design notes of the SMoE layer"):

* RC loss and damping happen in the backward of one autograd Function, from the error signal dL/dy arriving
  at the layer, so any number of SMoE layers at any depth train with ONE ordinary ``loss.backward()``.
* The RC loss gradient (sigmoid(g) − labels)/N is injected directly as the gate's gradient; its value is
  ``layer.last_rc_loss`` (computed when first read, from the step's own gate values). With RC on the gate
  gets no task gradient (paper App. B) unless ``gate_task_grad=True``; with RC off it gets the
  straight-through (or, weighted, the exact) gradient.
* The tensor-routing gate is input-independent: the top-E is taken once over (|E|, H, W), and batch-averaged
  RC labels give the exact mean BCE gradient without a B×|E|×H×W label tensor.
* The per-sample q-quantile uses ``kthvalue`` (lower quantile). Default q = 0.3 (the reference code's heat
  runs), not the paper text's 0.7; damping factor 0.1 (paper text; the reference code's default is 0.0).
* Deep networks (post-processing U-Net, vision SMoE-CNN) use damping off and a coherent gate init; this
  layer's defaults stay the paper's.
* Init: ``expert_init="reference"`` is Kaiming-uniform with the ReLU gain (the reference's hidden layers).
* Mixed precision: the injected gate gradient is multiplied by ``loss_scale`` (:func:`set_loss_scale`).
* Routing implementations (``route_impl``): ``index_select`` (planar) and ``channels_last`` give identical
  routing, labels and gradients; ``auto`` follows the input's memory format.
* No host synchronisation in forward or backward (CUDA-graph capturable) with ``expert_compute="all"``, the
  default on accelerators; logging values stay tensors.
* ``expert_compute="used"`` (the default on CPU with a tensor-routing gate) convolves only the experts that
  are selected somewhere on the grid. With a categorical prior most experts are selected nowhere: a
  land-sea prior with |E| = 4E selects about 2E of them (measured on the trained gcm_ens SMoE-U-Nets:
  32–34 of 64, 64–67 of 128, 130 of 256), which halves the dominant cost of a CPU step. The unselected
  experts' outputs are never read and their weight gradient is exactly zero either way, so results are the
  same (bitwise on exact data; tested). It reads the set size on the host, hence CPU only by default.
* ``expert_compute="selected"`` convolves each expert only in the rectangles of the grid that select it
  (:mod:`smoeweather.nn.selected`): the paper's ideal cost (§2.4) in FLOPs when every leaf holds one expert set,
  but on CPU each leaf is a separate oneDNN call, and on the 32 × 64 grids of the studies that costs more time
  than the FLOPs it saves (benchmarks/results/smoe_selected_cpu_quiet.md), so ``auto`` keeps ``used``.
* Under ``torch.compile`` every layer computes all experts and routes through an opaque custom operator
  (:mod:`smoeweather.nn.route_op`), so the layer compiles without a graph break.

The misrouting flags, RC labels, loss and damping are in :mod:`smoeweather.nn.misrouting`, the routing's autograd
Functions in :mod:`smoeweather.nn.smoe_autograd`; this module re-exports the functions other code imports from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from smoeweather.nn import route_op
from smoeweather.nn.gates import Selection, TensorRoutingGate, flat_slot_index

# the RC labels, loss and damping (misrouting) and the routing's autograd Functions (smoe_autograd) live in
# their own modules; the names other code imports from here are re-exported
from smoeweather.nn.misrouting import (  # noqa: F401
    batch_flagged_fraction_cpu,
    damping_factor,
    flagged_fraction,
    label_information,
    misrouted_mask,
    quantile_threshold,
    rc_gate_gradient,
    rc_loss_mean,
    routing_labels,
)
from smoeweather.nn.selected import LeafConvolutions, SelectedPlan, build_plan
from smoeweather.nn.smoe_autograd import _RouteBlock, _RouteExperts

GateNorm = Literal["none", "softmax", "abs", "softmax_abs"]
Padding = Literal["zeros", "periodic_lon"]
RouteImpl = Literal["auto", "index_select", "channels_last"]
RCThreshold = Literal["sample", "slot"]
ExpertCompute = Literal["auto", "all", "used", "selected"]
ROUTE_IMPLS = ("auto", "index_select", "channels_last")
EXPERT_COMPUTES = ("auto", "all", "used", "selected")


def pad_lon_circular(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Circular padding in W only; keeps a channels-last input channels-last (``F.pad`` returns planar)."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return F.pad(x, (pad, pad, 0, 0), mode="circular")
    return torch.cat([x[..., -pad:], x, x[..., :pad]], dim=-1)


def is_channels_last(x: torch.Tensor) -> bool:
    """True for a 4-d tensor laid out channels-last and not also contiguous (C = 1 or H = W = 1 are both)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


class SpatialMoE2d(nn.Module):
    """Spatial Mixture-of-Experts convolution (paper §2).

    Input (B, C, H, W) → output (B, E·F, H, W): at each location the E experts with the highest routing
    scores (out of |E|) are applied; their F output channels are concatenated in sorted routing-score
    order (slot 0 = highest score). Every expert is a k×k convolution; all experts are computed
    everywhere and then gathered (the paper's "naïve" implementation, §2.4), which keeps every expert in
    the autograd graph — DDP never sees an unused parameter.

    Args:
        in_channels: C.
        num_experts: |E|.
        num_selected: E, experts applied per location.
        gate: a gate module returning (G, |E|, H, W) scores; share one :class:`TensorRoutingGate`
            between layers to share routing. ``None`` builds a tensor-routing gate for ``grid``.
        grid: (H, W), needed when ``gate`` is None.
        out_per_expert: F, output channels of each expert.
        kernel_size: k of the expert convolutions.
        padding: ``zeros`` or ``periodic_lon`` (circular in W = longitude, zero in H = latitude).
        weighted: scale each selected expert by its (normalised) gate value.
        gate_norm: ``none`` (paper default), ``softmax``, ``abs`` or ``softmax_abs``.
        rc: train the gate with the routing-classification loss.
        damping: expert error damping factor for misrouted locations (paper text 0.1; the reference
            code's default and heat runs 0.0 = no expert gradient there); ``None`` disables damping.
        quantile: q; a selection is misrouted if its error is above the per-sample q-quantile plus
            ``tolerance``. Default 0.3 (70 % of the selections are candidates, as the reference code is
            run), not the 0.7 of the paper's text: with 0.7 training was observed to stall (see the
            module docstring for the evidence; it is not a lock).
        tolerance: absolute slack on that threshold for the RC labels, in output units of a
            mean-squared-error loss (reference code: 1e-5): a sample whose errors are all within it
            flags nothing, so a converged layer stops being pushed around.
        damping_tolerance: the same slack for expert damping (reference code: 1e-3).
        damping_quantile: quantile for damping when it should differ from the RC ``quantile``.
        rc_weight: multiplier of the RC loss.
        gate_task_grad: whether the gate also gets the task-loss gradient; default: only without RC.
        noise: routing noise in training, std = noise/sqrt(|E|) (0 = off; 1.0 is the N(0, 1/|E|) of
            the reference).
        aux_losses: subset of {"importance", "load", "spatial_agreement"} (paper App. C.1).
        bias: expert convolutions with bias.
        expert_init: ``torch`` (PyTorch's Conv2d default) or ``reference`` (Kaiming-uniform, ReLU gain:
            the reference code's init of hidden layers; its last layer — the heat SMoE's experts — gets
            the linear gain instead, see :func:`smoeweather.heat.models.reference_init`).
        route_impl: ``auto`` (default: ``channels_last`` for channels-last inputs, else ``index_select``),
            ``index_select`` (experts in the input's layout, output planar) or ``channels_last`` (experts
            and output channels-last; a planar input is converted first). Same results up to the conv's
            summation order, different speed and memory layout; see the module docstring.
        rc_threshold: which errors the RC quantile is taken over: ``sample`` (the paper: all slots and
            locations of a sample, so 1 − q of them are flagged and, in a hidden layer, the planes with the
            largest downstream weights are flagged everywhere) or ``slot`` (each slot's own spatial quantile per
            sample: a location is flagged for plane j when plane j's error there is high against plane j's
            errors elsewhere, which removes the plane-scale confound). ``last_label_information`` records the
            share of locations whose flagged fraction differs from 1 − q by more than 0.1.
        expert_compute: ``all`` (every expert everywhere, no host synchronisation), ``used`` (only the experts
            selected somewhere, for a shared routing G = 1; same results, see the module docstring),
            ``selected`` (each expert only in the rectangles of the grid where it is selected: a partition of the
            grid planned on the host once per routing, :mod:`smoeweather.nn.selected`; same results to float32
            summation order; G = 1 only, else all experts) or ``auto`` (``used`` on CPU, ``all`` on accelerators).
    """

    def __init__(
        self,
        in_channels: int,
        num_experts: int,
        num_selected: int = 1,
        gate: nn.Module | None = None,
        grid: tuple[int, int] | None = None,
        out_per_expert: int = 1,
        kernel_size: int = 3,
        padding: Padding = "zeros",
        weighted: bool = False,
        gate_norm: GateNorm = "none",
        rc: bool = True,
        damping: float | None = 0.1,
        quantile: float = 0.3,
        tolerance: float = 1e-5,
        damping_tolerance: float = 1e-3,
        damping_quantile: float | None = None,
        rc_weight: float = 1.0,
        gate_task_grad: bool | None = None,
        noise: float = 0.0,
        aux_losses: tuple[str, ...] = (),
        bias: bool = False,
        expert_init: str = "torch",
        route_impl: RouteImpl = "auto",
        rc_threshold: RCThreshold = "sample",
        expert_compute: ExpertCompute = "auto",
    ) -> None:
        super().__init__()
        if not 1 <= num_selected <= num_experts:
            raise ValueError(f"num_selected must be in 1..num_experts={num_experts}, got {num_selected}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if gate_norm not in ("none", "softmax", "abs", "softmax_abs"):
            raise ValueError(f"gate_norm must be none, softmax, abs or softmax_abs, got {gate_norm!r}")
        if padding not in ("zeros", "periodic_lon"):
            raise ValueError(f"padding must be 'zeros' or 'periodic_lon', got {padding!r}")
        if rc_threshold not in ("sample", "slot"):
            raise ValueError(f"rc_threshold must be 'sample' or 'slot', got {rc_threshold!r}")
        if expert_compute not in EXPERT_COMPUTES:
            raise ValueError(f"expert_compute must be one of {', '.join(EXPERT_COMPUTES)}, got {expert_compute!r}")
        if route_impl not in ROUTE_IMPLS:
            raise ValueError(f"route_impl must be one of {', '.join(ROUTE_IMPLS)}, got {route_impl!r}")
        unknown = set(aux_losses) - {"importance", "load", "spatial_agreement"}
        if unknown:
            raise ValueError(f"unknown aux_losses {sorted(unknown)}; expected importance, load, spatial_agreement")
        if gate is None:
            if grid is None:
                raise ValueError("give either a gate module or grid=(H, W) for a tensor-routing gate")
            gate = TensorRoutingGate(num_experts, *grid, num_selected=num_selected, out_per_expert=out_per_expert)
        self.in_channels, self.num_experts, self.num_selected = in_channels, num_experts, num_selected
        self.out_per_expert, self.kernel_size, self.padding = out_per_expert, kernel_size, padding
        self.out_channels = num_selected * out_per_expert
        self.gate = gate
        pad = kernel_size // 2
        self.experts = nn.Conv2d(in_channels, num_experts * out_per_expert, kernel_size, bias=bias,
                                 padding=(pad, 0) if padding == "periodic_lon" else pad)
        if expert_init == "reference":
            # the reference code's init of every weight: Kaiming-uniform for ReLU, bound sqrt(6 / fan_in),
            # 2.4× PyTorch's default; on heat diffusion the more diverse random stencils matter (the default
            # init left the d = 0.25 region without an expert for 14k steps, this one finds it at ~10-16k)
            nn.init.kaiming_uniform_(self.experts.weight, nonlinearity="relu")
            if bias:
                nn.init.zeros_(self.experts.bias)
        elif expert_init != "torch":
            raise ValueError(f"expert_init must be 'torch' or 'reference', got {expert_init!r}")
        self.weighted, self.gate_norm = weighted, gate_norm
        self.rc, self.damping, self.quantile, self.rc_weight = rc, damping, quantile, rc_weight
        self.tolerance, self.damping_tolerance = tolerance, damping_tolerance
        self.damping_quantile = quantile if damping_quantile is None else damping_quantile
        self.gate_task_grad, self.noise, self.aux_losses = gate_task_grad, noise, tuple(aux_losses)
        self.route_impl, self.rc_threshold, self.expert_compute = route_impl, rc_threshold, expert_compute
        self.loss_scale = 1.0
        # the selected path's per-leaf cost in multiply-adds (None: selected.CALL_OVERHEAD_MACS); 0 cuts the grid
        # until every leaf holds one expert set (each expert computed exactly where it is selected)
        self.selected_overhead_macs: float | None = None
        self._route_key = route_op.register(self, _RouteExperts)  # for compiled code (smoeweather.nn.route_op)
        # logged values of the last backward: tensors, or partials that compute them on first read
        self._diagnostics: dict[str, torch.Tensor | Callable[[], torch.Tensor]] = {}
        self.aux_loss: torch.Tensor | None = None
        self._last_idx: torch.Tensor | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``, unpickling) registers itself for compiled code under its own key."""
        super().__setstate__(state)
        self._route_key = route_op.register(self, _RouteExperts)

    def record_diagnostics(self, **values: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        """Set logged values of this backward (``last_rc_loss``, ``last_label_information``,
        ``last_misrouted_fraction``); a callable (a picklable ``functools.partial`` of tensors that are not
        modified later) is evaluated on first read, so a step whose values nobody reads does not compute them."""
        self._diagnostics.update(values)

    def _diagnostic(self, name: str) -> torch.Tensor | None:
        value = self._diagnostics.get(name)
        if value is not None and not isinstance(value, torch.Tensor):
            value = self._diagnostics[name] = value()
        return value

    @property
    def last_routing(self) -> torch.Tensor | None:
        """(1, H, W) top-1 expert of the last forward (of its first sample for input-dependent gates), or None."""
        idx = self._last_idx
        return None if idx is None else idx[:1, 0].detach()

    @property
    def last_rc_loss(self) -> torch.Tensor | None:
        """Mean BCE of the RC labels in the last backward (float32 scalar), or None."""
        return self._diagnostic("last_rc_loss")

    @property
    def last_label_information(self) -> torch.Tensor | None:
        """Share of locations whose flagged fraction is off 1 − q by > 0.1 in the last backward, or None."""
        return self._diagnostic("last_label_information")

    @property
    def last_misrouted_fraction(self) -> torch.Tensor | None:
        """Fraction of the selections flagged misrouted in the last backward, or None."""
        return self._diagnostic("last_misrouted_fraction")

    @property
    def gate_gets_task_grad(self) -> bool:
        return (not self.rc) if self.gate_task_grad is None else self.gate_task_grad

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, experts={self.num_experts}, selected={self.num_selected}, "
                f"F={self.out_per_expert}, k={self.kernel_size}, padding={self.padding}, weighted={self.weighted}, "
                f"rc={self.rc}, damping={self.damping}, q={self.quantile}")

    def normalised_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Gate scores after the configured normalisation: (G, |E|, H, W)."""
        scores = self.gate(x)
        if self.gate_norm in ("abs", "softmax_abs"):
            scores = scores.abs()
        if self.gate_norm in ("softmax", "softmax_abs"):
            scores = scores.softmax(dim=1)
        return scores

    def resolved_route_impl(self, x: torch.Tensor) -> str:
        """The routing implementation used for input ``x`` (``auto`` follows its memory format)."""
        if self.route_impl != "auto":
            return self.route_impl
        return "channels_last" if is_channels_last(x) else "index_select"

    def uses_selected_experts(self, x: torch.Tensor, shared_routing: bool) -> bool:
        """Whether this call convolves fewer than all experts (``used`` or ``selected``, resolved for ``x``)."""
        return self.resolved_expert_compute(x, shared_routing) != "all"

    def resolved_expert_compute(self, x: torch.Tensor, shared_routing: bool) -> str:
        """What this call computes: ``all``, ``used`` or ``selected`` (``expert_compute`` resolved for ``x``).
        A per-sample routing computes all experts; ``auto`` is ``used`` on CPU (measured faster than ``selected`` for
        the SMoE-U-Nets and ResNets on 32 × 64 grids: benchmarks/results/smoe_selected_cpu.md), ``all`` on accelerators.
        ``selected`` becomes ``used`` under autocast (the leaf convolutions' backward runs in the input's dtype);
        under ``torch.compile`` every mode computes ``all`` (the used experts and the plan have data-dependent
        shapes, which would break the graph)."""
        mode = self.expert_compute
        if not shared_routing or mode == "all" or torch.compiler.is_compiling():
            return "all"  # (compiled: the used experts' count and the plan are data-dependent shapes)
        if mode == "auto":
            mode = "used" if x.device.type == "cpu" else "all"
        if mode == "selected" and torch.is_autocast_enabled(x.device.type):
            return "used"
        return mode

    def selected_plan(self, idx: torch.Tensor, batch: int, channels_last: bool,
                      selection: Selection | None) -> SelectedPlan:
        """The leaf plan of the shared selection ``idx`` (1, E, H, W), memoised in the gate's ``selection``."""
        fan_in = self.in_channels * self.kernel_size ** 2

        overhead = self.selected_overhead_macs

        def make() -> SelectedPlan:
            return build_plan(idx[0], self.num_experts, self.out_per_expert, fan_in, batch, channels_last, overhead)
        if selection is None:
            return make()
        key = ("selected", self.num_experts, self.out_per_expert, fan_in, batch, channels_last, overhead)
        return selection.memo(key, make)

    def apply_selected(self, x: torch.Tensor, plan: SelectedPlan, channels_last: bool) -> torch.Tensor:
        """The plan's leaf convolutions: (B, C, H, W) → (B, N) leaf outputs (see :mod:`smoeweather.nn.selected`)."""
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        pad = self.kernel_size // 2
        if self.padding == "periodic_lon":
            xp = F.pad(pad_lon_circular(x, pad), (0, 0, pad, pad)) if pad else x
        else:
            xp = F.pad(x, (pad, pad, pad, pad)) if pad else x
        return LeafConvolutions.apply(xp, self.experts.weight, self.experts.bias, plan)

    def apply_experts(self, x: torch.Tensor, channels_last: bool = False,
                      experts: torch.Tensor | None = None) -> torch.Tensor:
        """All experts at all locations: (B, C, H, W) → (B, |E|, F, H, W); with ``channels_last`` computed
        and laid out channels-last, i.e. (B, H, W, |E|, F) in memory. ``experts`` (n,) ascending indices:
        only those experts, (B, n, F, H, W), with weights read from the full parameter (the others get a
        zero gradient, as they do when all are computed and none is selected)."""
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.padding == "periodic_lon":  # circular copy in longitude only; latitude zeros by the conv
            x = pad_lon_circular(x, self.kernel_size // 2)
        if experts is None:
            out = self.experts(x)
            n = self.num_experts
        else:
            f = self.out_per_expert
            rows = experts if f == 1 else (experts.view(-1, 1) * f + torch.arange(f, device=experts.device)).reshape(-1)
            bias = None if self.experts.bias is None else self.experts.bias.index_select(0, rows)
            out = F.conv2d(x, self.experts.weight.index_select(0, rows), bias, padding=self.experts.padding)
            n = experts.numel()
        if channels_last:
            out = out.contiguous(memory_format=torch.channels_last)  # no-op unless a backend chose planar
        b, _, h, w = out.shape
        return out.view(b, n, self.out_per_expert, h, w)

    def _used_experts(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts selected anywhere, ascending (n,), and ``idx`` (1, E, H, W) renumbered into them."""
        flat = idx.reshape(-1)
        used = torch.bincount(flat, minlength=self.num_experts) > 0  # (a one-pass histogram: 2.4× an index_put)
        experts = used.nonzero().view(-1)  # host sync: the number of used experts sets the conv's shape
        position = torch.cumsum(used, 0) - 1  # position of each used expert in ``experts``
        return experts, position.index_select(0, flat).view(idx.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels_last = self.resolved_route_impl(x) == "channels_last"
        scores = self.normalised_scores(x)
        routing_scores = scores
        if self.training and self.noise > 0:
            routing_scores = scores + torch.randn_like(scores) * (self.noise / math.sqrt(self.num_experts))
        flat = selection = None
        if isinstance(self.gate, TensorRoutingGate) and self.gate_norm in ("none", "softmax") and \
                routing_scores is scores:  # order-preserving: the gate's cached selection is valid
            selection = self.gate.selection(self.num_selected, self.out_per_expert, channels_last=channels_last)
            idx = selection.idx
        else:
            idx = routing_scores.detach().topk(self.num_selected, dim=1, sorted=True).indices
        self.__dict__["_last_idx"] = idx  # for last_routing; a plain attribute, set without Module.__setattr__
        experts = local_idx = None
        if torch.compiler.is_compiling():  # all experts, an opaque routing operator: no graph break (route_op)
            y = route_op.route(self.apply_experts(x, channels_last), scores, idx, self._route_key, channels_last)
            return self._finish(y, scores, routing_scores, idx)
        mode = self.resolved_expert_compute(x, shared_routing=idx.shape[0] == 1)
        if mode == "selected":
            plan = self.selected_plan(idx, x.shape[0], channels_last, selection)
            if len(plan.leaves) > 1:
                y = _RouteBlock.apply(self.apply_selected(x, plan, channels_last), scores, idx, self, plan.flat,
                                      channels_last, selection)
                return self._finish(y, scores, routing_scores, idx)
            mode = "used"  # one leaf: the used experts on the whole grid, which that path computes faster
        if mode == "used":
            if selection is None:
                experts, local_idx = self._used_experts(idx)
            else:  # once per gate and step: the layers sharing the gate share it
                experts, local_idx = selection.memo(("used", self.num_experts), lambda: self._used_experts(idx))
            if experts.numel() == self.num_experts:
                experts = local_idx = None
                flat = None if selection is None else selection.flat
            else:  # the gate's flat index is for all |E| experts: index the block of the n used ones
                flat = None if selection is None else selection.memo(
                    ("used_flat", self.num_experts, self.out_per_expert, channels_last),
                    lambda: flat_slot_index(local_idx[0], experts.numel(), self.out_per_expert, channels_last))
        elif selection is not None:
            flat = selection.flat
        expert_out = self.apply_experts(x, channels_last, experts)
        y = _RouteExperts.apply(expert_out, scores, idx, self, flat, channels_last, local_idx,
                                selection)  # (B, E, F, H, W)
        return self._finish(y, scores, routing_scores, idx)

    def _finish(self, y: torch.Tensor, scores: torch.Tensor, routing_scores: torch.Tensor,
                idx: torch.Tensor) -> torch.Tensor:
        """Gate weighting, auxiliary losses, and the slots (B, E, F, H, W) → the output (B, E·F, H, W)."""
        if self.weighted:
            weight_source = scores if self.gate_gets_task_grad else scores.detach()
            weights = weight_source.gather(1, idx).unsqueeze(2)  # (G, E, 1, H, W)
            y = y * weights.to(y.dtype)
        self.aux_loss = self._aux_losses(scores, routing_scores, idx) if self.aux_losses and self.training else None
        b, _, _, h, w = y.shape
        return y.reshape(b, self.out_channels, h, w)  # a view in both layouts

    def _aux_losses(self, scores: torch.Tensor, routing_scores: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Paper App. C.1: importance / load / spatial agreement, equally weighted (scaled by the caller)."""
        sparse = torch.zeros_like(scores).scatter(1, idx, scores.gather(1, idx))  # top-E gate G(x)
        terms = []
        if "importance" in self.aux_losses:
            importance = sparse.sum(dim=(0, 2, 3))
            terms.append((importance.std() / importance.mean().clamp_min(1e-9)) ** 2)
        if "load" in self.aux_losses and self.noise > 0:
            std = self.noise / math.sqrt(self.num_experts)
            threshold = routing_scores.detach().topk(self.num_selected, dim=1).values[:, -1:]
            # validate_args=False: the validation branches on tensor values (a host sync on CUDA)
            p = 1.0 - torch.distributions.Normal(0.0, std, validate_args=False).cdf(threshold - scores)
            load = p.sum(dim=(0, 2, 3))
            terms.append((load.std() / load.mean().clamp_min(1e-9)) ** 2)
        if "spatial_agreement" in self.aux_losses and sparse.shape[0] > 1:
            terms.append(sparse.std(dim=0).mean(dim=(1, 2)).sum())
        if not terms:
            return scores.new_zeros(())
        return torch.stack(terms).sum()


def smoe_layers(model: nn.Module) -> list[SpatialMoE2d]:
    """All SMoE layers of a model."""
    return [m for m in model.modules() if isinstance(m, SpatialMoE2d)]


def routing_loss(model: nn.Module, aux_weight: float = 0.01) -> torch.Tensor:
    """The loss term a training loop adds for the SMoE layers of ``model`` (after its forward).

    The RC loss itself is applied inside backward (see module docstring); this returns the auxiliary
    routing losses of App. C.1 × ``aux_weight`` (0 when none are configured).
    """
    terms = [m.aux_loss for m in smoe_layers(model) if m.aux_loss is not None]
    if not terms:
        p = next(model.parameters(), None)
        return torch.zeros((), device=p.device if p is not None else None)
    return aux_weight * torch.stack(terms).sum()


def rc_loss_value(model: nn.Module) -> torch.Tensor | None:
    """Sum of the RC losses of the last backward over all SMoE layers (for logging), or None."""
    values = [m.last_rc_loss for m in smoe_layers(model) if m.last_rc_loss is not None]
    return torch.stack(values).sum() if values else None


def set_loss_scale(model: nn.Module, scale: float) -> None:
    """Tell every SMoE layer the current loss scale (fp16 GradScaler), so RC gate gradients are scaled too."""
    for m in smoe_layers(model):
        m.loss_scale = float(scale)
