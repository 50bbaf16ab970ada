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
