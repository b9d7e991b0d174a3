"""ppl's NUTS driver against NumPyro's MCMC on the same model and settings, in the same run.

    python bench/nuts_vs_numpyro.py [--hidden 16]

Both use NumPyro's NUTS kernel with 4 sequential chains, 500 warmup and 1000 draws, on
breast_cancer (a BNN with one hidden layer, or logistic regression with --hidden 0). Prints wall
time (including compilation), min bulk ESS per second over the probe-batch function values, and
the ppl / NumPyro ratios. A second ppl fit on same-shaped data shows the saved compilation.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC
from numpyro.infer import NUTS as NumPyroNUTS

import ppl
from ppl.diagnostics import _arviz
from ppl.models import BNN


def min_function_ess(model, draws: dict, X) -> float:
    chains, num = next(iter(draws.values())).shape[:2]
    flat = {k: v.reshape(chains * num, *v.shape[2:]) for k, v in draws.items()}
    f = jax.vmap(lambda p: model.apply(p, X))(flat)
    return float(_arviz.ess(np.asarray(f).reshape(chains, num, -1), "bulk").min())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=16)
    args = parser.parse_args()
    data = ppl.datasets.load("breast_cancer", seed=0)
    hidden = (args.hidden,) if args.hidden else ()
    model = BNN(hidden=hidden, activation="tanh", likelihood="bernoulli")
    X, y = jnp.asarray(data.train.X), jnp.asarray(data.train.y)
    probe = X[:64]

    start = time.perf_counter()
    post = ppl.fit(model, data.train, method="nuts", seed=0, num_warmup=500, num_samples=1000, num_chains=4)
    ppl_time = time.perf_counter() - start
    ppl_ess = min_function_ess(model, post.draws, probe)

    start = time.perf_counter()
    mcmc = MCMC(NumPyroNUTS(model), num_warmup=500, num_samples=1000, num_chains=4, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    numpyro_time = time.perf_counter() - start
    samples = mcmc.get_samples(group_by_chain=True)
    numpyro_ess = min_function_ess(model, {k: np.asarray(v) for k, v in samples.items() if k != "y"}, probe)

    start = time.perf_counter()
    ppl.fit(model, (data.train.X, data.train.y[::-1]), method="nuts", seed=1, num_warmup=500, num_samples=1000, num_chains=4)
    ppl_again = time.perf_counter() - start

    print(f"model: BNN hidden={hidden}, {post.problem.num_params} parameters, N={X.shape[0]}")
    print(f"ppl     : {ppl_time:7.1f} s, min function ESS {ppl_ess:7.0f}, ESS/s {ppl_ess / ppl_time:7.1f}")
    print(f"NumPyro : {numpyro_time:7.1f} s, min function ESS {numpyro_ess:7.0f}, ESS/s {numpyro_ess / numpyro_time:7.1f}")
    print(f"ratio ppl/NumPyro: time {ppl_time / numpyro_time:.2f}, ESS/s {(ppl_ess / ppl_time) / (numpyro_ess / numpyro_time):.2f}")
    print(f"ppl second same-shaped fit (no recompilation): {ppl_again:.1f} s ({ppl_again / ppl_time:.2f} of the first)")


if __name__ == "__main__":
    main()
