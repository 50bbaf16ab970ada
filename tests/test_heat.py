"""Heat diffusion: generator, store, dataset, metric, the exact-SMoE check and the benchmark CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipelines.heat_diffusion import (
    DIFFUSIVITIES,
    generate,
    initial_states,
    open_heat,
    region_map,
    simulate,
    split_runs,
    stencils,
)
from smoeweather.cli import main
from smoeweather.data.heat import HeatDiffusionDataset
from smoeweather.experiments.heat import routing_accuracy
from smoeweather.metrics.relative_error import pct_within_1pct
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate

EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7: spacing of float32 at 1.0


def f32_tol(n_ops: int, scale: float = 1.0) -> float:
    """Absolute error bound of ``n_ops`` float32 roundings on values of magnitude ≤ ``scale``.

    Each rounding errs by ≤ eps/2 relative; we allow eps per operation (factor 2 of headroom for the
    summation order, which conv2d may change with the batch size), so the bound is n_ops · eps · scale.
    """
    return n_ops * EPS32 * scale


# one diffusion step = 5 products + 4 sums of the five-point stencil, ≤ 9 roundings per value
OPS_PER_STEP = 9


@pytest.fixture(scope="module")
def heat_store(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("heat") / "heat.zarr"
    return generate(path, runs=3, val_runs=2, test_runs=2, steps=6, size=16, seed=1, progress=False)


def test_region_map_is_deterministic_and_clustered() -> None:
    a, b = region_map(32, seed=3), region_map(32, seed=3)
    assert np.array_equal(a, b) and set(np.unique(a)) == {0, 1, 2}
    # preferential attachment: right-hand neighbours agree far more often than the 1/3 of random types
    agreement = (a[:, 1:] == a[:, :-1]).mean()
    assert agreement > 0.5


def test_stencils_are_five_point_diffusion() -> None:
    s = stencils()
    assert s.shape == (3, 3, 3)
    for kernel, d in zip(s, DIFFUSIVITIES):
        # float32 storage of a float64 value: one rounding (≤ eps/2 relative)
        assert kernel[1, 1] == pytest.approx(1 - 4 * d, rel=EPS32, abs=0)
        assert kernel[0, 1] == pytest.approx(d, rel=EPS32, abs=0)
        # the float32 sum of 9 entries (4 roundings of storage + 8 of summation) stays within that many eps
        assert kernel[0, 0] == 0 and float(kernel.sum()) == pytest.approx(1.0, rel=0, abs=f32_tol(13))


def test_simulation_matches_a_hand_step_with_zero_boundary() -> None:
    regions = np.zeros((4, 4), dtype=np.int8)
    regions[:, 2:] = 2
    field = np.zeros((1, 4, 4), dtype=np.float32)
    field[0, 0, 0] = 1.0  # corner: two neighbours are outside the domain (zero)
    field[0, 1, 2] = 1.0  # interior point in region 2
    out = simulate(field, regions, steps=1)[0, 1]
    d0, d2 = DIFFUSIVITIES[0], DIFFUSIVITIES[2]
    tol = {"rel": 0, "abs": f32_tol(OPS_PER_STEP + 1)}  # one step (+ the stencil's own float32 rounding)
    assert out[0, 0] == pytest.approx(1 - 4 * d0, **tol)
    assert out[0, 1] == pytest.approx(d0, **tol)  # neighbour of the corner, region 0
    assert out[1, 2] == pytest.approx(1 - 4 * d2, **tol)
    assert out[1, 3] == pytest.approx(d2, **tol) and out[1, 1] == pytest.approx(d0, **tol)


def test_initial_states_have_drops_in_every_region() -> None:
    regions = region_map(16, seed=0)
    fields = initial_states(5, regions, np.random.default_rng(0))
    for f in fields:
        assert f.min() >= 0 and f.max() == 1.0
        for r in range(3):
            assert 1 <= (f[regions == r] == 1.0).sum() <= 3


def test_store_layout_splits_and_atomic_refusal(heat_store, tmp_path) -> None:
    ds = open_heat(heat_store)
    assert ds["heat"].dims == ("run", "step", "y", "x") and ds["heat"].shape == (7, 7, 16, 16)
    assert [split_runs(ds, s).size for s in ("train", "val", "test")] == [3, 2, 2]
    heat = ds["heat"].values
    assert not np.allclose(heat[split_runs(ds, "train")[0], 0], heat[split_runs(ds, "val")[0], 0])
    np.testing.assert_array_equal(ds["stencil"].values, stencils())
    # the stored steps are the generator's steps. The re-simulation runs conv2d on a batch of 1 instead of
    # the generator's batch, which may change the float32 summation order: allow the rounding of 6 steps
    # (values ≤ 1, the diffusion is a convex combination so errors do not grow) — 54 eps ≈ 6.4e-6.
    again = simulate(heat[:1, 0], ds["region"].values, steps=6)
    np.testing.assert_allclose(again, heat[:1], rtol=0, atol=f32_tol(6 * OPS_PER_STEP))
    with pytest.raises(FileExistsError, match="already exists"):
        generate(heat_store, runs=1, val_runs=1, test_runs=1, steps=1, size=8, progress=False)
    with pytest.raises(ValueError, match="--steps"):
        generate(tmp_path / "bad.zarr", steps=0, progress=False)
    assert not (tmp_path / "bad.zarr").exists()
    with pytest.raises(FileNotFoundError, match="smoe heat generate"):
        open_heat(tmp_path / "missing.zarr")


def test_dataset_pairs_frame_t_with_t_plus_1(heat_store) -> None:
    ds = HeatDiffusionDataset(heat_store, "val")
    heat = open_heat(heat_store)["heat"].values[split_runs(open_heat(heat_store), "val")]
    assert len(ds) == 2 * 6
    x, y = ds[6 + 2]  # run 1, step 2
    np.testing.assert_array_equal(x[0].numpy(), heat[1, 2])
    np.testing.assert_array_equal(y[0].numpy(), heat[1, 3])
    xb, yb = ds.__getitems__([0, 8])
    assert xb.shape == (2, 1, 16, 16)
    torch.testing.assert_close(xb[1], x)
    torch.testing.assert_close(yb[1], y)


def test_smoe_with_true_stencils_and_map_predicts_exactly(heat_store) -> None:
    """An SMoE whose experts are the stencils and whose gate is the region map IS the generator."""
    store = open_heat(heat_store)
    regions = torch.from_numpy(store["region"].values.astype(np.int64))
    gate = TensorRoutingGate(3, 16, 16, prior=regions, prior_strength=1.0, frozen=True)
    layer = SpatialMoE2d(1, 3, 1, gate=gate)
    with torch.no_grad():
        layer.experts.weight.copy_(torch.from_numpy(stencils()).unsqueeze(1))
    data = HeatDiffusionDataset(heat_store, "test")
    x, y = data.__getitems__(list(range(len(data))))
    with torch.no_grad():
        pred = layer(x)
    # one float32 step each (SMoE layer vs generator), values ≤ 1: 2 × 9 roundings apart at most
    torch.testing.assert_close(pred, y, rtol=0, atol=f32_tol(2 * OPS_PER_STEP))
    assert pct_within_1pct(pred, y) == 100.0
    assert routing_accuracy(gate.weight.argmax(0).numpy(), store["region"].values) == 1.0


def test_pct_within_1pct_closed_form() -> None:
    y = np.array([1.0, 1.0, 0.0, -2.0])
    pred = np.array([1.009, 1.02, 0.0, -2.01])  # within, outside, exactly 0 (atol), within
    assert pct_within_1pct(pred, y) == 75.0
    assert pct_within_1pct(torch.tensor(pred), torch.tensor(y)) == 75.0


def test_routing_accuracy_is_permutation_invariant() -> None:
    regions = np.array([[0, 1], [2, 2]])
    assert routing_accuracy(np.array([[2, 0], [1, 1]]), regions) == 1.0
    assert routing_accuracy(np.array([[2, 0], [1, 0]]), regions) == 0.75


def test_generate_and_benchmark_through_the_cli(tmp_path, capsys) -> None:
    store = tmp_path / "h.zarr"
    assert main(["heat", "generate", "--out", str(store), "--runs", "2", "--val-runs", "1", "--test-runs", "1",
                 "--steps", "4", "--size", "8"]) == 0
    assert open_heat(store)["heat"].shape == (4, 5, 8, 8)
    assert main(["heat", "generate", "--out", str(store), "--runs", "2"]) == 2  # exists: clear error
    assert "already exists" in capsys.readouterr().err
    out = tmp_path / "bench"
    rc = main(["heat", "benchmark", "--out", str(out), "--data", str(store), "--only", "smoe,conv",
               "training.max_epochs=1", "training.progress=false"])
    assert rc == 0
    doc = json.loads((out / "heat_benchmark.json").read_text())
    assert [r["name"] for r in doc["rows"]] == ["smoe", "conv"]
    smoe = doc["rows"][0]
    assert smoe["paper"] == 100.0 and smoe["params"] == 27 + 3 * 64 and 0 <= smoe["pct_within_1pct"] <= 100
    assert {"epochs", "seconds", "routing_accuracy"} <= smoe.keys()
    assert "| smoe |" in (out / "heat_benchmark.md").read_text()
    assert (out / "heat_routing.png").stat().st_size > 1000 and (out / "heat_experts.png").stat().st_size > 1000
    assert main(["heat", "benchmark", "--out", str(out), "--only", "nonsense"]) == 2
