"""``ivon``: Improved Variational Online Newton (Shen et al., ICML 2024).

Mean-field variational inference by a natural-gradient rule that costs about what Adam costs:
q(u) = N(m, diag(1/h)) over the flat unconstrained parameters, where h is an online estimate of
the expected diagonal curvature of the negative log density. Each step draws u = m + ε/√h, takes
the gradient ĝ of −log p̃(u | D) there (on a minibatch, scaled to the data, when ``batch_size`` is
set), and updates

    g ← β₁ g + (1 − β₁) ĝ
    ĥ = ĝ · (u − m) · h                       (the reparameterisation estimate of E_q[diag ∇²])
    h ← β₂ h + (1 − β₂) ĥ + ½ (1 − β₂)² (h − ĥ)² / h
    m ← m − α (g / (1 − β₁ᵗ)) / h

The third term of the h update keeps h positive whatever ĥ is: h·(1 + x + x²/2) with
x = (1 − β₂)(ĥ − h)/h. Its fixed point is h = E_q[diag ∇²(−log p̃)] at m where E_q[ĝ] = 0, which is
the stationary point of the mean-field ELBO (Bonnet's and Price's theorems): for a Gaussian
posterior with precision Λ, h = diag(Λ) and m its mean, the mean-field optimum.

ppl's form differs from the paper's only in units: the paper scales the loss per data point and
carries the data size λ and a weight decay δ; here the loss is the whole negative log density
(the model's prior included, tempered as the problem says), so λ = 1 and δ = 0 and h is in the
posterior's own precision units. ``hess_init`` is the paper's initial h per data point, so h
starts at ``hess_init · N`` plus the prior's precision.

The objective recorded each step is the negative ELBO, E_q[−log p̃] − H(q), estimated from the
step's draws: the loss curve is directly comparable with ``svi``'s, and the run is judged as svi's
are (the loss has settled and the expected gradient is zero within its noise). The result is a
mean-field Gaussian with the whole treatment of one: k-hat, the variance check against the
curvature, the predictives, saving, ``as_numpyro_guide``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ppl.core import curvature
from ppl.core.checkpoint import Session
from ppl.core.data import check_batch_size
from ppl.core.errors import OptionError
from ppl.core.gaussian import Diagonal, Gaussian, draw
from ppl.core.method import Method, check_choice, check_positive, check_positive_int
from ppl.core.posterior import Posterior
from ppl.inference.optimize import (
    INITS, OptimizerConfig, budget_of, check_budget, has_moved, round_convergence, run_to_posterior, stationarity,
)

__all__ = ["IVON", "IVONRule", "NegativeELBO"]


class IVONState(NamedTuple):
    count: jax.Array  # steps taken (for the momentum's bias correction and the schedule)
    momentum: jax.Array  # g, like m


@dataclass(frozen=True)
class IVONRule:
    """The IVON update as an optax transformation over params ``{"m", "h"}`` whose gradients come
    from :class:`NegativeELBO` (hashable: it is part of the static ``OptimizerConfig``)."""

    beta1: float
    beta2: float
    clip_radius: float | None = None

    def build(self, rate) -> optax.GradientTransformation:
        beta1, beta2, radius = self.beta1, self.beta2, self.clip_radius

        def init(params):
            return IVONState(jnp.zeros((), jnp.int32), jnp.zeros_like(params["m"]))

        def update(grads, state, params):
            h = params["h"]
            count = state.count + 1
            # The gradient in h of E_q[−log p̃] is E[ĝ ε] · d(1/√h)/dh = −½ h^(−3/2) E[ĝ ε]; the objective
            # adds the entropy's −½ Σ log h, whose gradient −1/(2h) is taken back out here.
            hess = -2.0 * jnp.square(h) * (grads["h"] - 0.5 / h)
            momentum = beta1 * state.momentum + (1.0 - beta1) * grads["m"]
            new_h = beta2 * h + (1.0 - beta2) * hess + 0.5 * (1.0 - beta2) ** 2 * jnp.square(h - hess) / h
            step_size = rate(state.count) if callable(rate) else rate
            corrected = momentum / (1.0 - beta1 ** count.astype(momentum.dtype))
            newton = corrected / new_h
            if radius is not None:
                newton = jnp.clip(newton, -radius, radius)
            updates = {"m": -step_size * newton, "h": new_h - h}
            return updates, IVONState(count, momentum)

        return optax.GradientTransformation(init, update)


@dataclass(frozen=True)
class NegativeELBO:
    """E_q[−log p̃(u | D)] − H(q) for q = N(m, diag(1/h)), from ``num_particles`` draws: the loss
    IVON records, written so that its gradients carry ĝ (in m) and ĝ·ε (in h)."""

    num_particles: int
    fixed_h: bool = False  # True: h is held (no gradient), as the convergence judge asks only about m

    def __call__(self, params, problem, key, batch, step=None):
        m, h = params["m"], params["h"]
        if self.fixed_h:
            h = jax.lax.stop_gradient(h)
        eps = jax.random.normal(key, (self.num_particles, m.shape[0]), m.dtype)
        u = m[None] + eps / jnp.sqrt(h)[None]
        energy = -jnp.mean(jax.vmap(lambda v: problem.logdensity_fn(v, batch))(u))
        entropy = 0.5 * m.shape[0] * (1.0 + math.log(2.0 * math.pi)) - 0.5 * jnp.sum(jnp.log(h))
        return energy - entropy


@dataclass(frozen=True)
class IVON(Method):
    """Improved Variational Online Newton: mean-field VI by a natural-gradient rule at Adam's cost
    (see ``docs/methods/ivon.md``)."""

    name: ClassVar[str] = "ivon"
    kind: ClassVar[str] = "independent"
    loss_label: ClassVar[str] = "negative ELBO, estimated each step"
    resumable: ClassVar[bool] = True
    description: ClassVar[str] = (
        "IVON: mean-field Gaussian by variational online Newton (natural-gradient VI at Adam's cost)"
    )

    steps: int = 5000
    learning_rate: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    hess_init: float = 1.0
    clip_radius: float | None = 1.0
    num_particles: int = 1
    batch_size: int | None = None
    init: str = "prior"
    num_draws: int = 1000
    max_steps: int | None = None

    def __post_init__(self):
        super().__post_init__()
        for option in ("steps", "num_particles", "num_draws"):
            check_positive_int(self.name, option, getattr(self, option))
        check_budget(self.name, self.steps, self.max_steps)
        check_positive(self.name, "learning_rate", self.learning_rate)
        check_positive(self.name, "hess_init", self.hess_init)
        if self.clip_radius is not None:
            check_positive(self.name, "clip_radius", self.clip_radius)
        check_choice(self.name, "init", self.init, INITS)
        for option in ("beta1", "beta2"):
            value = getattr(self, option)
            if not 0.0 <= value < 1.0:
                raise OptionError(f"{self.name}: {option} must lie in [0, 1), got {value!r}")

    @classmethod
    def remedy(cls, posterior, topic):
        if topic == "fit":
            return "a mean-field Gaussian is far from the posterior: try method='svi' with guide='full_rank', or 'nuts'"
        return super().remedy(posterior, topic)

    def stored_draws(self) -> int:
        return self.num_draws

    def check(self, problem) -> None:
        check_batch_size(self.batch_size, problem.num_data)
        if problem.local_sites:
            raise OptionError(f"{self.name}: models with local latents (a VAE) are fitted with svi")

    def config(self) -> OptimizerConfig:
        radius = None if self.clip_radius is None else float(self.clip_radius)
        return OptimizerConfig(IVONRule(float(self.beta1), float(self.beta2), radius), int(self.steps), "cosine",
                               self.batch_size, max_steps=budget_of(self.steps, self.max_steps))

    def starting_point(self, key, problem) -> dict:
        """m from ``init``; h = ``hess_init`` · N plus the prior's precision where it is known."""
        m = problem.init_position(key, self.init)
        h = jnp.full_like(m, self.hess_init * problem.num_data)
        if problem.is_declarative:
            h = h + jnp.maximum(curvature.prior_precision_diagonal(problem, m), 0.0)
        return {"m": m, "h": h}

    def run(self, key, problem, session: Session | None = None) -> Posterior:
        self.check(problem)
        init_key, run_key, draw_key, check_key = jax.random.split(key, 4)
        start = self.starting_point(init_key, problem)
        objective = NegativeELBO(int(self.num_particles))
        config = self.config()

        def judged(params, losses):
            # m's fixed point, E_q[ĝ] = 0, is the ELBO's; h's is biased by its update's positivity
            # term when ĥ is noisy (a ReLU network's), so only m is tested for stationarity (h's
            # quality is the verdict's variance check against the curvature)
            stationary = stationarity(
                NegativeELBO(objective.num_particles, fixed_h=True), problem, params, check_key, loss_scale=float(np.mean(losses[-10:])) if len(losses) else 1.0
            )
            return round_convergence(losses, self.steps, config.budget, moved=has_moved(start, params),
                                     stationary=stationary)

        def build(params, losses):
            family = Gaussian(params["m"], Diagonal(1.0 / jnp.sqrt(params["h"])))
            status, trace = judged(params, losses)
            return Posterior(
                method=self.name, kind=self.kind, declared_by=type(self), problem=problem,
                flat_draws=draw(family, draw_key, self.num_draws)[None],
                status=status, trace=trace, info={"guide": "mean_field"}, approximation=family,
            )

        return run_to_posterior(objective, config, problem, start, run_key, learning_rate=self.learning_rate,
                                label=self.name, session=session, build=build, judged=judged)

