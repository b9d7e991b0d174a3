"""Laplace, its curvature service, covariance operators, mixtures and MoLA, against ground truth.

Tolerances: structures that are exact for the model (full GGN, K-FAC and rank-P low rank on
linear regression) must match the closed form to float64 rounding of the curvature (1e-6 as
the contract asks, observed ~1e-12); operators are checked against their dense definitions to
1e-10; Monte Carlo comparisons use multiples of the Monte Carlo standard error stated inline.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from conftest import closed_form
from scipy.optimize import minimize_scalar
from scipy.stats import multivariate_normal

from ppl.core import curvature
from ppl.core.errors import MemoryBudgetError, OptionError
from ppl.core.problem import compile_problem, trace_count
from ppl.inference import _curvatures as structures
import ppl
from ppl.core.gaussian import (
    Diagonal,
    Full,
    Gaussian,
    KroneckerFactors,
    LowRankDiagonal,
    Mixture,
    PrecisionLowRank,
    Subset,
    from_arrays,
)
from ppl.inference.exact import NotPositiveDefiniteError
from ppl.models import BNN, LinearRegression, LogisticRegression
from ppl.models.priors import FanIn, ScaleMixture


# -- conjugate linear regression: Laplace is exact -------------------------------------------------
@pytest.mark.parametrize("hessian", ["full", "kfac", "lowrank"])
def test_exact_structures_equal_the_closed_form(hessian, linear_model, linear_data, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="laplace", seed=0, subset="all", hessian=hessian, rank=4)
    q = post.approximation
    np.testing.assert_allclose(np.asarray(q.mean), linear_truth["mean"], atol=1e-6)
    np.testing.assert_allclose(np.asarray(q.covariance()), linear_truth["cov"], atol=1e-6)
    assert abs(post.evidence.log_evidence - linear_truth["log_evidence"]) < 1e-6
    assert post.diagnostics().log_evidence == pytest.approx(linear_truth["log_evidence"], abs=1e-6)
    assert post.status.converged is True


@pytest.mark.parametrize("tempering", ["likelihood", "cold"])
def test_tempered_laplace_equals_the_tempered_closed_form(tempering, linear_model, linear_data):
    X, y = (np.asarray(a, dtype=float) for a in linear_data.train)
    truth = closed_form(X, y, temperature=0.5, tempering=tempering)
    post = ppl.fit(linear_model, (X, y), method="laplace", seed=0, subset="all", hessian="kfac", temperature=0.5,
                   tempering=tempering)
    np.testing.assert_allclose(np.asarray(post.approximation.mean), truth["mean"], atol=1e-6)
    np.testing.assert_allclose(np.asarray(post.approximation.covariance()), truth["cov"], atol=1e-6)


@pytest.mark.parametrize("name", structures.names())
def test_every_registered_structure_on_the_conjugate_case(name, linear_model, linear_data, linear_truth):
    """Enrols every curvature structure in the registry: on conjugate linear regression the GGN is
    the likelihood's exact Hessian and the prior is Gaussian, so any structure's Gaussian sits at the
    exact mean with the exact precision on its diagonal (a structure drops correlations, never the
    curvature of a coordinate), and the log-determinant it gives the evidence is the one of the
    covariance it assembles."""
    post = ppl.fit(linear_model, linear_data.train, method="laplace", seed=0, subset="all", hessian=name, rank=4)
    q = post.approximation
    np.testing.assert_allclose(np.asarray(q.mean), linear_truth["mean"], atol=1e-6)
    precision = np.linalg.inv(np.asarray(q.covariance()))
    np.testing.assert_allclose(np.diag(precision), np.diag(linear_truth["precision"]), rtol=1e-8)
    structure = structures.structure(name)
    problem = post.problem
    u = jnp.asarray(q.mean)
    index = np.arange(problem.num_params)
    layers = curvature.layer_slices(problem) if problem.model.has_layers else None
    with curvature.float64():
        pieces = structures.likelihood_pieces(problem, u, index, name, 4, jax.random.key(0), layers)
        prior = curvature.prior_precision_diagonal(problem, u)
        blocks, health, _ = structure.assemble(pieces, 1.0, prior)
        assert float(health) > 0
        log_det = float(structure.log_det(pieces, 1.0, prior))
    assert log_det == pytest.approx(-sum(float(block.log_det()) for block in blocks), rel=1e-10)
    small = structure.memory_bytes(10, 1, [(0, 3, 3)], 4)
    assert curvature.CHUNK_BYTES < small < structure.memory_bytes(1000, 1, [(0, 30, 30)], 4)


def test_diag_is_the_diagonal_precision_gaussian(linear_model, linear_data, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="laplace", seed=0, subset="all", hessian="diag")
    expected = np.diag(1.0 / np.diag(linear_truth["precision"]))
    np.testing.assert_allclose(np.asarray(post.approximation.covariance()), expected, atol=1e-12)
    np.testing.assert_allclose(np.asarray(post.approximation.mean), linear_truth["mean"], atol=1e-6)


def test_ggn_equals_the_hessian_of_a_linear_gaussian_model(linear_model, linear_data):
    problem = compile_problem(linear_model, linear_data.train)
    u = jnp.asarray(np.random.default_rng(0).normal(size=problem.num_params))
    prior = curvature.prior_precision_diagonal(problem, u)
    ggn = curvature.ggn(problem, u, None, "full", 7)  # 7 rows a chunk: the last chunk is padded
    np.testing.assert_allclose(np.asarray(ggn + jnp.diag(prior)), np.asarray(curvature.hessian(problem, u)), atol=1e-10)


def test_auto_hessian_is_the_exact_ggn_where_it_is_affordable():
    """hessian="auto": the full GGN up to FULL_MAX free coordinates (a last layer, a small network),
    K-FAC above, where a dense P × P matrix stops being cheap."""
    from ppl.inference.laplace import FULL_MAX, Laplace

    X, y = np.random.default_rng(0).normal(size=(20, 30)), np.arange(20) % 2
    small = compile_problem(BNN(hidden=(8,), likelihood="bernoulli"), (X, y))
    large = compile_problem(BNN(hidden=(50, 50), likelihood="bernoulli"), (X, y))  # 4151 weights
    assert Laplace().structure(small) == ("last_layer", "full")
    assert Laplace(subset="all").structure(small) == ("all", "full")
    assert len(Laplace(subset="all").free_index(large)) > FULL_MAX
    assert Laplace(subset="all").structure(large) == ("all", "kfac")
    assert Laplace().structure(large) == ("last_layer", "full")  # its last layer: 51 coordinates


def test_kfac_is_exact_for_one_datum_of_a_network():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(1, 3)), np.array([2])
    problem = compile_problem(BNN(hidden=(4,), likelihood="categorical", num_classes=3), (X, y))
    u = jnp.asarray(rng.normal(size=problem.num_params))
    dense = np.asarray(curvature.ggn(problem, u, None, "full", 1))
    for (start, rows, cols), (A, G) in zip(curvature.layer_slices(problem), curvature.kfac_factors(problem, u, 1)):
        block = dense[start : start + rows * cols, start : start + rows * cols]
        np.testing.assert_allclose(np.kron(A, G), block, atol=1e-12)


@pytest.mark.slow
def test_ggn_matches_dense_jacobians_for_a_softmax_network():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(23, 3)), rng.integers(0, 3, 23)
    problem = compile_problem(BNN(hidden=(5,), likelihood="categorical"), (X, y))
    u = jnp.asarray(rng.normal(size=problem.num_params))
    J = np.asarray(jax.jacfwd(lambda v: problem.apply(problem.constrain(v), jnp.asarray(X)))(u))
    p = np.asarray(jax.nn.softmax(problem.apply(problem.constrain(u), jnp.asarray(X))))
    Lam = np.stack([np.diag(r) - np.outer(r, r) for r in p])
    expected = np.einsum("ncp,ncd,ndq->pq", J, Lam, J)
    np.testing.assert_allclose(np.asarray(curvature.ggn(problem, u, None, "full", 5)), expected, atol=1e-10)
    np.testing.assert_allclose(np.asarray(curvature.ggn(problem, u, None, "diag", 5)), np.diag(expected), atol=1e-10)
    vectors = rng.normal(size=(problem.num_params, 3))
    np.testing.assert_allclose(np.asarray(curvature.ggn_vp(problem, u, None, jnp.asarray(vectors), 5)), expected @ vectors, atol=1e-10)
    index = jnp.arange(10, problem.num_params)
    np.testing.assert_allclose(np.asarray(curvature.ggn(problem, u, index, "full", 5)), expected[10:, 10:], atol=1e-10)
    start = curvature.layer_slices(problem)[-1][0]  # the last layer, from its structure
    last = expected[start:, start:]
    np.testing.assert_allclose(np.asarray(curvature.last_layer_ggn(problem, u, "full", 5)), last, atol=1e-10)
    np.testing.assert_allclose(np.asarray(curvature.last_layer_ggn(problem, u, "diag", 5)), np.diag(last), atol=1e-10)
    top = np.linalg.eigvalsh(expected)[::-1][:3]
    _, values = curvature.ggn_lowrank(problem, u, None, jax.random.PRNGKey(0), 3, 5, iterations=6)
    np.testing.assert_allclose(np.asarray(values), top, rtol=1e-6)


# -- logistic regression: Newton's MAP and −H⁻¹ ------------------------------------------------------
def test_logistic_regression_equals_newton_and_inverse_hessian():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3))
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(X @ np.array([1.5, -1.0, 0.5]) + 0.3)))).astype(int)
    A = np.c_[X, np.ones(200)]
    theta = np.zeros(4)
    for _ in range(50):  # Newton–Raphson on the log joint with the N(0, 1) prior
        p = 1 / (1 + np.exp(-A @ theta))
        grad = A.T @ (y - p) - theta
        hess = A.T @ (A * (p * (1 - p))[:, None]) + np.eye(4)
        theta = theta + np.linalg.solve(hess, grad)
    p = 1 / (1 + np.exp(-A @ theta))
    cov = np.linalg.inv(A.T @ (A * (p * (1 - p))[:, None]) + np.eye(4))
    post = ppl.fit(LogisticRegression(prior_scale=1.0), (X, y), method="laplace", seed=0, subset="all", hessian="full")
    np.testing.assert_allclose(np.asarray(post.approximation.mean), theta, atol=1e-5)
    np.testing.assert_allclose(np.asarray(post.approximation.covariance()), cov, atol=1e-5)


# -- marginal likelihood --------------------------------------------------------------------------------
def test_marglik_finds_the_closed_form_optimum_and_compiles_once(linear_data):
    X, y = (np.asarray(a, dtype=float) for a in linear_data.train)

    def neg_evidence(log_alpha):
        return -closed_form(X, y, prior_scale=math.exp(-0.5 * log_alpha), noise_scale=0.5)["log_evidence"]

    best = math.exp(minimize_scalar(neg_evidence, bounds=(-10, 10), method="bounded", options={"xatol": 1e-9}).x)
    model = LinearRegression(noise_scale=0.5)
    post = ppl.fit(model, (X, y), method="laplace", seed=0, subset="all", hessian="full", prior_precision="marglik")
    assert abs(post.info["prior_precision"][0] / best - 1) < 0.02
    # the result's model is the model with the tuned prior, and its evidence is the closed form's there
    assert post.problem.model.prior_scale == pytest.approx(post.info["prior_precision"][0] ** -0.5)
    assert post.evidence.log_evidence == pytest.approx(-neg_evidence(math.log(post.info["prior_precision"][0])), abs=1e-6)
    # Compiles once: after one warm-up fit, fits on new data values of the same shape trace exactly
    # as often with 2 rounds as with 6 (only the tuned model's final problem is new each time).
    counts = []
    for rounds, shift in ((2, 0.1), (6, 0.2)):
        before = trace_count()
        ppl.fit(model, (X, y + shift), method="laplace", seed=0, subset="all", hessian="full",
                prior_precision="marglik", marglik_rounds=rounds)
        counts.append(trace_count() - before)
    assert counts[0] == counts[1]


@pytest.mark.slow
def test_marglik_learns_the_noise_of_linear_regression(linear_data):
    X, y = linear_data.train
    post = ppl.fit(LinearRegression(noise_scale=None), linear_data.train, method="laplace", seed=0,
                   hessian="kfac", prior_precision="marglik", prior_structure="scalar")
    # the (type-II) maximum-likelihood σ of the closed-form evidence over (α, σ)
    from scipy.optimize import minimize

    def neg(h):
        return -closed_form(np.asarray(X), np.asarray(y, float), prior_scale=math.exp(-0.5 * h[0]), noise_scale=math.exp(h[1]))["log_evidence"]

    h = minimize(neg, np.zeros(2), method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10}).x
    assert post.info["noise_scale"] == pytest.approx(math.exp(h[1]), rel=0.02)
    assert post.info["prior_precision"][0] == pytest.approx(math.exp(h[0]), rel=0.02)
    assert post.problem.model.noise_scale == pytest.approx(post.info["noise_scale"])


# -- covariance operators against their dense definitions ---------------------------------------------
def _spd(rng, n):
    a = rng.normal(size=(n, n))
    return a @ a.T / n + 0.1 * np.eye(n)


def _check_operator(q: Gaussian, dense: np.ndarray, rng):
    P = dense.shape[0]
    np.testing.assert_allclose(np.asarray(q.covariance()), dense, atol=1e-10)
    np.testing.assert_allclose(np.asarray(q.variance()), np.diag(dense), atol=1e-10)
    index = q.active_index
    free = np.arange(P) if index is None else np.asarray(index)
    J = rng.normal(size=(4, 3, len(free)))
    np.testing.assert_allclose(
        np.asarray(q.output_covariance(jnp.asarray(J))), J @ dense[np.ix_(free, free)] @ J.transpose(0, 2, 1), atol=1e-9
    )
    x = np.asarray(q.mean)[None] + rng.normal(size=(5, P))
    if index is not None:
        x[:, np.setdiff1d(np.arange(P), free)] = np.asarray(q.mean)[np.setdiff1d(np.arange(P), free)]
    sub = np.ix_(free, free)
    expected = multivariate_normal(np.asarray(q.mean)[free], dense[sub]).logpdf(x[:, free])
    np.testing.assert_allclose(np.asarray(q.log_prob(jnp.asarray(x))), expected, atol=1e-9)
    draws = np.asarray(q.sample(jax.random.PRNGKey(0), 40000))
    # sample covariance within ~6 Monte Carlo standard errors (sd of a covariance entry ≈ σ_i σ_j/√n)
    scale = np.sqrt(np.outer(np.diag(dense), np.diag(dense)))
    assert np.all(np.abs(np.cov(draws.T) - dense) <= 6 * scale / math.sqrt(40000) + 1e-12)
    rebuilt = from_arrays(q.kind, {k: np.asarray(v) for k, v in q.arrays().items()}, dim=P)
    np.testing.assert_allclose(np.asarray(rebuilt.covariance()), dense, atol=1e-12)


def _kronecker(A, G, weight, delta):
    """One layer's K-FAC Gaussian block, as the kfac structure assembles it."""
    prior = jnp.full(A.shape[0] * G.shape[0], delta)
    return structures.structure("kfac").assemble([(A, G)], weight, prior)[0][0]


