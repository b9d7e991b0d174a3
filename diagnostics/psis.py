"""PSIS k-hat of an approximation and PSIS-LOO (Vehtari et al. 2017, 2024)."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp

from ppl.diagnostics import _arviz

__all__ = ["khat", "khat_threshold", "psis_loo"]


def khat(log_ratios: np.ndarray) -> float:
    """Pareto k-hat of importance ratios p/q, given log p(θ_s, D) − log q(θ_s) for draws θ_s ~ q.

    Sign convention (pinned by a test): q = N(0, 1), p = N(0, 1.5²) gives k ≈ 0.56 (p has heavier
    tails than q); swapping p and q gives a small or negative k.
    """
    _, k = _arviz.psis(np.asarray(log_ratios, dtype=float))
    return float(k)


def khat_threshold(num_draws: int) -> float:
    """min(1 − 1/log10 S, 0.7) for S draws (Vehtari et al. 2024)."""
    return min(1.0 - 1.0 / math.log10(num_draws), 0.7)


def psis_loo(loglik, *, reff: float = 1.0, log_correction: np.ndarray | None = None):
    """PSIS-LOO from pointwise log-likelihoods (S, N), or from an iterable of (S, n_j) blocks of
    consecutive observations (``Posterior.pointwise_log_likelihood_chunks``): each observation's
    importance ratios are smoothed on their own, so the blocks are processed one at a time and
    only the per-observation results (N numbers each) are kept.

    For draws from an approximation q rather than the posterior, ``log_correction`` = log p − log q
    per draw turns the ratios into p(θ | D₋ᵢ)/q(θ) (Magnusson et al. 2019).
    Returns (elpd_loo, its standard error, pointwise k-hat (N,), pointwise elpd (N,)); the standard
    error is √N times the pointwise values' standard deviation, and paired differences between
    methods come from the pointwise values.
    """
    blocks = [loglik] if isinstance(loglik, np.ndarray) else loglik
    ks, pointwise = [], []
    for block in blocks:
        ratios = -block.T  # (n, S): log 1/p(y_i | θ_s)
        if log_correction is not None:
            ratios = ratios + log_correction[None, :]
        smoothed, k = _arviz.psis(ratios, reff=reff)
        # Log likelihoods near ±1e300 (absurd data) overflow in sums and squares: the result is then
        # ±inf or NaN, which Diagnostics reports as None, instead of a numpy warning.
        with np.errstate(over="ignore", invalid="ignore"):
            pointwise.append(logsumexp(smoothed + block.T, axis=1))
        ks.append(np.atleast_1d(k))
    pointwise, k = np.concatenate(pointwise), np.concatenate(ks)
    with np.errstate(over="ignore", invalid="ignore"):
        elpd = float(pointwise.sum())
        se = float(np.sqrt(pointwise.shape[0] * pointwise.var()))
    return elpd, se, k, pointwise
