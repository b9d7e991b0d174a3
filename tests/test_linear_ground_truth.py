"""Every Gaussian-linear ground truth: exact, NUTS, SVI full-rank and mean-field."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import closed_form, flat_params

from ppl.diagnostics import _arviz
import ppl


def test_exact_equals_closed_form(linear_data, linear_model, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    family = post.approximation
    # Site order in the flat vector is w (D,) then b, as in closed_form.
    np.testing.assert_allclose(np.asarray(family.mean), linear_truth["mean"], rtol=0, atol=1e-10)
    cov = np.asarray(family.covariance())
    np.testing.assert_allclose(cov, linear_truth["cov"], rtol=1e-9, atol=1e-12)
    assert abs(post.diagnostics().log_evidence - linear_truth["log_evidence"]) < 1e-8


@pytest.mark.parametrize("tempering", ["likelihood", "cold"])
def test_exact_tempered_posteriors_differ_as_defined(linear_data, linear_model, tempering):
    X, y = (np.asarray(a, dtype=float) for a in linear_data.train)
    truth = closed_form(X, y, temperature=3.0, tempering=tempering)
    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0, temperature=3.0, tempering=tempering)
    family = post.approximation
    np.testing.assert_allclose(np.asarray(family.mean), truth["mean"], atol=1e-10)
    cov = np.asarray(family.covariance())
    np.testing.assert_allclose(cov, truth["cov"], rtol=1e-9, atol=1e-12)


def test_cold_and_tempered_likelihood_are_not_the_same(linear_data, linear_model):
    cold = ppl.fit(linear_model, linear_data.train, method="exact", seed=0, temperature=3.0, tempering="cold")
    lik = ppl.fit(linear_model, linear_data.train, method="exact", seed=0, temperature=3.0, tempering="likelihood")
    assert not np.allclose(np.asarray(cold.approximation.variance()), np.asarray(lik.approximation.variance()))


def test_nuts_matches_closed_form_within_monte_carlo_error(linear_data, linear_model, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_chains=4)
    diag = post.diagnostics()
    assert diag.rhat_max <= 1.01
    assert diag.divergences == 0
    draws = flat_params(post.draws)
    sd_true = np.sqrt(np.diag(linear_truth["cov"]))
    ess = _arviz.ess(draws, "bulk")
    mcse = draws.std(axis=(0, 1)) / np.sqrt(ess)
    error = np.abs(draws.mean(axis=(0, 1)) - linear_truth["mean"])
    assert np.all(error <= 4 * mcse), (error, mcse)
    assert np.all(error <= 0.1 * sd_true)
    # sd of an sd estimate is about sd / sqrt(2 ESS) (< 2% here): 10% is a five-sigma band.
    assert np.all(ess >= 1000)
    np.testing.assert_allclose(draws.std(axis=(0, 1)), sd_true, rtol=0.10)


def test_svi_full_rank_defaults_match_exact(linear_data, linear_model, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, guide="full_rank")
    q = post.approximation
    sd_true = np.sqrt(np.diag(linear_truth["cov"]))
    assert post.status.converged
    assert np.all(np.abs(np.asarray(q.mean) - linear_truth["mean"]) <= 0.1 * sd_true)
    np.testing.assert_allclose(np.sqrt(np.asarray(q.variance())), sd_true, rtol=0.15)
    diag = post.diagnostics()
    # ELBO = log Z − KL(q‖p): within 0.1 nats of the exact log evidence once converged.
    assert linear_truth["log_evidence"] - 0.1 <= diag.elbo <= linear_truth["log_evidence"] + 0.01
    assert diag.khat < 0.5


def test_svi_mean_field_reaches_closed_form_optimum(linear_data, linear_model, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, guide="mean_field")
    q = post.approximation
    optimum_var = 1.0 / np.diag(linear_truth["precision"])
    exact_var = np.diag(linear_truth["cov"])
    # The correlated inputs make the mean-field optimum of the weights much narrower than their exact
    # marginals (the bias, last, is nearly uncorrelated with them).
    assert np.all(exact_var[:-1] / optimum_var[:-1] > 2.0)
    assert post.status.converged
    np.testing.assert_allclose(np.asarray(q.variance()), optimum_var, rtol=0.15)
    assert np.all(np.abs(np.asarray(q.mean) - linear_truth["mean"]) <= 0.1 * np.sqrt(optimum_var))


@pytest.mark.parametrize("temperature", [0.1, 1.0, 3.0])
def test_svi_mean_field_cold_optimum_scales_with_temperature(linear_data, linear_model, linear_truth, temperature):
    # Cold posterior p(θ | D)^(1/T) of a Gaussian: N(μ, T Σ); its mean-field optimum is N(μ, T·d), d_p = 1/Λ_pp.
    post = ppl.fit(
        linear_model, linear_data.train, method="svi", seed=0, guide="mean_field", temperature=temperature, tempering="cold"
    )
    optimum_var = temperature / np.diag(linear_truth["precision"])
    np.testing.assert_allclose(np.asarray(post.approximation.variance()), optimum_var, rtol=0.15)
    assert np.all(np.abs(np.asarray(post.approximation.mean) - linear_truth["mean"]) <= 0.1 * np.sqrt(optimum_var))


@pytest.mark.slow  # a statistical check: out of the default run (15 minutes); CI runs it in the slow step
def test_likelihood_tempering_matches_its_closed_form_under_nuts_and_full_rank_svi(linear_data, linear_model):
    X, y = linear_data.train
    truth = closed_form(np.asarray(X), np.asarray(y), temperature=3.0, tempering="likelihood")
    sd_true = np.sqrt(np.diag(truth["cov"]))
    nuts = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_chains=4, temperature=3.0)
    draws = flat_params(nuts.draws)
    mcse = draws.std(axis=(0, 1)) / np.sqrt(_arviz.ess(draws, "bulk"))
    assert np.all(np.abs(draws.mean(axis=(0, 1)) - truth["mean"]) <= 4 * mcse)
    np.testing.assert_allclose(draws.std(axis=(0, 1)), sd_true, rtol=0.10)  # ESS ≥ 1000: 5 sigma of an sd
    svi = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, guide="full_rank", temperature=3.0)
    q = svi.approximation
    assert svi.status.converged
    assert np.all(np.abs(np.asarray(q.mean) - truth["mean"]) <= 0.1 * sd_true)
    np.testing.assert_allclose(np.sqrt(np.asarray(q.variance())), sd_true, rtol=0.15)


def test_map_is_the_posterior_mode(linear_data, linear_model, linear_truth):
    post = ppl.fit(linear_model, linear_data.train, method="map", seed=0)
    np.testing.assert_allclose(flat_params(post.draws)[0, 0], linear_truth["mean"], atol=1e-6)
