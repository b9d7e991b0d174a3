"""Convergence summaries over all sites of a posterior (R-hat, ESS), via the ArviZ adapter, and
function-space R-hat at many inputs, computed in blocks of inputs."""

from __future__ import annotations

import numpy as np

from ppl.diagnostics import _arviz

__all__ = ["max_rhat", "min_ess", "function_rhat"]


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



def function_rhat(posterior, X, *, max_bytes: int | None = None) -> np.ndarray:
    """Rank-normalised split R-hat of the network's outputs at each of the inputs ``X`` (N, D),
    shape (N, outputs): function-space convergence everywhere the user cares about, not only on
    the probe batch behind ``Diagnostics.rhat_function_max``. R-hat compares chains, so it is for
    samplers with ``num_chains ≥ 2``.

    The outputs are computed and reduced in blocks of inputs (``Posterior.function_draws_chunks``,
    at most ``max_bytes`` each, 32 MiB by default), so memory is one block and its working copies
    plus the (N, outputs) result, however many inputs: 100,000 inputs × 1,000 draws, 800 MB of
    outputs whole, go through in 24 blocks.
    """
    if posterior.num_chains < 2:
        raise ValueError(
            f"function_rhat compares chains, and this {posterior.method} posterior has "
            f"{posterior.num_chains}; fit with num_chains ≥ 2"
        )
    options = {} if max_bytes is None else {"max_bytes": max_bytes}
    return np.concatenate([_arviz.rhat(block) for block in posterior.function_draws_chunks(X, **options)])
