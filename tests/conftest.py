"""Shared test fixtures: seeds, paths to ../shared/data (skipped with a reason when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))

# SMOE_TEST_THREADS=1 / 2 reruns the suite at another intra-op thread count (reduction order changes):
# every float comparison must pass at both
torch.set_num_threads(int(os.environ.get("SMOE_TEST_THREADS", max(1, min(2, os.cpu_count() or 1)))))

UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def float_tol(dtype: torch.dtype | np.dtype | type, n_ops: int, scale: float = 1.0) -> dict[str, float]:
    """``rtol``/``atol`` for comparing two computations of the same quantity in ``dtype``.

    Worst-case rounding of a chain of ``n_ops`` dependent operations (or of a sum of n_ops terms in any
    order) is n_ops · u relative, u = unit roundoff (2^-24 for float32). ``scale`` is the magnitude of the
    values, for an absolute tolerance near zero (cancellation). Factor 2: both sides round.
    """
    if not isinstance(dtype, torch.dtype):
        dtype = torch.from_numpy(np.zeros(0, dtype)).dtype
    rtol = 2.0 * n_ops * UNIT_ROUNDOFF[dtype]
    return {"rtol": rtol, "atol": rtol * scale}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def shared_data() -> Path:
    """Path to ../shared/data; skips the test with a reason when it is not there (a user's clone)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"../shared/data not found at {SHARED_DATA} (only present in the project's CI)")
    return SHARED_DATA
