"""Shared test fixtures: seeds, paths to ../shared/data (skipped with a reason when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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
