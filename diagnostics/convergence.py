"""Convergence summaries over all sites of a posterior (R-hat, ESS), via the ArviZ adapter."""

from __future__ import annotations

import numpy as np

from ppl.diagnostics import _arviz

__all__ = ["max_rhat", "min_ess"]


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float).ravel()
    return values[np.isfinite(values)]


def max_rhat(arrays) -> float | None:
    """Largest R-hat over every component of every (chain, draw, ...) array; None if undefined."""
    values = np.concatenate([_finite(_arviz.rhat(a)) for a in arrays] or [np.array([])])
    return float(values.max()) if values.size else None


def min_ess(arrays, method: str) -> float | None:
    values = np.concatenate([_finite(_arviz.ess(a, method)) for a in arrays] or [np.array([])])
    return float(values.min()) if values.size else None
