"""``svi``: stochastic variational inference with Gaussian guides over the flat unconstrained vector.

The guides are the shared Gaussian family (:mod:`ppl.inference._gaussian`), parameterised for
unconstrained optimisation:

* ``mean_field`` — N(μ, diag(σ²)), σ = exp(ρ)
* ``low_rank`` — N(μ, diag(σ²) + W Wᵀ), W of shape (P, rank)
* ``full_rank`` — N(μ, L Lᵀ), L lower triangular with an exp-parameterised diagonal
* ``delta`` — a point mass (MAP by SVI's optimiser)

The objective is the reparameterised ELBO with the Gaussian entropy in closed form
(Kucukelbir et al. 2017; Titsias & Lázaro-Gredilla 2014):

    ELBO(φ) = E_{ε∼N(0,I)}[log p̃(μ + A ε, D)] + H[q_φ],

estimated with ``num_particles`` draws per step. Defaults are chosen so that the optimum is
actually reached on small correlated problems: several particles, Adam with a cosine decay of the
learning rate to 1% (the late, small steps average out the gradient noise), and a convergence
check on the loss curve recorded in ``Posterior.info``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ppl._checkpoint import Session
from ppl._data import check_batch_size
from ppl._posterior import Posterior
from ppl.inference._base import (
    Method,
    check_choice,
    check_dense_matrix,
    check_positive,
    check_stored_draws,
    check_positive_int,
)
from ppl.inference._gaussian import Diagonal, Full, Gaussian, LowRankDiagonal, PointMass, draw
from ppl.inference.optimize import (
    INITS,
    NegativeLogJoint,
    OptimizerConfig,
    _full_gradient,
    _moved,
    loss_convergence,
    minimize,
)

__all__ = ["SVI", "GUIDES", "guide_family", "NegativeELBO"]

GUIDES = ("mean_field", "low_rank", "full_rank", "delta")
OBJECTIVES = ("elbo",)
INIT_SCALE = 0.1  # initial guide standard deviation, as NumPyro's autoguides


def init_guide(kind: str, loc: jax.Array, rank: int, key) -> dict:
    """Variational parameters of guide ``kind`` centred at ``loc``."""
    dim = loc.shape[0]
    log_scale = jnp.full(dim, jnp.log(INIT_SCALE))
    if kind == "mean_field":
        return {"loc": loc, "log_scale": log_scale}
    if kind == "low_rank":
        # A zero factor is a stationary point of the ELBO in W; start it small and random.
        factor = 0.01 * jax.random.normal(key, (dim, rank), dtype=loc.dtype)
        return {"loc": loc, "log_scale": log_scale, "factor": factor}
    if kind == "full_rank":
        return {"loc": loc, "tril": jnp.zeros((dim, dim)), "log_scale": log_scale}
    return {"loc": loc}


def guide_family(kind: str, params: dict):
    """The family object (Gaussian or PointMass) described by variational ``params``."""
    if kind == "mean_field":
        return Gaussian(params["loc"], Diagonal(jnp.exp(params["log_scale"])))
    if kind == "low_rank":
        return Gaussian(params["loc"], LowRankDiagonal(params["factor"], jnp.exp(params["log_scale"])))
    if kind == "full_rank":
        scale_tril = jnp.tril(params["tril"], -1) + jnp.diag(jnp.exp(params["log_scale"]))
        return Gaussian(params["loc"], Full(scale_tril))
    return PointMass(params["loc"])


@dataclass(frozen=True)
class NegativeELBO:
    """−ELBO of a Gaussian guide, ``num_particles`` reparameterised draws, analytic entropy."""

    guide: str
    num_particles: int

    def __call__(self, params, problem, key, batch):
        family = guide_family(self.guide, params)
        draws = family.sample(key, self.num_particles)
        log_density = jax.vmap(lambda u: problem.logdensity_fn(u, batch))(draws)
        return -(jnp.mean(log_density) + family.entropy())


@dataclass(frozen=True)
class SVI(Method):
    """Stochastic variational inference (ELBO) with mean-field, low-rank, full-rank or delta guides."""

    name = "svi"
    description = "variational inference: Gaussian guides (mean_field, low_rank, full_rank) or delta, ELBO"

    guide: str = "mean_field"
    objective: str = "elbo"
    num_particles: int = 8
    steps: int = 5000
    learning_rate: float = 0.01
    schedule: str = "cosine"
    batch_size: int | None = None
    rank: int = 10
    init: str = "prior"
    num_draws: int = 1000

    def __post_init__(self):
        super().__post_init__()
        check_choice(self.name, "guide", self.guide, GUIDES)
        check_choice(self.name, "objective", self.objective, OBJECTIVES)
        check_choice(self.name, "schedule", self.schedule, ("constant", "cosine"))
        check_choice(self.name, "init", self.init, INITS)
        for option in ("num_particles", "steps", "rank", "num_draws"):
            check_positive_int(self.name, option, getattr(self, option))
        check_positive(self.name, "learning_rate", self.learning_rate)

    def stored_draws(self) -> int:
        return 1 if self.guide == "delta" else self.num_draws

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)
        itemsize = np.dtype(problem.init_params.dtype).itemsize
        # Each step draws num_particles parameter vectors and keeps them for the gradient.
        check_stored_draws(f"{self.name} (num_particles per step)", self.num_particles, problem.num_params, itemsize)
        if self.guide == "full_rank":
            # The factor, Adam's two moments and its gradient: four P × P arrays.
            check_dense_matrix(
                self.name, "a full-rank guide", problem.num_params, itemsize, copies=4,
                alternatives="guide='low_rank' (rank=...) or 'mean_field'",
            )

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        init_key, factor_key, run_key, draw_key = jax.random.split(key, 4)
        loc = problem.init_position(init_key, self.init)
        rank = min(self.rank, problem.num_params)
        start = init_guide(self.guide, loc, rank, factor_key)
        objective = (
            NegativeLogJoint() if self.guide == "delta" else NegativeELBO(self.guide, self.num_particles)
        )
        config = OptimizerConfig("adam", int(self.steps), self.schedule, self.batch_size)

        if self.guide == "delta":
            # A delta guide is a MAP: its objective is deterministic on the full data, so judge it
            # by its full-batch gradient as map does.
            start_norm = float(_full_gradient(objective, problem, start, run_key)[1])

        def build(params, losses):
            family = guide_family(self.guide, params)
            flat = draw(family, draw_key, self.stored_draws())
            judged = {"moved": _moved(start, params)}
            if self.guide == "delta":
                judged["gradient"] = (start_norm, float(_full_gradient(objective, problem, params, run_key)[1]))
            info = {"losses": losses, **loss_convergence(losses, self.steps, **judged)}
            return Posterior(method=self.name, problem=problem, flat_draws=flat[None], info=info, approximation=family)

        result = minimize(
            objective, config, problem, start, run_key, learning_rate=self.learning_rate,
            label=f"svi ({self.guide})", session=session, build=build,
        )
        posterior = build(result.params, result.losses)
        posterior.resume_state = result.resume_state
        return posterior