def test_kronecker_operator():
    rng = np.random.default_rng(4)
    A, G = _spd(rng, 3), _spd(rng, 2)
    q = Gaussian(jnp.asarray(rng.normal(size=6)), _kronecker(jnp.asarray(A), jnp.asarray(G), 2.0, 0.5))
    _check_operator(q, np.linalg.inv(2.0 * np.kron(A, G) + 0.5 * np.eye(6)), rng)


def test_kronecker_factors_operator():
    """The matrix-normal guide's operator: Σ = (L_a L_aᵀ) ⊗ (L_g L_gᵀ) over a 3 × 2 matrix, row by row,
    here inside a Subset beside a diagonal block, as the guide lays it out."""
    rng = np.random.default_rng(7)
    la = np.tril(rng.normal(size=(3, 3)), -1) + np.diag(rng.uniform(0.5, 1.5, size=3))
    lg = np.tril(rng.normal(size=(2, 2)), -1) + np.diag(rng.uniform(0.5, 1.5, size=2))
    diag_scale = rng.uniform(0.5, 1.5, size=2)
    q = Gaussian(jnp.asarray(rng.normal(size=8)), Subset(
        jnp.arange(8), (Diagonal(jnp.asarray(diag_scale[:1])), KroneckerFactors(jnp.asarray(la), jnp.asarray(lg)),
                        Diagonal(jnp.asarray(diag_scale[1:]))), 8))
    dense = np.zeros((8, 8))
    dense[0, 0], dense[7, 7] = diag_scale[0] ** 2, diag_scale[1] ** 2
    dense[1:7, 1:7] = np.kron(la @ la.T, lg @ lg.T)
    _check_operator(q, dense, rng)


