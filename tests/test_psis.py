"""PSIS k-hat sign convention."""

from __future__ import annotations

import numpy as np
from scipy import stats

from ppl.diagnostics import khat, khat_threshold


def test_khat_sign_convention():
    # q = N(0, 1), p = N(0, 1.5²): the ratios p/q have a Pareto tail with k = 1 − σ_q²/σ_p² ≈ 0.56.
    # With S = 1e5 draws the tail holds 3√S ≈ 949 draws; the estimator's sd is about
    # (1 + k)/√949 ≈ 0.05, so ±0.15 is a three-sigma band.
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000)
    log_p, log_q = stats.norm.logpdf(x, scale=1.5), stats.norm.logpdf(x)
    k = khat(log_p - log_q)
    assert abs(k - (1 - 1 / 1.5**2)) < 0.15
    # The wrong sign (log q − log p) describes a light tail (true k < 0): it must not look like 0.5.
    assert khat(log_q - log_p) < 0.2


def test_khat_threshold():
    assert khat_threshold(1000) == min(1 - 1 / 3, 0.7)
    assert khat_threshold(10**6) == 0.7
