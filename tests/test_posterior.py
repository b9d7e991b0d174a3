"""Posterior behaviour shared by all methods: save/load, ArviZ export, prediction, reproducibility."""

from __future__ import annotations

import arviz as az
import matplotlib
import numpy as np
import pytest

from ppl.models import BNN, LogisticRegression
import ppl

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def nuts_linear(linear_model, linear_data):
    return ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_warmup=200, num_samples=200)


def test_chain_zero_is_the_same_whatever_the_number_of_chains(linear_model, linear_data):
    four = ppl.fit(linear_model, linear_data.train, method="nuts", seed=5, num_chains=4, num_warmup=100, num_samples=100,
                    time_budget=0)  # one round each: an extension's length depends on every chain's R-hat
    one = ppl.fit(linear_model, linear_data.train, method="nuts", seed=5, num_chains=1, num_warmup=100, num_samples=100,
                   time_budget=0)
    for site in four.draws:
        np.testing.assert_array_equal(four.draws[site][0], one.draws[site][0])


def test_save_load_round_trip(tmp_path, nuts_linear, linear_data):
    nuts_linear.save(tmp_path / "run")
    loaded = ppl.load(tmp_path / "run")
    assert loaded.method == "nuts" and loaded.options == nuts_linear.options
    for site in nuts_linear.draws:
        np.testing.assert_array_equal(loaded.draws[site], nuts_linear.draws[site])
    np.testing.assert_array_equal(loaded.chain_stats.diverging, nuts_linear.chain_stats.diverging)
    a, b = loaded.diagnostics(), nuts_linear.diagnostics()
    assert a.rhat_max == b.rhat_max and a.elpd_loo == b.elpd_loo
    pa = loaded.predict(linear_data.test.X, seed=1)
    pb = nuts_linear.predict(linear_data.test.X, seed=1)
    np.testing.assert_array_equal(pa.mean, pb.mean)
    assert not list((tmp_path / "run").glob(".*")), "temporary files left behind"


def test_save_load_density_method(tmp_path, linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="svi", seed=0, guide="low_rank", steps=500)
    post.save(tmp_path / "svi")
    loaded = ppl.load(tmp_path / "svi")
    draws = post.sample(5, seed=2)
    np.testing.assert_allclose(loaded.log_prob(draws), post.log_prob(draws))
    assert loaded.diagnostics().khat == post.diagnostics().khat


def test_arviz_export_is_accepted(nuts_linear, linear_model, linear_data):
    idata = nuts_linear.to_arviz()
    for group in ("posterior", "sample_stats", "log_likelihood", "observed_data"):
        assert group in idata.groups()
    assert idata.posterior["w"].dims == ("chain", "draw", "feature")
    summary = az.summary(idata)
    assert "w[0]" in summary.index
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo)
    # The same estimator as az.loo (same relative efficiency, same PSIS); only the order of floating-
    # point operations differs.
    assert abs(loo.elpd_loo - nuts_linear.diagnostics().elpd_loo) < 1e-6 * abs(loo.elpd_loo)
    other = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    table = az.compare({"nuts": idata, "exact": other.to_arviz()})
    assert set(table.index) == {"nuts", "exact"}
    axes = az.plot_trace(idata, var_names=["b"])
    assert axes.shape[0] == 1
    matplotlib.pyplot.close("all")


def test_summary_has_numpyro_s_shape_and_arviz_s_numbers(nuts_linear, linear_model, linear_data):
    # one row per scalar element of each latent site; mean/sd/median/interval from the pooled draws,
    # n_eff and r_hat as az.summary computes ess_bulk and r_hat for the same chains
    table = nuts_linear.summary(prob=0.8)
    reference = az.summary(nuts_linear.to_arviz(), var_names=["b", "w"], kind="diagnostics")
    assert table.columns == ("mean", "std", "median", "10.0%", "90.0%", "n_eff", "r_hat")
    assert list(table.rows) == ["b", "w[0]", "w[1]", "w[2]"]
    w = np.asarray(nuts_linear.draws["w"]).reshape(-1, 3)
    row = table.rows["w[1]"]
    assert row["mean"] == pytest.approx(w[:, 1].mean()) and row["std"] == pytest.approx(w[:, 1].std(ddof=1))
    assert (row["10.0%"], row["median"], row["90.0%"]) == pytest.approx(tuple(np.quantile(w[:, 1], [0.1, 0.5, 0.9])))
    for name, values in table.rows.items():
        assert values["n_eff"] == pytest.approx(reference.loc[name, "ess_bulk"], abs=0.51)  # ArviZ rounds to integers
        assert values["r_hat"] == pytest.approx(reference.loc[name, "r_hat"], abs=0.006)
    text = str(table)
    assert "w[2]" in text and "Number of divergences: 0" in text and "Markov chains" in text
    # independent draws of an approximation: ESS applies, R-hat does not; a point: neither
    exact = ppl.fit(linear_model, linear_data.train, method="exact", seed=0).summary()
    assert exact.rows["b"]["n_eff"] > 100 and exact.rows["b"]["r_hat"] is None and exact.divergences is None
    point = ppl.fit(linear_model, linear_data.train, method="map", seed=0).summary()
    assert point.rows["b"]["n_eff"] is None and point.rows["b"]["std"] == 0.0 and "—" in str(point)
    with pytest.raises(ValueError, match="prob must be a number in"):
        nuts_linear.summary(prob=90)


