"""Neural-network layers: the Spatial Mixture-of-Experts, its gates and routing losses (no xarray here)."""

from smoeweather.nn.gates import (
    CoordConv2d,
    LocallyConnected2d,
    TensorRoutingGate,
    build_gate,
    tensor_gate_bound,
)
from smoeweather.nn.padding import PeriodicLonConv2d, pad_periodic_lon
from smoeweather.nn.smoe import (
    SpatialMoE2d,
    misrouted_mask,
    rc_loss_value,
    routing_labels,
    routing_loss,
    set_loss_scale,
    smoe_layers,
)

__all__ = [
    "CoordConv2d",
    "LocallyConnected2d",
    "PeriodicLonConv2d",
    "SpatialMoE2d",
    "TensorRoutingGate",
    "build_gate",
    "misrouted_mask",
    "pad_periodic_lon",
    "rc_loss_value",
    "routing_labels",
    "routing_loss",
    "set_loss_scale",
    "smoe_layers",
    "tensor_gate_bound",
]