def test_precision_low_rank_operator():
    rng = np.random.default_rng(5)
    d = rng.uniform(0.5, 2.0, size=7)
    U, _ = np.linalg.qr(rng.normal(size=(7, 3)))
    lam = np.array([5.0, 1.0, 0.0])
    op = PrecisionLowRank.from_eigenpairs(jnp.asarray(d), jnp.asarray(U), jnp.asarray(lam))
    _check_operator(Gaussian(jnp.asarray(rng.normal(size=7)), op), np.linalg.inv(np.diag(d) + U @ np.diag(lam) @ U.T), rng)


def test_subset_of_blocks_and_the_older_operators():
    rng = np.random.default_rng(6)
    A, G = _spd(rng, 2), _spd(rng, 2)
    kron = _kronecker(jnp.asarray(A), jnp.asarray(G), 1.0, 1.0)
    diag_scale = rng.uniform(0.5, 1.5, size=3)
    index = np.array([1, 2, 3, 4, 6, 7, 9])
    q = Gaussian(jnp.asarray(rng.normal(size=10)), Subset(jnp.asarray(index), (kron, Diagonal(jnp.asarray(diag_scale))), 10))
    dense = np.zeros((10, 10))
    block = np.zeros((7, 7))
    block[:4, :4] = np.linalg.inv(np.kron(A, G) + np.eye(4))
    block[4:, 4:] = np.diag(diag_scale**2)
    dense[np.ix_(index, index)] = block
    _check_operator(q, dense, rng)
    factor = rng.normal(size=(4, 2))
    _check_operator(Gaussian(jnp.zeros(4), LowRankDiagonal(jnp.asarray(factor), jnp.ones(4))), np.eye(4) + factor @ factor.T, rng)
    L = np.tril(rng.normal(size=(4, 4)), -1) + np.diag(rng.uniform(0.5, 1.0, size=4))
    _check_operator(Gaussian(jnp.zeros(4), Full(jnp.asarray(L))), L @ L.T, rng)


