"""SMoE layer fast path: the two routing implementations give identical results, and a training
step of the layer makes no host synchronisation (CUDA-graph friendly) and compiles.

Equality is BITWISE where the computations are the same up to memory layout: the gather/scatter of the
routing (random float data fed to the routing function directly), and the whole layer on integer-valued
data, where every convolution and gradient sum is exact in float32 and so independent of the summation
order that a channels-last convolution changes. On ordinary float data the layer is compared with
dtype-derived tolerances (conftest.float_tol).
"""

from __future__ import annotations

import pytest
import torch
from conftest import float_tol
from torch import nn
from torch._subclasses.fake_tensor import (  # private, but the reference way to run without data
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from smoeweather.nn import SpatialMoE2d, TensorRoutingGate, smoe_autograd
from smoeweather.nn.gates import ConvGate
from smoeweather.nn.smoe import _RouteExperts, quantile_threshold

IMPLS = ("index_select", "channels_last")
# (B, C, |E|, E, F, H, W, kernel, padding); the last has E·H·W = 72,000 > 65,536: subsampled quantile, with
# E = 3 and H·W ≡ 0 (mod 3), so a subsample strided in memory order (H, W, E) would pick other values
SHAPES = [
    (3, 2, 5, 2, 1, 4, 6, 3, "zeros"),
    (2, 3, 6, 3, 2, 5, 7, 3, "periodic_lon"),
    (4, 1, 4, 1, 3, 3, 8, 1, "zeros"),
    (2, 1, 4, 3, 1, 150, 160, 1, "periodic_lon"),
]


def _ints(*shape: int, low: int = -2, high: int = 3) -> torch.Tensor:
    return torch.randint(low, high, shape).float()


def _integer_layers(shape: tuple, gate_kind: str, weighted: bool) -> list[SpatialMoE2d]:
    """One layer per routing implementation, identical integer-valued weights. The tensor gate (G = 1)
    holds distinct multiples of 1/8, the conv gate (G = B) integers; damping 0.5 keeps gradients dyadic."""
    b, c, n, e, f, h, w, k, padding = shape
    torch.manual_seed(11)
    expert_weight = _ints(n * f, c, k, k)
    scores = (torch.randperm(n * h * w).float().view(n, h, w) - n * h * w / 2) / 8
    conv_weight, conv_bias = _ints(n, c, 3, 3), _ints(n)
    layers = []
    for impl in IMPLS:
        gate = ConvGate(c, n) if gate_kind == "conv" else None
        layer = SpatialMoE2d(c, n, e, gate=gate, grid=(h, w), out_per_expert=f, kernel_size=k, padding=padding,
                             weighted=weighted, damping=0.5, gate_task_grad=True, route_impl=impl)
        with torch.no_grad():
            layer.experts.weight.copy_(expert_weight)
            if gate_kind == "conv":
                layer.gate.conv.weight.copy_(conv_weight)
                layer.gate.conv.bias.copy_(conv_bias)
            else:
                layer.gate.weight.copy_(scores)
        layers.append(layer)
    return layers


def _train_step(layer: SpatialMoE2d, x: torch.Tensor, grad_out: torch.Tensor, bf16: bool = False) -> dict:
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = layer(x)
    (y.float() * grad_out).sum().backward()
    out = {"y": y.detach().float(), "x.grad": x.grad, "rc_loss": layer.last_rc_loss,
           "misrouted": layer.last_misrouted_fraction}
    out.update({f"{name}.grad": p.grad for name, p in layer.named_parameters()})
    return out


# LARGE exercises the subsampled quantile; it runs once (tensor gate, unweighted) to stay fast
SMALL, LARGE = SHAPES[:3], SHAPES[3]
EXACT_CASES = [(shape, gate, weighted) for shape in SMALL for gate in ("tensor", "conv") for weighted in (False, True)]
EXACT_CASES.append((LARGE, "tensor", False))


@pytest.mark.parametrize(("shape", "gate_kind", "weighted"), EXACT_CASES,
                         ids=lambda v: "x".join(map(str, v[:8])) if isinstance(v, tuple) else str(v))
def test_route_impls_identical_on_exact_data(shape: tuple, gate_kind: str, weighted: bool) -> None:
    """Outputs, expert/gate/input gradients, RC loss and misrouted fraction: bitwise equal."""
    b, c, n, e, f, h, w = shape[:7]
    layers = _integer_layers(shape, gate_kind, weighted)
    x, grad_out = _ints(b, c, h, w, low=-1, high=2), _ints(b, e * f, h, w, low=-3, high=4)
    results = [_train_step(layer, x, grad_out) for layer in layers]
    assert results[0].keys() == results[1].keys()
    for key, value in results[0].items():
        assert torch.equal(value, results[1][key]), key
    assert 0.0 < float(results[0]["misrouted"]) < 1.0  # the RC and damping branches did run
    assert layers[1](x).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("gate_kind", ["tensor", "conv"])
def test_route_impls_identical_on_exact_data_bf16(gate_kind: str) -> None:
    """bf16 autocast: routing, flags and gate gradients bitwise (bitwise here for all); the expert
    convolution's gradients in the two layouts may round their exact sums to bf16 at implementation-defined
    points on other hardware, so those get a bf16 tolerance."""
    shape = (2, 3, 6, 3, 2, 5, 7, 3, "periodic_lon")
    layers = _integer_layers(shape, gate_kind, weighted=False)
    x, grad_out = _ints(2, 3, 5, 7, low=-1, high=2), _ints(2, 6, 5, 7, low=-3, high=4)
    results = [_train_step(layer, x, grad_out, bf16=True) for layer in layers]
    for key, value in results[0].items():
        if key in ("experts.weight.grad", "x.grad"):
            tol = float_tol(torch.bfloat16, 4, scale=value)
            torch.testing.assert_close(value, results[1][key], **tol)
        else:
            assert torch.equal(value, results[1][key]), key


def _channels_last_5d(t: torch.Tensor) -> torch.Tensor:
    """(B, |E|, F, H, W) with the memory layout (B, H, W, |E|, F) of a channels-last expert output."""
    return t.permute(0, 3, 4, 1, 2).contiguous().permute(0, 3, 4, 1, 2)


# (B, |E|, E, F, H, W): F = 16 makes a reduction over F vectorise differently per layout; B = 3 with |E| = 48 gives
# label sums of 32 fractions k/3, whose rounding depends on the summation order; the last one is subsampled
@pytest.mark.parametrize("shape", [(3, 5, 2, 1, 4, 6), (2, 6, 3, 2, 5, 7), (4, 4, 1, 3, 3, 8), (2, 3, 2, 16, 4, 5),
                                   (3, 48, 32, 1, 4, 6), (2, 4, 3, 1, 150, 160)])
@pytest.mark.parametrize("shared", [True, False], ids=["G=1", "G=B"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_function_bitwise_on_float_data(shape: tuple, shared: bool, dtype: torch.dtype) -> None:
    """The routing Function alone on random floats: the same expert outputs in both memory layouts give
    bitwise equal slots, expert gradients (damping 0.1), gate gradients and logged values."""
    b, n, e, f, h, w = shape
    torch.manual_seed(12)
    gate = TensorRoutingGate(n, h, w, num_selected=e, out_per_expert=f)
    expert_out = torch.randn(b, n, f, h, w).to(dtype)
    grad_y = torch.randn(b, e, f, h, w).to(dtype)
    results = []
    for channels_last in (False, True):
        layer = SpatialMoE2d(1, n, e, gate=gate, out_per_expert=f, damping=0.1, gate_task_grad=True)
        source = (_channels_last_5d(expert_out) if channels_last else expert_out.clone()).requires_grad_()
        scores = gate.weight.unsqueeze(0)
        idx = scores.detach().topk(e, dim=1).indices
        if not shared:
            scores, idx = scores.expand(b, -1, -1, -1), idx.expand(b, -1, -1, -1)
        gate.weight.grad = None
        y = _RouteExperts.apply(source, scores, idx, layer, None, channels_last)
        y.backward(grad_y)
        assert source.grad.stride() == source.stride()  # the scatter wrote the layout the conv reads
        results.append([y.contiguous(), source.grad.contiguous(), gate.weight.grad.clone(),
                        layer.last_rc_loss, layer.last_misrouted_fraction])
    for name, a, c in zip(("y", "expert grad", "gate grad", "rc loss", "misrouted"), *results, strict=True):
        assert torch.equal(a, c), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("damping", [0.1, 0.0, 0.37])
def test_damping_factor_fused_equals_unfused(dtype: torch.dtype, damping: float) -> None:
    """The CUDA default (one `where`) and the CPU default (copy/mul/add) write the same bits."""
    from smoeweather.nn.smoe import damping_factor

    wrong = torch.rand(3, 4, 5, 6) > 0.4
    fused, unfused = (damping_factor(wrong, damping, dtype, fused=flag) for flag in (True, False))
    assert fused.dtype == dtype and torch.equal(fused, unfused)
    assert set(fused.unique().tolist()) == {1.0, float(torch.tensor(damping - 1.0, dtype=dtype) + 1.0)}


def test_quantile_threshold_ignores_memory_layout() -> None:
    for shape in [(3, 4, 5, 6), (2, 3, 150, 160)]:  # exact, and strided subsample (> 65,536 per sample)
        error = torch.rand(shape)
        permuted = error.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        assert not permuted.is_contiguous()
        assert torch.equal(quantile_threshold(error, 0.3), quantile_threshold(permuted, 0.3))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_impls_agree_on_float_data(impl: str, dtype: torch.dtype) -> None:
    """Ordinary float data (no RC flags, straight-through gate gradient): the channels-last convolution
    sums in another order, so float tolerance over the C·k·k- and B·H·W-term sums."""
    torch.manual_seed(13)
    b, c, n, e, f, h, w = 3, 4, 6, 3, 2, 6, 9
    layers = []
    for route_impl in ("index_select", impl):
        torch.manual_seed(14)
        layers.append(SpatialMoE2d(c, n, e, grid=(h, w), out_per_expert=f, padding="periodic_lon", rc=False,
                                   damping=None, route_impl=route_impl))
    x, target = torch.randn(b, c, h, w), torch.randn(b, e * f, h, w)
    results = []
    for layer in layers:
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y = layer(xi)
        nn.functional.mse_loss(y.float(), target).backward()
        results.append((y.detach().float(), layer.experts.weight.grad, layer.gate.weight.grad, xi.grad))
    for a, c_ in zip(*results, strict=True):
        # bf16 rounds the (differently ordered) conv sums to 8 bits, and a straight-through gate gradient
        # sums B·F of those: tolerance from the value range rather than from the term count
        torch.testing.assert_close(a, c_, **float_tol(dtype, 2 * b * h * w if dtype == torch.float32 else 4,
                                                       scale=a))


def test_periodic_padding_keeps_channels_last() -> None:
    from smoeweather.nn.smoe import pad_lon_circular

    x = torch.randn(2, 3, 4, 6)
    padded = pad_lon_circular(x.contiguous(memory_format=torch.channels_last), 2)
    assert padded.is_contiguous(memory_format=torch.channels_last)  # F.pad would return planar: one more copy
    assert torch.equal(padded, pad_lon_circular(x, 2))


def test_auto_route_impl_follows_input_layout() -> None:
    layer = SpatialMoE2d(3, 5, 2, grid=(4, 6), padding="periodic_lon")
    planar = torch.randn(2, 3, 4, 6)
    channels_last = planar.contiguous(memory_format=torch.channels_last)
    assert layer.resolved_route_impl(planar) == "index_select"
    assert layer.resolved_route_impl(channels_last) == "channels_last"
    assert layer.resolved_route_impl(torch.randn(2, 1, 4, 6).contiguous(memory_format=torch.channels_last)) == \
        "index_select"  # C = 1: both layouts at once, planar wins
    y_planar, y_cl = layer(planar), layer(channels_last)
    assert y_planar.is_contiguous() and y_cl.is_contiguous(memory_format=torch.channels_last)
    tol = float_tol(torch.float32, 3 * 9, scale=float(y_planar.detach().abs().max()))  # 27-term conv sums
    torch.testing.assert_close(y_planar, y_cl, **tol)
    with pytest.raises(ValueError, match="route_impl"):
        SpatialMoE2d(3, 5, 2, grid=(4, 6), route_impl="triton")


# --- host synchronisation ------------------------------------------------------------------------------------
# On CPU a host sync costs nothing and cannot be observed, so the check runs the step under FakeTensorMode:
# tensors without data, where every operation whose result would need the data on the host (.item(), bool()/
# float()/int()/tolist() of a tensor, nonzero, boolean-mask indexing, any data-dependent shape) raises.
# That is exactly the set of operations that synchronise a CUDA stream with the host.


def _layer_step(impl: str, gate_kind: str) -> None:
    """Build the layer (RC + damping, F = 2, periodic, every aux loss with noise) and run forward + backward.
    ``expert_compute="all"``: the accelerators' default (``auto`` resolves to it off CPU); ``used`` reads the
    number of selected experts on the host by design (CPU only)."""
    gate = ConvGate(3, 8) if gate_kind == "conv" else None
    layer = SpatialMoE2d(3, 8, 3, gate=gate, grid=(6, 10), out_per_expert=2, padding="periodic_lon", rc=True,
                         damping=0.1, noise=1.0, aux_losses=("importance", "load", "spatial_agreement"),
                         route_impl=impl, expert_compute="all")
    layer.train()
    x, target = torch.randn(4, 3, 6, 10), torch.randn(4, 6, 6, 10)
    loss = nn.functional.mse_loss(layer(x), target) + layer.aux_loss
    loss.backward()
    assert layer.last_rc_loss is not None and layer.last_misrouted_fraction is not None


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gate_kind", ["tensor", "conv"], ids=["G=1", "G=B"])
def test_training_step_has_no_host_sync(impl: str, gate_kind: str) -> None:
    with FakeTensorMode():
        _layer_step(impl, gate_kind)


@pytest.mark.parametrize(("inject", "error"), [
    (lambda t: t.max().item(), DataDependentOutputException),
    (lambda t: bool((t > 0).any()), DataDependentOutputException),
    (lambda t: t[t > 0], DynamicOutputShapeException),
], ids=["item", "bool", "mask-index"])
def test_host_sync_check_catches_injected_sync(monkeypatch: pytest.MonkeyPatch, inject, error) -> None:
    """The check can fail: a sync slipped into the backward's quantile is caught."""
    original = smoe_autograd.quantile_threshold

    def with_sync(values: torch.Tensor, quantile: float, **kwargs) -> torch.Tensor:
        inject(values)
        return original(values, quantile, **kwargs)

    monkeypatch.setattr(smoe_autograd, "quantile_threshold", with_sync)
    with pytest.raises(error), FakeTensorMode():
        _layer_step("channels_last", "tensor")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU and a CUDA build of torch (torch.cuda.set_sync_debug_mode)")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gate_kind", ["tensor", "conv"], ids=["G=1", "G=B"])
def test_training_step_has_no_host_sync_cuda(impl: str, gate_kind: str) -> None:
    gate = ConvGate(8, 16) if gate_kind == "conv" else None
    layer = SpatialMoE2d(8, 16, 4, gate=gate, grid=(16, 32), out_per_expert=2, padding="periodic_lon",
                         rc=True, damping=0.1, route_impl=impl).cuda()
    x, target = torch.randn(4, 8, 16, 32, device="cuda"), torch.randn(4, 8, 16, 32, device="cuda")

    def step() -> None:
        nn.functional.mse_loss(layer(x), target).backward()

    step()  # warm-up: lazy initialisation (cuBLAS/cuDNN handles) may synchronise once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.isfinite(layer.last_rc_loss)


# --- torch.compile -------------------------------------------------------------------------------------------
# Compiles on CPU (inductor too, ~16 s cold, so the test uses aot_eager: Dynamo + AOTAutograd tracing without
# code generation). One graph break by design: the routing Function writes last_rc_loss/last_misrouted_fraction
# onto the layer in its backward, a side effect Dynamo does not trace, so that Function runs eagerly inside the
# compiled model; fullgraph=True would fail on it.


@pytest.mark.parametrize("impl", IMPLS)
def test_compiled_model_matches_eager(impl: str) -> None:
    torch._dynamo.reset()

    def model() -> nn.Module:
        torch.manual_seed(15)
        return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(),
                             SpatialMoE2d(3, 6, 2, grid=(8, 12), out_per_expert=2, route_impl=impl),
                             nn.ReLU(), nn.Conv2d(4, 1, 1))

    x, target = torch.randn(4, 2, 8, 12), torch.randn(4, 1, 8, 12)
    eager, compiled = model(), model()
    runs = []
    for net, module in ((eager, eager), (torch.compile(compiled, backend="aot_eager"), compiled)):
        for _ in range(2):  # the second step routes with the updated gate
            module.zero_grad()
            y = net(x)
            nn.functional.mse_loss(y, target).backward()
            with torch.no_grad():
                for p in module.parameters():
                    p -= 0.1 * p.grad
        runs.append([y.detach(), module[2].last_rc_loss, *[p.detach().clone() for p in module.parameters()]])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, **float_tol(torch.float32, 64, scale=a))
    torch._dynamo.reset()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("weighted", [False, True])
