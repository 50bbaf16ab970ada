"""Float rounding allowances: how far two evaluations of one computation in a float dtype may differ.

One home for the tolerance rule used by the export checks (torch against onnxruntime) and by the tests: the
worst-case rounding of a chain of ``n`` dependent operations (or of a sum of ``n`` terms in any order) is
``n · u`` relative, u the unit roundoff of the dtype; both sides round, hence ``2 n u``.
"""

from __future__ import annotations

import numpy as np
import torch

UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def magnitude(values: object) -> float:
    """max |x| of a tensor (detached: no autograd warning), array or number, as a float."""
    if isinstance(values, torch.Tensor):
        return float(values.detach().abs().max()) if values.numel() else 0.0
    return float(np.max(np.abs(np.asarray(values)), initial=0.0))


def float_tol(dtype: torch.dtype | np.dtype | type, n_ops: int, scale: object = 1.0) -> dict[str, float]:
    """``rtol``/``atol`` for comparing two computations of the same quantity in ``dtype``: ``rtol = 2 n_ops u``;
    ``atol = rtol · scale``, ``scale`` the magnitude of the values (for cancellation near zero): a number, or the
    values themselves (a tensor or array: their max |x|, :func:`magnitude`)."""
    if not isinstance(dtype, torch.dtype):
        dtype = torch.from_numpy(np.zeros(0, dtype)).dtype
    rtol = 2.0 * n_ops * UNIT_ROUNDOFF[dtype]
    return {"rtol": rtol, "atol": rtol * magnitude(scale)}


def tolerance_ratio(got: np.ndarray, want: np.ndarray, rtol: float, channel_axis: int = -3) -> tuple[float, float]:
    """(largest |got − want| / (rtol (|want| + max|want| of its channel)), largest |got − want|) over the values
    present in ``want``; channels along ``channel_axis`` (C of (..., C, H, W)). NaNs (a level a forecast leaves
    out) are skipped where both have them; NaNs in different places give (inf, inf). At most 1: within ``2 n u``
    (:func:`float_tol`'s ``rtol``) of each channel's magnitude."""
    import warnings

    got, want = np.asarray(got), np.asarray(want)
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf"), float("inf")
    axes = tuple(i for i in range(want.ndim) if i != channel_axis % want.ndim)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN channel
        scale = np.nanmax(np.abs(want), axis=axes, keepdims=True)
        err = np.abs(got.astype(np.float64) - want)
        if np.isnan(err).all():
            return 0.0, 0.0
        return float(np.nanmax(err / (rtol * (np.abs(want) + scale) + 1e-30))), float(np.nanmax(err))
