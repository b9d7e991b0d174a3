"""What a fitted model with local latents (a VAE) adds to its Posterior: encode, decode, generate,
reconstruct, importance-sampled log p(x), and the local model for other backends.

Everything here evaluates the decoder at the global guide's mean (the point estimate of a
default VAE; the posterior mean of a Bayesian decoder's weights) and the fitted encoder.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from scipy.special import logsumexp

from ppl.core.data import validate_inputs
from ppl.core.errors import DataError, OptionError
from ppl.core.keys import as_key, check_num_samples
from ppl.core.objectives import local_log_weights

__all__ = ["encode", "decode", "generate", "reconstruct", "log_marginal", "local_model", "global_params"]

_ROWS = 256  # data rows per compiled chunk of importance sampling


def _require(post, what: str):
    if getattr(post, "local_guide", None) is None:
        raise TypeError(
            f"Posterior.{what} applies to a model with local latents fitted by svi (ppl.models.VAE); this is a "
            f"{post.method!r} posterior of {type(post.problem.model).__name__ if post.problem else post.program}"
        )
    return post.local_guide


def _data(post, X, what: str) -> jax.Array:
    X = validate_inputs(X, f"{what}: X")
    D = post.problem.data_X.shape[-1]
    if X.shape[1] != D:
        raise DataError(f"{what}: X has {X.shape[1]} columns but the model was fitted on {D}")
    return jnp.asarray(post.problem.model.check_inputs(X))


def _u(post) -> jax.Array:
    return post.approximation.mean


def global_params(post) -> dict:
    """Constrained global sites (decoder weights, sigma) at the global guide's mean."""
    _require(post, "global_params")
    return {k: np.asarray(v) for k, v in post.problem.constrain(_u(post)).items()}


@partial(jax.jit, static_argnames=("guide",))
def _encode(guide, local_params, X):
    return guide.local.encode(local_params, X)


def encode(post, X) -> tuple:
    """The encoder's q(z | x) = N(loc, diag scale²) for each row of X: (loc, scale), each (N, L)."""
    guide, local_params = _require(post, "encode")
    loc, scale = _encode(guide, local_params, _data(post, X, "encode"))
    return np.asarray(loc), np.asarray(scale)


@jax.jit
def _decode(problem, u, z):
    model = problem.model
    return model.mean_of(model.decode(problem.constrain(u), z))


def decode(post, z) -> np.ndarray:
    """E[x | z] for latents z (N, L): Bernoulli probabilities, or Gaussian means."""
    _require(post, "decode")
    z = np.asarray(z, dtype=float)
    L = post.problem.model.latent_dim
    if z.ndim != 2 or z.shape[1] != L or not np.all(np.isfinite(z)):
        raise DataError(f"decode: z must be a finite array of shape (N, {L}), got shape {z.shape}")
    return np.asarray(_decode(post.problem, _u(post), jnp.asarray(z)))


def generate(post, n: int, seed) -> np.ndarray:
    """``n`` new data points x ∼ p(x | z), z ∼ N(0, I) (shape (n, D))."""
    _require(post, "generate")
    check_num_samples(n)
    z_key, x_key = jax.random.split(as_key(seed))
    z = jax.random.normal(z_key, (int(n), post.problem.model.latent_dim))
    return np.asarray(_sample_x(post.problem, _u(post), z, x_key))


@jax.jit
def _sample_x(problem, u, z, key):
    params = problem.constrain(u)
    return problem.model.observation(problem.model.decode(params, z), params).sample(key)


def reconstruct(post, X, seed) -> np.ndarray:
    """E[x | z] at one draw z ∼ q(z | x) per row of X (shape (N, D))."""
    guide, local_params = _require(post, "reconstruct")
    X = _data(post, X, "reconstruct")
    loc, scale = _encode(guide, local_params, X)
    z = loc + scale * jax.random.normal(as_key(seed), loc.shape, dtype=loc.dtype)
    return np.asarray(_decode(post.problem, _u(post), z))


@partial(jax.jit, static_argnames=("guide", "num"))
def _importance(guide, params, problem, u, X, key, num: int):
    log_w, log_joint, log_q = local_log_weights(guide, params, problem, key, X, num, u=u)
    return log_w, log_joint, log_q


def importance_weights(post, X, num_samples: int, seed) -> tuple:
    """Per-datum log p(x_i, z_k) − log q(z_k | x_i), log p(x_i, z_k), log q(z_k | x_i) for
    ``num_samples`` draws z_k ∼ q(z | x_i), each (num_samples, N), in chunks of rows."""
    guide, local_params = _require(post, "importance_weights")
    check_num_samples(num_samples)
    X = _data(post, X, "log_marginal")
    params = {"global": None, "local": local_params}
    key = as_key(seed)
    parts = []
    for start in range(0, X.shape[0], _ROWS):
        chunk_key = jax.random.fold_in(key, start)
        parts.append(jax.device_get(_importance(guide, params, post.problem, _u(post), X[start : start + _ROWS],
                                                chunk_key, int(num_samples))))
    return tuple(np.concatenate([p[i] for p in parts], axis=1) for i in range(3))


def log_marginal(post, X, num_samples: int = 500, seed=0) -> np.ndarray:
    """Importance-sampled log p(x_i) per row of X with the encoder as proposal:
    log (1/K) Σ_k p(x_i, z_k) / q(z_k | x_i) (a lower bound in expectation, tight as K grows)."""
    log_w, _, _ = importance_weights(post, X, num_samples, seed)
    return logsumexp(log_w, axis=0) - np.log(log_w.shape[0])


def local_model(post, X):
    """A NumPyro program for p(z | x) of the rows of X with the decoder fixed at its fitted values.

    Its latent ``z`` (N, L) is global there, so any backend fits it:
    ``ppl.fit(post.local_model(X[:20]), method="nuts", seed=0)``.
    """
    _require(post, "local_model")
    X = _data(post, X, "local_model")
    model = post.problem.model
    params = post.problem.constrain(_u(post))
    latent_dim = model.latent_dim

    def vae_local_posterior():
        with numpyro.plate("data", X.shape[0]):
            z = numpyro.sample("z", model.prior(X.shape[0]))
            numpyro.sample("x", model.observation(model.decode(params, z), params), obs=X)

    if X.shape[0] * latent_dim > 10_000:
        raise OptionError(
            f"local_model: {X.shape[0]} rows × {latent_dim} latents = {X.shape[0] * latent_dim} parameters is more "
            "than a per-point backend should take at once; pass fewer rows (e.g. X[:20])"
        )
    return vae_local_posterior