def test_mixture_density_sampling_and_support():
    rng = np.random.default_rng(7)
    comps = [Gaussian(jnp.asarray(rng.normal(size=3)), Full(jnp.asarray(np.diag(rng.uniform(0.5, 1, 3))))) for _ in range(2)]
    log_w = jnp.log(jnp.asarray([0.3, 0.7]))
    mix = Mixture(tuple(comps), log_w)
    x = rng.normal(size=(6, 3))
    dense = [np.asarray(c.covariance()) for c in comps]
    expected = np.logaddexp(
        math.log(0.3) + multivariate_normal(np.asarray(comps[0].mean), dense[0]).logpdf(x),
        math.log(0.7) + multivariate_normal(np.asarray(comps[1].mean), dense[1]).logpdf(x),
    )
    np.testing.assert_allclose(np.asarray(mix.log_prob(jnp.asarray(x))), expected, atol=1e-10)
    draws = np.asarray(mix.sample(jax.random.PRNGKey(1), 20000))
    sd = np.sqrt(np.asarray(mix.variance()) / 20000)
    assert np.all(np.abs(draws.mean(0) - np.asarray(mix.mean)) < 5 * sd)
    # subset components: a point off a component's fixed coordinates has no density under it
    sub = [Gaussian(jnp.asarray(rng.normal(size=3)), Subset(jnp.asarray([2]), (Diagonal(jnp.ones(1)),), 3)) for _ in range(2)]
    mix = Mixture(tuple(sub), jnp.log(jnp.asarray([0.5, 0.5])))
    point = np.asarray(sub[0].mean).copy()
    point[2] += 0.3
    assert float(mix.log_prob(jnp.asarray(point[None]))[0]) == pytest.approx(math.log(0.5) + float(sub[0].log_prob(jnp.asarray(point))))
    rebuilt = from_arrays(mix.kind, {k: np.asarray(v) for k, v in mix.arrays().items()}, dim=3)
    np.testing.assert_allclose(np.asarray(rebuilt.log_prob(jnp.asarray(point[None]))), np.asarray(mix.log_prob(jnp.asarray(point[None]))))