def test_used_experts_only_is_bitwise_identical(impl: str, weighted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Speed: with a land-sea prior only the experts selected somewhere are convolved
    (``expert_compute="used"``). On integer data the output, every gradient (unselected experts' weights get
    exact zeros both ways), the RC loss and the flags are bitwise those of computing every expert."""
    h, w = 6, 8
    prior = (torch.arange(h * w).view(h, w) % 3 == 0).long()  # two categories, both present
    results, computed, calls = [], [], []
    original = torch.nn.functional.conv2d

    def counting_conv(inp: torch.Tensor, weight: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append(weight.shape[0])
        return original(inp, weight, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv2d", counting_conv)
    for compute in ("all", "used"):
        torch.manual_seed(1)
        gate = TensorRoutingGate(8, h, w, num_selected=2, out_per_expert=2, prior=prior, init="coherent")
        layer = SpatialMoE2d(3, 8, 2, gate=gate, out_per_expert=2, padding="periodic_lon", damping=0.5,
                             weighted=weighted, gate_task_grad=True, bias=True, route_impl=impl,
                             expert_compute=compute)
        with torch.no_grad():
            layer.experts.weight.copy_(_ints(*layer.experts.weight.shape))
            layer.experts.bias.copy_(_ints(16))
            # coherent scores in multiples of 1/8 (exact products when weighted): expert e scores e/8, plus 4
            # where its group (experts 0–3 sea, 4–7 land) is the location's category, as the prior's init does
            group = torch.arange(8) // 4
            gate.weight.copy_(torch.arange(8).view(8, 1, 1) / 8 + 4.0 * (group.view(8, 1, 1) == prior))
        x = _ints(2, 3, h, w, low=-1, high=2)
        if impl == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        grad_out = _ints(2, 4, h, w, low=-3, high=4)
        calls.clear()
        results.append(_train_step(layer, x, grad_out))
        computed.append(list(calls))
    for key, value in results[0].items():
        assert torch.equal(value, results[1][key]), key
    assert computed == [[16], [8]]  # all: every expert × F = 2 channels; used: the 2 + 2 selected ones
    assert 0.0 < float(results[0]["misrouted"]) < 1.0


def test_expert_compute_auto_and_validation() -> None:
    layer = SpatialMoE2d(2, 4, 1, grid=(3, 4))
    assert layer.uses_selected_experts(torch.zeros(1, 2, 3, 4), shared_routing=True)
    assert not layer.uses_selected_experts(torch.zeros(1, 2, 3, 4), shared_routing=False)
    assert not SpatialMoE2d(2, 4, 1, grid=(3, 4), expert_compute="all").uses_selected_experts(
        torch.zeros(1, 2, 3, 4), shared_routing=True)
    with pytest.raises(ValueError, match="expert_compute"):
        SpatialMoE2d(2, 4, 1, grid=(3, 4), expert_compute="some")
