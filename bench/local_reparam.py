"""Gradient variance of the mean-field ELBO on a BNN: plain reparameterisation against local reparameterisation.

    python bench/local_reparam.py

Fits a BNN (one hidden layer of 50 tanh units) to two_moons with SVI mean-field, then, at the
fitted guide, draws 300 single-particle gradient estimates of the minibatch ELBO (batch of 64,
scaled by N/B) with each estimator: one weight draw per step shared by the batch (plain), or
per-datum pre-activation draws (``local_reparam=True``, Kingma et al. 2015). Prints the mean and
median over guide parameters of the gradient variance, for the means and the log-scales, and the
ratio plain / local (above 1: local reparameterisation is the quieter estimator). Both estimators
have the same expectation; their mean gradients are printed side by side as a check.
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import ppl  # noqa: E402
from ppl.core.objectives import ELBO, GuideLoss  # noqa: E402
from ppl.inference.guides import MeanField  # noqa: E402
from ppl.models import BNN  # noqa: E402

REPEATS = 300
BATCH = 64


def main() -> None:
    data = ppl.datasets.load("two_moons", seed=0)
    model = BNN(hidden=(50,), activation="tanh", likelihood="bernoulli")
    post = ppl.fit(model, data.train, method="svi", seed=0, guide="mean_field", steps=3000, batch_size=BATCH)
    problem, family = post.problem, post.approximation
    loc, scale = family.loc, family.cov.scale
    # The fitted guide as mean-field parameters with a unit frame (the same q).
    params = {"shift": loc, "frame_scale": jnp.ones_like(loc), "loc": jnp.zeros_like(loc), "log_scale": jnp.log(scale)}
    guide = MeanField()
    assert np.allclose(guide.family(params).cov.scale, scale)
    X, y = (jnp.asarray(a) for a in data.train)
    batch = (X[:BATCH], y[:BATCH])
    print(f"BNN 2-50-1 tanh on two_moons, {problem.num_params} weights; {REPEATS} single-particle gradients, batch {BATCH}")
    results = {}
    for label, local in (("plain", False), ("local", True)):
        loss = GuideLoss(guide, ELBO(num_particles=1, local_reparam=local))

        @jax.jit
        def gradients(keys, loss=loss):
            return jax.lax.map(lambda k: ravel_pytree(jax.grad(lambda p: loss(p, problem, k, batch))(params))[0], keys)

        draws = np.asarray(gradients(jax.random.split(jax.random.PRNGKey(1), REPEATS)))
        flat, unravel = ravel_pytree(params)
        variance = unravel(jnp.asarray(draws.var(axis=0)))
        mean = unravel(jnp.asarray(draws.mean(axis=0)))
        results[label] = (variance, mean)
        print(
            f"  {label:>5}: gradient variance over means  mean {float(jnp.mean(variance['loc'])):.4g}  median "
            f"{float(jnp.median(variance['loc'])):.4g};  over log-scales  mean {float(jnp.mean(variance['log_scale'])):.4g}"
        )
    for part in ("loc", "log_scale"):
        plain, local = results["plain"][0][part], results["local"][0][part]
        print(f"  ratio plain / local ({part}): mean {float(jnp.mean(plain) / jnp.mean(local)):.2f}, median of "
              f"per-parameter ratios {float(jnp.median(plain / local)):.2f}")
    plain_mean, local_mean = results["plain"][1]["loc"], results["local"][1]["loc"]
    se = np.sqrt((np.asarray(results["plain"][0]["loc"]) + np.asarray(results["local"][0]["loc"])) / REPEATS)
    z = np.abs(np.asarray(plain_mean - local_mean)) / np.maximum(se, 1e-300)
    print(f"  same expectation: |Δ mean gradient| / se over the means — median {np.median(z):.2f}, max {np.max(z):.2f}")


if __name__ == "__main__":
    main()