@pytest.mark.parametrize(
    "kind, arrays, message",
    [
        ("kronecker", {"loc": np.zeros(4), "qa": np.ones((2, 2)), "qg": np.eye(2), "scale": np.ones((2, 2))}, "orthonormal"),
        ("kronecker", {"loc": np.zeros(4), "qa": np.eye(2), "qg": np.eye(2), "scale": -np.ones((2, 2))}, "positive"),
        ("subset:diagonal", {"loc": np.zeros(4), "index": np.array([2, 1]), "b0_scale": np.ones(2)}, "increasing"),
        ("subset:diagonal", {"loc": np.zeros(4), "index": np.array([1, 2]), "b0_scale": np.ones(3)}, "cover"),
        ("subset:unknown", {"loc": np.zeros(4), "index": np.array([1]), "b0_x": np.ones(1)}, "unknown"),
        ("mixture:2:diagonal", {"log_weights": np.zeros(2), "c0_loc": np.zeros(4), "c0_scale": np.ones(4),
                                "c1_loc": np.zeros(4), "c1_scale": np.ones(4)}, "summing to one"),
        ("precision_low_rank", {"loc": np.zeros(4), "inv_sqrt_d": np.ones(4), "basis": np.ones((4, 1)), "coef": np.ones(1)}, "(-1, 0]"),
    ],
)
def test_tampered_approximations_are_refused(kind, arrays, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        from_arrays(kind, arrays, dim=4)


# -- networks: predictives, save/load, bad input ---------------------------------------------------
@pytest.fixture(scope="module")
def cancer():
    data = ppl.datasets.load("breast_cancer", seed=0)
    model = BNN(hidden=(20,), likelihood="bernoulli")
    return data, model, ppl.fit(model, data.train, method="map", seed=0)


@pytest.mark.slow  # out of the default run to keep it near 15 minutes; CI runs it in the slow step
def test_probit_agrees_with_a_large_linearised_sample(cancer):
    data, model, map_post = cancer
    post = ppl.fit(model, data.train, method="laplace", seed=0, init=map_post, hessian="kfac")
    assert post.info["subset"] == "last_layer" and post.info["hessian"] == "kfac"
    probit = post.predict(data.test.X, seed=1, mode="probit")
    sampled = post.predict(data.test.X, seed=1, mode="linearized", num_samples=10_000)
    # 10,000 draws: Monte Carlo sd of a probability ≤ 0.005; the probit approximation's own error
    # for a Gaussian logit is below 0.02 (Spiegelhalter & Lauritzen 1990)
    assert np.max(np.abs(probit.probs - sampled.probs)) < 0.02
    # the last layer is linear in its weights: linearised and plain Monte Carlo agree in distribution
    mc = post.predict(data.test.X, seed=2, mode="mc", num_samples=10_000)
    assert np.max(np.abs(mc.probs - sampled.probs)) < 0.03


@pytest.mark.slow
def test_laplace_runs_save_and_load(cancer, tmp_path):
    data, model, map_post = cancer
    # (every operator's arrays round-trip through from_arrays in the operator tests above)
    for i, options in enumerate([dict(hessian="kfac", subset="all"), dict(hessian="lowrank", rank=5)]):
        post = ppl.fit(model, data.train, method="laplace", seed=0, init=map_post, num_draws=200, **options)
        post.save(tmp_path / f"run{i}")
        back = ppl.load(tmp_path / f"run{i}")
        assert back.approximation.kind == post.approximation.kind
        np.testing.assert_allclose(
            back.predict(data.test.X, seed=1, mode="probit").probs, post.predict(data.test.X, seed=1, mode="probit").probs
        )
        np.testing.assert_allclose(back.log_prob(post.sample(3, seed=4)), post.log_prob(post.sample(3, seed=4)))


@pytest.mark.slow
def test_bridge_and_mode_errors(cancer):
    data, model, map_post = cancer
    post = ppl.fit(model, data.train, method="laplace", seed=0, init=map_post, num_draws=100)
    with pytest.raises(OptionError, match="bridge"):
        post.predict(data.test.X, seed=0, mode="bridge")
    iris = ppl.datasets.load("iris", seed=0)
    cat = ppl.fit(BNN(hidden=(8,), likelihood="categorical"), iris.train, method="laplace", seed=0, num_draws=100)
    bridge = cat.predict(iris.test.X, seed=0, mode="bridge").probs
    np.testing.assert_allclose(bridge.sum(axis=1), 1.0)
    assert np.mean(bridge.argmax(1) == cat.predict(iris.test.X, seed=0, mode="probit").probs.argmax(1)) > 0.9


def _saddle_program(y=None):
    x = numpyro.sample("x", dist.Normal(0.0, 10.0))
    numpyro.sample("y", dist.Normal(x**2, 0.1), obs=y)


def test_bad_input_is_refused_with_clear_errors(cancer, linear_data):
    data, model, map_post = cancer
    program_data = {"y": np.array(1.0)}
    with pytest.raises(OptionError, match="K-FAC needs dense layers"):
        ppl.fit(_saddle_program, program_data, method="laplace", seed=0, hessian="kfac", subset="all")
    with pytest.raises(OptionError, match="no network layers"):
        ppl.fit(_saddle_program, program_data, method="laplace", seed=0, subset="last_layer")
    with pytest.raises(OptionError, match="entries but the model has"):
        ppl.fit(model, data.train, method="laplace", seed=0, subset=np.ones(5, bool), hessian="diag")
    with pytest.raises(OptionError, match="all False"):
        ppl.fit(model, data.train, method="laplace", seed=0, subset=np.zeros(5, bool))
    with pytest.raises(OptionError, match="not Gaussian"):
        ppl.fit(BNN(hidden=(4,), likelihood="bernoulli", prior=ScaleMixture()), data.train, method="laplace", seed=0,
                prior_precision="marglik")
    with pytest.raises(OptionError, match="one prior precision per layer"):
        ppl.fit(BNN(hidden=(4,), likelihood="bernoulli", prior=FanIn()), data.train, method="laplace", seed=0,
                hessian="kfac")
    with pytest.raises(MemoryBudgetError, match="kfac"):
        ppl.fit(BNN(hidden=(3000,), likelihood="bernoulli"), data.train, method="laplace", seed=0, subset="all",
                hessian="full")
    # the exact Hessian at a saddle (the start x = 0 is stationary) is not positive definite
    with pytest.raises(NotPositiveDefiniteError, match="laplace"):
        ppl.fit(_saddle_program, program_data, method="laplace", seed=0, init="zeros")
    # an unconverged MAP: the gradient norm is reported, ok is False
    post = ppl.fit(model, data.train, method="laplace", seed=0, steps=2, num_draws=100)
    assert post.status.converged is False and "gradient norm" in post.status.convergence
    diag = post.diagnostics()
    assert not diag.ok and any("non-stationary" in w for w in diag.warnings)


def test_plain_program_gets_the_exact_hessian():
    def model(y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("data", 50):
            numpyro.sample("y", dist.Normal(mu, sigma), obs=y)

    y = np.random.default_rng(8).normal(1.0, 0.7, size=50)
    post = ppl.fit(model, {"y": y}, method="laplace", seed=0)
    assert post.info["hessian"] == "full" and post.info["subset"] == "all"
    problem = post.problem
    mode = post.approximation.mean
    assert float(jnp.linalg.norm(jax.grad(problem.logdensity_fn)(mode))) < 1e-6
    precision = -np.asarray(jax.hessian(problem.logdensity_fn)(mode))
    np.testing.assert_allclose(np.asarray(post.approximation.covariance()), np.linalg.inv(precision), rtol=1e-8)


@pytest.mark.slow
def test_heteroscedastic_regression_fisher_and_linearised_noise(tmp_path):
    model = BNN(hidden=(32,), activation="tanh", likelihood="heteroscedastic")
    # the output "Hessian" is the Fisher: the expectation over y of −∇²_f log N(y; μ, e^s), which a
    # two-point rule y = μ ± σ integrates exactly (the Hessian is quadratic in y)
    mu, s = 0.3, -0.7
    f = jnp.asarray([[mu, s]])

    def nll(ff, yy):
        return -model.observation(ff, {}).log_prob(yy).sum()

    sigma = math.exp(s / 2)
    fisher = sum(np.asarray(jax.hessian(nll)(f, jnp.asarray([y])))[0, :, 0, :] for y in (mu + sigma, mu - sigma)) / 2
    root = np.asarray(model.output_hessian_sqrt(f, {}))[0]
    np.testing.assert_allclose(root @ root.T, fisher, atol=1e-12)
    # noise that grows with |x|: the linearised predictive's aleatoric sd follows it
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(300, 1))
    y = np.sin(X[:, 0]) + rng.normal(size=300) * (0.05 + 0.3 * np.abs(X[:, 0]))
    post = ppl.fit(model, (X, y), method="laplace", seed=0, subset="all", hessian="full")
    pred = post.predict(np.array([[-2.5], [0.0], [2.5]]), seed=1, mode="linearized")
    noise = np.sqrt(pred.aleatoric_variance)  # truth 0.8, 0.05, 0.8
    assert noise[1] < 0.3 and noise[0] > 0.5 and noise[2] > 0.5
    assert pred.member_noise.shape == (post.num_draws, 3)
    metrics = ppl.evaluate(post, (X[:50], y[:50]), seed=1, mode="linearized")
    assert np.isfinite(metrics["nll"]) and 0 <= metrics["coverage_90"] <= 1
    post.save(tmp_path / "het")
    np.testing.assert_allclose(ppl.load(tmp_path / "het").predict(X[:5], seed=1).mean, post.predict(X[:5], seed=1).mean)


@pytest.mark.parametrize("method", ["laplace", "mola"])
def test_ctrl_c_during_the_map_search_is_reported_not_hidden(method, monkeypatch, linear_model, linear_data):
    from test_faults import _interrupt_after

    _interrupt_after(monkeypatch, 2)
    post = ppl.fit(linear_model, linear_data.train, method=method, seed=0, steps=2000, num_draws=100,
                   init="prior")
    assert post.status.interrupted and post.status.steps_done < 2000
    diag = post.diagnostics()
    assert not diag.ok and any("interrupted" in w for w in diag.warnings)



# -- multi-output Gaussian regression: K targets, a noise scale per output --------------------------
def _multi_output_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    W = rng.normal(size=(3, 2))
    Y = X @ W + np.array([0.5, -1.0]) + rng.normal(size=(n, 2)) * np.array([0.2, 0.6])
    return X, Y


@pytest.mark.parametrize("hessian", ["full", "kfac"])
def test_multi_output_laplace_equals_the_closed_form_per_output(hessian):
    # A linear network (hidden=()) with fixed per-output noise is conjugate: output k's weights and
    # bias have the closed-form posterior of a linear regression with noise σ_k, independently of the
    # other outputs. Λ = diag(1/σ_k²) is the same for every datum, so K-FAC is exact here too.
    X, Y = _multi_output_data()
    sigmas, s = np.array([0.2, 0.6]), 0.8
    model = BNN(hidden=(), prior_scale=s, noise_scale=(0.2, 0.6), num_outputs=2)
    post = ppl.fit(model, (X, Y), method="laplace", seed=0, subset="all", hessian=hessian)
    q = post.approximation
    mean, cov = np.asarray(q.mean), np.asarray(q.covariance())
    Xa = np.c_[X, np.ones(len(X))]
    # flat layout: w0 (3, 2) row-major, then b0 (2,) → output k's coefficients sit at [k, 2+k, 4+k, 6+k]
    for k in range(2):
        precision = Xa.T @ Xa / sigmas[k] ** 2 + np.eye(4) / s**2
        truth_cov = np.linalg.inv(precision)
        truth_mean = truth_cov @ Xa.T @ Y[:, k] / sigmas[k] ** 2
        at = np.arange(4) * 2 + k
        np.testing.assert_allclose(mean[at], truth_mean, atol=1e-6)
        np.testing.assert_allclose(cov[np.ix_(at, at)], truth_cov, atol=1e-6)
        np.testing.assert_allclose(cov[np.ix_(at, np.arange(4) * 2 + 1 - k)], 0.0, atol=1e-10)
        # the linearised predictive at new inputs: exact mean and variance x̃ᵀ Σ_k x̃ + σ_k²
        Xt = np.random.default_rng(1).normal(size=(5, 3))
        xt = np.c_[Xt, np.ones(5)]
        pred = post.predict(Xt, seed=0, mode="linearized")
        assert pred.mean.shape == pred.variance.shape == (5, 2)
        np.testing.assert_allclose(pred.mean[:, k], xt @ truth_mean, atol=1e-6)
        np.testing.assert_allclose(pred.epistemic_variance[:, k], np.einsum("ni,ij,nj->n", xt, truth_cov, xt), atol=1e-9)
        np.testing.assert_allclose(pred.aleatoric_variance[:, k], sigmas[k] ** 2, atol=1e-12)
    # the output Hessian root is diag(1/σ_k)
    root = np.asarray(model.output_hessian_sqrt(jnp.zeros((3, 2)), {}))
    np.testing.assert_allclose(root, np.broadcast_to(np.diag(1 / sigmas), (3, 2, 2)), atol=1e-15)


def test_multi_output_learns_one_noise_per_output_and_round_trips(tmp_path):
    X, Y = _multi_output_data(n=400)
    model = BNN(hidden=(8,), activation="tanh")  # num_outputs read from Y, sigma learned per output
    post = ppl.fit(model, (X, Y), method="map", seed=0)
    assert post.problem.model.num_outputs == 2 and post.draws["sigma"].shape == (1, 1, 2)
    # the MAP noise per output lands near the truth (0.2, 0.6): 400 residuals give ~4% relative sd
    np.testing.assert_allclose(post.draws["sigma"][0, 0], [0.2, 0.6], rtol=0.15)
    pred = post.predict(X[:7], seed=0)
    assert pred.mean.shape == (7, 2) and pred.member_noise.shape == (1, 2)
    # log_prob is the joint density of an input's K targets: the sum of the per-output log densities
    mu, sd = pred.mean, np.asarray(post.draws["sigma"][0, 0])
    expected = np.sum(-0.5 * ((Y[:7] - mu) / sd) ** 2 - np.log(sd) - 0.5 * math.log(2 * math.pi), axis=1)
    np.testing.assert_allclose(pred.log_prob(Y[:7]), expected, atol=1e-10)
    metrics = ppl.evaluate(post, (X, Y), seed=0)
    assert metrics["rmse"] < 0.5 and 0.8 < metrics["coverage_90"] < 0.97
    post.save(tmp_path / "multi")
    loaded = ppl.load(tmp_path / "multi")
    assert loaded.problem.model == post.problem.model
    np.testing.assert_allclose(loaded.predict(X[:7], seed=0).mean, pred.mean)


def test_multi_output_bad_input_is_refused():
    X, Y = _multi_output_data(n=30)
    with pytest.raises(ppl.DataError, match="multi-output regression is BNN"):
        ppl.fit(LinearRegression(), (X, Y), method="map", seed=0)
    with pytest.raises(ppl.DataError, match="multi-output regression is BNN"):
        ppl.fit(BNN(likelihood="bernoulli"), (X, Y > 0), method="map", seed=0)
    with pytest.raises(ppl.DataError, match="num_outputs=3"):
        ppl.fit(BNN(num_outputs=3), (X, Y), method="map", seed=0)
    with pytest.raises(ppl.DataError, match=r"needs targets of shape \(N, 2\)"):
        ppl.fit(BNN(num_outputs=2), (X, Y[:, 0]), method="map", seed=0)
    with pytest.raises(ValueError, match="noise_scale has 3 values"):
        BNN(noise_scale=(0.1, 0.2, 0.3), num_outputs=2)
    with pytest.raises(ValueError, match="num_outputs applies only"):
        BNN(likelihood="categorical", num_outputs=2)
    with pytest.raises(OptionError, match="marglik tunes one Gaussian noise scale"):
        ppl.fit(BNN(hidden=(4,)), (X, Y), method="laplace", seed=0, prior_precision="marglik")


def test_heteroscedastic_noise_survives_row_chunking(monkeypatch):
    # The per-input noise of a heteroscedastic model must be joined across row chunks like the means
    # (it was once taken from the first chunk only).
    import ppl.core.predict as predict_module

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = X[:, 0] + rng.normal(size=40) * 0.3
    post = ppl.fit(BNN(hidden=(4,), likelihood="heteroscedastic"), (X, y), method="map", seed=0, steps=50)
    whole = post.predict(X[:10], seed=0)
    monkeypatch.setattr(predict_module, "PREDICT_CHUNK_BYTES", 3 * 2 * 8)  # three rows a chunk
    chunked = post.predict(X[:10], seed=0)
    assert chunked.member_noise.shape == whole.member_noise.shape == (1, 10)
    np.testing.assert_allclose(chunked.member_noise, whole.member_noise, atol=1e-12)
    np.testing.assert_allclose(chunked.variance, whole.variance, atol=1e-12)


def test_a_float32_run_factorises_its_curvature_in_float64():
    # Nearly collinear inputs make the posterior precision ill-conditioned (condition number ≈ 4e6):
    # summed and inverted in float32 its covariance was 18% off and the log evidence 0.1 off; the
    # curvature service sums in float64 and Laplace factorises in float64 in any run. What remains
    # is float32's own rounding of the MAP and of the log likelihood there (|log p| ≈ 1.8e3, so a
    # few 1e-4), hence the tolerances below.
    import json
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import json, numpy as np, jax, ppl
        from ppl.models import LinearRegression
        assert not jax.config.jax_enable_x64
        rng = np.random.default_rng(0)
        n, s, sig = 2000, 10.0, 0.1
        x1 = rng.normal(size=n)
        X = np.c_[x1, x1 + 1e-3 * rng.normal(size=n), rng.normal(size=n)]
        y = X @ np.array([1.0, -0.5, 0.3]) + sig * rng.normal(size=n)
        Xa = np.c_[X, np.ones(n)]
        P = Xa.T @ Xa / sig**2 + np.eye(4) / s**2
        C = np.linalg.inv(P); m = C @ Xa.T @ y / sig**2; r = y - Xa @ m
        logz = (-0.5 * r @ r / sig**2 - n * np.log(sig) - 0.5 * n * np.log(2 * np.pi) - 0.5 * m @ m / s**2
                - 4 * np.log(s) - 0.5 * np.linalg.slogdet(P)[1])
        out = {}
        for h in ("full", "kfac"):
            post = ppl.fit(LinearRegression(prior_scale=s, noise_scale=sig), (X, y), method="laplace", seed=0,
                           subset="all", hessian=h)
            cov = np.asarray(post.approximation.covariance(), float)
            out[h] = {"dtype": str(post.approximation.loc.dtype), "cov": float(np.max(np.abs(cov - C)) / np.max(np.abs(C))),
                      "logz": float(post.evidence.log_evidence - logz), "cond": float(np.linalg.cond(P))}
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    for h in ("full", "kfac"):
        assert record[h]["dtype"] == "float32" and record[h]["cond"] > 1e6
        assert record[h]["cov"] < 1e-4, record
        assert abs(record[h]["logz"]) < 5e-3, record


def test_laplace_init_must_be_a_map_posterior_of_this_model(linear_model, linear_data):
    # refused before anything runs: a Gaussian's mean is not a mode, another model's layout does not fit
    svi = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, steps=50)
    with pytest.raises(OptionError, match=r"init= takes a fitted 'map' Posterior .*got a 'svi' posterior"):
        ppl.fit(linear_model, linear_data.train, method="laplace", seed=0, init=svi)
    other = ppl.fit(LinearRegression(bias=False), linear_data.train, method="map", seed=0)
    with pytest.raises(OptionError, match="init must be a map Posterior of this model"):
        ppl.fit(linear_model, linear_data.train, method="laplace", seed=0, init=other)


