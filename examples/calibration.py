"""Temperature scaling and split-conformal prediction, measured.

    python -m examples.calibration [--seed 0]

1. Digits (10 classes): a BNN's MAP under a wide prior (overconfident), its temperature fitted on
   a validation split, test metrics before and after; conformal sets at 98% target coverage on the
   raw and on the temperature-scaled predictive; and the coverage averaged over 20 random
   reshuffles of the calibration and test points.
2. Heavy-tailed regression (20,000 synthetic points): a linear model that assumes Gaussian noise of
   the wrong size; its own 90% intervals against conformal ones.
3. A small validation split (breast_cancer, 185 rows): the temperature lowers the validation NLL
   by construction, not necessarily the test NLL; a well-centred Laplace predictive keeps T near 1.

Every number printed is measured in this run.
"""

from __future__ import annotations


import numpy as np

import ppl
from examples._cli import parse, parser
from ppl.models import BNN, LinearRegression, LogisticRegression


def coverage_sd(num_calibration: int, num_test: int, alpha: float) -> float:
    """Standard deviation of one split's empirical coverage: the coverage given the calibration
    points is Beta(k, n + 1 − k) with k = ⌈(n + 1)(1 − α)⌉, and m test points cover Binomial(m, ·)
    of it, so Var = Var(C) + E[C(1 − C)]/m."""
    from ppl._calibrate import conformal_rank

    n, k = num_calibration, conformal_rank(num_calibration, alpha)
    mean, var_c = k / (n + 1), k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2))
    return float(np.sqrt(var_c + (mean - var_c - mean**2) / num_test))


def digits(seed: int) -> dict:
    data = ppl.datasets.load("digits", seed=seed)  # 1438 train / 359 test rows, standardised
    X, y = data.train
    fit, val, cal = slice(0, 1000), slice(1000, 1219), slice(1219, None)  # 1000 / 219 / 219
    model = BNN(hidden=(64,), activation="tanh", likelihood="categorical", prior_scale=30.0)
    post = ppl.fit(model, (X[fit], y[fit]), method="map", seed=seed)

    calibration = ppl.calibrate(post, (X[val], y[val]), seed=seed + 1)
    print(calibration)
    report = calibration.evaluate(data.test, seed=seed + 2)
    print("test metric   uncalibrated   calibrated")
    for name in ("nll", "ece", "brier", "accuracy"):
        print(f"  {name:10s} {report['uncalibrated'][name]:12.4f} {report['calibrated'][name]:12.4f}")

    print("conformal sets, alpha = 0.02 (target coverage 0.98), 219 calibration / 359 test points:")
    for label, predictor in (("raw", post), ("scaled", calibration)):
        for score in ("aps", "lac"):
            sets = ppl.conformal(predictor, (X[cal], y[cal]), alpha=0.02, seed=seed + 1, score=score)
            result = sets.coverage(data.test, seed=seed + 2)
            print(
                f"  {label:6s} {score}: coverage {result['coverage']:.3f}, mean set size "
                f"{result['mean_set_size']:.2f}, empty sets {result['empty_sets']:.3f}"
            )

    # One split's coverage is random (see coverage_sd); the average over reshuffles of the
    # calibration and test points shows the mean it varies around.
    pool_X, pool_y = np.concatenate([X[cal], data.test[0]]), np.concatenate([y[cal], data.test[1]])
    rng = np.random.default_rng(seed)
    coverage = {"aps": [], "lac": []}
    for repeat in range(20):
        order = rng.permutation(pool_X.shape[0])
        c, t = order[:219], order[219:]
        for score in coverage:
            sets = ppl.conformal(calibration, (pool_X[c], pool_y[c]), alpha=0.1, seed=repeat, score=score)
            coverage[score].append(sets.coverage((pool_X[t], pool_y[t]), seed=repeat)["coverage"])
    for score, values in coverage.items():
        print(
            f"  scaled {score}, alpha = 0.1, 20 reshuffles: mean coverage {np.mean(values):.3f} "
            f"(min {np.min(values):.3f}, max {np.max(values):.3f}; one split's sd {coverage_sd(219, 359, 0.1):.3f})"
        )
    return {"report": report, "reshuffled_coverage": {k: float(np.mean(v)) for k, v in coverage.items()},
            "one_split_sd": coverage_sd(219, 359, 0.1), "repeats": 20}


def heavy_tailed_regression(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(20000, 5))
    y = X @ rng.normal(size=5) + 0.5 * np.abs(X[:, 0]) * rng.standard_t(3, size=20000)
    fit, cal, test = slice(0, 1000), slice(1000, 10500), slice(10500, None)
    post = ppl.fit(LinearRegression(noise_scale=0.3), (X[fit], y[fit]), method="exact", seed=seed)
    own = ppl.evaluate(post, (X[test], y[test]), seed=seed + 2)
    print(f"heavy-tailed regression: the posterior's own 90% interval covers {own['coverage_90']:.3f}")
    intervals = ppl.conformal(post, (X[cal], y[cal]), alpha=0.1, seed=seed + 1)
    result = intervals.coverage((X[test], y[test]), seed=seed + 2)
    print(
        f"  conformal, alpha = 0.1, 9500 calibration / 9500 test points: coverage {result['coverage']:.3f} "
        f"(one split's sd {coverage_sd(9500, 9500, 0.1):.4f}), mean width {result['mean_width']:.3f}"
    )
    return {"own_coverage": own["coverage_90"], "conformal_coverage": result["coverage"],
            "one_split_sd": coverage_sd(9500, 9500, 0.1)}


def small_validation_split(seed: int) -> dict:
    data = ppl.datasets.load("breast_cancer", seed=seed)
    X, y = data.train
    post = ppl.fit(LogisticRegression(prior_scale=10.0), (X[:270], y[:270]), method="laplace", seed=seed)
    calibration = ppl.calibrate(post, (X[270:], y[270:]), seed=seed + 1, num_samples=200)
    report = calibration.evaluate(data.test, seed=seed + 2)
    print(
        f"breast_cancer, logistic Laplace, {calibration.num_validation} validation rows: T = {calibration.temperature:.2f}, "
        f"validation NLL {calibration.validation_nll_uncalibrated:.3f} -> {calibration.validation_nll:.3f}, "
        f"test NLL {report['uncalibrated']['nll']:.3f} -> {report['calibrated']['nll']:.3f}"
    )
    return {"calibration": calibration, "report": report}


def main(argv=None) -> dict:
    args = parse(parser(__doc__, "calibration", out=False), argv)
    return {
        "digits": digits(args.seed),
        "heavy_tailed": heavy_tailed_regression(args.seed),
        "small_validation": small_validation_split(args.seed),
    }


if __name__ == "__main__":
    main()
