"""Probabilistic scores: agreement with properscoring/scores, closed forms, EFI limits, spread–skill."""

from __future__ import annotations

import numpy as np
import properscoring
import pytest
import xarray as xr
from scipy import integrate, stats
from scores.probability import crps_for_ensemble, tail_tw_crps_for_ensemble

from smoeweather.metrics import probabilistic as P

EPS64 = np.finfo(np.float64).eps
M = 11
# float64 sums of M member terms of O(1) values: a few·M ulps
RTOL = 8 * M * EPS64


def _ensemble(shape: tuple[int, ...] = (6, 4, 5), m: int = M, seed: int = 0) -> tuple[xr.DataArray, xr.DataArray]:
    rng = np.random.default_rng(seed)
    dims = ("time", "latitude", "longitude")
    fc = xr.DataArray(rng.normal(size=(*shape, m)), dims=(*dims, "member"))
    truth = xr.DataArray(rng.normal(size=shape), dims=dims)
    return fc, truth


def test_standard_crps_matches_properscoring() -> None:
    fc, truth = _ensemble()
    ours = P.crps_ensemble(fc, truth, estimator="standard")
    ref = properscoring.crps_ensemble(truth.values, fc.values)
    np.testing.assert_allclose(ours.values, ref, rtol=RTOL, atol=RTOL)
    assert ours.dims == truth.dims


@pytest.mark.parametrize(("estimator", "method"), [("standard", "ecdf"), ("fair", "fair")])
def test_crps_matches_scores(estimator: str, method: str) -> None:
    fc, truth = _ensemble()
    ours = P.crps_ensemble(fc, truth, estimator=estimator)
    ref = crps_for_ensemble(fc, truth, "member", method=method, preserve_dims="all")
    np.testing.assert_allclose(ours.values, ref.transpose(*ours.dims).values, rtol=RTOL, atol=RTOL)


def test_crps_dataset_dask_and_float32() -> None:
    fc, truth = _ensemble()
    ds_fc = xr.Dataset({"a": fc, "b": 2 * fc})
    ds_truth = xr.Dataset({"a": truth, "b": 2 * truth, "extra": truth})
    eager = P.crps_ensemble(ds_fc, ds_truth)
    lazy = P.crps_ensemble(ds_fc.chunk({"time": 2, "member": 3}), ds_truth.chunk({"time": 3}))
    assert lazy["a"].chunks is not None  # stays lazy
    xr.testing.assert_allclose(lazy.compute(), eager, rtol=RTOL)
    # CRPS is positively homogeneous: CRPS(2x, 2y) = 2 CRPS(x, y)
    np.testing.assert_allclose(eager["b"].values, 2 * eager["a"].values, rtol=RTOL)
    # float32 inputs are scored in float64: only their rounding (≤ |x|·eps32/2 each) differs, and the CRPS
    # moves by at most twice the largest input perturbation (1-Lipschitz in the members and in the truth)
    f32 = P.crps_ensemble(fc.astype(np.float32), truth.astype(np.float32))
    atol = 2 * float(abs(fc).max()) * np.finfo(np.float32).eps
    np.testing.assert_allclose(f32.values, eager["a"].values, rtol=0, atol=atol)


def test_crps_bad_input() -> None:
    fc, truth = _ensemble()
    with pytest.raises(ValueError, match="member"):
        P.crps_ensemble(truth, truth)
    with pytest.raises(ValueError, match="at least 2"):
        P.crps_ensemble(fc.isel(member=[0]), truth, estimator="fair")
    with pytest.raises(ValueError, match="estimator"):
        P.crps_ensemble(fc, truth, estimator="unbiased")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'b'"):
        P.crps_ensemble(xr.Dataset({"a": fc, "b": fc}), xr.Dataset({"a": truth}))


def test_gaussian_crps_closed_forms() -> None:
    mu = xr.DataArray([0.0, 1.0, 0.0, 3.0, 2.0])
    sigma = xr.DataArray([1.0, 2.0, 1.0, 0.5, 0.0])
    truth = xr.DataArray([0.0, 1.0, 10.0, -2.0, 5.0])
    got = P.crps_gaussian(mu, sigma, truth).values
    # z = 0: σ(2φ(0) − 1/√π) = σ(√2 − 1)/√π
    assert got[0] == pytest.approx((np.sqrt(2) - 1) / np.sqrt(np.pi), rel=4 * EPS64)
    assert got[1] == pytest.approx(2 * (np.sqrt(2) - 1) / np.sqrt(np.pi), rel=4 * EPS64)
    # |z| = 10: Φ, φ terms below 1e-22, CRPS = |y − μ| − σ/√π
    assert got[2] == pytest.approx(10 - 1 / np.sqrt(np.pi), rel=16 * EPS64)
    assert got[3] == pytest.approx(5 - 0.5 / np.sqrt(np.pi), rel=16 * EPS64)
    assert got[4] == 3.0  # σ = 0: absolute error
    ref = properscoring.crps_gaussian(truth.values[:4], mu.values[:4], sigma.values[:4])
    np.testing.assert_allclose(got[:4], ref, rtol=16 * EPS64)
    assert np.isnan(P.crps_gaussian(xr.DataArray(0.0), xr.DataArray(-1.0), xr.DataArray(0.0)).item())


