"""ppl's per-step cost against the same model and updates hand-written in plain NumPyro, optax and
BlackJAX, measured side by side in one process.

    python -m bench.overhead [--quick] [--out FILE.json]

The model is a BNN with one hidden layer of 16 tanh units on breast_cancer (455 training rows,
30 inputs, Bernoulli likelihood), in float32.

- ``svi``: mean-field Gaussian, 8 particles, Adam with cosine decay, full batch. The peer is
  NumPyro's ``SVI`` with ``AutoNormal`` and ``Trace_ELBO(num_particles=8)``, its updates run as one
  jitted ``lax.scan``. Also compared: the ELBO each reaches after the same number of steps from a
  prior draw (the mean of the last 10% of the loss curve).
- ``map``: Adam on the full batch. The peer runs optax's Adam on NumPyro's potential function
  (``initialize_model``) in a jitted scan. Also compared: the final loss.
- ``sgld``: 4 chains, minibatches of 64 drawn per chain. ppl's per-step time comes from two fits
  of the same 20 draws at different thinning (the diagnostics then cost the same). The peer is
  BlackJAX's ``sgld`` kernel on its own gradient estimator, the chains vmapped, in a jitted scan; and the same in dense whitened coordinates, as
  ppl runs its chains (two P × P products per step beside the gradient).
- ``nuts`` and ``hmc``: 4 sequential chains of 500 warmup and 1000 draws, NumPyro's kernel in
  both (HMC with ppl's trajectory length π/2 given to NumPyro as well). Compared: the whole
  run's wall time and the minimum bulk ESS per second over function values.

For ppl the per-step time is the difference between two warm fits of different lengths over their
difference in steps (sized so the difference takes about 3 s), so that what a fit does once
(drawing, diagnostics) cancels; the peer's is a warm scan's time over its steps. The ELBO and loss
columns compare both after the same ``steps`` from a prior draw. A ratio above 1 means ppl is slower.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ppl
from bench import _harness
from ppl.models import BNN

HIDDEN = 16
PARTICLES = 8
LEARNING_RATE = 0.01


def _problem():
    data = ppl.datasets.load("breast_cancer", seed=0)
    model = BNN(hidden=(HIDDEN,), activation="tanh", likelihood="bernoulli")
    X = jnp.asarray(data.train.X, jnp.float32)
    y = jnp.asarray(data.train.y)
    return data, model, X, y


def _scan_time(step, state, steps: int, repeats: int) -> tuple:
    """(seconds per step, compile seconds, final state, losses) of a peer's jitted scan of ``step``."""
    run = jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(steps)))
    holder = {}

    def once():
        holder["out"] = jax.block_until_ready(run(state))

    timing = _harness.timed(once, repeats)
    final, losses = holder["out"]
    return timing["warm_s"] / steps, timing["compile_s"], final, np.asarray(losses)


