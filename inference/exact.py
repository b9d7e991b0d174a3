"""``exact``: the closed-form posterior of conjugate Bayesian linear regression.

With a Gaussian prior and a Gaussian likelihood of known noise, the (tempered) log density is
quadratic in the weights: log p̃(θ) = c + hᵀθ − ½ θᵀΛθ. Its gradient h and Hessian −Λ at θ = 0
are therefore exact, so the posterior is N(Λ⁻¹h, Λ⁻¹) and

    log Z = log p̃(0) + ½ hᵀΛ⁻¹h + (P/2) log 2π − ½ log |Λ|.

Working from the Problem's own log density means tempering (likelihood or cold) is honoured
exactly as by every other method. With T = 1 this is Bishop (2006) §3.3 and §3.5.

Numerics. Neither Σ = Λ⁻¹ nor any inverse of Λ is formed. Λ is first rescaled symmetrically by
its diagonal (Jacobi): Λ̃ = D Λ D with D ≈ diag(Λ)^(-1/2) rounded to a power of two, so the
rescaling is exact and Λ̃ has a diagonal in [1/2, 2) whatever the scales of the columns of X. Λ̃ is
then factored in reversed order: with J the exchange matrix, J Λ̃ J = M Mᵀ (an ordinary Cholesky)
and U = J M J is upper triangular with Λ̃ = U Uᵀ. Hence Σ = D U⁻ᵀ U⁻¹ D, and

    scale_tril = D U⁻ᵀ     (lower triangular with a positive diagonal; Σ = scale_tril scale_trilᵀ)

comes from one triangular solve against the identity. The mean and the quadratic term of log Z
come from two triangular solves with U, and log |Λ| = 2 Σ log diag(U) − 2 Σ log D.

The previous implementation factored Λ, formed Σ̂ = L⁻ᵀL⁻¹ and factored Σ̂ again: one more
factorisation and Gram product, and a second Cholesky that returns NaN when Σ̂ rounds to
indefinite. Both are backward stable, so their errors are of the same order, κ(C)·eps with C the
unit-diagonal rescaling of Λ (tests/test_exact_numerics.py measures them); the floor common to
both is the rounding of Λ itself, which the Hessian forms as XᵀX/σ² + I/s².

Positive definiteness. ``rcond`` = 1 / max_i Λ_ii Σ_ii (the reciprocal of the largest variance
inflation factor) costs one pass over scale_tril and lies in [λ_min(C), P·λ_min(C)]. If the
factorisation failed (NaN, non-positive pivot) or rcond ≤ P·eps (Λ singular to working precision:
κ(C) ≥ 1/(P·eps), so no digit of Σ could be trusted), :meth:`Exact.run` raises
:class:`NotPositiveDefiniteError` (an :class:`ppl.OptionError`) naming the parameters along the
(near-)null direction and what to do, instead of returning NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from ppl.core.errors import OptionError
from ppl.core.gaussian import Full, Gaussian, draw
from ppl.core.method import Method, check_positive_int
from ppl.core.posterior import Posterior
from ppl.core.records import Evidence
from ppl.models import LinearRegression

__all__ = ["Exact", "gaussian_integral", "GaussianIntegral", "NotPositiveDefiniteError"]


class NotPositiveDefiniteError(OptionError):
    """The posterior precision is not (numerically) positive definite: no Gaussian posterior exists."""


class PrecisionFactor(NamedTuple):
    """Λ = D⁻¹ U Uᵀ D⁻¹ and Σ = Λ⁻¹ = L Lᵀ, with D = diag(``scale``), U = ``upper``, L = ``scale_tril``.

    ``rcond`` = 1 / max_i Λ_ii Σ_ii: the reciprocal of the largest variance inflation factor, i.e.
    min_i (1 − R²_i) with R²_i the squared multiple correlation (in the metric of Λ) of coordinate i
    with all the others. It lies in [λ_min(C), P·λ_min(C)] for the unit-diagonal C = diag(Λ)^(-1/2)
    Λ diag(Λ)^(-1/2), so it is a cheap, scale-free reciprocal condition number. It is −inf when the
    factorisation failed (a NaN, a non-positive pivot, or a non-positive diagonal entry of Λ).
    """

    scale_tril: jax.Array
    upper: jax.Array
    scale: jax.Array
    rcond: jax.Array


class GaussianIntegral(NamedTuple):
    """What :func:`gaussian_integral` returns; ``rcond`` as in :class:`PrecisionFactor`."""

    mean: jax.Array
    scale_tril: jax.Array
    log_z: jax.Array
    rcond: jax.Array


def pivot_tolerance(dim: int, dtype) -> float:
    """``rcond`` at or below P·eps means Λ is singular to working precision (see :class:`PrecisionFactor`).

    Then λ_min(C) ≤ P·eps: κ(C) ≥ 1/(P·eps), and no digit of Σ can be trusted. Above it,
    λ_min(C) > eps, so every accepted problem has κ(C) < P/eps.
    """
    return float(dim * jnp.finfo(dtype).eps)


def factor_precision(precision) -> PrecisionFactor:
    """Jacobi-scaled, reversed-order Cholesky of a symmetric precision matrix (jittable, never raises).

    Check the result with :func:`check_positive_definite` (host side) before using it.
    """
    precision = 0.5 * (precision + precision.T)
    diag = jnp.diag(precision)
    positive = diag > 0
    # D ≈ diag(Λ)^(-1/2), rounded to a power of two so that Λ̃ = D Λ D is exact (no rounding at all)
    # and its diagonal lies in [1/2, 2). A non-positive diagonal already proves Λ is not PD: scale it
    # by 1 and let the factorisation fail.
    _, exponent = jnp.frexp(jnp.where(positive, diag, 1.0))
    scale = jnp.ldexp(jnp.ones_like(diag), -(exponent // 2))
    scaled = scale[:, None] * precision * scale[None, :]
    reversed_chol = jnp.linalg.cholesky(scaled[::-1, ::-1])  # J Λ̃ J = M Mᵀ
    upper = reversed_chol[::-1, ::-1]  # U = J M J, upper triangular, Λ̃ = U Uᵀ
    eye = jnp.eye(upper.shape[0], dtype=upper.dtype)
    inv_upper_t = jnp.tril(solve_triangular(upper, eye, trans="T", lower=False))  # U⁻ᵀ: Σ̃ = U⁻ᵀU⁻¹
    scale_tril = scale[:, None] * inv_upper_t
    # Variance inflation factors Λ_ii Σ_ii = Λ̃_ii Σ̃_ii (row sums of squares of U⁻ᵀ); inf → rcond 0.
    vif = jnp.diag(scaled) * jnp.sum(jnp.square(inv_upper_t), axis=1)
    ok = jnp.all(positive) & jnp.all(jnp.isfinite(upper)) & jnp.all(jnp.diag(upper) > 0) & ~jnp.any(jnp.isnan(vif))
    rcond = jnp.where(ok, 1.0 / jnp.max(vif), -jnp.inf)
    return PrecisionFactor(scale_tril, upper, scale, rcond)


def whiten(factor: PrecisionFactor, vector):
    """z = U⁻¹ D v, so that vᵀ Λ⁻¹ v = ‖z‖² and Λ⁻¹ v = D U⁻ᵀ z."""
    return solve_triangular(factor.upper, factor.scale * vector, lower=False)


def log_det_precision(factor: PrecisionFactor):
    """log |Λ| = 2 Σ log diag(U) − 2 Σ log D."""
    return 2.0 * (jnp.sum(jnp.log(jnp.abs(jnp.diag(factor.upper)))) - jnp.sum(jnp.log(factor.scale)))


@jax.jit
def gaussian_integral(problem) -> GaussianIntegral:
    """Mean, Cholesky factor of the covariance and log normaliser of a quadratic log density, plus
    ``rcond`` (check it against :func:`pivot_tolerance`: at or below it, or −inf, the other fields
    are meaningless and may be NaN; :meth:`Exact.run` checks and raises instead)."""
    zero = problem.init_params
    value, grad = jax.value_and_grad(problem.logdensity_fn)(zero)
    factor = factor_precision(-jax.hessian(problem.logdensity_fn)(zero))
    z = whiten(factor, grad)
    mean = factor.scale * solve_triangular(factor.upper, z, trans="T", lower=False)
    log_z = value + 0.5 * jnp.sum(jnp.square(z)) + 0.5 * zero.shape[0] * math.log(2 * math.pi)
    log_z = log_z - 0.5 * log_det_precision(factor)
    return GaussianIntegral(mean, factor.scale_tril, log_z, factor.rcond)


@jax.jit
def _precision(problem):
    return -jax.hessian(problem.logdensity_fn)(problem.init_params)


def flat_names(problem) -> list:
    """Readable names of the flat unconstrained coordinates: ``w[3]``, ``b``."""
    names = []
    for site in problem.sites:
        if site.size == 1 and len(site.unconstrained_shape) <= 1:
            names.append(site.name if not site.unconstrained_shape else f"{site.name}[0]")
            continue
        for index in np.ndindex(*site.unconstrained_shape):
            names.append(f"{site.name}[{','.join(map(str, index))}]")
    return names


def check_positive_definite(rcond, precision, names=None, *, advice: str = "") -> None:
    """Raise :class:`NotPositiveDefiniteError` unless ``rcond`` (of :class:`PrecisionFactor`) clears
    :func:`pivot_tolerance`.

    Only on failure is ``precision`` examined (on the host, in float64) to name the coordinates that
    look responsible: those with a non-positive or non-finite diagonal entry, or else the largest
    components of the eigenvector of the smallest eigenvalue of the unit-diagonal rescaled precision.
    """
    precision = np.asarray(precision)
    dim = precision.shape[0]
    tol = pivot_tolerance(dim, precision.dtype)
    rcond = float(rcond)
    if rcond > tol:
        return
    names = list(names) if names is not None else [f"theta[{i}]" for i in range(dim)]
    lam = 0.5 * (precision + precision.T).astype(np.float64)
    diag = np.diag(lam)
    if rcond == -np.inf:
        what = "its Cholesky factorisation failed"
    else:
        what = (
            f"it is singular to working precision: the largest variance inflation factor Λ_ii·Σ_ii is "
            f"{1.0 / rcond:.3g} ≥ 1/(P·eps) = {1.0 / tol:.3g}"
        )
    bad = [i for i in range(dim) if not (np.isfinite(diag[i]) and diag[i] > 0)]
    if not np.all(np.isfinite(lam)):
        rows = sorted({int(i) for i in np.nonzero(~np.isfinite(lam))[0]})
        culprits = "it has non-finite entries in the rows of " + _listing([names[i] for i in rows])
    elif bad:
        culprits = "its diagonal is not positive at " + _listing([f"{names[i]} ({diag[i]:.3g})" for i in bad])
    else:
        d = 1.0 / np.sqrt(diag)
        evals, evecs = np.linalg.eigh(d[:, None] * lam * d[None, :])
        v = evecs[:, 0]
        order = [int(i) for i in np.argsort(-np.abs(v), kind="stable") if abs(v[i]) >= 0.1 * np.max(np.abs(v))]
        culprits = (
            f"its (near-)null direction (eigenvalue {evals[0]:.3g} after rescaling to a unit diagonal) involves "
            + _listing([f"{names[i]} ({v[i]:+.2f})" for i in order])
            + ", which look collinear: one is, up to rounding, a linear combination of the others"
        )
    raise NotPositiveDefiniteError(
        f"method 'exact': the posterior precision is not positive definite ({what}), so there is no Gaussian "
        f"posterior to return; {culprits}." + (f" {advice}." if advice else "")
    )


def _listing(items: list, limit: int = 10) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _advice(problem) -> str:
    model = problem.model
    if isinstance(model, LinearRegression):
        return (
            "w[j] is the coefficient of column j of X and b the intercept. Use a tighter prior (a smaller "
            f"prior_scale than {model.prior_scale:g}), or standardise the columns of X and drop duplicated or "
            "collinear ones (a constant column duplicates the intercept)"
        )
    return "Use a tighter prior, or remove redundant (collinear) parameters"


@dataclass(frozen=True)
class Exact(Method):
    """Closed-form Gaussian posterior and log evidence of conjugate linear regression."""

    name = "exact"
    kind = "independent"
    description = "closed-form posterior and log evidence of conjugate LinearRegression (known noise)"

    num_draws: int = 1000

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.name, "num_draws", self.num_draws)

    def stored_draws(self) -> int:
        return self.num_draws

    def check(self, problem) -> None:
        model = problem.model
        if not isinstance(model, LinearRegression) or model.noise_scale is None:
            raise OptionError(
                "method 'exact' applies only to LinearRegression with a fixed noise_scale (the conjugate case); "
                f"got {type(model).__name__ if problem.is_declarative else 'a plain NumPyro program'}"
                + (" with a learned sigma" if isinstance(model, LinearRegression) else "")
                + " — use 'nuts' or 'svi'"
            )

    def run(self, key, problem, session=None) -> Posterior:
        self.check(problem)
        mean, scale_tril, log_z, rcond = gaussian_integral(problem)
        if not float(rcond) > pivot_tolerance(problem.num_params, mean.dtype):
            check_positive_definite(rcond, _precision(problem), flat_names(problem), advice=_advice(problem))
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale_tril)) and np.isfinite(float(log_z))):
            # Unreachable for validated data (the precision factorised); guard anyway rather than return NaN.
            raise OptionError(
                "method 'exact': the posterior mean, covariance or log evidence is not finite although the "
                "precision is positive definite; the log density or its gradient at zero is not finite"
            )
        family = Gaussian(mean, Full(scale_tril))
        flat = draw(family, key, self.num_draws)
        return Posterior(
            method=self.name,
            kind=self.kind,
            declared_by=type(self),
            problem=problem,
            flat_draws=flat[None],
            # closed_form: q is the posterior itself, so constant log p − log q means a perfect fit.
            evidence=Evidence(log_evidence=float(log_z), closed_form=True),
            approximation=family,
        )
