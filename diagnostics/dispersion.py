"""Under-dispersion of a Gaussian approximation, predicted from the curvature at its mean.

PSIS k-hat compares q with the posterior only where q puts its draws; a q much narrower than the
posterior puts them all near the mode, where the density ratio is nearly constant, and k-hat
stays small (mean-field SVI on the posteriordb references: k-hat 0.29 to 0.65 with marginal sds
0.005 to 0.47 of the reference). The curvature of the log density sees it at once: the optimum of
mean-field VI on a Gaussian posterior N(μ, Λ⁻¹) has variances 1/Λᵢᵢ where the posterior has
(Λ⁻¹)ᵢᵢ, and these differ by the correlations q leaves out.

So for a Gaussian q = N(m, Σ) (or each component of a mixture) over at most ``MAX_PARAMS``
coordinates, with H the Hessian of −log p̃ at m over q's free coordinates: the variance of q
along a direction w against that of the Gaussian the curvature implies, wᵀΣw / wᵀH⁻¹w, is
smallest at the smallest eigenvalue of Lᵀ Σ L (H = L Lᵀ). That eigenvalue is
``Diagnostics.dispersion_min``; below ``THRESHOLD`` (q's sd under half the curvature's in some
direction) the run fails. Where H is not positive definite at m (a saddle, or a flat direction),
the curvature implies no Gaussian and nothing is predicted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_PARAMS = 5000  # free coordinates up to which the dense Hessian is formed
THRESHOLD = 0.25  # the smallest variance ratio allowed: sd half the curvature's

__all__ = ["dispersion_min", "MAX_PARAMS", "THRESHOLD"]


def _components(family) -> tuple:
    return tuple(family.components) if hasattr(family, "components") else (family,)


HESSIAN_CHUNK = 32  # Hessian columns computed at once: memory is this many Hessian-vector products' work


@jax.jit
def _hessian_columns(problem, loc, free, basis):
    """Columns of the Hessian of −log p̃ over the coordinates ``free`` (the others held at
    ``loc``): H @ basis[k] for each row k of ``basis``, by forward-over-reverse products."""

    def negative(v):
        return -problem.logdensity_fn(loc.at[free].set(v))

    point = loc[free]
    gradient = jax.grad(negative)
    return jax.vmap(lambda direction: jax.jvp(gradient, (point,), (direction,))[1])(basis)


def _free_hessian(problem, loc, free) -> np.ndarray:
    """The dense Hessian over ``free``, ``HESSIAN_CHUNK`` columns at a time: forming it in one
    vectorised pass holds every column's intermediate values at once (133 GB for a CNN's 4640
    weights of one convolution on 1154 images)."""
    size = len(free)
    columns = []
    for start in range(0, size, HESSIAN_CHUNK):
        basis = jnp.eye(HESSIAN_CHUNK, size, k=start, dtype=loc.dtype)  # rows start .. start + chunk − 1 of I
        columns.append(np.asarray(_hessian_columns(problem, loc, free, basis), dtype=np.float64))
    return np.concatenate(columns, axis=0)[:size]


def dispersion_min(problem, family) -> tuple[float | None, str]:
    """(the smallest variance ratio over directions and components, or None; why None)."""
    if not hasattr(family, "components") and not hasattr(family, "cov"):
        return None, "the approximation is not Gaussian"
    worst = np.inf
    for q in _components(family):
        if not hasattr(q, "cov"):
            return None, "the approximation is not Gaussian"
        index = q.active_index
        free = np.arange(problem.num_params) if index is None else np.asarray(index)
        if len(free) > MAX_PARAMS:
            return None, f"q covers {len(free)} coordinates, more than the {MAX_PARAMS} a dense Hessian is formed for"
        rows = np.asarray(q.cov.transform_noise(jnp.eye(q.cov.noise_dim, dtype=q.loc.dtype)), dtype=np.float64)
        covariance = (rows.T @ rows)[np.ix_(free, free)]
        hessian = _free_hessian(problem, q.loc, jnp.asarray(free))
        if not np.all(np.isfinite(hessian)):
            return None, "the Hessian at q's mean is not finite"
        hessian = 0.5 * (hessian + hessian.T)
        try:
            root = np.linalg.cholesky(hessian)
        except np.linalg.LinAlgError:
            return None, "the Hessian of −log p at q's mean is not positive definite (a saddle or a flat direction)"
        worst = min(worst, float(np.linalg.eigvalsh(root.T @ covariance @ root)[0]))
    return worst, ""
