"""The only module that imports ArviZ: a move to ArviZ 1.x touches this file alone."""

from __future__ import annotations

import arviz as az
import numpy as np

__all__ = ["rhat", "ess", "psis", "relative_efficiency", "inference_data"]


def _dataset(array: np.ndarray):
    return az.convert_to_dataset({"x": np.asarray(array, dtype=float)})


def rhat(array: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat (max of bulk and folded) per component of (chain, draw, ...)."""
    return np.asarray(az.rhat(_dataset(array), method="rank")["x"].values)


def ess(array: np.ndarray, method: str) -> np.ndarray:
    """Bulk or tail effective sample size per component of (chain, draw, ...)."""
    return np.asarray(az.ess(_dataset(array), method=method)["x"].values)


def psis(log_ratios: np.ndarray, reff: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Pareto-smoothed log weights and k-hat. ``log_ratios`` (..., S): log target − log proposal.

    ArviZ's ``psislw`` takes the log importance *ratios* (it is called with −log-likelihood in
    LOO); ppl always passes log p − log q, never its negative.
    """
    log_ratios = np.asarray(log_ratios, dtype=float)
    rows = np.atleast_2d(log_ratios)
    smoothed = rows - np.logaddexp.reduce(rows, axis=-1, keepdims=True)
    khat = np.full(rows.shape[0], -np.inf)
    fit = ~_flat_tail(rows, reff)
    if fit.any():
        # The Pareto fit's profile likelihood overflows harmlessly for light (k < 0) tails.
        with np.errstate(over="ignore"):
            fitted, k = az.psislw(rows[fit], reff=reff)
        smoothed[fit], khat[fit] = np.asarray(fitted), np.asarray(k)
    if log_ratios.ndim == 1:
        return smoothed[0], khat[0]
    return smoothed, khat


BOUNDED_LOG_RANGE = 0.1


def _flat_tail(rows: np.ndarray, reff: float) -> np.ndarray:
    """Rows whose weights are bounded so tightly that a Pareto tail fit is meaningless.

    Two cases. (1) The largest ratios are equal to float precision (the tail ArviZ selects): a
    confident classifier gives p(y_i | θ) = 1 to the last bit under most draws; ArviZ would fit a
    Pareto tail to zero exceedances (dividing by zero, or reporting k = inf for four or fewer
    distinct tail values). (2) All log ratios lie within ``BOUNDED_LOG_RANGE`` (weights within
    ~10% of each other): the weights are bounded, so their variance is finite (at most
    (e^0.1 − 1)²/4 ≈ 0.003) and the true k is ≤ 0, but the scale-free Pareto fit to exceedances
    spread over many decades (1e-2 … 1e-14) reports spurious k > 1. Such rows need no smoothing:
    k = -inf.
    """
    num_draws = rows.shape[-1]
    tail_size = int(np.ceil(min(0.2 * num_draws, 3.0 * np.sqrt(num_draws / reff))))
    shifted = np.sort(rows - rows.max(axis=-1, keepdims=True), axis=-1)
    cutoff = np.maximum(shifted[:, -tail_size - 1], np.log(np.finfo(float).tiny))
    exceed = np.exp(shifted) - np.exp(cutoff)[:, None]
    above = shifted > cutoff[:, None]
    count = above.sum(axis=-1)
    flat = (count <= 4) | (shifted[:, 0] >= -BOUNDED_LOG_RANGE)
    for i in np.flatnonzero(~flat):
        tail = exceed[i][above[i]]  # already sorted
        flat[i] = tail[int(tail.size / 4 + 0.5) - 1] <= 0.0
    return flat


def relative_efficiency(loglik: np.ndarray) -> float:
    """Relative MCMC efficiency ESS/S of the pointwise likelihoods (chain, draw, N), as ArviZ's loo."""
    chains, draws = loglik.shape[:2]
    values = np.exp(loglik - loglik.max(axis=(0, 1), keepdims=True))
    reff = float(np.nanmean(ess(values, "mean")) / (chains * draws))
    return reff if np.isfinite(reff) and reff > 0 else 1.0


def inference_data(*, posterior: dict, sample_stats: dict, log_likelihood: dict, observed_data: dict, dims: dict):
    """Build ``arviz.InferenceData`` from dicts of (chain, draw, ...) arrays."""
    return az.from_dict(
        posterior=posterior,
        sample_stats=sample_stats or None,
        log_likelihood=log_likelihood or None,
        observed_data=observed_data or None,
        dims=dims,
    )
