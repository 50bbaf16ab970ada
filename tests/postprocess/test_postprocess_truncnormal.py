"""The normal truncated at 0 for non-negative targets: its closed-form CRPS against the CRPS integral computed
by the ``scores`` package from the CDF and by adaptive quadrature, quantiles and moments against
``scipy.stats.truncnorm``, EMOS with a truncated-normal fit recovering known coefficients, and the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scores
import torch
import xarray as xr
from conftest import float_tol
from scipy import integrate, stats

from smoeweather.cli import main
from smoeweather.metrics.probabilistic import crps_gaussian
from smoeweather.postprocess.distributions import (
    check_distribution,
    crps_torch,
    crps_truncnormal,
    moments,
    quantiles,
)
from smoeweather.postprocess.emos import fit_blocks

CASES = [(2.0, 1.0, 2.5), (0.3, 1.2, 0.0), (0.3, 1.2, 1.7), (-1.0, 0.8, 0.4), (-2.5, 1.5, 0.05), (5.0, 2.0, 1.0),
         (1.0, 0.5, -0.7)]  # (μ, σ, y): near and far from the bound, μ < 0, and an impossible y < 0


def _tn_cdf(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    lo = stats.norm.cdf(-mu / sigma)
    return np.where(x < 0, 0.0, (stats.norm.cdf((x - mu) / sigma) - lo) / (1.0 - lo))


# float64 closed forms divide by 1 − Φ(−μ/σ) and difference Φ values: their rounding (eps ≈ 2.2e-16) is
# amplified by up to ~1e4 in these cases, and quad and scipy's ppf carry their own 1e-12-level error; 1e-8
# relative leaves room for another libm and BLAS while still catching any wrong term.
RTOL = 1e-8


def test_crps_matches_the_integral_by_quadrature() -> None:
    """CRPS = ∫ (F(x) − 1{x ≥ y})² dx, integrated adaptively (quad, 1e-12) over [0, y] and [y, ∞)."""
    for mu, sigma, y in CASES:
        def f(x: float, mu: float = mu, sigma: float = sigma, y: float = y) -> float:
            return float((_tn_cdf(np.array(x), mu, sigma) - (x >= y)) ** 2)

        lo, hi = min(0.0, y), max(0.0, y)
        ref = sum(integrate.quad(f, a, b, epsabs=1e-13, epsrel=1e-12, limit=200)[0]
                  for a, b in ((lo, hi), (hi, np.inf)) if b > a)
        np.testing.assert_allclose(crps_truncnormal(mu, sigma, y), ref, rtol=RTOL)


def test_crps_matches_scores_crps_cdf() -> None:
    """``scores.probability.crps_cdf`` (exact integration of a piecewise-linear CDF) on a 0.5 ms grid: agreement
    within its discretisation error, ≈ h² · max|F''| · range / 12 ≪ 1e-6."""
    mu, sigma, y = (np.array(c) for c in zip(*CASES))
    x = np.arange(-1.0, 20.0, 5e-4)
    cdf = np.stack([_tn_cdf(x, m, s) for m, s in zip(mu, sigma)])
    fc = xr.DataArray(cdf, dims=("case", "threshold"), coords={"threshold": x})
    got = scores.probability.crps_cdf(fc, xr.DataArray(y, dims="case"), threshold_dim="threshold",
                                      preserve_dims=["case"])["total"].values
    np.testing.assert_allclose(crps_truncnormal(mu, sigma, y), got, rtol=0, atol=1e-6)


def test_crps_torch_and_normal_limit() -> None:
    mu, sigma, y = (np.array(c, np.float64) for c in zip(*CASES))
    t = crps_torch("truncnormal", *(torch.from_numpy(a) for a in (mu, sigma, y))).numpy()
    np.testing.assert_allclose(t, crps_truncnormal(mu, sigma, y), **float_tol(np.float64, 50))
    # far from the bound the truncation does nothing: the normal's CRPS
    np.testing.assert_allclose(crps_truncnormal(40.0, 2.0, 41.3), crps_gaussian(40.0, 2.0, 41.3),
                               **float_tol(np.float64, 50))
    assert check_distribution("truncnormal") == "truncnormal"
    with pytest.raises(ValueError, match=r"--distribution 'gamma'.*normal.*truncnormal"):
        check_distribution("gamma")


def test_quantiles_and_moments_match_scipy() -> None:
    q = np.array([0.01, 0.1, 0.5, 0.9, 0.99])
    for mu, sigma, _ in CASES:
        ref = stats.truncnorm(-mu / sigma, np.inf, loc=mu, scale=sigma)
        np.testing.assert_allclose(quantiles("truncnormal", mu, sigma, q), ref.ppf(q), rtol=RTOL)
        mean, sd = moments("truncnormal", mu, sigma)
        np.testing.assert_allclose([mean, sd], [ref.mean(), ref.std()], rtol=1e-9)
        assert (quantiles("truncnormal", mu, sigma, q) >= 0).all()


def _tn_sample(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[float, ...]]:
    """Wind-speed-like data: ensemble mean m ≥ 0, variance v, y ~ N₀(a + b m, c + d v)."""
    rng = np.random.default_rng(seed)
    a, b, c, d = -0.3, 0.9, 0.5, 0.6
    m = rng.gamma(1.5, 1.2, n)
    v = rng.gamma(2.0, 0.5, n)
    mu, sd = a + b * m, np.sqrt(c + d * v)
    y = stats.truncnorm.rvs(-mu / sd, np.inf, loc=mu, scale=sd, random_state=rng)
    return m, v, y, (a, b, c, d)


def test_emos_truncated_normal_fit_recovers_coefficients() -> None:
    m, v, y, true = _tn_sample(20_000)
    blk = {"X": np.stack([np.ones_like(m), m], -1)[None], "v": v[None], "y": y[None], "w": np.ones((1, len(m)))}
    coef, ok = fit_blocks(lambda fn: fn(blk), distribution="truncnormal")
    assert ok.all()
    np.testing.assert_allclose(coef[0], true, atol=0.08)  # sampling error of 20,000 cases (≈ 0.02)
    normal, _ = fit_blocks(lambda fn: fn(blk))
    mu_n, sd_n = normal[0, 0] + normal[0, 1] * m, np.sqrt(normal[0, 2] + normal[0, 3] * v)
    mu_t, sd_t = coef[0, 0] + coef[0, 1] * m, np.sqrt(coef[0, 2] + coef[0, 3] * v)
    # on truncated data the truncated fit scores better than the best normal
    assert crps_truncnormal(mu_t, sd_t, y).mean() < crps_gaussian(mu_n, sd_n, y).mean() - 0.01


def _cli(*args: object) -> int:
    return main(["postprocess", *map(str, args), "--scheduler", "threads", "--quiet", "--overwrite"])


def test_cli_truncnormal_fit_apply_and_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for s in range(5):
        for d in pd.date_range("2004-01-01", periods=30):
            obs = max(0.0, 1.0 + 0.5 * s + 2.0 * np.sin(d.day_of_year / 3.0 + s) + rng.normal())
            rows.append([*np.maximum(0.0, obs + rng.normal(0.3, 1.0, 4)), obs, int(d.strftime("%Y%m%d00")),
                         f"S{s}", 45.0, -120.0 + s, 100.0])
    cols = ["A", "B", "C", "D", "observation", "date", "station", "latitude", "longitude", "elevation"]
    pd.DataFrame(rows, columns=cols).to_csv(tmp_path / "wind.csv", index=False)
    assert _cli("fit", "--forecast", tmp_path / "wind.csv", "--table-variable", "10m_wind_speed", "--distribution",
                "truncnormal", "--out", tmp_path / "tn.nc") == 0
    with xr.open_dataset(tmp_path / "tn.nc") as mf:
        assert mf.attrs["distribution"] == "truncnormal" and "truncated" in mf.attrs["predictive_distribution"]
    assert _cli("apply", "--emos", tmp_path / "tn.nc", "--forecast", tmp_path / "wind.csv", "--table-variable",
                "10m_wind_speed", "--out", tmp_path / "pp.zarr", "--members", "4", "--quantiles", "0.05", "0.5",
                "0.95") == 0
    pp = xr.open_zarr(tmp_path / "pp.zarr").load()
    qs = xr.open_zarr(tmp_path / "pp_quantiles.zarr")["10m_wind_speed"].load()
    ens = xr.open_zarr(tmp_path / "pp_members.zarr")["10m_wind_speed"].load()
    assert pp.attrs["distribution"] == "truncnormal"
    mu, sd = pp["10m_wind_speed"], pp["10m_wind_speed_std"]
    want = quantiles("truncnormal", mu.values[..., None], sd.values[..., None], np.array([0.05, 0.5, 0.95]))
    got = qs.transpose(*mu.dims, "quantile").values
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], **float_tol(np.float32, 20, 10.0))
    assert float(qs.min()) >= 0 and float(ens.min()) >= 0
    # per site (one truncated-normal Newton fit per station, out of core) agrees in kind
    assert _cli("fit", "--forecast", tmp_path / "wind.csv", "--table-variable", "10m_wind_speed", "--distribution",
                "truncnormal", "--per-site", "--out", tmp_path / "tn_site.nc") == 0
    with xr.open_dataset(tmp_path / "tn_site.nc") as mf:
        assert mf.sizes["site"] == 5 and np.isfinite(mf["10m_wind_speed_c"].values).all()
        assert (mf["10m_wind_speed_c"].values > 0).all() and (mf["10m_wind_speed_d"].values >= 0).all()
    # a variable with negative values is refused by name
    df = pd.DataFrame(rows, columns=cols)
    df["observation"] -= 5.0
    df.to_csv(tmp_path / "neg.csv", index=False)
    assert _cli("fit", "--forecast", tmp_path / "neg.csv", "--distribution", "truncnormal", "--out",
                tmp_path / "neg.nc", "--no-plausibility-check") == 2  # (unlabelled small 2m temperatures: as in K)
    err = capsys.readouterr().err
    assert re.search(r"--distribution truncnormal: '2m_temperature' has negative values.*--distribution normal", err)
