"""The one damped saddle-free Newton solver of post-processing: many independent small problems (one per group:
variable × lead × level (× grid point or site) (× forecast date)) iterated together.

Each iteration, for every group still moving:

1. the step p = −|H|⁻¹ g (eigenvalues by magnitude: saddle-free, so every step descends) and the Newton
   decrement −gᵀp; a group whose decrement is below ``tol`` stops (converged);
2. an Armijo backtracking line search over the step lengths ``ladder`` (1, ½, ¼, …), all evaluated in one
   call of the problem (one pass over the data when its sums are spread over blocks), then, with ``halvings``,
   further halvings one by one for the groups that still fail; a group for which no step length lowers its
   loss stops (at its minimum to working precision);
3. the derivatives at the accepted point: those at the full step come with the line search, the others are
   recomputed (only for the groups that took a shorter step).

With ``compact`` the stopped groups leave the working arrays once a quarter of them is done, so the cost
follows the groups still moving.

What is minimised is a :class:`Problem`: the loss, gradient and Hessian of its groups, the step and the
decrement (each problem computes them in its own arithmetic: torch or numpy). The EMOS problems are in
:mod:`.emos` (the closed-form Gaussian CRPS of the mean/spread form in torch, any mean predictors summed over
blocks in numpy, the truncated normal by autograd).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

LADDER = 0.5 ** np.arange(8)  # step lengths tried in one pass (backtracking line search)
ARMIJO = 1e-4  # sufficient decrease: f(θ + αp) ≤ f(θ) + ARMIJO·α·gᵀp


class Problem(Protocol):
    """Independent groups r = 0..R−1 of parameters θ (R, P) (the working rows; :meth:`keep` drops rows)."""

    def derivatives(self, theta: np.ndarray, rows: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(loss (n,), gradient (n, P), Hessian (n, P, P)) at ``theta`` (R, P) of ``rows`` (default all)."""
        ...

    def trial(self, theta: np.ndarray, step: np.ndarray, ladder: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(loss (R, A) at θ + αp for α in ``ladder``, and loss, gradient, Hessian at θ + p)."""
        ...

    def losses(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Loss (n,) at ``theta[rows]`` (``theta`` (R, P)) of ``rows``."""
        ...

    def step(self, grad: np.ndarray, hess: np.ndarray) -> np.ndarray:
        """Saddle-free Newton step −|H|⁻¹ g (R, P)."""
        ...

    def dot(self, grad: np.ndarray, step: np.ndarray) -> np.ndarray:
        """gᵀp (R,)."""
        ...

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the working ``rows`` (needed with ``compact``)."""
        ...


def saddle_free_step(grad: np.ndarray, hess: np.ndarray) -> np.ndarray:
    """−|H|⁻¹ g (G, P) in numpy: eigenvalues by magnitude, floored at 10⁻¹⁰ of the largest.

    A group without curvature (H = 0, e.g. one whose cases are all missing) takes no step: its 1/|λ| would
    overflow to ∞ and its step be ∞ or ∞ · 0 = NaN, which stopped it as well, through a warning."""
    evals, evecs = np.linalg.eigh(hess)
    magnitude = np.abs(evals)
    floored = np.maximum(magnitude, 1e-10 * magnitude.max(1, keepdims=True))
    inv = np.divide(1.0, floored, out=np.zeros_like(floored), where=floored > 1.0 / np.finfo(floored.dtype).max)
    return -np.einsum("gij,gj->gi", evecs, inv * np.einsum("gji,gj->gi", evecs, grad))


def _halve(problem: Problem, theta: np.ndarray, step: np.ndarray, f: np.ndarray, slope: np.ndarray,
           rows: np.ndarray, alpha0: float, halvings: int) -> np.ndarray:
    """Step lengths (n,) of ``rows`` by halving from ``alpha0`` until the Armijo test holds (0: none does)."""
    alpha = np.full(len(rows), alpha0)
    found = np.zeros(len(rows), bool)
    for _ in range(halvings):
        todo = np.nonzero(~found)[0]
        if len(todo) == 0:
            break
        r = rows[todo]
        cand = theta.copy()
        cand[r] = theta[r] + alpha[todo, None] * step[r]
        ok = problem.losses(cand, r) <= f[r] + ARMIJO * alpha[todo] * slope[r]
        found[todo[ok]] = True
        alpha[todo[~ok]] *= 0.5
    return np.where(found, alpha, 0.0)


def minimise(problem: Problem, theta: np.ndarray, live: np.ndarray, iterations: int = 50, tol: float = 1e-12,
             ladder: np.ndarray = LADDER, halvings: int = 0, compact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(θ (G, P) at the minimum, converged (G,)) from the start ``theta`` of the groups ``live`` (the others are
    left as they are, with nothing to do: converged); module doc. ``ladder`` starts at 1."""
    theta = np.array(theta, np.float64)
    live = np.array(live, bool)
    out, out_live = theta.copy(), live.copy()
    idx = np.arange(len(theta))  # groups held in the working rows
    f, g, h = problem.derivatives(theta)
    for _ in range(iterations):
        step = problem.step(g, h)
        slope = problem.dot(g, step)  # −(Newton decrement) < 0
        live &= -slope >= tol
        if not live.any():
            break
        if compact and live.sum() < 0.75 * len(idx):  # drop the stopped groups from the working rows
            keep = np.nonzero(live)[0]
            out[idx], out_live[idx] = theta, live
            idx, theta, f, g, h, step, slope = (a[keep] for a in (idx, theta, f, g, h, step, slope))
            problem.keep(keep)
            live = np.ones(len(idx), bool)
        step = step * live[:, None]
        fa, f1, g1, h1 = problem.trial(theta, step, ladder)
        ok = fa <= f[:, None] + ARMIJO * ladder[None, :] * slope[:, None]
        found = ok.any(1) & live
        alpha = np.where(found, ladder[np.argmax(ok, 1)], 0.0)
        more = np.nonzero(live & ~found)[0]
        if halvings and len(more):
            alpha[more] = _halve(problem, theta, step, f, slope, more, ladder[-1] * 0.5, halvings)
            found[more] = alpha[more] > 0
        live &= found  # no step length lowers the loss: at its minimum to working precision
        new = np.where(found[:, None], theta + alpha[:, None] * step, theta)
        full = found & (alpha == 1.0)
        f, g, h = np.where(full, f1, f), np.where(full[:, None], g1, g), np.where(full[:, None, None], h1, h)
        redo = np.nonzero(found & (alpha < 1.0))[0]
        if len(redo):
            f[redo], g[redo], h[redo] = problem.derivatives(new, redo)
        theta = new
    else:
        live &= -problem.dot(g, problem.step(g, h)) >= tol
    out[idx], out_live[idx] = theta, live
    return out, ~out_live
