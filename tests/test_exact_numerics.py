"""Numerics of ``method="exact"``: collinear and badly scaled designs, old vs new factorisation,
and a clear error (never NaN) when the posterior precision is not positive definite.

Errors are measured scale-free, as the posterior itself would be read:

* covariance: max_ij |Σ̂_ij − Σ_ij| / √(Σ_ii Σ_jj)   (a correlation-scale error);
* mean:       max_j |μ̂_j − μ_j| / √Σ_jj              (in posterior standard deviations);
* log evidence: absolute, in nats.

Tolerances come from first-order perturbation theory. Forming Λ = XᵀX/σ² + I/s² and factoring it
(or eigendecomposing it, for the references) are backward stable: each is exact for a Λ whose
unit-diagonal rescaling C = diag(Λ)^(-1/2) Λ diag(Λ)^(-1/2) is perturbed by ‖δC‖ ≲ c·P·eps. The
scale-free error of Σ = Λ⁻¹ is then ≲ κ(C)·‖δC‖ for the computed result and for the reference
alike, so we allow TOL_FACTOR · P · κ(C) · eps with TOL_FACTOR = 10 (both sides plus slack);
the measured errors sit one to three orders of magnitude below it. κ(C), not κ(Λ), is the
relevant number: a diagonal rescaling changes neither the posterior correlations nor, for a
Cholesky or a Jacobi-scaled eigendecomposition, the rounding errors.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import closed_form
from jax.scipy.linalg import cho_solve, solve_triangular

from ppl.inference import exact
from ppl.models import LinearRegression
import ppl

EPS = np.finfo(np.float64).eps
TOL_FACTOR = 10.0
NOISE = 0.5


# -- references and measurements (numpy float64, independent of ppl) ------------------------------
def design(X):
    return np.hstack([X, np.ones((X.shape[0], 1))])


def eig_reference(X, y, prior_scale, noise_scale=NOISE):
    """Posterior and log evidence from an eigendecomposition of the Jacobi-scaled precision."""
    A = design(X)
    n, P = A.shape
    lam = np.eye(P) / prior_scale**2 + A.T @ A / noise_scale**2
    h = A.T @ y / noise_scale**2
    d = 1.0 / np.sqrt(np.diag(lam))
    w, V = np.linalg.eigh(d[:, None] * lam * d[None, :])
    assert w[0] > 0
    half = d[:, None] * V / np.sqrt(w)  # Σ = half halfᵀ
    cov = half @ half.T
    mean = half @ (half.T @ h)
    log_det = np.sum(np.log(w)) - 2.0 * np.sum(np.log(d))
    log_p0 = -0.5 * P * math.log(2 * math.pi * prior_scale**2) - 0.5 * n * math.log(2 * math.pi * noise_scale**2)
    log_p0 -= 0.5 * y @ y / noise_scale**2
    quad = np.sum(np.square(half.T @ h))
    log_z = log_p0 + 0.5 * quad + 0.5 * P * math.log(2 * math.pi) - 0.5 * log_det
    # Magnitude of the terms of log Z, for its tolerance (cancellation between them is the risk).
    scale_z = abs(log_p0) + quad + abs(log_det) + P
    return {"mean": mean, "cov": cov, "log_z": log_z, "kappa": w[-1] / w[0], "P": P, "scale_z": scale_z}


def fit_exact(X, y, prior_scale, noise_scale=NOISE):
    post = ppl.fit(LinearRegression(prior_scale=prior_scale, noise_scale=noise_scale), (X, y), method="exact", seed=0)
    L = np.asarray(post.approximation.cov.scale_tril)
    return {
        "mean": np.asarray(post.approximation.loc),
        "tril": L,
        "cov": L @ L.T,
        "log_z": post.diagnostics().log_evidence,
    }


def errors(got, ref):
    sd = np.sqrt(np.diag(ref["cov"]))
    out = {
        "cov": np.max(np.abs(got["cov"] - ref["cov"]) / np.outer(sd, sd)),
        "mean": np.max(np.abs(got["mean"] - ref["mean"]) / sd),
    }
    if "log_z" in got and "log_z" in ref:
        out["log_z"] = abs(got["log_z"] - ref["log_z"])
    return out


def assert_valid_tril(L):
    assert np.all(np.isfinite(L))
    assert np.array_equal(L, np.tril(L)), "scale_tril must be lower triangular"
    assert np.all(np.diag(L) > 0), "scale_tril must have a positive diagonal"


def assert_matches(got, ref, label):
    tol = TOL_FACTOR * ref["P"] * ref["kappa"] * EPS
    err = errors(got, ref)
    sd_units = 1.0 + np.max(np.abs(ref["mean"]) / np.sqrt(np.diag(ref["cov"])))  # δμ ∝ δΛ·μ as well as δh
    assert err["cov"] <= tol, (label, err, tol)
    assert err["mean"] <= tol * sd_units, (label, err, tol * sd_units)
    assert err["log_z"] <= tol * ref["scale_z"], (label, err, tol * ref["scale_z"])
    return err


def dyadic_design(seed, n=200, d=4):
    # Dyadic entries (k/8): sums and small multiples below are exact in float64, so "collinear"
    # means exactly collinear, not collinear up to the rounding of the test's own arithmetic.
    rng = np.random.default_rng(seed)
    X = rng.integers(-16, 17, size=(n, d)) / 8.0
    y = X @ rng.normal(size=d) + 0.3 + NOISE * rng.normal(size=n)
    return X, y


# -- (1) exactly collinear columns, kept PD by the prior ----------------------------------------------
@pytest.mark.parametrize("kind", ["duplicate", "combination"])
def test_collinear_columns_match_float64_references(kind):
    X, y = dyadic_design(seed=1)
    extra = X[:, 1] if kind == "duplicate" else X[:, 0] - 2.0 * X[:, 2] + 0.5 * X[:, 3]
    X = np.column_stack([X, extra])
    ref = eig_reference(X, y, prior_scale=1.0)
    got = fit_exact(X, y, prior_scale=1.0)
    assert_valid_tril(got["tril"])
    # κ(C) = 2.1e3 (duplicate) / 4.0e3 (combination): covariance tolerance 2.8e-11 / 5.3e-11.
    # Measured: covariance ≤ 7.5e-13, mean ≤ 7.3e-13 sd, log Z ≤ 1.9e-12 nats.
    assert 1e2 < ref["kappa"] < 1e5
    assert_matches(got, ref, "eigendecomposition")
    # Second, independent reference: conftest's closed form (np.linalg.inv, and log Z from the n × n
    # marginal likelihood N(y; 0, σ²I + s²AAᵀ)). Its log|K| is good to ~n·cond(K)·eps, hence the
    # extra log Z bound (measured: ≤ 7.7e-13 nats against ≈ 4e-9 allowed).
    truth = closed_form(X, y, prior_scale=1.0, noise_scale=NOISE)
    truth_ref = {**ref, "mean": truth["mean"], "cov": truth["cov"], "log_z": truth["log_evidence"]}
    err = assert_matches(got, truth_ref, "closed_form")
    A = design(X)
    cond_k = np.linalg.cond(NOISE**2 * np.eye(len(y)) + A @ A.T)
    assert err["log_z"] <= TOL_FACTOR * len(y) * cond_k * EPS, (err, cond_k)


# -- (2) column scales differing by 1e6 ---------------------------------------------------------------
def test_columns_scaled_by_1e6_match_float64_reference():
    X, y = dyadic_design(seed=2, d=5)
    X = X * 2.0 ** np.round(np.log2(np.logspace(-3, 3, 5)))  # 1e-3 … 1e3, exact power-of-two scaling
    ref = eig_reference(X, y, prior_scale=1.0)
    lam = np.eye(6) + design(X).T @ design(X) / NOISE**2
    # κ(Λ) = 1.2e9 but κ(C) = 1.6: the scales cost no accuracy. Tolerances: covariance 2.1e-14,
    # mean 6.8e-13 sd; measured 1.0e-15, 2.5e-14 sd, log Z exact to the last bit. (conftest's
    # closed_form is no reference here: its unscaled np.linalg.inv is off by 2e-12 sd in the mean
    # and its n × n K has cond ≈ 1e9, which costs its log evidence 4e-7 nats.)
    assert np.linalg.cond(lam) > 1e8 and ref["kappa"] < 10
    got = fit_exact(X, y, prior_scale=1.0)
    assert_valid_tril(got["tril"])
    assert_matches(got, ref, "eigendecomposition")


def test_scaled_and_collinear_match_float64_reference():
    X, y = dyadic_design(seed=3)
    X = np.column_stack([X, X[:, 0] + X[:, 3]]) * 2.0 ** np.array([-10, 0, 10, -5, 10])  # scales 1e-3 … 1e3
    ref = eig_reference(X, y, prior_scale=1.0)
    got = fit_exact(X, y, prior_scale=1.0)
    assert_valid_tril(got["tril"])
    # κ(C) = 2.8 (the prior, s = 1, keeps the exact collinearity harmless once rescaled).
    # Measured: covariance 1.3e-15 (tolerance 3.7e-14), mean 1.9e-14 sd, log Z 4.5e-13 nats.
    assert_matches(got, ref, "eigendecomposition")


# -- (3) old (form Σ, factor again) vs new (reversed Cholesky of the scaled precision) ----------------
def old_factorisation(lam, h):
    """The previous ``gaussian_integral``: Cholesky of Λ, Σ̂ = L⁻ᵀL⁻¹, Cholesky of Σ̂."""
    L = jnp.linalg.cholesky(lam)
    inv = solve_triangular(L, jnp.eye(lam.shape[0]), lower=True)
    tril = jnp.linalg.cholesky(inv.T @ inv)
    mean = cho_solve((L, True), h)
    return {"tril": np.asarray(tril), "mean": np.asarray(mean), "log_det": float(2 * jnp.sum(jnp.log(jnp.diag(L))))}


def new_factorisation(lam, h):
    factor = exact.factor_precision(jnp.asarray(lam))
    z = exact.whiten(factor, jnp.asarray(h))
    mean = factor.scale * solve_triangular(factor.upper, z, trans="T", lower=False)
    return {
        "tril": np.asarray(factor.scale_tril),
        "mean": np.asarray(mean),
        "log_det": float(exact.log_det_precision(factor)),
        "rcond": float(factor.rcond),
    }


def decimal_reference(lam, h, digits=60):
    """Σ, Σh and log|Λ| of the given float64 Λ, h in 60-digit decimal arithmetic (the truth for Λ)."""
    P = lam.shape[0]
    with localcontext() as ctx:
        ctx.prec = digits
        A = [[Decimal(float(v)) for v in row] for row in lam]
        L = [[Decimal(0)] * P for _ in range(P)]
        for j in range(P):
            s = A[j][j] - sum(L[j][k] * L[j][k] for k in range(j))
            assert s > 0
            L[j][j] = s.sqrt()
            for i in range(j + 1, P):
                L[i][j] = (A[i][j] - sum(L[i][k] * L[j][k] for k in range(j))) / L[j][j]
        inv = [[Decimal(0)] * P for _ in range(P)]  # L⁻¹, column by column
        for c in range(P):
            for i in range(P):
                rhs = (Decimal(1) if i == c else Decimal(0)) - sum(L[i][k] * inv[k][c] for k in range(i))
                inv[i][c] = rhs / L[i][i]
        cov = [[sum(inv[k][i] * inv[k][j] for k in range(P)) for j in range(P)] for i in range(P)]
        hd = [Decimal(float(v)) for v in h]
        mean = [sum(cov[i][j] * hd[j] for j in range(P)) for i in range(P)]
        log_det = 2 * sum(L[i][i].ln() for i in range(P))
        return {
            "cov": np.array([[float(v) for v in row] for row in cov]),
            "mean": np.array([float(v) for v in mean]),
            "log_det": float(log_det),
        }


def random_precision(rng, P, kappa, scaled):
    Q, _ = np.linalg.qr(rng.normal(size=(P, P)))
    lam = (Q * np.logspace(0, -np.log10(kappa), P)) @ Q.T
    if scaled:
        s = np.logspace(-3, 3, P)[rng.permutation(P)]
        lam = s[:, None] * lam * s[None, :]
    lam = 0.5 * (lam + lam.T)
    return lam, lam @ rng.normal(size=P)


def compare(lam, h):
    ref = decimal_reference(lam, h)
    out = {}
    for label, fn in (("old", old_factorisation), ("new", new_factorisation)):
        got = fn(jnp.asarray(lam), jnp.asarray(h))
        got["cov"] = got["tril"] @ got["tril"].T
        out[label] = {**errors(got, ref), "log_det": abs(got["log_det"] - ref["log_det"])}
    out["mean_scale"] = 1.0 + np.max(np.abs(ref["mean"]) / np.sqrt(np.diag(ref["cov"])))
    return out


def test_new_factorisation_is_at_least_as_accurate_as_the_old_one():
    """40 precisions (seed 0), P = 8, κ(C) = 1e12, every other one with column scales 1e-3 … 1e3;
    reference: the exact Σ, Σh, log|Λ| of each float64 Λ in 60-digit arithmetic. Measured:

                         geometric mean        worst            mean log10(new/old) ± s.e.   new better
        covariance       old 4.7e-6 new 4.0e-6  old 4.5e-5 new 2.5e-5   −0.07 ± 0.12            52%
        mean (sd units)  old 2.0e-10 new 1.5e-10 old 2.1e-8 new 3.1e-8  −0.13 ± 0.09            60%
        log|Λ| (nats)    old 3.4e-6 new 3.7e-6  old 4.4e-5 new 2.5e-5   +0.03 ± 0.16            52%

    (κ·eps = 2.2e-4; the perturbation bound 10·P·κ·eps = 1.8e-2.) Both algorithms are backward
    stable, so both errors are O(κ(C)·eps) and which one wins on a single matrix is the luck of the
    rounding (either way by up to 10^2.8 here); forming Σ̂ = L⁻ᵀL⁻¹ does not square κ in practice.
    So "at least as accurate" is asserted as it can honestly hold: over the ensemble, the new error
    is no larger than the old one beyond twice the standard error of the mean log10 ratio, and every
    new error is inside the perturbation bound. Where the two differ qualitatively is at the edge of
    singularity (test_old_approach_returned_nan_where_new_one_raises).
    """
    rng = np.random.default_rng(0)
    P, kappa = 8, 1e12
    rows = [compare(*random_precision(rng, P, kappa, scaled=bool(t % 2))) for t in range(40)]
    bound = TOL_FACTOR * P * kappa * EPS
    for key in ("cov", "log_det"):
        old = np.log10([r["old"][key] for r in rows])
        new = np.log10([r["new"][key] for r in rows])
        diff = new - old
        se = diff.std(ddof=1) / np.sqrt(len(diff))
        assert diff.mean() <= 2 * se, (key, diff.mean(), se, 10 ** old.mean(), 10 ** new.mean())
        assert 10 ** new.max() <= bound, (key, 10 ** new.max(), bound)
    for r in rows:
        # δμ = −Σ δΛ μ: the mean's error in sd units carries the extra factor 1 + max|μ|/sd.
        assert r["new"]["mean"] <= bound * r["mean_scale"], r


def test_old_vs_new_on_an_ill_conditioned_regression():
    """A near-collinear column (X0 + 1e-6·noise) under a vague prior (s = 1e3): κ(C) = 1.7e9.

    Reference: the posterior of the float64 Λ of this very problem, in 60-digit arithmetic.
    Measured: covariance error old 1.2e-7, new 2.1e-9; mean old 3.8e-9, new 4.7e-11 sd; log|Λ|
    old 1.2e-7, new 2.1e-9 (bound 10·P·κ·eps = 2.3e-5). The new one wins by 60× on this matrix, but
    per the ensemble above that is rounding luck, so only the bound is asserted, not the ordering.
    """
    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, 4))
    X = np.column_stack([X, X[:, 0] + 1e-6 * rng.normal(size=200)])
    y = X[:, :4] @ rng.normal(size=4) + NOISE * rng.normal(size=200)
    model = LinearRegression(prior_scale=1e3, noise_scale=NOISE)
    problem = ppl.compile_problem(model, (X, y))
    lam = np.asarray(exact._precision(problem))
    h = np.asarray(jax.grad(problem.logdensity_fn)(problem.init_params))
    d = 1.0 / np.sqrt(np.diag(lam))
    kappa = np.linalg.cond(d[:, None] * lam * d[None, :])
    assert 1e9 < kappa < 1e10
    result = compare(lam, h)
    bound = TOL_FACTOR * lam.shape[0] * kappa * EPS
    assert result["new"]["cov"] <= bound and result["new"]["log_det"] <= bound, (result, bound)
    # The fit itself goes through the same factorisation: same numbers as new_factorisation.
    got = fit_exact(X, y, prior_scale=1e3)
    new = new_factorisation(lam, h)
    np.testing.assert_array_equal(got["tril"], new["tril"])
    assert_valid_tril(got["tril"])


# -- (4) not positive definite: a clear error, never NaN ------------------------------------------------
def test_indefinite_matrix_gives_the_clear_error_not_nan():
    indefinite = jnp.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # eigenvalues 3, 1, −1
    factor = jax.jit(exact.factor_precision)(indefinite)
    assert float(factor.rcond) == -np.inf  # a flag, not NaN
    with pytest.raises(ppl.OptionError, match="not positive definite") as info:
        exact.check_positive_definite(factor.rcond, indefinite, ["w[0]", "w[1]", "b"])
    assert isinstance(info.value, ValueError) and isinstance(info.value, exact.NotPositiveDefiniteError)
    message = str(info.value)
    assert "w[0]" in message and "w[1]" in message and "b (" not in message  # the null direction is (1, −1, 0)


def test_negative_diagonal_is_named():
    lam = jnp.array([[2.0, 0.1], [0.1, -1.0]])
    factor = exact.factor_precision(lam)
    assert float(factor.rcond) == -np.inf
    with pytest.raises(ppl.OptionError, match=r"diagonal is not positive at b \(-1\)"):
        exact.check_positive_definite(factor.rcond, lam, ["w[0]", "b"])


def test_positive_definite_matrix_passes_the_check():
    lam = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    factor = exact.factor_precision(lam)
    exact.check_positive_definite(factor.rcond, lam)  # no error
    L = np.asarray(factor.scale_tril)
    np.testing.assert_allclose(L @ L.T, np.linalg.inv(np.asarray(lam)), rtol=1e-14)
    assert_valid_tril(L)


@pytest.mark.parametrize(
    ("kind", "named"),
    [("duplicate", ["w[1]", "w[4]"]), ("intercept", ["w[4]", "b"])],
)
def test_singular_precision_in_fit_raises_and_names_the_columns(kind, named):
    # With s = 1e8 the prior's 1e-16 on the diagonal vanishes in rounding next to XᵀX/σ² ≈ 1e3, so
    # an exactly duplicated column (or a constant one, which duplicates the intercept) leaves Λ
    # singular in float64: the old code returned NaN here (asserted below), the new one raises.
    X, y = dyadic_design(seed=5)
    extra = X[:, 1] if kind == "duplicate" else np.ones(X.shape[0])
    X = np.column_stack([X, extra])
    with pytest.raises(ppl.OptionError, match="posterior precision is not positive definite") as info:
        ppl.fit(LinearRegression(prior_scale=1e8, noise_scale=NOISE), (X, y), method="exact", seed=0)
    message = str(info.value)
    for name in named:
        assert f"{name} (" in message, message
    assert "prior_scale" in message and "collinear" in message and "standardise" in message
    assert "nan" not in message.lower()


def test_old_approach_returned_nan_where_new_one_raises():
    X, y = dyadic_design(seed=5)
    X = np.column_stack([X, X[:, 1]])
    problem = ppl.compile_problem(LinearRegression(prior_scale=1e8, noise_scale=NOISE), (X, y))
    lam = exact._precision(problem)
    h = jax.grad(problem.logdensity_fn)(problem.init_params)
    assert not np.all(np.isfinite(old_factorisation(lam, h)["tril"]))
    mean, scale_tril, log_z, rcond = exact.gaussian_integral(problem)
    assert not float(rcond) > exact.pivot_tolerance(problem.num_params, mean.dtype)