def test_the_two_gaussian_crps_homes_agree() -> None:
    """The numpy/xarray CRPS and the torch one (losses, DRN, networks) agree in float64 to a few ulps of
    the O(1) terms (they differ only in Φ: scipy's ndtr against ½ erfc(−z/√2)); numpy in, numpy out."""
    import torch

    from smoeweather.nn.crps import gaussian_crps

    rng = np.random.default_rng(3)
    mu, y = rng.normal(size=(2, 500)) * 3
    sigma = rng.uniform(0.05, 4.0, 500)
    ours = P.crps_gaussian(mu, sigma, y)
    assert isinstance(ours, np.ndarray)
    np.testing.assert_array_equal(ours, P.crps_gaussian(xr.DataArray(mu), xr.DataArray(sigma), xr.DataArray(y)))
    t = gaussian_crps(*(torch.from_numpy(a) for a in (mu, sigma, y))).numpy()
    np.testing.assert_allclose(t, ours, rtol=32 * EPS64, atol=32 * EPS64 * sigma.max())


def test_fair_crps_of_large_gaussian_ensemble() -> None:
    """E_y[CRPS(N(0,σ²), y)] = σ/√π for y ~ N(0,σ²); the fair estimator is unbiased for it, the standard one
    has expectation σ/√π (1 + 1/M) (E|X − X'| term shrunk by (M − 1)/M)."""
    n, m, sigma = 20_000, 50, 2.0
    rng = np.random.default_rng(1)
    fc = xr.DataArray(rng.normal(0, sigma, size=(n, m)), dims=("point", "member"))
    truth = xr.DataArray(rng.normal(0, sigma, size=n), dims=("point",))
    for estimator, expected in (("fair", sigma / np.sqrt(np.pi)),
                                ("standard", sigma / np.sqrt(np.pi) * (1 + 1 / m))):
        crps = P.crps_ensemble(fc, truth, estimator=estimator)
        tol = 5 * float(crps.std()) / np.sqrt(n)  # 5 standard errors of the mean of n iid scores
        assert abs(float(crps.mean()) - expected) < tol, (estimator, float(crps.mean()), expected, tol)
    # and the Gaussian closed form of the same truths agrees with the fair ensemble score on average
    g = P.crps_gaussian(xr.zeros_like(truth), xr.full_like(truth, sigma), truth)
    assert abs(float(g.mean()) - sigma / np.sqrt(np.pi)) < 5 * float(g.std()) / np.sqrt(n)


@pytest.mark.parametrize("tail", ["upper", "lower"])
@pytest.mark.parametrize(("estimator", "method"), [("standard", "ecdf"), ("fair", "fair")])
def test_threshold_weighted_crps_matches_scores(tail: str, estimator: str, method: str) -> None:
    fc, truth = _ensemble()
    threshold = xr.DataArray(np.linspace(-0.5, 0.8, 5), dims=("longitude",))
    ours = P.extreme_weighted_crps(fc, truth, threshold, tail=tail, estimator=estimator)
    ref = tail_tw_crps_for_ensemble(fc, truth, "member", threshold=threshold, tail=tail, method=method,
                                    preserve_dims="all")
    np.testing.assert_allclose(ours.values, ref.transpose(*ours.dims).values, rtol=RTOL, atol=RTOL)
    # below an upper threshold nothing counts: everything under t scores 0
    if tail == "upper":
        zero = P.extreme_weighted_crps(fc, truth, float(max(fc.max(), truth.max())) + 1.0)
        assert float(abs(zero).max()) == 0.0


def test_threshold_from_model_climate() -> None:
    fc, truth = _ensemble()
    climate, _ = _ensemble(shape=(40, 4, 5), seed=3)
    t = P.climate_quantile(climate, 0.9, ("time", "member"))
    a = P.extreme_weighted_crps(fc, truth, climate=climate, quantile=0.9)
    xr.testing.assert_allclose(a, P.extreme_weighted_crps(fc, truth, t))
    with pytest.raises(ValueError, match="threshold or a model climate"):
        P.extreme_weighted_crps(fc, truth)