def test_log_prob_matches_the_family(linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    draws = post.sample(11, seed=4)
    flat = np.concatenate([draws["w"], draws["b"][:, None]], axis=1)
    expected = np.asarray(post.approximation.log_prob(flat))  # identity transforms: no Jacobian
    np.testing.assert_allclose(post.log_prob(draws), expected)
    nuts = ppl.fit(linear_model, linear_data.train, method="nuts", seed=0, num_warmup=50, num_samples=50, num_chains=1)
    with pytest.raises(TypeError, match="no density"):
        nuts.log_prob(draws)


def test_linearized_prediction_of_a_linear_model_is_its_closed_form(linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    lin = post.predict(linear_data.test.X, seed=1, mode="linearized")
    X = np.c_[linear_data.test.X, np.ones(len(linear_data.test.X))]  # columns of w, then b
    mean, cov = np.asarray(post.approximation.mean), np.asarray(post.approximation.covariance())
    np.testing.assert_allclose(lin.mean, X @ mean, rtol=1e-10)
    np.testing.assert_allclose(lin.epistemic_variance, np.einsum("ni,ij,nj->n", X, cov, X), rtol=1e-10)
    np.testing.assert_allclose(lin.variance, lin.epistemic_variance + linear_model.noise_scale**2, rtol=1e-12)
    # its draws are draws of that Gaussian: their mean agrees within Monte Carlo error (5 standard errors)
    se = np.sqrt(lin.epistemic_variance / lin.member_means.shape[0])
    assert np.all(np.abs(lin.member_means.mean(axis=0) - lin.mean) < 5 * se + 1e-12)


def test_classification_prediction_and_probit():
    data = ppl.datasets.load("two_moons", seed=0)
    post = ppl.fit(LogisticRegression(), data.train, method="svi", seed=0, guide="full_rank", steps=1500)
    pred = post.predict(data.test.X, seed=1)
    assert pred.probs.shape == (data.test.X.shape[0], 2)
    np.testing.assert_allclose(pred.probs.sum(axis=1), 1.0)
    assert pred.member_probs.shape == (post.num_draws, data.test.X.shape[0], 2)
    np.testing.assert_allclose(pred.entropy, pred.aleatoric + pred.epistemic, atol=1e-12)
    probit = post.predict(data.test.X, seed=1, mode="probit")
    # The probit approximation is close to the MC predictive for a near-Gaussian logit.
    assert np.max(np.abs(probit.probs - pred.probs)) < 0.05
    metrics = ppl.evaluate(post, data.test, seed=1)
    assert set(metrics) == {"nll", "accuracy", "ece", "brier"}
    assert 0.8 < metrics["accuracy"] <= 1.0


def test_categorical_bnn_reads_classes_from_labels():
    data = ppl.datasets.load("iris", seed=0)
    post = ppl.fit(BNN(hidden=(8,), likelihood="categorical"), data.train, method="map", seed=0, steps=300)
    assert post.draws["w1"].shape[-1] == 3
    pred = post.predict(data.test.X, seed=0)
    assert pred.probs.shape == (data.test.X.shape[0], 3)


def test_regression_metrics(linear_model, linear_data):
    post = ppl.fit(linear_model, linear_data.train, method="exact", seed=0)
    metrics = ppl.evaluate(post, linear_data.test, seed=1)
    assert set(metrics) == {"nll", "rmse", "coverage_90"}
    assert metrics["rmse"] < 1.0 and 0.6 <= metrics["coverage_90"] <= 1.0


def test_a_posterior_is_frozen_and_replaced_not_patched(linear_model, linear_data):
    """A method's result is built once: setting an attribute raises an error that says what to do;
    the run record ppl.fit passes and held-out rows make new Posteriors that share the draws, and
    the one they came from keeps its own record and verdict."""
    post = ppl.fit(linear_model, linear_data.train, method="laplace", seed=3)
    assert post.seed == 3 and post.options["hessian"] == post.record.options["hessian"] and post.wall_time_s > 0
    assert post.provenance["data"]["rows"] == len(linear_data.train.X) and post.fingerprint
    with pytest.raises(AttributeError, match="frozen.*with_heldout"):
        post.seed = 4
    with pytest.raises(AttributeError, match="frozen"):
        post.heldout = linear_data.test
    before = post.diagnostics()
    judged = post.with_heldout(*linear_data.test)
    assert judged is not post and post.heldout is None and judged.heldout[0].shape == np.shape(linear_data.test.X)
    assert judged.draws is post.draws and judged.flat_draws is post.flat_draws and judged.seed == 3
    assert judged.diagnostics().heldout_rows == len(linear_data.test.X)
    assert post.diagnostics() is before and before.heldout_rows is None
    with pytest.raises(TypeError, match="cannot be replaced"):
        post.replace(draws={})


def test_the_method_s_class_speaks_for_its_run_fitted_or_loaded(linear_model, linear_data, tmp_path):
    """Remedies, the loss label and the round length come from the class the method (or the loader)
    passes; the Posterior never looks a method up by its name."""
    from ppl.core import registry
    from ppl.core.method import Method
    from ppl.core.posterior import Posterior

    post = ppl.fit(linear_model, linear_data.train, method="laplace", seed=0)
    laplace = registry.get("laplace")
    assert post.declared_by is laplace and post.loss_label == laplace.loss_label != Method.loss_label
    assert post.remedy("fit") == laplace.remedy(post, "fit") != Method.remedy(post, "fit")
    assert post.with_heldout(*linear_data.test).declared_by is laplace
    post.save(tmp_path / "run")
    assert ppl.load(tmp_path / "run").declared_by is laplace
    # built by hand without a declaration: the base class's generic advice, whatever the name says
    bare = Posterior(method="laplace", kind="independent", problem=post.problem, flat_draws=post.flat_draws,
                     approximation=post.approximation)
    assert bare.declared_by is Method and bare.loss_label == "loss" and bare.remedy("fit") == Method.remedy(bare, "fit")
