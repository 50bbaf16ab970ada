"""Shared test fixtures: seeds, float tolerances, paths to ../shared/data (skipped with a reason when absent),
and the synthetic data many files read, built once per session (seeded, so every build is the same bytes).

Session fixtures are read-only for the tests: a test that writes files puts them under its own ``tmp_path``."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from smoeweather import numerics

REPO = Path(__file__).resolve().parents[1]
# tests/ mirrors the package, a folder per subpackage; the test modules whose builders others reuse (gcm_ens_like,
# srft_like, a tiny trained checkpoint, ...) import one another by name from any folder
sys.path[:0] = [str(d) for d in sorted(Path(__file__).parent.iterdir())
                if d.is_dir() and d.name.isidentifier() and not d.name.startswith("_") and str(d) not in sys.path]
SHARED_DATA = Path(os.environ.get("SMOE_SHARED_DATA", REPO.parent / "shared" / "data"))
# what a skipped test says is missing and how to supply it (one wording for every test that reads SHARED_DATA)
SHARED_HOW = ("not part of this repository (some files are GPL): put the project's sample-data folder beside "
              "your clone as ../shared/data, or set SMOE_SHARED_DATA to where your copy is")


def needs_shared(*parts: str) -> str:
    """The skip reason of a test that reads ``SHARED_DATA/parts`` (the whole folder when no parts)."""
    what = f"the sample file {SHARED_DATA.joinpath(*parts)}" if parts else f"the real sample files in {SHARED_DATA}"
    return f"needs {what}, {SHARED_HOW}"


def skip_without_shared(*parts: str) -> pytest.MarkDecorator:
    """``skipif`` marker for a test that reads ``SHARED_DATA/parts``, with the :func:`needs_shared` reason."""
    return pytest.mark.skipif(not SHARED_DATA.joinpath(*parts).exists(), reason=needs_shared(*parts))


# SMOE_TEST_THREADS=1 / 2 reruns the suite at another intra-op thread count (reduction order changes):
# every float comparison must pass at both. By default the cores are shared among pytest-xdist's workers
# (`make test` runs `-n auto`): 2 workers on 2 cores get 1 thread each, not 2 each on 2 cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
torch.set_num_threads(int(os.environ.get("SMOE_TEST_THREADS", max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))))

# the one tolerance rule (smoeweather.numerics), re-exported for the tests: `from conftest import float_tol`
UNIT_ROUNDOFF, float_tol = numerics.UNIT_ROUNDOFF, numerics.float_tol


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """Collection imports every test module (torch, Lightning, xarray, ...: millions of long-lived objects), and
    the cyclic GC walked them again at every full pass: a third of the collection's CPU time (9.4 s -> 6.3 s on 2
    cores). Off while collecting; after it, what is alive is frozen out of every later pass (not the tests' own)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def shared_data() -> Path:
    """Path to ../shared/data; skips the test with a reason when it is not there (a user's clone)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(needs_shared())
    return SHARED_DATA


@pytest.fixture(scope="session")
def world_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """100 days of the default world from 2000-01-01 (seed 0, 400 six-hourly steps) as a canonical store,
    statistics over all of it: the tiny world every training, forecast and evaluation test reads."""
    from pipelines.prepare import write_store
    from pipelines.world import simulate_world

    path = tmp_path_factory.mktemp("world") / "world.zarr"
    ds = simulate_world((2000, 2000), seed=0, n_steps=400)
    write_store(lambda: ds, path, args={"test": "world"}, train_years=None, source="test", time_chunk=8,
                scheduler="synchronous", progress=False)
    return str(path)


@pytest.fixture(scope="session")
def gcm_ens_streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two years of a GCM-ensemble file in the ../shared/data/gcm_ens layout (24 inits, 4 members, 8 × 16):
    ``a`` 2005 (seed 1), ``b`` 2006 (seed 2), for the post-processing networks' tests."""
    from test_postprocess_networks import write_gcm_ens

    folder = tmp_path_factory.mktemp("gcm_ens")
    return {"a": write_gcm_ens(folder / "ens_2005.nc", "2005-01-01", seed=1),
            "b": write_gcm_ens(folder / "ens_2006.nc", "2006-01-01", seed=2)}


@pytest.fixture
def recorded_threads() -> Iterator[None]:
    """2 intra-op threads for the test (the reduction order its digests were recorded with), whatever the
    suite's default (1 per pytest-xdist worker on 2 cores); the default restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
