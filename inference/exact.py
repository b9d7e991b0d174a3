"""``exact``: the closed-form posterior of conjugate Bayesian linear regression.

With a Gaussian prior and a Gaussian likelihood of known noise, the (tempered) log density is
quadratic in the weights: log p̃(θ) = c + hᵀθ − ½ θᵀΛθ. Its gradient h and Hessian −Λ at θ = 0
are therefore exact, so the posterior is N(Λ⁻¹h, Λ⁻¹) and

    log Z = log p̃(0) + ½ hᵀΛ⁻¹h + (P/2) log 2π − ½ log |Λ|.

Working from the Problem's own log density means tempering (likelihood or cold) is honoured
exactly as by every other method. With T = 1 this is Bishop (2006) §3.3 and §3.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ppl._errors import OptionError
from ppl._posterior import Posterior
from ppl.inference._base import Method, check_positive_int
from ppl.inference._gaussian import Full, Gaussian, draw
from ppl.models import LinearRegression

__all__ = ["Exact", "gaussian_integral"]


@jax.jit
def gaussian_integral(problem):
    """Mean, Cholesky factor of the covariance, and log normaliser of a quadratic log density."""
    zero = problem.init_params
    value, grad = jax.value_and_grad(problem.logdensity_fn)(zero)
    precision = -jax.hessian(problem.logdensity_fn)(zero)
    chol_precision = jnp.linalg.cholesky(precision)
    mean = jax.scipy.linalg.cho_solve((chol_precision, True), grad)
    # Σ = Λ⁻¹; its Cholesky factor from the inverse of Λ's: Σ = L⁻ᵀL⁻¹.
    inv_chol = jax.scipy.linalg.solve_triangular(chol_precision, jnp.eye(zero.shape[0]), lower=True)
    scale_tril = jnp.linalg.cholesky(inv_chol.T @ inv_chol)
    log_det_precision = 2.0 * jnp.sum(jnp.log(jnp.diag(chol_precision)))
    log_z = value + 0.5 * grad @ mean + 0.5 * zero.shape[0] * math.log(2 * math.pi) - 0.5 * log_det_precision
    return mean, scale_tril, log_z


@dataclass(frozen=True)
class Exact(Method):
    """Closed-form Gaussian posterior and log evidence of conjugate linear regression."""

    name = "exact"
    description = "closed-form posterior and log evidence of conjugate LinearRegression (known noise)"

    num_draws: int = 1000

    def __post_init__(self):
        check_positive_int(self.name, "num_draws", self.num_draws)

    def check(self, problem) -> None:
        model = problem.model
        if not isinstance(model, LinearRegression) or model.noise_scale is None:
            raise OptionError(
                "method 'exact' applies only to LinearRegression with a fixed noise_scale (the conjugate case); "
                f"got {type(model).__name__ if problem.is_declarative else 'a plain NumPyro program'}"
                + (" with a learned sigma" if isinstance(model, LinearRegression) else "")
                + " — use 'nuts' or 'svi'"
            )

    def run(self, key, problem) -> Posterior:
        self.check(problem)
        mean, scale_tril, log_z = gaussian_integral(problem)
        family = Gaussian(mean, Full(scale_tril))
        flat = draw(family, key, self.num_draws)
        return Posterior(
            method=self.name,
            problem=problem,
            flat_draws=flat[None],
            info={"log_evidence": float(log_z)},
            approximation=family,
        )
