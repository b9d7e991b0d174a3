"""The `flow` SVI guide (inverse autoregressive flow) against `mean_field` on two 2-D posteriors.

    python bench/flow_guide.py

Targets, each a plain NumPyro model with an observed site:

* ``correlated``: θ ~ N(0, I), y_i ~ N(θ, Σ) with corr(Σ) = 0.97 and 3 observations; the posterior
  is a Gaussian with correlation ≈ 0.95 (printed, from the closed form).
* ``banana``: a, b ~ N(0, 1), y_i ~ N(a + b², 0.3) with 3 observations; the posterior follows the
  parabola a ≈ ȳ − b².

Both guides use ppl's defaults (MAP/Laplace frame, ELBO, 8 particles, 5000 steps, 2 flows). Prints,
per target, the log evidence log p(y) by quadrature on a grid (the ceiling every ELBO sits under),
then per guide the PSIS k-hat of the draws, the ELBO, and the wall time of the first fit (with
compilation; the first guide of a target also compiles the shared MAP/Laplace start) and of an
identical second fit (warm), then a line with the differences flow − mean-field (k-hat lower
and ELBO higher mean the flow is the better fit; the time difference is of the warm fits).
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from scipy.special import logsumexp  # noqa: E402
from scipy.stats import multivariate_normal, norm  # noqa: E402

import ppl  # noqa: E402

LIKELIHOOD_CORR = 0.97
COV = np.array([[1.0, LIKELIHOOD_CORR], [LIKELIHOOD_CORR, 1.0]])
BANANA_SIGMA = 0.3
GRID = np.linspace(-8.0, 8.0, 1601)  # quadrature grid per coordinate


def correlated(y):
    theta = numpyro.sample("theta", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", dist.MultivariateNormal(theta, covariance_matrix=COV), obs=y)


def banana(y):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", dist.Normal(a + b**2, BANANA_SIGMA), obs=y)


def correlated_log_joint(u, v, y):
    theta = np.stack([u, v], axis=-1)
    lik = sum(multivariate_normal(np.zeros(2), COV).logpdf(yi - theta) for yi in y)
    return norm.logpdf(u) + norm.logpdf(v) + lik


def banana_log_joint(a, b, y):
    return norm.logpdf(a) + norm.logpdf(b) + sum(norm.logpdf(yi, a + b**2, BANANA_SIGMA) for yi in y)


def log_evidence(log_joint, y) -> float:
    u, v = np.meshgrid(GRID, GRID, indexing="ij")
    step = GRID[1] - GRID[0]
    return float(logsumexp(log_joint(u, v, y)) + 2.0 * np.log(step))


def correlated_data():
    rng = np.random.default_rng(0)
    y = rng.multivariate_normal([0.5, 0.3], COV, size=3)
    cov = np.linalg.inv(np.eye(2) + y.shape[0] * np.linalg.inv(COV))
    corr = cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1])
    return y, f"posterior correlation {corr:.3f} (closed form)"


def banana_data():
    rng = np.random.default_rng(1)
    y = 1.0 + BANANA_SIGMA * rng.standard_normal(3)
    return y, f"ȳ = {y.mean():.2f}, {y.shape[0]} observations, σ = {BANANA_SIGMA}"


def fit(model, y, guide):
    start = time.perf_counter()
    post = ppl.fit(model, {"y": y}, method="svi", seed=0, guide=guide)
    diag = post.diagnostics()
    return diag.khat, diag.elbo, time.perf_counter() - start


def main() -> None:
    for name, model, log_joint, (y, note) in (
        ("correlated", correlated, correlated_log_joint, correlated_data()),
        ("banana", banana, banana_log_joint, banana_data()),
    ):
        print(f"{name}: {note}; log evidence {log_evidence(log_joint, y):.4f} (quadrature)")
        results = {}
        for guide in ("mean_field", "flow"):
            khat, elbo, first = fit(model, y, guide)
            warm = fit(model, y, guide)[2]
            results[guide] = khat, elbo, warm
            print(f"  {guide:<10}  k-hat {khat:6.3f}   ELBO {elbo:9.4f}   {first:5.1f} s first fit, {warm:5.2f} s warm")
        (k_mf, e_mf, t_mf), (k_fl, e_fl, t_fl) = results["mean_field"], results["flow"]
        print(f"  flow − mean_field: k-hat {k_fl - k_mf:+.3f}   ELBO {e_fl - e_mf:+.4f}   "
              f"warm time {t_fl - t_mf:+.2f} s (×{t_fl / t_mf:.1f})")


if __name__ == "__main__":
    main()