def test_a_mode_at_a_kink_is_stationary_for_laplace_as_for_map():
    # A Laplace likelihood's MAP sits at the data's median, a kink where the gradient stays near 1
    # but no step along it lowers the loss. map calls that settled; laplace, given that MAP, must
    # agree (it once called every ReLU ensemble member on UCI yacht "not stationary").
    import numpyro
    import numpyro.distributions as dist

    def program(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Laplace(mu, 1.0), obs=y)

    data = {"y": np.array([0.3, 1.7, 2.2, 5.0, 9.0])}
    mode = ppl.fit(program, data, method="map", seed=0)
    assert mode.status.converged and "kink" in mode.status.convergence
    post = ppl.fit(program, data, method="laplace", seed=0, init=mode, num_draws=100)
    assert post.status.converged and "kink" in post.status.convergence
    assert post.info["map_gradient_norm"] > 0.5


def test_a_mode_left_short_is_recentred_on_the_last_layer_s_conditional_mode():
    """A MAP search stopped early leaves the last layer off its conditional mode; the Laplace
    Gaussian is re-centred by Newton steps with its own covariance. Under a Gaussian likelihood with
    σ fixed, the last layer's conditional posterior is exactly Gaussian with the GGN as its
    precision: after one step the Gaussian is that posterior (log p − log q constant: k-hat −inf),
    where left at the early MAP its log ratio is linear in the draws and k-hat fails."""
    from ppl.inference.laplace import NEWTON_TOL

    data = ppl.datasets.load("sinusoid", seed=0)
    model = BNN(hidden=(16,), noise_scale=0.2)
    early = ppl.fit(model, data.train, method="map", seed=0, steps=20, max_steps=20)
    post = ppl.fit(model, data.train, method="laplace", seed=0, init=early, prior_precision=None)
    assert post.info["mode_shift_sd"] > 1.0 and post.info["newton_steps"] >= 1
    q = post.approximation
    index = np.asarray(q.active_index)
    gradient = jax.grad(post.problem.logdensity_fn)(q.loc)[index]
    covariance = np.asarray(q.covariance())[np.ix_(index, index)]
    assert float(np.sqrt(gradient @ covariance @ gradient)) <= NEWTON_TOL
    assert post.diagnostics().khat == float("-inf")