def test_efi_limits() -> None:
    rng = np.random.default_rng(2)
    climate = xr.DataArray(rng.gamma(2.0, size=(3, 4, 300)), dims=("latitude", "longitude", "member"))
    same = P.extreme_forecast_index(climate, climate, climate_dims=("member",))
    # a forecast distributed exactly like the climate: 0 up to float rounding of 100 bin terms
    np.testing.assert_allclose(same.values, 0.0, atol=100 * 4 * EPS64)
    above = P.extreme_forecast_index(climate + 1e3, climate, climate_dims=("member",))
    below = P.extreme_forecast_index(climate - 1e3, climate, climate_dims=("member",))
    np.testing.assert_allclose(above.values, 1.0, rtol=100 * 4 * EPS64)
    np.testing.assert_allclose(below.values, -1.0, rtol=100 * 4 * EPS64)
    shifts = [P.extreme_forecast_index(climate + s, climate, climate_dims=("member",)).mean().item()
              for s in (-1.0, -0.2, 0.2, 1.0)]
    assert shifts == sorted(shifts) and shifts[0] < 0 < shifts[-1]


def test_efi_matches_quadrature_for_shifted_gaussian() -> None:
    """Climate N(0,1), forecast N(δ,1), both as exact quantile samples: EFI = (2/π)∫(p − Φ(Φ⁻¹(p) − δ))/√(p(1−p))dp.
    The bin discretisation holds F_f constant over each p-bin, so its error is at most (2/π)·max_k ΔA_k·(total
    variation of F_f = 1) = (2/π)·2 arcsin(√(1/K)); sampling adds the quantile spacing (≈ 1/N in p)."""
    delta, n, k = 0.7, 4000, 400
    q = stats.norm.ppf((np.arange(n) + 0.5) / n)
    climate = xr.DataArray(q, dims=("member",))
    efi = P.extreme_forecast_index(climate + delta, climate, climate_dims=("member",), n_bins=k).item()
    exact = (2 / np.pi) * integrate.quad(
        lambda p: (p - stats.norm.cdf(stats.norm.ppf(p) - delta)) / np.sqrt(p * (1 - p)), 0, 1, limit=200)[0]
    bound = (2 / np.pi) * 2 * np.arcsin(np.sqrt(1 / k)) + 2 / n
    assert abs(efi - exact) < bound, (efi, exact, bound)


def test_spread_skill_ratio_consistent_ensemble() -> None:
    """Truth drawn like a member: E[(x̄ − y)²] = (1 + 1/M)·E[var] so the corrected ratio is 1."""
    n, m = 20_000, 5
    rng = np.random.default_rng(4)
    scale = rng.uniform(0.5, 2.0, size=n)  # flow-dependent spread
    fc = xr.DataArray(rng.normal(size=(n, m)) * scale[:, None], dims=("time", "member"))
    truth = xr.DataArray(rng.normal(size=n) * scale, dims=("time",))
    ratio = P.spread_skill_ratio(fc, truth, dims=("time",)).item()
    # relative standard error of a mean of n squared-normal terms is ≤ √(2/n)·(max/min scale)², halved by √
    tol = 5 * np.sqrt(2 / n) * 16 / 2
    assert abs(ratio - 1.0) < tol, ratio
    under = P.spread_skill_ratio(0.5 * fc, truth, dims=("time",)).item()
    assert under < 1.0 - tol


def test_spread_skill_weights_and_kept_dims() -> None:
    fc, truth = _ensemble()
    w = xr.DataArray(np.array([0.0, 0.0, 1.0, 0.0]), dims=("latitude",))
    r = P.spread_skill_ratio(fc, truth, weights=w, dims=("time", "latitude", "longitude"))
    one_row = P.spread_skill_ratio(fc.isel(latitude=[2]), truth.isel(latitude=[2]))
    assert r.item() == pytest.approx(one_row.item(), rel=RTOL)
    per_time = P.spread_skill_ratio(fc, truth, dims=("latitude", "longitude"))
    assert per_time.dims == ("time",)


def test_gaussian_spread_skill_is_one_for_a_calibrated_forecast() -> None:
    """Truth drawn from the forecast N(μ, σ²) → ratio 1 up to sampling: RMSE² is a mean of n σ²χ²₁ terms, so
    its relative standard error is √(2/n); the ratio's is half that."""
    from smoeweather.metrics.probabilistic import spread_skill_ratio_gaussian

    rng = np.random.default_rng(0)
    n = 200_000
    mu = xr.DataArray(rng.normal(size=n), dims="time")
    sigma = xr.DataArray(rng.uniform(0.5, 2.0, size=n), dims="time")
    truth = mu + sigma * xr.DataArray(rng.normal(size=n), dims="time")
    ratio = float(spread_skill_ratio_gaussian(mu, sigma, truth, dims=("time",)))
    assert ratio == pytest.approx(1.0, abs=5 * 0.5 * np.sqrt(2 / n) * 2.0)  # 5 standard errors, σ-spread ≤ 2×
    narrow = float(spread_skill_ratio_gaussian(mu, sigma / 2, truth, dims=("time",)))
    assert narrow == pytest.approx(ratio / 2, rel=1e-12)
