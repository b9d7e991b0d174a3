"""Print how far each method lands from the closed-form ground truth (numbers for issue notes).

    python bench/ground_truth.py

Runs in float64 on the `linear` dataset (correlated inputs, known noise) and on breast_cancer for
logistic MAP vs Newton-Raphson. Prints errors in the units the tests use (MCSE, posterior sd).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import closed_form, flat_params  # noqa: E402
from test_logistic_map import newton_map  # noqa: E402

import ppl  # noqa: E402
from ppl.diagnostics import _arviz  # noqa: E402
from ppl.models import LinearRegression, LogisticRegression  # noqa: E402


def main() -> None:
    data = ppl.datasets.load("linear", seed=0)
    X, y = (np.asarray(a, dtype=float) for a in data.train)
    truth = closed_form(X, y)
    sd = np.sqrt(np.diag(truth["cov"]))
    model = LinearRegression(prior_scale=1.0, noise_scale=0.5)

    exact = ppl.fit(model, data.train, method="exact", seed=0)
    print(f"exact: |log Z − closed form| = {abs(exact.diagnostics().log_evidence - truth['log_evidence']):.2e}")

    start = time.perf_counter()
    nuts = ppl.fit(model, data.train, method="nuts", seed=0, num_chains=4)
    draws = flat_params(nuts.draws)
    ess = _arviz.ess(draws, "bulk")
    mcse = draws.std(axis=(0, 1)) / np.sqrt(ess)
    err = np.abs(draws.mean(axis=(0, 1)) - truth["mean"])
    d = nuts.diagnostics()
    print(f"nuts ({time.perf_counter() - start:.1f} s): max |mean err|/MCSE = {np.max(err / mcse):.2f}, "
          f"max |mean err|/sd = {np.max(err / sd):.3f}, sd ratio range = "
          f"[{np.min(draws.std(axis=(0, 1)) / sd):.3f}, {np.max(draws.std(axis=(0, 1)) / sd):.3f}], "
          f"R-hat max = {d.rhat_max:.4f}, divergences = {d.divergences}, min bulk ESS = {ess.min():.0f}")

    for guide in ("full_rank", "mean_field", "low_rank"):
        start = time.perf_counter()
        post = ppl.fit(model, data.train, method="svi", seed=0, guide=guide)
        q = post.approximation
        target_var = np.diag(truth["cov"]) if guide != "mean_field" else 1.0 / np.diag(truth["precision"])
        var_ratio = np.asarray(q.variance()) / target_var
        diag = post.diagnostics()
        print(f"svi {guide} ({time.perf_counter() - start:.1f} s): max |mean err|/sd = "
              f"{np.max(np.abs(np.asarray(q.mean) - truth['mean']) / np.sqrt(target_var)):.4f}, "
              f"variance ratio to its target in [{var_ratio.min():.3f}, {var_ratio.max():.3f}], "
              f"ELBO − log Z = {diag.elbo - truth['log_evidence']:.4f}, k-hat = {diag.khat:.2f}, "
              f"converged = {post.status.converged}")
    print(f"  (exact / mean-field-optimum variance ratio of the weights: "
          f"{np.round(np.diag(truth['cov'])[:-1] * np.diag(truth['precision'])[:-1], 2)})")

    bc = ppl.datasets.load("breast_cancer", seed=0)
    newton = newton_map(np.asarray(bc.train.X), np.asarray(bc.train.y, dtype=float), 1.0)
    post = ppl.fit(LogisticRegression(), bc.train, method="map", seed=0)
    found = np.concatenate([post.draws["w"][0, 0], post.draws["b"][0, 0][None]])
    print(f"logistic map: max |map − Newton| = {np.max(np.abs(found - newton)):.2e}")


if __name__ == "__main__":
    main()
