"""The heat-diffusion score of the SMoE paper (§3.1): percentage of points within 1 % relative error."""

from __future__ import annotations

from typing import Any


def within_tolerance(prediction: Any, target: Any, rtol: float = 0.01, atol: float = 1e-8) -> Any:
    """Elementwise |ŷ − y| ≤ atol + rtol·|y| (numpy arrays, xarray objects or torch tensors)."""
    return abs(prediction - target) <= atol + rtol * abs(target)


def pct_within_1pct(prediction: Any, target: Any) -> float:
    """100 · mean(|ŷ − y| ≤ 1e-8 + 0.01·|y|) over all points, as a Python float."""
    hits = within_tolerance(prediction, target)
    if hasattr(hits, "float"):  # torch
        return float(100.0 * hits.float().mean())
    return float(100.0 * hits.mean())
