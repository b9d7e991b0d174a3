"""SVI objectives as strategy objects: ELBO, IWAE and Rényi bounds, with β and KL warm-up.

An objective is a frozen dataclass whose ``loss(guide, params, problem, key, batch, step)`` is the
negative bound to minimise. It sees the guide only through ``guide.family(params)``, so every
objective composes with every guide.

Each bound is built from log weights log w = ℓ(u) + b·(π(u) − log q(u)) for draws u ∼ q, where
the Problem splits the (tempered, minibatch-scaled) log density into its likelihood part ℓ and
its prior part π (prior plus the constraining Jacobian; :meth:`ppl.Problem.density_parts`), and
b = β·warm-up(step) weighs the prior/KL side (β-VAE, Higgins et al. 2017). With b = 1, log w is
log p̃(u, D) − log q(u). Temperature stays where it is, in the Problem.

* :class:`ELBO` — mean of log w over ``num_particles`` draws; a Gaussian guide's −E log q is its
  entropy in closed form (lower variance).
* :class:`IWAE` — log (1/K) Σ_k w_k over K joint draws (Burda et al. 2016); K = 1 is the ELBO.
  ``gradient="dreg"`` gives the doubly reparameterised gradient of Tucker et al. (2019): the score
  term of log q is dropped and the pathwise term is weighted by the squared normalised weights,
  which keeps the gradient's signal as K grows.
* :class:`Renyi` — (1/(1−α)) log (1/K) Σ_k w_k^{1−α} (Li & Turner 2016): α = 0 is IWAE, α → 1
  the ELBO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from ppl.core import curvature, devices
__all__ = ["ELBO", "IWAE", "Renyi", "OBJECTIVES", "GuideLoss", "kl_weight", "local_loss", "local_log_weights"]

OBJECTIVES = ("elbo", "iwae", "renyi")


def kl_weight(beta: float, kl_warmup: int, step) -> jax.Array:
    """b = β · min(1, (step + 1) / kl_warmup): linear annealing of the prior/KL side (step None: done)."""
    if not kl_warmup or step is None:
        return jnp.asarray(beta)
    return beta * jnp.minimum(1.0, (step + 1.0) / kl_warmup)


def _parts(problem, draws, batch):
    draws = devices.shard_particles(draws)  # split over devices when a fit runs on several
    return jax.vmap(lambda u: problem.density_parts(u, batch))(draws)


def _draws(family, key, n: int, stop_gradient: bool = False):
    """``n`` reparameterised draws of ``family`` and their log q (with q's parameters' gradient
    stopped when ``stop_gradient``: the draws still carry it, the density does not)."""
    if hasattr(family, "sample_and_log_prob") and not stop_gradient:
        return family.sample_and_log_prob(key, n)
    draws = family.sample(key, n)
    frozen = jax.tree_util.tree_map(jax.lax.stop_gradient, family) if stop_gradient else family
    return draws, frozen.log_prob(draws)


@dataclass(frozen=True)
class ELBO:
    num_particles: int = 8
    beta: float = 1.0
    kl_warmup: int = 0
    local_reparam: bool = False
    name = "elbo"
    gradient = "standard"

    def reduce(self, log_w):
        """The bound from log weights (K, ...) of K draws: here their mean."""
        return jnp.mean(log_w, axis=0)

    def loss(self, guide, params, problem, key, batch, step=None):
        if problem.local_sites:
            return local_loss(self, guide, params, problem, key, batch, step)
        family = guide.family(params)
        b = kl_weight(self.beta, self.kl_warmup, step)
        if getattr(family, "kind", None) == "point":
            # A point mass has no entropy: the objective is the (β-weighted) log joint at its
            # location, without the Jacobian (a delta guide finds the constrained-space MAP, as map).
            prior, lik = problem.density_parts(family.loc, batch, jacobian=False)
            return -(lik + b * prior)
        if self.local_reparam:
            # Prior side in closed form over the weights (or from whole-weight draws); likelihood
            # from per-datum pre-activation draws. Both are unbiased, so the ELBO estimate is too.
            weight_key, activation_key = jax.random.split(key)
            draws, prior = _local_reparam_prior_side(problem, family, weight_key, self.num_particles, batch)
            keys = jax.random.split(activation_key, self.num_particles)
            loc, scale = family.loc, family.cov.scale
            lik = jax.vmap(lambda u, k: problem.local_reparam_log_likelihood(loc, scale, u, k, batch))(draws, keys)
            return -(problem.weights(batch)[1] * jnp.mean(lik) + b * (jnp.mean(prior) + family.entropy()))
        if hasattr(family, "entropy"):
            draws = family.sample(key, self.num_particles)
            prior, lik = _parts(problem, draws, batch)
            return -(jnp.mean(lik) + b * (jnp.mean(prior) + family.entropy()))
        draws, log_q = _draws(family, key, self.num_particles)
        prior, lik = _parts(problem, draws, batch)
        return -jnp.mean(lik + b * (prior - log_q))


def _local_reparam_prior_side(problem, family, key, n: int, batch):
    """``(draws, prior side at each)`` for the locally reparameterised ELBO of a mean-field guide.

    With a zero-mean Gaussian prior on every weight and bias (``ppl.models``' default), the weights'
    part of E_q[prior side] has a closed form: log p is quadratic in them, so under q = N(μ, s²) its
    expectation is its value at μ minus ½ Σ α_i s_i², with α_i the prior precision. Only the other
    coordinates (a noise scale) are drawn; the weights stay at μ, where the likelihood never reads
    them (it draws pre-activations from q's moments). A step then draws K numbers per coordinate
    that is not a weight instead of K per weight: on a 300,000-weight network, drawing 8 × P
    normals had been a quarter of the step. Any other prior: whole-weight draws, as the plain ELBO.
    """
    mask = curvature.network_mask(problem)
    if not problem.model.gaussian_prior or not mask.any():
        draws = family.sample(key, n)
        return draws, _parts(problem, draws, batch)[0]
    loc, scale = family.loc, family.cov.scale
    rest = np.flatnonzero(~mask)
    noise = jax.random.normal(key, (n, rest.size), loc.dtype)
    draws = jnp.broadcast_to(loc, (n, loc.size)).at[:, rest].add(scale[rest][None] * noise)
    if rest.size:
        prior = _parts(problem, draws, batch)[0]
    else:  # every draw is μ: one evaluation serves all
        prior = jnp.broadcast_to(problem.density_parts(loc, batch)[0], (n,))
    # α does not depend on where a Gaussian prior's Hessian is taken: no gradient through it
    precision = jax.lax.stop_gradient(curvature.prior_precision_diagonal(problem, loc))
    spread = jnp.sum(jnp.where(jnp.asarray(mask), precision * jnp.square(scale), 0.0))
    return draws, prior - 0.5 * problem.weights(batch)[0] * spread


def _log_weights(guide, params, problem, key, batch, step, beta, kl_warmup, k, stop_gradient=False):
    family = guide.family(params)
    draws, log_q = _draws(family, key, k, stop_gradient)
    prior, lik = _parts(problem, draws, batch)
    return lik + kl_weight(beta, kl_warmup, step) * (prior - log_q)


@dataclass(frozen=True)
class IWAE:
    num_particles: int = 8
    beta: float = 1.0
    kl_warmup: int = 0
    gradient: str = "standard"  # or "dreg"
    name = "iwae"

    def reduce(self, log_w):
        """log (1/K) Σ_k w_k over the leading axis."""
        return logsumexp(log_w, axis=0) - math.log(log_w.shape[0])

    def loss(self, guide, params, problem, key, batch, step=None):
        if problem.local_sites:
            return local_loss(self, guide, params, problem, key, batch, step)
        dreg = self.gradient == "dreg"
        log_w = _log_weights(guide, params, problem, key, batch, step, self.beta, self.kl_warmup,
                             self.num_particles, stop_gradient=dreg)
        value = self.reduce(log_w)
        if not dreg:
            return -value
        # DReG: ∇ = Σ w̃_k² ∂log w_k/∂u_k ∂u_k/∂φ, with log q's own parameter path cut above. The
        # surrogate has that gradient; the returned number is still the bound itself.
        weights = jax.lax.stop_gradient(jax.nn.softmax(log_w))
        surrogate = jnp.sum(jnp.square(weights) * log_w)
        return -(jax.lax.stop_gradient(value) + surrogate - jax.lax.stop_gradient(surrogate))


@dataclass(frozen=True)
class Renyi:
    num_particles: int = 8
    alpha: float = 0.5
    beta: float = 1.0
    kl_warmup: int = 0
    name = "renyi"
    gradient = "standard"

    def reduce(self, log_w):
        """(1/(1−α)) log (1/K) Σ_k w_k^{1−α} over the leading axis."""
        return (logsumexp((1.0 - self.alpha) * log_w, axis=0) - math.log(log_w.shape[0])) / (1.0 - self.alpha)

    def loss(self, guide, params, problem, key, batch, step=None):
        if problem.local_sites:
            return local_loss(self, guide, params, problem, key, batch, step)
        return -self.reduce(
            _log_weights(guide, params, problem, key, batch, step, self.beta, self.kl_warmup, self.num_particles)
        )


def _normal_log_prob(z, loc, scale):
    return jnp.sum(-0.5 * jnp.square((z - loc) / scale) - jnp.log(scale) - 0.5 * math.log(2.0 * math.pi), axis=-1)


def _local_terms(problem, u, X, eps, loc, scale, q_loc, q_scale):
    """z = loc + scale·eps for noise eps (K, B, L); returns the global prior and Jacobian of ``u``
    (from the first draw), and per draw and datum log p(z), log p(x | z, u) and log q(z | x) under
    N(q_loc, q_scale²) — the one evaluation behind every local-latent bound and report."""
    z = loc[None] + scale[None] * eps
    global_prior, log_jacobian, local_prior, likelihood = jax.vmap(lambda zk: problem.local_terms(u, zk, X))(z)
    return global_prior[0], log_jacobian[0], local_prior, likelihood, _normal_log_prob(z, q_loc[None], q_scale[None])


def local_log_weights(guide, params, problem, key, X, num: int, *, u=None):
    """Per-datum log weights (num, B) of the local latents at global ``u`` (the global guide's
    mean when None): log p(x_i, z) − log q(z | x_i), z ∼ q(z | x_i). Also returns the per-datum
    log p(x_i, z) and log q(z | x_i) (for k-hat and reports)."""
    u = guide.family(params).mean if u is None else u
    loc, scale = guide.local.encode(params["local"], X)
    eps = jax.random.normal(key, (num, *loc.shape), dtype=loc.dtype)
    _, _, local_prior, likelihood, log_q = _local_terms(problem, u, X, eps, loc, scale, loc, scale)
    log_joint = local_prior + likelihood
    return log_joint - log_q, log_joint, log_q


def local_loss(objective, guide, params, problem, key, batch, step=None):
    """The negative bound of a model with local latents (a VAE), for one minibatch.

    One draw of the global sites u ∼ q(u) (the decoder; a point for a delta guide) and K =
    ``num_particles`` draws z_ik ∼ q(z | x_i) per datum give log w_ik; the objective reduces them
    over k per datum (mean: ELBO; log-mean-exp: IWAE; Rényi), and

        bound = b·(prior weight·log p(u) + log|J| − log q(u)) + likelihood weight · Σ_i bound_i

    with the Problem's weights (tempering, N/B). With ``gradient="dreg"`` the encoder's gradient is
    the doubly reparameterised one (w̃² on the pathwise term, log q's parameter path cut) and the
    decoder's is IWAE's own (w̃ on ∇_u log w).
    """
    X = problem.data if batch is None else batch
    b = kl_weight(objective.beta, objective.kl_warmup, step)
    global_key, local_key = jax.random.split(key)
    family = guide.family(params)
    if getattr(family, "kind", None) == "point":
        u, log_q_global = family.loc, jnp.zeros(())
    else:
        draws, log_q = _draws(family, global_key, 1)
        u, log_q_global = draws[0], log_q[0]
    prior_weight, likelihood_weight = problem.weights(batch)
    loc, scale = guide.local.encode(params["local"], X)
    eps = jax.random.normal(local_key, (objective.num_particles, *loc.shape), dtype=loc.dtype)

    def log_weights(u, loc, scale, q_loc, q_scale):
        global_prior, log_jacobian, local_prior, likelihood, log_q = _local_terms(
            problem, u, X, eps, loc, scale, q_loc, q_scale
        )
        return likelihood + b * (local_prior - log_q), prior_weight * global_prior + log_jacobian

    stop = jax.lax.stop_gradient
    if objective.gradient == "dreg":
        log_w_encoder, _ = log_weights(stop(u), loc, scale, stop(loc), stop(scale))
        log_w_decoder, global_side = log_weights(u, stop(loc), stop(scale), stop(loc), stop(scale))
        weights = stop(jax.nn.softmax(log_w_encoder, axis=0))
        value = objective.reduce(log_w_encoder)
        surrogate = jnp.sum(jnp.square(weights) * log_w_encoder, axis=0) + jnp.sum(weights * log_w_decoder, axis=0)
        per_datum = stop(value) + surrogate - stop(surrogate)
    else:
        log_w, global_side = log_weights(u, loc, scale, loc, scale)
        per_datum = objective.reduce(log_w)
    return -(b * (global_side - log_q_global) + likelihood_weight * jnp.sum(per_datum))


@dataclass(frozen=True)
class GuideLoss:
    """A guide and an objective composed into what :func:`~ppl.inference.optimize.minimize` minimises."""

    guide: object
    objective: object

    def __call__(self, params, problem, key, batch, step=None):
        return self.objective.loss(self.guide, params, problem, key, batch, step)