def svi_row(steps: int, repeats: int) -> list:
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal
    from numpyro.infer.initialization import init_to_sample

    data, model, X, y = _problem()

    def fit(n):
        return ppl.fit(model, data.train, method="svi", seed=0, init="prior", guide="mean_field",
                       num_particles=PARTICLES, steps=n, max_steps=n, num_draws=8, progress_bar=False)

    timing = _harness.per_step(fit, 50, repeats)
    per_step, compile_s = timing["per_step_s"], timing["compile_s"]
    ppl_loss = float(np.mean(np.asarray(fit(steps).trace.losses)[-steps // 10:]))

    schedule = optax.cosine_decay_schedule(LEARNING_RATE, steps, alpha=0.01)
    svi = SVI(model, AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.1), optax.adam(schedule),
              Trace_ELBO(num_particles=PARTICLES))
    state = svi.init(jax.random.PRNGKey(0), X, y)
    peer_step, peer_compile, _, losses = _scan_time(lambda s, _: svi.update(s, X, y), state, steps, repeats)
    peer_loss = float(np.mean(losses[-steps // 10:]))
    return ["svi", "NumPyro SVI + AutoNormal", per_step * 1e3, peer_step * 1e3, per_step / peer_step,
            compile_s, peer_compile, f"{ppl_loss:.1f} / {peer_loss:.1f}"]


def map_row(steps: int, repeats: int) -> list:
    from numpyro.infer.util import initialize_model

    data, model, X, y = _problem()

    def fit(n):
        return ppl.fit(model, data.train, method="map", seed=0, optimizer="adam", steps=n, max_steps=n,
                       progress_bar=False)

    timing = _harness.per_step(fit, 50, repeats)
    per_step, compile_s = timing["per_step_s"], timing["compile_s"]
    ppl_loss = float(np.asarray(fit(steps).trace.losses)[-1])

    info = initialize_model(jax.random.PRNGKey(0), model, model_args=(X, y))
    potential = info.potential_fn
    optimizer = optax.adam(optax.cosine_decay_schedule(LEARNING_RATE, steps, alpha=0.01))
    params = info.param_info.z

    def step(carry, _):
        p, s = carry
        loss, grad = jax.value_and_grad(potential)(p)
        updates, s = optimizer.update(grad, s, p)
        return (optax.apply_updates(p, updates), s), loss

    peer_step, peer_compile, _, losses = _scan_time(step, (params, optimizer.init(params)), steps, repeats)
    return ["map (adam)", "optax Adam on NumPyro's potential", per_step * 1e3, peer_step * 1e3,
            per_step / peer_step, compile_s, peer_compile, f"{ppl_loss:.1f} / {float(losses[-1]):.1f}"]


def sgld_row(steps: int, repeats: int) -> list:
    import blackjax
    from blackjax.sgmcmc.gradients import grad_estimator
    from numpyro.infer.util import initialize_model

    data, model, X, y = _problem()
    chains, batch, step_size = 4, 64, 1e-4

    draws = 20

    def fit(thin):
        return ppl.fit(model, data.train, method="sgld", seed=0, num_chains=chains, batch_size=batch,
                       num_warmup=50, num_samples=draws, thinning=thin, step_size=step_size, progress_bar=False,
                       time_budget=0)

    # the same draws (so the diagnostics cost the same), more steps between them; time_budget=0 keeps
    # each fit at its requested length (by default the chains are extended until they mix, and both
    # fits would then run as long as mixing takes, whatever their thinning)
    timing = _harness.per_step(fit, 1, repeats, most=5000)
    per_step, compile_s = timing["per_step_s"] / draws, timing["compile_s"]

    import numpyro.distributions as dist
    from numpyro import handlers

    # the same posterior for BlackJAX: the prior from NumPyro's trace, the per-datum
    # likelihood from the network's logit
    info = initialize_model(jax.random.PRNGKey(0), model, model_args=(X[:1], y[:1]))
    unravel = info.param_info.z
    n = X.shape[0]

    def logprior(p):
        trace = handlers.trace(handlers.substitute(model, p)).get_trace(X[:1], y[:1])
        return sum(jnp.sum(site["fn"].log_prob(site["value"])) for site in trace.values()
                   if site["type"] == "sample" and not site["is_observed"])

    def loglik(p, datum):
        x, t = datum
        return jnp.sum(dist.Bernoulli(logits=jnp.reshape(model.apply(p, x[None]), ())).log_prob(t))

    estimate = grad_estimator(logprior, loglik, n)
    kernel = blackjax.sgld(estimate)
    keys = jax.random.split(jax.random.PRNGKey(1), chains)
    positions = jax.vmap(lambda k: jax.tree.map(lambda v: 0.1 * jax.random.normal(k, v.shape, v.dtype), unravel))(keys)

    def minibatch(key):  # each chain its own rows, as ppl's chains
        index = jax.random.choice(key, n, (batch,), replace=False)
        return X[index], y[index]

    def step(carry, t):
        pos, key = carry
        key, move = jax.random.split(key)
        keys = jax.random.split(move, chains)
        new = jax.vmap(lambda p, k: kernel.step(k, p, minibatch(jax.random.fold_in(k, 1)), step_size))(pos, keys)
        return (new, key), jnp.zeros(())

    peer_step, peer_compile, _, _ = _scan_time(step, (positions, jax.random.PRNGKey(2)), steps, repeats)

    # ppl runs its chains in whitened coordinates u = L z, L dense for up to 1000 parameters: two
    # P × P products per step beside the gradient. The same work for BlackJAX (L's values do not
    # change the cost, so it is the identity, stored dense).
    from jax.flatten_util import ravel_pytree

    template, unflatten = ravel_pytree(jax.tree.map(lambda v: v[0], positions))
    L = jnp.eye(template.shape[0], dtype=template.dtype)
    build = blackjax.sgmcmc.sgld.build_kernel()

    def whitened_gradient(z, minibatch):
        return L.T @ ravel_pytree(estimate(unflatten(L @ z), minibatch))[0]

    def white_step(carry, t):
        zs, key = carry
        key, move = jax.random.split(key)
        keys = jax.random.split(move, chains)
        new = jax.vmap(lambda z, k: build(k, z, whitened_gradient, minibatch(jax.random.fold_in(k, 1)), step_size))(zs, keys)
        return (new, key), jnp.zeros(())

    zs = jax.vmap(lambda p: ravel_pytree(p)[0])(positions)
    white_step_s, white_compile, _, _ = _scan_time(white_step, (zs, jax.random.PRNGKey(2)), steps, repeats)
    return [
        ["sgld (4 chains)", "BlackJAX sgld, chains vmapped", per_step * 1e3, peer_step * 1e3,
         per_step / peer_step, compile_s, peer_compile, "—"],
        ["sgld (4 chains)", "the same, dense-whitened as ppl", per_step * 1e3, white_step_s * 1e3,
         per_step / white_step_s, compile_s, white_compile, "—"],
    ]


def mcmc_row(method: str, repeats: int) -> list:
    """``nuts`` or ``hmc``: whole runs of 4 sequential chains against NumPyro's ``MCMC`` with the
    same kernel and settings (HMC: ppl's trajectory length π/2 given to NumPyro too)."""
    import math

    from numpyro.infer import HMC as NumPyroHMC
    from numpyro.infer import MCMC
    from numpyro.infer import NUTS as NumPyroNUTS

    from bench.nuts_vs_numpyro import function_ess

    data, model, X, y = _problem()
    probe = X[:64]
    kernel = (lambda: NumPyroNUTS(model)) if method == "nuts" else (
        lambda: NumPyroHMC(model, trajectory_length=math.pi / 2))
    ppl_times, peer_times, ppl_ess, peer_ess = [], [], [], []
    for r in range(repeats):
        start = time.perf_counter()
        post = ppl.fit(model, data.train, method=method, seed=r, num_warmup=500, num_samples=1000, num_chains=4,
                       progress_bar=False)
        ppl_times.append(time.perf_counter() - start)
        ppl_ess.append(function_ess(model, post.draws, probe)[0])
        start = time.perf_counter()
        mcmc = MCMC(kernel(), num_warmup=500, num_samples=1000, num_chains=4, chain_method="sequential",
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(r), X, y)
        peer_times.append(time.perf_counter() - start)
        samples = mcmc.get_samples(group_by_chain=True)
        peer_ess.append(function_ess(model, {k: np.asarray(v) for k, v in samples.items() if k != "y"}, probe)[0])
    a, b = float(np.median(ppl_times)), float(np.median(peer_times))
    rate_a, rate_b = float(np.median(np.divide(ppl_ess, ppl_times))), float(np.median(np.divide(peer_ess, peer_times)))
    return [f"{method} (whole run, s)", f"NumPyro MCMC({method.upper()})", a, b, a / b, None, None,
            f"ESS/s {rate_a:.0f} / {rate_b:.0f}"]


def run(quick: bool = False, repeats: int = 3) -> dict:
    steps = 500 if quick else 2000
    rows = [svi_row(steps, repeats), map_row(steps, repeats), *sgld_row(steps, repeats)]
    if not quick:
        rows.extend(mcmc_row(method, repeats) for method in ("nuts", "hmc"))
    columns = ["method", "peer", "ppl ms/step", "peer ms/step", "ratio", "ppl compile s", "peer compile s",
               "loss or ESS (ppl / peer)"]
    title = (f"per-step cost against hand-written peers (BNN 30-{HIDDEN}-1 on breast_cancer, float32, "
             f"median of {repeats} warm repeats; target ratio ≤ 1.05)")
    return {"name": "overhead", "tables": [_harness.table(title, columns, rows)]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 steps, no NUTS")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    return _harness.report(run(args.quick, args.repeats), args.out)


if __name__ == "__main__":
    main()
