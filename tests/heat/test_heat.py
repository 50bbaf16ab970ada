"""Heat diffusion: generator, store, dataset, metric, the exact-SMoE check and the benchmark CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipelines.heat_diffusion import (
    DIFFUSIVITIES,
    REFERENCE_DIFFUSIVITIES,
    generate,
    initial_states,
    initial_states_reference,
    load_region_mask,
    open_heat,
    region_map,
    simulate,
    split_runs,
    stencils,
)
from smoeweather.cli import main
from smoeweather.heat.data import HeatDiffusionDataset
from smoeweather.heat.models import build_heat_model, reference_init
from smoeweather.heat.table import resolve_config, routing_accuracy
from smoeweather.metrics.relative_error import pct_within_1pct
from smoeweather.nn import SpatialMoE2d, TensorRoutingGate
from smoeweather.training.regression import FieldRegressionModule

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
    np.testing.assert_array_equal(ds["stencil"].values, stencils())  # stored constants: exact
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
    np.testing.assert_array_equal(x[0].numpy(), heat[1, 2])  # the dataset hands out the stored values: exact
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


def _adam_steps(layer: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                steps: int = 300) -> None:
    """``steps`` seeded minibatch (32) MSE steps, on ONE thread: 16×16 tensors are too small to gain from
    more, and on a loaded machine extra threads spin (measured: 3 CPU-s of work took 400 s wall with 2)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            idx = torch.randint(0, x.shape[0], (32,), generator=g)
            loss = torch.nn.functional.mse_loss(layer(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)


def _train_from_true_experts(name: str, **kwargs) -> tuple[float, float]:
    """300 Adam steps of one SMoE row on 16×16 generator frames, experts started at the true stencils
    (shuffled: expert k ≠ region k) and trainable, gate random. Returns (routing accuracy, % within 1 %)."""
    regions = region_map(16, seed=0)
    frames = torch.from_numpy(simulate(initial_states(40, regions, np.random.default_rng(0)), regions, steps=10))
    x, y = frames[:32, :-1].reshape(-1, 1, 16, 16), frames[:32, 1:].reshape(-1, 1, 16, 16)
    xv, yv = frames[32:, :-1].reshape(-1, 1, 16, 16), frames[32:, 1:].reshape(-1, 1, 16, 16)
    torch.manual_seed(0)
    layer = build_heat_model(name, 16, **kwargs)
    with torch.no_grad():
        layer.experts.weight.copy_(torch.from_numpy(stencils())[[2, 0, 1]].unsqueeze(1))
    # a larger gate lr than the benchmark's 1e-3: Adam moves a logit ~lr per step and the gate starts
    # at U(−3, 3), so 1e-3 needs thousands of steps just to cross; the routing claim does not depend on it
    opt = torch.optim.Adam([{"params": [layer.experts.weight], "lr": 1e-3},
                            {"params": [layer.gate.weight], "lr": 0.05}])
    _adam_steps(layer, opt, x, y)
    with torch.no_grad():
        pct = pct_within_1pct(layer(xv), yv)
    return routing_accuracy(layer.gate.weight.detach().argmax(0).numpy(), regions), pct


def test_rc_with_damping_learns_the_region_map_and_beats_no_rc() -> None:
    """The paper's claim (Table 1), tested: the RC loss trains the gate to the region map, damping keeps the
    experts from being dragged off by misrouted points, and the same layer without RC does not learn the
    map. The experts start at the true stencils so the test takes seconds; learning them from scratch
    too takes ~10k steps (the quick benchmark's SMoE row)."""
    routing, pct = _train_from_true_experts("smoe", damping=0.0)  # the reference's damping factor
    assert routing >= 0.95 and pct >= 99.0
    routing_no_rc, pct_no_rc = _train_from_true_experts("smoe_no_rc_no_damping")
    assert routing_no_rc < 0.6 and pct_no_rc < pct - 50
    # RC without damping: under Adam the misrouted points move the (tiny) stencil entries by ~lr per step
    # whatever their gradient's size, the experts drift, and the map is not learned in the same budget
    routing_rc_only, _ = _train_from_true_experts("smoe_rc_only")
    assert routing_rc_only < 0.9


def test_rc_gate_alone_learns_the_map_at_q07_with_frozen_true_experts() -> None:
    """Evidence for the docs of q: with the experts frozen at the true stencils, q = 0.7 does not lock the
    gate — the RC loss alone takes it to the region map."""
    regions = region_map(16, seed=0)
    frames = torch.from_numpy(simulate(initial_states(32, regions, np.random.default_rng(1)), regions, steps=10))
    x, y = frames[:, :-1].reshape(-1, 1, 16, 16), frames[:, 1:].reshape(-1, 1, 16, 16)
    torch.manual_seed(0)
    layer = build_heat_model("smoe_q07", 16)
    assert layer.quantile == 0.7
    with torch.no_grad():
        layer.experts.weight.copy_(torch.from_numpy(stencils()).unsqueeze(1))
    layer.experts.weight.requires_grad_(False)
    opt = torch.optim.Adam([layer.gate.weight], lr=0.05)
    _adam_steps(layer, opt, x, y)
    assert routing_accuracy(layer.gate.weight.detach().argmax(0).numpy(), regions) >= 0.95


def test_pct_within_1pct_closed_form() -> None:
    y = np.array([1.0, 1.0, 0.0, -2.0])
    pred = np.array([1.009, 1.02, 0.0, -2.01])  # within, outside, exactly 0 (atol), within
    assert pct_within_1pct(pred, y) == 75.0
    assert pct_within_1pct(torch.tensor(pred), torch.tensor(y)) == 75.0


def test_routing_accuracy_is_permutation_invariant() -> None:
    regions = np.array([[0, 1], [2, 2]])
    assert routing_accuracy(np.array([[2, 0], [1, 1]]), regions) == 1.0
    assert routing_accuracy(np.array([[2, 0], [1, 0]]), regions) == 0.75


def test_region_mask_loader_reads_a_user_file_and_names_bad_ones(tmp_path) -> None:
    regions = region_map(12, seed=5)
    good = tmp_path / "mask.npy"
    np.save(good, regions.astype(np.int64))
    loaded = load_region_mask(good, num_regions=3)
    assert loaded.dtype == np.int8 and np.array_equal(loaded, regions)
    np.save(tmp_path / "float.npy", regions.astype(np.float64))  # integral floats are accepted
    assert np.array_equal(load_region_mask(tmp_path / "float.npy"), regions)
    bad = {
        "rect.npy": (np.zeros((4, 5), dtype=np.int64), "square 2-D"),
        "gap.npy": (np.array([[0, 2], [2, 0]]), "0..R-1"),
        "frac.npy": (np.array([[0.5, 1.0], [0.0, 1.0]]), "non-integral"),
    }
    for name, (array, message) in bad.items():
        np.save(tmp_path / name, array)
        with pytest.raises(ValueError, match=message) as err:
            load_region_mask(tmp_path / name)
        assert name in str(err.value)
    with pytest.raises(ValueError, match="expected 2"):
        load_region_mask(good, num_regions=2)
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(ValueError, match="text.npy"):
        load_region_mask(tmp_path / "text.npy")
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        load_region_mask(tmp_path / "missing.npy")


def test_reference_generator_draws_and_simulates_like_the_reference(tmp_path) -> None:
    """One drop count per run shared by all types, drops with replacement, float64 simulation — checked
    against an independent float64 simulation with scipy.signal.convolve2d (the reference's own routine)."""
    from scipy.signal import convolve2d

    regions = region_map(10, seed=2)
    fields = initial_states_reference(200, regions, np.random.default_rng(4))
    assert fields.dtype == np.float64
    drops = np.array([[(f[regions == r] == 1.0).sum() for r in range(3)] for f in fields])  # (runs, types)
    assert drops.min() >= 1 and drops.max() <= 3
    # shared count n and with-replacement draws: no type has more drops than another type's n can explain;
    # with replacement, coinciding draws give fewer distinct drops than n in some runs
    assert (drops.max(1) - drops.min(1) <= 2).all()
    assert (np.bincount(drops.max(1), minlength=4)[1:] > 0).all()  # every n ∈ {1, 2, 3} occurs
    # the drop count of the first run equals what the reference's draw order gives: U(0, 0.1) field, then n
    rng = np.random.default_rng(4)
    rng.uniform(0.0, 0.1, regions.shape)
    n0 = int(rng.integers(1, 3, endpoint=True))
    assert drops[0].max() <= n0 and drops[0].min() >= 1

    mask = tmp_path / "mask.npy"
    np.save(mask, regions)
    store = generate(tmp_path / "ref.zarr", runs=2, val_runs=1, test_runs=1, steps=5, mask=mask,
                     generator="reference", progress=False)
    ds = open_heat(store)
    assert ds.attrs["generator"] == "reference" and ds.attrs["region_map"] == str(mask)
    np.testing.assert_array_equal(ds["region"].values, regions)
    # stored constants: exact
    np.testing.assert_array_equal(ds["diffusivity"].values, np.float32(REFERENCE_DIFFUSIVITIES))
    heat = ds["heat"].values
    kernels = stencils(REFERENCE_DIFFUSIVITIES, dtype=np.float64)
    # float64 from the stored float32 first frame: the reference simulates in float64 from its float64
    # initial field; storing only rounds, so start both simulations from the same (float32) frame
    field = heat[0, 0].astype(np.float64)
    for t in range(1, 6):
        steps = [convolve2d(field, k, mode="same", boundary="fill") for k in kernels]
        field = np.choose(regions, steps)
        # a float64 simulation stored as float32: one rounding (≤ eps/2 relative) + float64 noise
        np.testing.assert_allclose(heat[0, t], field.astype(np.float32), rtol=EPS32, atol=1e-30)


def test_generate_refuses_a_mask_that_does_not_match_the_diffusivities(tmp_path) -> None:
    mask = tmp_path / "two.npy"
    np.save(mask, np.array([[0, 1], [1, 0]]))
    with pytest.raises(ValueError, match="expected 3"):
        generate(tmp_path / "x.zarr", mask=mask, progress=False)
    with pytest.raises(ValueError, match="--generator"):
        generate(tmp_path / "y.zarr", generator="nope", progress=False)
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()


def test_reference_init_uses_linear_gain_on_the_last_layer() -> None:
    torch.manual_seed(0)
    conv = reference_init(build_heat_model("conv", 16))  # 3 layers: 1→12, 12→12, 12→1
    convs = [m for m in conv.modules() if isinstance(m, torch.nn.Conv2d)]
    fan_in = [c.weight[0].numel() for c in convs]
    bounds = [float(c.weight.detach().abs().max()) for c in convs]
    # Kaiming-uniform bound: gain·sqrt(3/fan_in); relu gain √2 for hidden layers, 1 for the last
    assert bounds[0] <= np.sqrt(6 / fan_in[0]) and bounds[1] <= np.sqrt(6 / fan_in[1])
    assert bounds[1] > np.sqrt(3 / fan_in[1])  # 1,296 draws: the relu-gain range is used
    assert bounds[2] <= np.sqrt(3 / fan_in[2]) and convs[2].bias is not None and not convs[2].bias.any()
    smoe = build_heat_model("smoe", 16, init="reference")
    assert float(smoe.experts.weight.detach().abs().max()) <= np.sqrt(3 / 9)  # the experts are the last layer
    with pytest.raises(ValueError, match="init"):
        build_heat_model("smoe", 16, init="nope")


def test_selection_on_pct_within_1pct_maximises() -> None:
    module = FieldRegressionModule(build_heat_model("conv", 8, layers=1), monitor="val_pct_within_1pct")
    sched = module.configure_optimizers()["lr_scheduler"]
    assert sched["monitor"] == "val_pct_within_1pct" and sched["scheduler"].mode == "max"
    assert FieldRegressionModule(build_heat_model("conv", 8, layers=1)).configure_optimizers()[
        "lr_scheduler"]["scheduler"].mode == "min"
    with pytest.raises(ValueError, match="monitor"):
        FieldRegressionModule(build_heat_model("conv", 8, layers=1), monitor="val_acc")


def test_benchmark_config_protocols_and_no_time_boxes() -> None:
    ref = resolve_config(quick=True)
    assert ref["protocol"] == "reference" and ref["training"]["monitor"] == "val_pct_within_1pct"
    assert ref["data"]["generator"] == "reference" and ref["init"] == "reference" and ref["damping_factor"] == 0.0
    assert ref["models"].get("conv", {}).get("layers", 3) == 3  # the paper's 3-layer conv, also in quick
    proj = resolve_config(quick=True, protocol="project")
    assert proj["training"]["monitor"] == "val_loss" and proj["damping_factor"] == 0.1
    full = resolve_config()
    assert (full["data"]["runs"], full["data"]["steps"], full["data"]["size"]) == (1000, 100, 64)
    assert all(len(full["row_seeds"][r]) >= 3 for r in ("smoe", "conv", "smoe_no_rc_no_damping"))
    for cfg in (ref, proj, full):  # budgets in epochs only
        assert "max_time" not in cfg["training"]
        assert all("max_time" not in (t or {}) for t in cfg.get("row_training", {}).values())
    with pytest.raises(ValueError, match="protocol"):
        resolve_config(protocol="nope")


def test_generate_and_benchmark_through_the_cli(tmp_path, capsys) -> None:
    store = tmp_path / "h.zarr"
    assert main(["heat", "generate", "--out", str(store), "--runs", "2", "--val-runs", "1", "--test-runs", "1",
                 "--steps", "4", "--size", "8", "--generator", "reference"]) == 0
    assert open_heat(store)["heat"].shape == (4, 5, 8, 8)
    assert main(["heat", "generate", "--out", str(store), "--runs", "2"]) == 2  # exists: clear error
    assert "already exists" in capsys.readouterr().err
    docs = []
    for k in range(2):  # twice: the table must not change (seeded, no wall-clock budget)
        out = tmp_path / f"bench{k}"
        rc = main(["heat", "benchmark", "--out", str(out), "--data", str(store), "--only", "smoe,conv",
                   "training.max_epochs=2", "training.progress=false", "training.threads=1",
                   "training.accelerator=cpu", "row_seeds.smoe=[0, 1]", "row_seeds.conv=[0]"])
        assert rc == 0
        docs.append(json.loads((out / "heat_benchmark.json").read_text()))
    doc = docs[0]
    assert doc["protocol"] == "reference" and [r["name"] for r in doc["rows"]] == ["smoe", "conv"]
    smoe = doc["rows"][0]
    assert smoe["paper"] == 100.0 and smoe["params"] == 27 + 3 * 64
    assert smoe["seeds"] == [0, 1] and len(smoe["runs"]) == 2 and smoe["steps"] == [2, 2]  # 1 batch/epoch
    assert smoe["runs"][0]["pct_within_1pct"] != smoe["runs"][1]["pct_within_1pct"]  # the seed is used
    assert {"routing_accuracy", "pct_std"} <= smoe.keys()

    def strip(d: dict) -> list:
        return [{k: v for k, v in run.items() if k not in ("seconds", "checkpoint")}
                for row in d["rows"] for run in row["runs"]]

    assert strip(docs[0]) == strip(docs[1])
    tables = [(tmp_path / f"bench{k}" / "heat_benchmark.md").read_text() for k in range(2)]
    assert tables[0] == tables[1]
    # the reported score IS the best checkpoint's % within 1 % on the test split, recomputed independently
    data = HeatDiffusionDataset(store, "test")
    x, y = data.__getitems__(list(range(len(data))))
    for row in doc["rows"]:
        for run in row["runs"]:
            state = torch.load(run["checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
            model = build_heat_model(row["name"], 8)
            model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
            with torch.no_grad():
                expected = pct_within_1pct(model.eval()(x), y)
            # JSON rounds to 3 decimals; the logged epoch mean of a float32 batch mean adds ≤ 1e-5
            assert run["pct_within_1pct"] == pytest.approx(expected, abs=5e-4 + 1e-5)
    assert 0 < smoe["pct_within_1pct"] < 100  # 2 steps cannot learn the task: not a vacuous 100
    md = (tmp_path / "bench0" / "heat_benchmark.md").read_text()
    assert "| smoe |" in md and "Protocol: reference" in md and "seconds" not in md
    out = tmp_path / "bench0"
    assert (out / "heat_routing.png").stat().st_size > 1000 and (out / "heat_experts.png").stat().st_size > 1000
    assert main(["heat", "benchmark", "--out", str(out), "--only", "nonsense"]) == 2
    assert main(["heat", "benchmark", "--out", str(out), "--data", str(store), "--only", "smoe",
                 "training.max_time=00:00:01:00"]) == 2
    assert "max_time" in capsys.readouterr().err
