"""The held-out check: is the predictive better than knowing nothing, and are its intervals honest?

Checks on the draws (R-hat, k-hat, LOO) judge a run against the posterior it targets; when that
posterior is itself over-fitted — a network whose noise scale collapsed to its training residual —
they agree with it and cannot see the harm. Data the fit never saw can. With held-out rows, the
verdict therefore also asks two questions of the posterior predictive:

* **Better than the trivial baseline?** The mean held-out log-likelihood per row must be at least
  that of a predictive that ignores the inputs: for regression a Gaussian with the training
  targets' mean and standard deviation (per output), for classification the training labels'
  class frequencies (add-one smoothed, so an absent class is not impossible). No tolerance: a
  predictive worse than this baseline is worse than no model, whatever its sampling error.
* **Honest 90% intervals?** (regression) The share of held-out targets inside their central 90%
  predictive interval must be consistent with intervals that cover between 0.9 − ``COVERAGE_SLACK``
  and 0.9 + ``COVERAGE_SLACK`` (an allowance for the mild misspecification every real model has),
  given the binomial noise of ``n`` targets. Too low: more than ``3·√(0.9·0.1/n) + COVERAGE_SLACK``
  under 0.9 (three binomial standard errors of a calibrated predictive's coverage). Too high: so
  few misses that intervals which miss 5% of the targets would leave that few with probability
  under ``TAIL`` (0.00135, the one-sided tail beyond three standard errors), from the exact
  binomial distribution of the miss count. The sides differ because that count is skewed where it
  nears zero: the normal approximation's upper bound, 0.95 + 3·√(0.09/n), reaches 1 for n ≤ 324,
  so on test sets of UCI's size intervals too wide could never fail (on naval's 1,193 rows it
  passed coverage 0.972, which the exact tail rejects). Up to 128 targets even all of them inside
  is not improbable for intervals that miss 5% (0.95¹²⁸ = 0.0014), and nothing too wide can fail
  there. A predictive whose intervals are ten times too narrow (coverage near 0) fails
  on any held-out set of a few rows.

The predictive is the method's default one (``mode="mc"``) with a fixed seed, so a saved run
decides the same way every time it is loaded (the held-out rows are saved with it).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom

HELDOUT_SEED = 0  # the predictive's seed: fixed, so the check is the same on every load
LEVEL = 0.9
COVERAGE_SLACK = 0.05
TAIL = 0.00135  # one-sided probability beyond three standard errors of a normal
REGRESSION = ("gaussian", "heteroscedastic")

__all__ = ["heldout_scores", "coverage_range"]


def coverage_range(n: int, level: float = LEVEL) -> tuple[float, float]:
    """The coverages ``(low, high)`` that ``n`` held-out targets may show (see the module
    docstring): ``low`` three binomial SEs plus the slack under ``level``; ``high`` from the fewest
    misses whose probability, for intervals that miss a share ``1 − level − COVERAGE_SLACK``, is
    at least ``TAIL``."""
    n = max(int(n), 1)
    low = level - (3.0 * math.sqrt(level * (1.0 - level) / n) + COVERAGE_SLACK)
    # the fewest misses m with P(M ≤ m) ≥ TAIL; (n − m) / n is the float a coverage of n − m inside
    # computes to (1 − m / n can differ from it in the last bit, failing a coverage at the bound)
    fewest = int(binom.ppf(TAIL, n, 1.0 - level - COVERAGE_SLACK))
    return max(low, 0.0), (n - fewest) / n


def _baseline_regression(train_y: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-row log density of the held-out targets under N(mean, sd²) of the training targets."""
    train_y = np.asarray(train_y, dtype=float)
    y = np.asarray(y, dtype=float)
    if train_y.ndim == 1:
        train_y, y = train_y[:, None], y[:, None]
    mean = train_y.mean(axis=0)
    sd = train_y.std(axis=0, ddof=1) if train_y.shape[0] > 1 else np.ones(train_y.shape[1])
    sd = np.where(sd > 0, sd, 1.0)
    z = (y - mean) / sd
    return np.sum(-0.5 * z**2 - np.log(sd) - 0.5 * math.log(2 * math.pi), axis=1)


def _baseline_classification(train_y: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    counts = np.bincount(np.asarray(train_y).astype(int), minlength=num_classes)[:num_classes] + 1.0
    log_freq = np.log(counts / counts.sum())
    return log_freq[np.asarray(y).astype(int)]


def heldout_scores(posterior, X, y) -> dict:
    """The held-out figures: ``ll`` and ``baseline_ll`` (mean per row), ``rows``, and for
    regression ``coverage`` of the central 90% interval over ``targets`` values."""
    problem = posterior.problem
    prediction = posterior.predict(X, seed=HELDOUT_SEED)
    log_prob = np.asarray(prediction.log_prob(np.asarray(y)), dtype=float)
    train_y = np.asarray(problem.data[1])
    scores = {"rows": int(np.shape(y)[0]), "ll": float(np.mean(log_prob))}
    if problem.likelihood in REGRESSION:
        targets = np.asarray(y, dtype=float)
        scores["baseline_ll"] = float(np.mean(_baseline_regression(train_y, targets)))
        cdf = np.mean(ndtr((targets[None] - prediction.member_means) / prediction.noise_per_draw()), axis=0)
        tail = (1.0 - LEVEL) / 2.0
        inside = (cdf >= tail) & (cdf <= 1.0 - tail)
        scores["coverage"] = float(np.mean(inside))
        scores["targets"] = int(inside.size)
    else:
        num_classes = int(np.shape(prediction.probs)[-1])
        scores["baseline_ll"] = float(np.mean(_baseline_classification(train_y, y, num_classes)))
    return scores
