"""``mh``: random-walk Metropolis (BlackJAX's additive-step kernel) for small models.

The chains run in the same whitened coordinates as the SG-MCMC methods (u = L z, L Lᵀ the
inverse curvature at the starts), where a spherical Gaussian proposal N(0, s² I) suits the
posterior's shape. The scale s starts at 2.38/√P (Roberts, Gelman & Gilks 1997) and is tuned per
chain during warmup by a Robbins–Monro step on log s towards ``target_accept`` (0.234, the
optimum for many dimensions; use about 0.44 for one), then held fixed, so the stored draws come
from a valid Metropolis chain. Every step evaluates the full-batch log density.

A random walk needs of the order of P steps per independent draw: beyond ``MAX_COMFORTABLE``
parameters the method warns, with the dimension, and points to ``nuts``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.mcmc import random_walk

from ppl.core.errors import OptionError
from ppl.core.method import extended_remedy
from ppl.inference.sgmcmc import WhitenedChains

__all__ = ["MH", "MAX_COMFORTABLE"]

MAX_COMFORTABLE = 100  # parameters beyond which random-walk proposals mix too slowly to recommend


@dataclass(frozen=True)
class MH(WhitenedChains):
    """Random-walk Metropolis with a warmup-tuned proposal scale (whitened coordinates)."""

    name: ClassVar[str] = "mh"
    description: ClassVar[str] = "random-walk Metropolis (BlackJAX kernel), proposal scale tuned in warmup; small models"

    target_accept: float = 0.234

    @classmethod
    def remedy(cls, posterior, topic):
        if topic == "mixing":
            return extended_remedy(
                posterior, "a random walk needs many steps per draw: raise num_samples and thinning, or use method='nuts'"
            )
        return super().remedy(posterior, topic)

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.target_accept < 1.0:
            raise OptionError(f"{self.name}: target_accept must lie in (0, 1), got {self.target_accept!r}")

    def check(self, problem) -> None:
        if problem.num_params > MAX_COMFORTABLE:
            warnings.warn(
                f"mh: the model has {problem.num_params} parameters; a random walk needs of the order of "
                f"{problem.num_params} steps per independent draw and mixes poorly beyond about {MAX_COMFORTABLE} — "
                "use method='nuts' (or raise thinning and num_samples and check R-hat and ESS)",
                UserWarning, stacklevel=4,
            )

    def _step(self, curvature: float, noise: float) -> float:
        return 1.0  # unused: the proposal scale is per chain, in the extra state

    def _init_extra(self, problem, white, z):
        log_density = _log_density(problem, white)(z)
        return (log_density, jnp.log(2.38 / math.sqrt(z.shape[0])).astype(z.dtype), jnp.zeros((), z.dtype))

    def _move(self, problem, white, state, key):
        z, (log_density, log_scale, accepted) = state
        kernel = random_walk.build_additive_step()
        scale = jnp.exp(log_scale)

        def random_step(k, position):
            return scale * jax.random.normal(k, position.shape, position.dtype)

        new, info = kernel(key, random_walk.RWState(z, log_density), _log_density(problem, white), random_step)
        return (new.position, (new.logdensity, log_scale, accepted + info.is_accepted)), info.acceptance_rate

    def _transition(self, problem, white, batch, state, key, step, index):
        # warmup: Robbins–Monro on log s towards target_accept, with a decaying gain
        (z, extra), rate = self._move(problem, white, state, key)
        log_density, log_scale, accepted = extra
        gain = 1.0 / jnp.power(index + 1.0, 0.6)
        log_scale = log_scale + gain * (jnp.minimum(rate, 1.0) - self.target_accept)
        return z, (log_density, log_scale, jnp.zeros_like(accepted))

    def _draw(self, problem, white, batch, state, key, step, index):
        def body(i, s):
            return self._move(problem, white, s, jax.random.fold_in(key, i))[0]

        return jax.lax.fori_loop(0, self.thinning, body, state)

    def _record(self, chain_stats, state, draws_done: int) -> tuple:
        _, (_, log_scale, accepted) = state
        rate = np.asarray(accepted) / max(draws_done * self.thinning, 1)
        return chain_stats._replace(accept_prob=rate, step_size=None), {"proposal_scale": np.exp(np.asarray(log_scale))}


def _log_density(problem, white):
    """The Problem's full-batch log density in whitened coordinates (the change u = L z has a
    constant Jacobian, which Metropolis ratios cancel)."""
    def log_density(z):
        return problem.logdensity_fn(white.to_u(z))

    return log_density
