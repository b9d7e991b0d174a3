"""Mean-field SVI on the correlated `linear` fixture: ppl's defaults against plain NumPyro.

    python bench/svi_defaults.py

Both aim at the closed-form mean-field optimum (variances 1/Λ_pp). Prints, per run,
the worst relative variance error and the wall time, and the time ratio ppl / NumPyro.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from numpyro.infer import SVI, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoNormal  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import closed_form  # noqa: E402

import ppl  # noqa: E402
from ppl.models import LinearRegression  # noqa: E402


def worst(var, target):
    return float(np.max(np.abs(np.asarray(var) / target - 1.0)))


def main() -> None:
    data = ppl.datasets.load("linear", seed=0)
    X, y = (np.asarray(a, dtype=float) for a in data.train)
    target = 1.0 / np.diag(closed_form(X, y)["precision"])
    model = LinearRegression(prior_scale=1.0, noise_scale=0.5)

    start = time.perf_counter()
    post = ppl.fit(model, data.train, method="svi", seed=0, guide="mean_field")
    ppl_time = time.perf_counter() - start
    print(f"ppl defaults (8 particles, 5000 steps, cosine):    worst variance error {worst(post.approximation.variance(), target):.3f}  ({ppl_time:.1f} s)")

    post = ppl.fit(model, data.train, method="svi", seed=0, guide="mean_field", num_particles=1, schedule="constant")
    print(f"ppl with 1 particle and a constant rate:           worst variance error {worst(post.approximation.variance(), target):.3f}")

    for seed in range(3):
        start = time.perf_counter()
        guide = AutoNormal(model)
        svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
        result = svi.run(jax.random.PRNGKey(seed), 5000, jnp.asarray(X), jnp.asarray(y), progress_bar=False)
        numpyro_time = time.perf_counter() - start
        var = np.concatenate([np.asarray(result.params["w_auto_scale"]) ** 2, [float(result.params["b_auto_scale"]) ** 2]])
        print(f"NumPyro AutoNormal, 1 particle, adam(0.01), 5000 (seed {seed}): worst variance error {worst(var, target):.3f}  "
              f"({numpyro_time:.1f} s; ppl/NumPyro time ratio {ppl_time / numpyro_time:.2f})")


if __name__ == "__main__":
    main()
