"""The one Newton solver of post-processing (:func:`smoeweather.postprocess.newton.minimise`): closed-form minima
of separable convex groups in both line-search modes (one pass over a ladder of step lengths, or halvings one
by one with compaction), descent away from a maximum (saddle-free), and both EMOS fitters run on it."""

from __future__ import annotations

import numpy as np
import pytest

from smoeweather.postprocess import emos, newton

TOL = 1e-12


class Separable:
    """f_r(θ) = Σ_i exp(a_ri θ_i) − b_ri θ_i: convex, minimum θ_i = log(b_ri / a_ri) / a_ri, curvature b_ri a_ri."""

    def __init__(self, a: np.ndarray, b: np.ndarray) -> None:
        self.a, self.b = a, b

    def _at(self, theta: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, ...]:
        a, b = (self.a, self.b) if rows is None else (self.a[rows], self.b[rows])
        return a, b, theta if rows is None else theta[rows]

    def derivatives(self, theta, rows=None):
        a, b, t = self._at(theta, rows)
        e = np.exp(a * t)
        hess = np.zeros((*t.shape, t.shape[1]))
        idx = np.arange(t.shape[1])
        hess[:, idx, idx] = a * a * e
        return (e - b * t).sum(1), a * e - b, hess

    def losses(self, theta, rows):
        a, b, t = self._at(theta, rows)
        return (np.exp(a * t) - b * t).sum(1)

    def trial(self, theta, step, ladder):
        fa = np.stack([self.losses(theta + al * step, np.arange(len(theta))) for al in ladder], 1)
        return (fa, *self.derivatives(theta + step))

    def step(self, grad, hess):
        return newton.saddle_free_step(grad, hess)

    def dot(self, grad, step):
        return (grad * step).sum(1)

    def keep(self, rows):
        self.a, self.b = self.a[rows], self.b[rows]


@pytest.mark.parametrize("mode", [dict(ladder=newton.LADDER), dict(ladder=np.ones(1), halvings=40, compact=True)])
def test_minimise_reaches_the_closed_form_minimum(mode: dict) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 3.0, (200, 3)), rng.uniform(0.2, 5.0, (200, 3))
    want = np.log(b / a) / a
    theta0 = want + rng.uniform(-1.5, 1.5, (200, 3)) / a  # full Newton steps from the left overshoot: backtracking
    live = np.ones(200, bool)
    live[:5] = False  # groups left out are returned as they are (nothing to do: converged)
    theta, ok = newton.minimise(Separable(a, b), theta0, live, iterations=100, tol=TOL, **mode)
    assert ok.all()
    np.testing.assert_array_equal(theta[:5], theta0[:5])
    # stopped at a Newton decrement below TOL: |θ − θ*| ≤ √(TOL / curvature) per coordinate
    np.testing.assert_array_less(np.abs(theta[5:] - want[5:]), np.sqrt(TOL / (a * b))[5:])


def test_minimise_descends_away_from_a_maximum() -> None:
    """f(θ) = θ⁴/4 − θ²/2 from θ = ±0.01 (negative curvature): the saddle-free step flips the curvature and
    descends to the minimum ±1 on the same side."""

    class DoubleWell(Separable):
        def derivatives(self, theta, rows=None):
            t = theta if rows is None else theta[rows]
            return (t**4 / 4 - t**2 / 2).sum(1), t**3 - t, (3 * t**2 - 1)[:, :, None]

        def losses(self, theta, rows):
            t = theta[rows]
            return (t**4 / 4 - t**2 / 2).sum(1)

    theta, ok = newton.minimise(DoubleWell(None, None), np.array([[0.01], [-0.01]]), np.ones(2, bool), 100, TOL)
    assert ok.all()
    np.testing.assert_allclose(theta[:, 0], [1.0, -1.0], atol=np.sqrt(TOL / 2.0))


def test_a_group_without_curvature_takes_no_step_and_no_warning() -> None:
    """A group whose Hessian is 0 (all its cases missing) takes a zero step, without an overflow or NaN warning
    (1/|λ| was ∞ there); the other groups' steps are −H⁻¹g as before."""
    hess = np.stack([np.zeros((2, 2)), np.diag([2.0, 4.0]), np.diag([1e-305, 1e-306])])
    grad = np.array([[0.0, 0.0], [2.0, -4.0], [1.0, 1.0]])
    with np.errstate(divide="raise", over="raise", invalid="raise"):  # underflow to subnormals is harmless
        step = newton.saddle_free_step(grad, hess)
    np.testing.assert_array_equal(step[0], 0.0)  # no curvature: no step, exactly
    np.testing.assert_allclose(step[1], [-1.0, 1.0], rtol=4 * np.finfo(np.float64).eps)  # −g/λ per axis
    assert np.isfinite(step).all()


def test_both_emos_fitters_run_on_the_one_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = emos.minimise

    def counted(problem, *args, **kwargs):
        calls.append(type(problem).__name__)
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(emos, "minimise", counted)
    rng = np.random.default_rng(1)
    m = rng.normal(size=(2, 100))
    v = rng.uniform(0.5, 2.0, (2, 100))
    y = m + rng.normal(size=(2, 100))
    w = np.ones((2, 100))
    coef, ok = emos.fit_groups_newton(m, v, y, w)
    block = {"X": np.stack([np.ones_like(m), m], -1), "v": v, "y": y, "w": w}
    pooled, ok2 = emos.fit_blocks(lambda fn: fn(block))
    assert calls == ["_MeanSpread", "_Pooled"] and ok.all() and ok2.all()
    # the same minimum from both problems' arithmetic (torch closed form, numpy block sums): each stops once its
    # Newton decrement is below tol = 1e-12, i.e. within about sqrt(tol) = 1e-6 of the minimum in standardised
    # units (the data here are of unit scale), so that is the agreement to expect, near zero coefficients too
    tol = 10 * np.sqrt(1e-12)
    np.testing.assert_allclose(pooled, coef, rtol=tol, atol=tol)
