"""Logistic regression: MAP equals Newton-Raphson."""

from __future__ import annotations

import numpy as np

from ppl.models import LogisticRegression
import ppl


def newton_map(X, y, prior_scale, iterations=50):
    A = np.hstack([X, np.ones((X.shape[0], 1))])
    theta = np.zeros(A.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-A @ theta))
        grad = A.T @ (y - p) - theta / prior_scale**2
        hess = -(A.T * (p * (1 - p))) @ A - np.eye(A.shape[1]) / prior_scale**2
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if np.max(np.abs(step)) < 1e-14:
            break
    return theta


def test_map_equals_newton_raphson():
    data = ppl.datasets.load("breast_cancer", seed=0)
    X, y = np.asarray(data.train.X), np.asarray(data.train.y, dtype=float)
    expected = newton_map(X, y, prior_scale=1.0)
    post = ppl.fit(LogisticRegression(prior_scale=1.0), data.train, method="map", seed=0)
    found = np.concatenate([post.draws["w"][0, 0], post.draws["b"][0, 0][None]])
    np.testing.assert_allclose(found, expected, atol=1e-4, rtol=0)
