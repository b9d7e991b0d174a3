"""Signal-to-noise ratio of a VAE encoder's IWAE gradient, standard against DReG, for K = 1, 8, 64.

    python bench/iwae_gradient_snr.py

Rainforth et al. (2018, "Tighter variational bounds are not necessarily better") show that the
inference network's IWAE gradient has SNR = |E[∇φ]| / sd[∇φ] falling like 1/√K as the number of
importance samples K grows; the doubly reparameterised gradient of Tucker et al. (2019) ("dreg")
removes the score term responsible, and its SNR must not fall.

The script fits ``VAE(latent_dim=4, hidden=(64,))`` on ``digits_binary`` (svi's defaults: ELBO,
delta decoder, 1000 Adam steps, batches of 128), then, at the fitted encoder and decoder, draws
M = 200 independent estimates of the encoder's gradient of the loss svi trains with
(``GuideLoss(guide, objective)`` built by the ``svi`` method with ``objective="iwae"``,
``num_particles=K``, ``gradient=g``) on a fixed minibatch (the first 64 training rows).

It prints, for each (K, gradient): the mean and the median over encoder parameters of the
per-parameter SNR |mean| / sd over the M estimates, and the SNR of the whole gradient vector
(‖mean‖ / √(Σ var)); then the ratio SNR(K=64) / SNR(K=1) for each gradient type. With K = 1 and
``gradient="dreg"`` svi runs ``IWAE(num_particles=1, gradient="dreg")``, the sticking-the-landing
gradient of the ELBO (Roeder et al. 2017), DReG's own K = 1 value; the row "dreg (direct)" builds
that objective by hand as a check that the two agree.
"""

from __future__ import annotations

import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import ppl  # noqa: E402
from ppl.core.objectives import IWAE, GuideLoss  # noqa: E402
from ppl.models import VAE  # noqa: E402

KS = (1, 8, 64)
GRADIENTS = ("standard", "dreg")
M = 200  # independent gradient estimates per (K, gradient)
BATCH = 64  # rows of the fixed minibatch


def gradient_estimates(loss, params, problem, batch, keys):
    """(M, P): the encoder's gradient of ``loss`` for each key, flattened."""
    flat_encoder, unravel = ravel_pytree(params["local"])

    def one(key):
        return jax.grad(lambda enc: loss({"global": params["global"], "local": unravel(enc)}, problem, key, batch))(
            flat_encoder
        )

    return jax.jit(lambda ks: jax.lax.map(one, ks, batch_size=25))(keys)


def snr(grads):
    """Per-parameter |mean| / sd (parameters whose M estimates are all equal are left out) and the
    vector SNR ‖mean‖ / √(Σ var)."""
    grads = np.asarray(grads)
    mean, sd = grads.mean(axis=0), grads.std(axis=0, ddof=1)
    varies = sd > 0
    per_param = np.abs(mean[varies]) / sd[varies]
    vector = np.linalg.norm(mean) / np.sqrt(np.sum(sd**2))
    return per_param, vector, int(np.sum(~varies))


def main() -> None:
    start = time.perf_counter()
    data = ppl.datasets.load("digits_binary", seed=0)
    X = data.train.X
    post = ppl.fit(VAE(latent_dim=4, hidden=(64,)), X, method="svi", seed=0, steps=1000, batch_size=128)
    problem = post.problem
    print(f"fitted VAE(latent_dim=4, hidden=(64,)) on digits_binary ({X.shape[0]} rows) in "
          f"{time.perf_counter() - start:.1f} s: ELBO {post.evidence.elbo:.1f}, "
          f"IWAE_100 {post.evidence.iwae:.1f}")

    loc = post.approximation.loc
    global_params = {"shift": loc, "frame_scale": jnp.ones_like(loc), "loc": jnp.zeros_like(loc)}
    encoder_params = post.local_guide[1]
    params = {"global": global_params, "local": encoder_params}
    batch = jnp.asarray(X[:BATCH])
    keys = jax.random.split(jax.random.PRNGKey(1), M)
    num_encoder = ravel_pytree(encoder_params)[0].shape[0]
    print(f"encoder parameters: {num_encoder}; M = {M} gradient estimates on the first {BATCH} rows")
    print(f"(noise floor: a parameter with zero mean gradient shows SNR ≈ √(2/(πM)) = {np.sqrt(2 / (np.pi * M)):.3f})")
    print()

    rows = []
    cases = [(K, g, None) for g in GRADIENTS for K in KS] + [(1, "dreg (direct)", IWAE(num_particles=1, gradient="dreg"))]
    for K, g, direct in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # K = 1: "iwae with num_particles=1 is the ELBO"
            method = ppl.core.registry.create("svi", {"objective": "iwae", "num_particles": K,
                                                           "gradient": "dreg" if g.startswith("dreg") else g})
        guide = method.guide_object(problem)
        objective = direct if direct is not None else method.objective_object(problem)
        family_loc = guide.family(params).loc
        assert np.array_equal(np.asarray(family_loc), np.asarray(loc)), "rebuilt decoder params differ from the fit"
        loss = GuideLoss(guide, objective)
        t = time.perf_counter()
        grads = gradient_estimates(loss, params, problem, batch, keys)
        per_param, vector, constant = snr(grads)
        rows.append((K, g, type(objective).__name__, float(np.mean(per_param)), float(np.median(per_param)), vector,
                     constant, time.perf_counter() - t))

    print(f"{'K':>3}  {'gradient':<14} {'objective':<9} {'mean SNR':>9} {'median SNR':>11} {'vector SNR':>11}"
          f"  {'constant':>8}  time")
    for K, g, name, mean, median, vector, constant, seconds in rows:
        print(f"{K:>3}  {g:<14} {name:<9} {mean:>9.4f} {median:>11.4f} {vector:>11.4f}  {constant:>8}  {seconds:.1f} s")
    print("(constant: encoder parameters whose gradient was identical in all M estimates, left out of the SNRs)")
    print()

    table = {(K, g): (mean, median, vector) for K, g, _, mean, median, vector, _, _ in rows}
    print("SNR(K=64) / SNR(K=1)            mean   median   vector")
    for g, base in (("standard", "standard"), ("dreg", "dreg"), ("dreg", "dreg (direct)")):
        ratios = [a / b for a, b in zip(table[(64, g)], table[(1, base)])]
        label = f"{g} (K=1: {base})"
        print(f"  {label:<28} {ratios[0]:>6.3f}  {ratios[1]:>6.3f}  {ratios[2]:>6.3f}")
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
